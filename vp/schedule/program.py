"""The simulator's program of a schedule (not to be confused with the planner, vp/plan/): what its loop needs that
does not depend on costs, as small tuples of integers, derived once per schedule object (vp/schedule/simulate.py
runs it; validate() reads it for its input, link and collective-order checks).
"""
from dataclasses import replace
from typing import NamedTuple

from vp.schedule.actions import COLLECTIVES, P2P, Action, Collective, Schedule
from vp.schedule.rules import members as group_members
from vp.schedule.rules import root_of, shapes


# step codes of the program: what the loop does with an action
_PLAIN, _SEND, _RECV, _SYNC, _MISSING = range(5)  # compute with no collective; p2p; anything that enters or waits
_MEM_NONE, _MEM_HOLD, _MEM_FREE = range(3)  # F, S hold their activations (peak counted); B, W, T free them


class _Program(NamedTuple):
    """What the simulator needs of a schedule, independent of costs, as integers: derived once per schedule object
    (a sweep simulates one schedule with many costs; validate() and the caller share it).

    steps[r][i]: (code, needs, a, b, c) where needs are the steps of rank r whose ends action i waits for
    (rules.local_needs; a need that does not come earlier makes the step _MISSING, raised when the rank gets there;
    the step just before is left out: it ends at the rank's clock);
    _PLAIN: a = index of its duration in time_keys, b = index of its memory in mem_keys, c = _MEM_*;
    _SEND: a = its channel (a send and its receive share one), b = its link; _RECV: a = channel, b = index in
    p2p_keys, c = its link;
    _SYNC: a = (instance it enters or -1, entered at the end, instances it waits on, a collective action (C0 C1 C2),
    index in time_keys), b, c as for _PLAIN.
    """
    steps: list  # per rank, per action: the tuple above
    time_keys: list  # (kind, stage) for Costs.time
    mem_keys: list  # (kind, stage) for Costs.mem
    p2p_keys: list  # (src, dst) for Costs.p2p
    channels: int  # number of send/receive channels
    links: list  # link id -> (src, dst, kind): one direction and kind of traffic between two ranks
    instances: list  # instance id -> Collective
    members: list  # instance id -> the ranks of its group
    roots: list  # instance id -> the rank it is sent from (C0, IB: receivers wait for it alone) or None
    counts: list  # per rank, (kind, chunk) -> how many distinct microbatches it runs of it
    p2p_actions: list  # per rank, how many sends and receives it runs
    missing: bool  # some step is _MISSING
    traffic: list  # link id -> (channels sent, channels received), in the order of the ranks' steps
    entries: list  # per rank, (step, instance id) of each instance it enters, in order (only if no step is _MISSING)


def _program(s: Schedule) -> _Program:
    return s.memo("simulator_program", _make_program)


def p2p_in_order(s: Schedule) -> bool:
    """Whether every action's inputs come earlier on its rank and each link (one direction and kind of traffic
    between two ranks) receives exactly what it sends, in the order sent: validate()'s checks, from the program."""
    prog = _program(s)
    return not prog.missing and all(sent == received for sent, received in prog.traffic)


