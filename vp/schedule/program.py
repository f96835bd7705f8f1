"""The simulator's program of a schedule (not to be confused with the planner, vp/plan/): what its loop needs that
does not depend on costs, as arrays of integers, derived once per schedule object (vp/schedule/simulate.py
runs it; validate() reads it for its input, link and collective-order checks).
"""
from dataclasses import replace
from typing import NamedTuple

import numpy as np

from vp.schedule.actions import COLLECTIVES, KINDS, P2P, Action, Schedule
from vp.schedule.derive import derive
from vp.schedule import kernel
from vp.schedule.rules import members as group_members
from vp.schedule.rules import root_of, shape_of


# step codes of the program (vp.schedule.kernel's): compute with no collective; p2p; anything that enters or waits
_PLAIN, _SEND, _RECV, _SYNC, _MISSING = kernel.PLAIN, kernel.SEND, kernel.RECV, kernel.SYNC, kernel.MISSING
_MEM_NONE, _MEM_HOLD, _MEM_FREE = kernel.NONE, kernel.HOLD, kernel.FREE  # F, S hold; B, W, T free
_KIND_CODE = {kind: n for n, kind in enumerate(KINDS)}


class _Program(NamedTuple):
    """What the simulator needs of a schedule, independent of costs, as integers: derived once per schedule object
    (a sweep simulates one schedule with many costs; validate() and the caller share it).

    Its steps, flat over the ranks (vp/schedule/kernel.py runs them): off[r]..off[r + 1] are rank r's steps in rec;
    rec[g] = (code, a, b, c, n0, n1), where needs[n0:n1] are the steps of rank r whose ends step g waits for
    (rules.local_needs; a need that does not come earlier makes the step _MISSING, raised when the rank gets there;
    the step just before is left out: it ends at the rank's clock);
    _PLAIN: a = index of its duration in time_keys, b = index of its memory in mem_keys, c = _MEM_*;
    _SEND: a = its channel (a send and its receive share one); _RECV: a = channel, b = index in p2p_keys;
    _SYNC: a = its row of sync = (instance it enters or -1, entered at the end, a collective action (C0 C1 C2),
    index in time_keys, w0, w1), waits[w0:w1] the instances it waits on; b, c as for _PLAIN;
    _MISSING: a = the channel of a receive (it waits for its send first) or -1.
    Instances: roots_at (-1: none) and group (an index into gstart/gmembers, the ranks of each group), as arrays.
    """
    off: object  # numpy int64 arrays, as above
    rec: object
    needs: object
    sync: object
    waits: object
    roots_at: object
    group: object
    gstart: object
    gmembers: object
    time_keys: list  # (kind, stage) for Costs.time
    mem_keys: list  # (kind, stage) for Costs.mem
    p2p_keys: list  # (src, dst) for Costs.p2p
    channels: int  # number of send/receive channels
    links: list  # link id -> (src, dst, kind): one direction and kind of traffic between two ranks
    instances: list  # instance id -> Collective
    inst_kind: object  # instance id -> index of its kind in inst_kinds (an array)
    inst_kinds: list  # the kinds of the instances
    members: list  # instance id -> the ranks of its group
    roots: list  # instance id -> the rank it is sent from (C0, IB: receivers wait for it alone) or None
    counts: list  # per rank, (kind, chunk) -> how many distinct microbatches it runs of it
    p2p_actions: list  # per rank, how many sends and receives it runs
    missing: bool  # some step is _MISSING
    in_order: bool  # each link receives exactly the channels it sends, in the order sent
    entry_start: object  # rank r enters instances entry_inst[entry_start[r]:entry_start[r + 1]], in order, at
    entry_step: object  # steps entry_step[...] (arrays; only if no step is _MISSING)
    entry_inst: object


def _program(s: Schedule) -> _Program:
    return s.memo("simulator_program", _make_program)


def p2p_in_order(s: Schedule) -> bool:
    """Whether every action's inputs come earlier on its rank and each link (one direction and kind of traffic
    between two ranks) receives exactly what it sends, in the order sent: validate()'s checks, from the program."""
    prog = _program(s)
    return not prog.missing and prog.in_order


