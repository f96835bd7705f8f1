"""The simulator's plan of a schedule: what its loop needs that does not depend on costs, as small tuples of integers,
derived once per schedule object (vp/schedule/simulate.py runs it; validate() reads it for its input and link checks).
"""
from dataclasses import replace
from typing import NamedTuple

from vp.schedule.actions import COLLECTIVES, P2P, Action, Collective, Schedule
from vp.schedule.rules import members as group_members
from vp.schedule.rules import root_of, shapes


# step codes of the plan: what the loop does with an action
_PLAIN, _SEND, _RECV, _SYNC, _MISSING = range(5)  # compute with no collective; p2p; anything that enters or waits
_MEM_NONE, _MEM_HOLD, _MEM_FREE = range(3)  # F, S hold their activations (peak counted); B, W, T free them


class _Plan(NamedTuple):
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


def _plan(s: Schedule) -> _Plan:
    return s.memo("simulator_plan", _make_plan)


def p2p_in_order(s: Schedule) -> bool:
    """Whether every action's inputs come earlier on its rank and each link (one direction and kind of traffic
    between two ranks) receives exactly what it sends, in the order sent: validate()'s checks, from the plan."""
    plan = _plan(s)
    sent, received = [[] for _ in plan.links], [[] for _ in plan.links]
    for steps in plan.steps:
        for code, _, chan, b, c in steps:
            if code == _SEND:
                sent[b].append(chan)
            elif code == _RECV:
                received[c].append(chan)
            elif code == _MISSING:
                return False
    return sent == received


def _make_plan(s: Schedule) -> _Plan:
    times, mems, p2ps, chans, insts, links = {}, {}, {}, {}, {}, {}  # key -> its index (dicts keep insertion order)
    instances = []

    def index(table: dict, key) -> int:
        return table.setdefault(key, len(table))

    def instance(inst: Collective, mb: int) -> int:  # inst: of microbatch 0 (rules.shape)
        got = insts.get((inst.group, inst.kind, mb))
        if got is None:
            got = insts[(inst.group, inst.kind, mb)] = len(instances)
            instances.append(replace(inst, mb=mb))
        return got

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

    steps = []
    for r, acts in enumerate(s.ranks):
        seen: dict = {}  # action -> its latest step on this rank so far (an Action equals its plain tuple)
        shape: dict = {}  # (kind, chunk) -> resolve(), the same for every microbatch
        out = []
        for i, a in enumerate(acts):
            mb = a.mb
            sh = shape.get((a.kind, a.chunk))
            if sh is None:
                sh = shape[(a.kind, a.chunk)] = resolve(a)
            code, need_shapes, x, mem, mode, _ = sh
            needs = ()
            for nk, nc in need_shapes:
                j = seen.get((r, nk, mb, nc))
                if j is None:
                    needs = None
                    break
                if j != i - 1:  # the step just before ends at the rank's clock, which every step waits for
                    needs += (j,)
            seen[a if a.rank == r else (r, a.kind, mb, a.chunk)] = i
            if needs is None:  # raised when the rank gets there; a receive still waits for its send first
                chan = index(chans, (x[0], r, x[1], mb, x[2])) if code == _RECV else -1
                out.append((_MISSING, (), chan, 0, 0))
            elif code == _SEND:
                out.append((_SEND, needs, index(chans, (r, x[0], x[1], mb, x[2])), x[4], 0))
            elif code == _RECV:
                out.append((_RECV, needs, index(chans, (x[0], r, x[1], mb, x[2])), x[3], x[4]))
            elif code == _PLAIN:
                out.append((_PLAIN, needs, x, mem, mode) if needs else sh[5])
            else:
                entry, at_end, waits, is_coll, dur = x
                entry = instance(entry, mb) if entry else -1
                waits = tuple(instance(w, mb) for w in waits)
                out.append((_SYNC, needs, (entry, at_end, waits, is_coll, dur), mem, mode))
        steps.append(out)
    members = [tuple(group_members(s, inst.group)) for inst in instances]
    roots = [root_of(s, inst.group) if inst.group in ("C0", "IB") else None for inst in instances]
    return _Plan(steps, list(times), list(mems), list(p2ps), len(chans), list(links), instances, members, roots)


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