def _make_program(s: Schedule) -> _Program:
    times, mems, p2ps, links = {}, {}, {}, {}  # key -> its index (dicts keep insertion order)
    instances = []
    chans = {}  # (src, dst, kind, stage) -> {microbatch: channel}
    insts = {}  # (group, kind) -> {microbatch: instance id}
    n_chans = 0

    def index(table: dict, key) -> int:
        return table.setdefault(key, len(table))

    def resolve(a: Action) -> tuple:  # _shape() with its keys turned into table indices
        code, needs, x, mem, mode = _shape(s, a)
        mem = index(mems, mem) if mem else 0
        if code in (_SEND, _RECV):
            link = (a.rank, x[0], x[1]) if code == _SEND else (x[0], a.rank, x[1])
            x = (*x, index(p2ps, (x[0], a.rank)), index(links, link))
        elif code == _PLAIN:
            x = index(times, x)
        else:
            x = (*x[:4], index(times, x[4]))
        return code, needs, x, mem, mode, (code, (), x, mem, mode)  # the last: one step for all that need nothing

    def instance(proto: Collective, mb: int) -> int:  # proto: of microbatch 0 (rules.shape); a new instance
        table = insts.setdefault((proto.group, proto.kind), {})
        table[mb] = len(instances)
        instances.append(replace(proto, mb=mb))
        return table[mb]

    def classify(r: int, a: Action, done: dict) -> tuple:
        """What every action of a's (kind, chunk) on rank r shares: (code, its needs' done tables, its own done
        table, x); x: _PLAIN: (its step where it needs nothing, (x, mem, mode)); _SEND, _RECV: (its link's
        channels by microbatch, p2p index, link, the link's channels sent or received so far); _SYNC: ((entered instances by microbatch, prototype) or None,
        ((waited instances by microbatch, prototype), ...), (at_end, is_coll, duration index), mem, mode)."""
        code, needs, x, mem, mode, bare = resolve(a)
        tables = tuple(done.setdefault(n, {}) for n in needs)
        mine = done.setdefault((a.kind, a.chunk), {})
        if code == _PLAIN:
            return code, tables, mine, (bare, (x, mem, mode))
        if code in (_SEND, _RECV):
            link = (r, x[0], x[1], x[2]) if code == _SEND else (x[0], r, x[1], x[2])
            while len(traffic) <= x[4]:
                traffic.append(([], []))
            return code, tables, mine, (chans.setdefault(link, {}), x[3], x[4], traffic[x[4]][code == _RECV])
        entry, at_end, waits, is_coll, dur = x
        table = (lambda proto: (insts.setdefault((proto.group, proto.kind), {}), proto))
        return code, tables, mine, (entry and table(entry), tuple(map(table, waits)), (at_end, is_coll, dur), mem,
                                    mode)

    steps, counts, p2p_actions, missing, traffic, entries = [], [], [], False, [], []
    for r, acts in enumerate(s.ranks):
        done: dict = {}  # (kind, chunk) -> {microbatch: its latest step on this rank so far}
        shape: dict = {}  # (kind, chunk) -> classify()
        out, entered, n_p2p = [], [], 0
        append = out.append
        for i, (_, kind, mb, chunk) in enumerate(acts):
            sh = shape.get((kind, chunk))
            if sh is None:
                sh = shape[(kind, chunk)] = classify(r, acts[i], done)
            code, tables, mine, x = sh
            needs = ()
            for table in tables:
                j = table.get(mb)
                if j is None:
                    needs = None
                    break
                if j != i - 1:  # the step just before ends at the rank's clock, which every step waits for
                    needs += (j,)
            mine[mb] = i
            if code == _PLAIN:
                if needs == ():
                    append(x[0])
                elif needs is not None:
                    append((_PLAIN, needs, *x[1]))
                else:
                    append((_MISSING, (), -1, 0, 0))
                    missing = True
                continue
            if code != _SYNC:
                chan, p2p, link, carried = x
                n_p2p += 1
                if needs is None and code == _SEND:  # raised when the rank gets there
                    append((_MISSING, (), -1, 0, 0))
                    missing = True
                    continue
                c = chan.get(mb)  # its channel: one per link and microbatch
                if c is None:
                    c = chan[mb] = n_chans
                    n_chans += 1
                if needs is None:  # a receive still waits for its send first
                    append((_MISSING, (), c, 0, 0))
                    missing = True
                else:
                    append((code, needs, c, link, 0) if code == _SEND else (code, needs, c, p2p, link))
                    carried.append(c)
                continue
            if needs is None:
                append((_MISSING, (), -1, 0, 0))
                missing = True
                continue
            entry, waits, (at_end, is_coll, dur), mem, mode = x
            if entry:
                got = entry[0].get(mb)
                entry = instance(entry[1], mb) if got is None else got
                if not missing:
                    entered.append((i, entry))
            else:
                entry = -1
            if waits:
                got = []
                for table, proto in waits:
                    w = table.get(mb)
                    got.append(instance(proto, mb) if w is None else w)
                waits = tuple(got)
            append((_SYNC, needs, (entry, at_end, waits, is_coll, dur), mem, mode))
        steps.append(out)
        entries.append(entered)
        counts.append({key: len(mbs) for key, mbs in done.items() if key in shape})
        p2p_actions.append(n_p2p)
    members = [tuple(group_members(s, inst.group)) for inst in instances]
    roots = [root_of(s, inst.group) if inst.group in ("C0", "IB") else None for inst in instances]
    return _Program(steps, list(times), list(mems), list(p2ps), n_chans, list(links), instances, members, roots,
                    counts, p2p_actions, missing, traffic, entries)


def _shape(s: Schedule, a: Action) -> tuple:
    """(code, needs, x, memory key, memory mode) of an action with its microbatch left out (rules.shape): needs are
    (kind, chunk) pairs; x: p2p: (peer, kind, stage) of the match; _PLAIN: its time key; _SYNC: ((group, kind)
    entered or None, entered at the end, ((group, kind) waited on, ...), a collective action, its time key)."""
    sh = shapes(s)[a.rank][(a.kind, a.chunk)]
    kind = a.kind
    if kind in P2P:
        return (_SEND if kind[0] == "S" else _RECV), sh.needs, (sh.peer, *sh.match), None, _MEM_NONE
    st = s.stage(a.rank, a.chunk) if kind in ("F", "B", "W") else None
    mem, mode = None, _MEM_NONE
    if kind in ("F", "S"):
        mem, mode = (kind, st), _MEM_HOLD
    elif kind == "B" and not s.split_w:
        mem, mode = ("F", st), _MEM_FREE
    elif kind in ("B", "W"):  # W split: B releases its part of F's memory, W the rest (Costs.mem)
        mem, mode = (kind, st), _MEM_FREE
    elif kind == "T":
        mem, mode = ("S", None), _MEM_FREE
    entry, waits = sh.entry, sh.waits
    if entry is None and not waits and kind not in COLLECTIVES:
        return _PLAIN, sh.needs, (kind, st), mem, mode
    sync = (entry, bool(entry) and entry.phase == "end", waits, kind in COLLECTIVES, (kind, st))
    return _SYNC, sh.needs, sync, mem, mode