def _make_program(s: Schedule) -> _Program:
    """Each rank's shapes (its (kind, chunk)s) classified here, once, in the order the rank meets them; its steps by
    vp/schedule/derive.py's compiled loop."""
    times, mems, p2ps, links = {}, {}, {}, {}  # key -> its index (dicts keep insertion order)
    chan_tabs, inst_tabs, protos = {}, {}, {}  # (src, dst, kind, stage) / (group, kind) / prototype -> its index
    rows: list[tuple] = []  # per shape: code, time, mem, mode, p2p, chan, link, entry, entry proto, at_end, is_coll
    shape_needs, wait_tab, wait_proto, nstart, wstart = [], [], [], [0], [0]

    def index(table: dict, key) -> int:
        return table.setdefault(key, len(table))

    def classify(r: int, kind: str, chunk: int, ids: dict) -> None:
        code, needs, x, mem, mode = _shape(s, Action(r, kind, 0, chunk))
        mem = index(mems, mem) if mem else 0
        shape_needs.extend(ids.setdefault(key, len(ids) + base) for key in needs)
        nstart.append(len(shape_needs))
        row = [code, 0, mem, mode, 0, 0, 0, -1, 0, 0, 0]
        if code in (_SEND, _RECV):
            link = (r, x[0], x[1]) if code == _SEND else (x[0], r, x[1])
            row[4], row[6] = index(p2ps, (x[0], r)), index(links, link)
            row[5] = index(chan_tabs, (r, x[0], x[1], x[2]) if code == _SEND else (x[0], r, x[1], x[2]))
        elif code == _PLAIN:
            row[1] = index(times, x)
        else:
            entry, at_end, waits, is_coll, dur = x
            row[1], row[9], row[10] = index(times, dur), at_end, is_coll
            if entry:
                row[7], row[8] = index(inst_tabs, (entry.group, entry.kind)), index(protos, (entry, entry.phase))
            for proto in waits:
                wait_tab.append(index(inst_tabs, (proto.group, proto.kind)))
                wait_proto.append(index(protos, (proto, proto.phase)))
        wstart.append(len(wait_tab))
        rows.append(tuple(row))

    kcs, mbs, off, keys_of, sbase = [], [], [0], [], [0]
    for r, acts in enumerate(s.ranks):
        base = len(rows)
        if acts:  # each step's (kind, chunk) as one code, and the codes in order of first appearance
            _, kinds, mbs_r, chunks = zip(*acts)
            chunk_of = np.array(chunks, np.int64)
            width = int(chunk_of.max()) + 1
            code = np.fromiter(map(_KIND_CODE.__getitem__, kinds), np.int64, len(acts)) * width + chunk_of
            first = np.unique(code, return_index=True)[1]
            first.sort()
            ids = {(kinds[i], chunks[i]): base + n for n, i in enumerate(first.tolist())}  # the shapes it runs
        else:
            ids = {}
        keys_of.append(list(ids))
        for kind, chunk in keys_of[-1]:
            classify(r, kind, chunk, ids)
        for _ in range(len(ids) + base - len(rows)):  # shapes only needed (none of them runs here: _MISSING)
            rows.append((_PLAIN, 0, 0, 0, 0, 0, 0, -1, 0, 0, 0))
            nstart.append(nstart[-1])
            wstart.append(wstart[-1])
        if acts:  # each step's shape id, from a table by its code
            table = np.zeros(len(_KIND_CODE) * width, np.int64)
            for kind, chunk in keys_of[-1]:
                table[_KIND_CODE[kind] * width + chunk] = ids[(kind, chunk)]
            kcs.append(table[code])
            mbs.append(np.array(mbs_r, np.int64))
        off.append(off[-1] + len(acts))
        sbase.append(len(rows))
    kc, mb = (np.concatenate(kcs), np.concatenate(mbs)) if kcs else (np.zeros(0, np.int64),) * 2
    table = np.array(rows, np.int64).reshape(-1, 11)
    (rec, need, sync, wait, inst_proto, inst_mb, n_chans, missing, in_order, seen, p2p_actions, entry_step,
     entry_inst, entry_start) = kernel.jit(derive, len(kc))(
        np.array(off, np.int64), kc, mb, int(mb.max()) + 1 if len(mb) else 1, *table.T.copy(),
        np.array(nstart, np.int64), np.array(shape_needs, np.int64), np.array(wstart, np.int64),
        np.array(wait_tab, np.int64), np.array(wait_proto, np.int64), len(chan_tabs), len(inst_tabs), len(links),
        np.array(sbase, np.int64))
    proto_of = [proto for proto, _ in protos]
    instances = [replace(proto_of[p], mb=m) for p, m in zip(inst_proto.tolist(), inst_mb.tolist())]
    groups: dict = {}  # group -> its index
    for inst in instances:
        groups.setdefault(inst.group, len(groups))
    ranks_of = [tuple(group_members(s, group)) for group in groups]
    members = [ranks_of[groups[inst.group]] for inst in instances]
    roots = [root_of(s, inst.group) if inst.group in ("C0", "IB") else None for inst in instances]
    seen, p2p_actions = seen.tolist(), p2p_actions.tolist()
    counts = [{key: seen[first + n] for n, key in enumerate(keys)} for keys, first in zip(keys_of, sbase)]
    arrays = (np.array(off, np.int64), rec, need, sync, wait, np.array([-1 if x is None else x for x in roots], np.int64),
              np.array([groups[inst.group] for inst in instances], np.int64),
              np.cumsum([0] + [len(m) for m in ranks_of], dtype=np.int64),
              np.array([q for m in ranks_of for q in m], np.int64))
    kinds = {}  # kind -> its index
    inst_kind = np.array([kinds.setdefault(inst.kind, len(kinds)) for inst in instances], np.int64)
    return _Program(*arrays, list(times), list(mems), list(p2ps), n_chans, list(links), instances, inst_kind,
                    list(kinds), members, roots,
                    counts, p2p_actions, bool(missing), bool(in_order), entry_start, entry_step, entry_inst)


def _shape(s: Schedule, a: Action) -> tuple:
    """(code, needs, x, memory key, memory mode) of an action with its microbatch left out (rules.shape): needs are
    (kind, chunk) pairs; x: p2p: (peer, kind, stage) of the match; _PLAIN: its time key; _SYNC: ((group, kind)
    entered or None, entered at the end, ((group, kind) waited on, ...), a collective action, its time key)."""
    sh = shape_of(s, a.rank, a.kind, a.chunk)
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
