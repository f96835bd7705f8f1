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


def _program(s: Schedule) -> _Program:
    return s.memo("simulator_program", _make_program)


def p2p_in_order(s: Schedule) -> bool:
    """Whether every action's inputs come earlier on its rank and each link (one direction and kind of traffic
    between two ranks) receives exactly what it sends, in the order sent: validate()'s checks, from the program."""
    prog = _program(s)
    sent, received = [[] for _ in prog.links], [[] for _ in prog.links]
    for steps in prog.steps:
        for code, _, chan, b, c in steps:
            if code == _SEND:
                sent[b].append(chan)
            elif code == _RECV:
                received[c].append(chan)
            elif code == _MISSING:
                return False
    return sent == received


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

    def instance(proto: Collective, mb: int) -> int:  # proto: of microbatch 0 (rules.shape)
        table = insts.setdefault((proto.group, proto.kind), {})
        got = table.get(mb)
        if got is None:
            got = table[mb] = len(instances)
            instances.append(replace(proto, mb=mb))
        return got

    steps = []
    for r, acts in enumerate(s.ranks):
        done: dict = {}  # (kind, chunk) -> {microbatch: its latest step on this rank so far}
        shape: dict = {}  # (kind, chunk) -> (resolve(), its own done table, its needs' done tables, its channels)
        out = []
        for i, a in enumerate(acts):
            _, kind, mb, chunk = a
            sh = shape.get((kind, chunk))
            if sh is None:
                got = resolve(a)
                code, x = got[0], got[2]
                link = (r, x[0], x[1], x[2]) if code == _SEND else (x[0], r, x[1], x[2]) if code == _RECV else None
                sh = shape[(kind, chunk)] = (got, done.setdefault((kind, chunk), {}),
                                             tuple(done.setdefault(n, {}) for n in got[1]),
                                             chans.setdefault(link, {}) if link else None)
            (code, _, x, mem, mode, bare), mine, need_tables, chan = sh
            needs = ()
            for table in need_tables:
                j = table.get(mb)
                if j is None:
                    needs = None
                    break
                if j != i - 1:  # the step just before ends at the rank's clock, which every step waits for
                    needs += (j,)
            mine[mb] = i
            if chan is not None and (needs is not None or code == _RECV):  # its channel: one per link and microbatch
                c = chan.get(mb)
                if c is None:
                    c = chan[mb] = n_chans
                    n_chans += 1
            if needs is None:  # raised when the rank gets there; a receive still waits for its send first
                out.append((_MISSING, (), c if code == _RECV else -1, 0, 0))
            elif code == _PLAIN:
                out.append((_PLAIN, needs, x, mem, mode) if needs else bare)
            elif code == _SEND:
                out.append((_SEND, needs, c, x[4], 0))
            elif code == _RECV:
                out.append((_RECV, needs, c, x[3], x[4]))
            else:
                entry, at_end, waits, is_coll, dur = x
                entry = instance(entry, mb) if entry else -1
                waits = tuple([instance(w, mb) for w in waits]) if waits else ()
                out.append((_SYNC, needs, (entry, at_end, waits, is_coll, dur), mem, mode))
        steps.append(out)
    members = [tuple(group_members(s, inst.group)) for inst in instances]
    roots = [root_of(s, inst.group) if inst.group in ("C0", "IB") else None for inst in instances]
    return _Program(steps, list(times), list(mems), list(p2ps), n_chans, list(links), instances, members, roots)


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
