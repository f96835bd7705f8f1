"""The simulator's program of a schedule (not to be confused with the planner, vp/plan/): what its loop needs that
does not depend on costs, as arrays of integers, derived once per schedule object (vp/schedule/simulate.py
runs it; validate() reads it for its input, link and collective-order checks).
"""
import hashlib
from collections.abc import Sequence
from dataclasses import replace
from typing import NamedTuple

import numpy as np

from vp.disk_cache import DiskCache
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
    instances: object  # instance id -> Collective (a sequence, made when read)
    inst_kind: object  # instance id -> index of its kind in inst_kinds (an array)
    inst_kinds: list  # the kinds of the instances
    members: object  # instance id -> the ranks of its group (a sequence)
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


class _Table(NamedTuple):
    """The shapes' rows of a program (what _make_program's compiled loop reads besides the steps), with the keys its
    indices stand for: a function of the schedule's kind and each rank's shapes in order of first appearance."""
    cols: object  # int64 [11, shape]: code, time, mem, mode, p2p, chan, link, entry, entry proto, at_end, is_coll
    nstart: object  # needs[nstart[i]:nstart[i + 1]] of shape i; waits likewise (wstart)
    needs: object
    wstart: object
    wait_tab: object
    wait_proto: object
    sbase: object  # rank r's shapes are sbase[r] .. sbase[r + 1]
    times: list
    mems: list
    p2ps: list
    links: list
    channels: int
    groups: int  # (group, kind) pairs entered or waited on
    protos: list  # instance prototype (of microbatch 0) per index


_TABLES: dict = {}  # (the schedule's fields but its microbatches and actions, each rank's shapes) -> _Table
_TABLES_AT_MOST = 4096  # emptied past this many


def _table(s: Schedule, keys_of: tuple) -> _Table:
    """The shape table of a schedule whose rank r runs the (kind, chunk)s keys_of[r] (in order of first appearance):
    worked out once per kind of schedule and keys, since shapes never read the microbatches (rules.shape_of), so
    the schedules a planner builds for many microbatch counts share it."""
    key = (s.method, s.pp, s.chunks, s.placement, s.vocab, s.split_w, keys_of)
    got = _TABLES.get(key)
    if got is None:
        if len(_TABLES) >= _TABLES_AT_MOST:
            _TABLES.clear()
        name = (hashlib.sha1(repr(key).encode()).hexdigest()[:24],)  # on disk between processes (vp.disk_cache)
        got = SHAPES.get(name)
        if got is None:
            got = _make_table(s, keys_of)
            SHAPES.put(name, got)
        _TABLES[key] = got
    return got


SHAPES = DiskCache("shapes")


def _make_table(s: Schedule, keys_of: tuple) -> _Table:
    times, mems, p2ps, links = {}, {}, {}, {}  # key -> its index (dicts keep insertion order)
    chan_tabs, inst_tabs, protos = {}, {}, {}  # (src, dst, kind, stage) / (group, kind) / prototype -> its index
    rows: list[tuple] = []  # per shape, as _Table.cols (transposed)
    shape_needs, wait_tab, wait_proto, nstart, wstart, sbase = [], [], [], [0], [0], [0]

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

    for r, keys in enumerate(keys_of):
        base = len(rows)
        ids = {key: base + n for n, key in enumerate(keys)}  # the shapes it runs, then those only needed
        for kind, chunk in keys:
            classify(r, kind, chunk, ids)
        for _ in range(len(ids) + base - len(rows)):  # shapes only needed (none of them runs here: _MISSING)
            rows.append((_PLAIN, 0, 0, 0, 0, 0, 0, -1, 0, 0, 0))
            nstart.append(nstart[-1])
            wstart.append(wstart[-1])
        sbase.append(len(rows))
    ints = [np.array(x, np.int64) for x in (nstart, shape_needs, wstart, wait_tab, wait_proto, sbase)]
    return _Table(np.array(rows, np.int64).reshape(-1, 11).T.copy(), *ints, list(times), list(mems), list(p2ps),
                  list(links), len(chan_tabs), len(inst_tabs), [proto for proto, _ in protos])


def _make_program(s: Schedule) -> _Program:
    """Each rank's shapes (its (kind, chunk)s) in the order the rank meets them, classified once per kind of schedule
    (_table); its steps by vp/schedule/derive.py's compiled loop."""
    per_rank, keys_of, off = [], [], [0]
    for acts in s.ranks:
        if acts:  # each step's (kind, chunk) as one code, and the codes in order of first appearance
            _, kinds, mbs_r, chunks = zip(*acts)
            chunk_of = np.array(chunks, np.int64)
            width = int(chunk_of.max()) + 1
            code = np.fromiter(map(_KIND_CODE.__getitem__, kinds), np.int64, len(acts)) * width + chunk_of
            first = np.unique(code, return_index=True)[1]
            first.sort()
            keys_of.append(tuple((kinds[i], chunks[i]) for i in first.tolist()))
            small = np.int16 if len(_KIND_CODE) * width < 2**15 else np.int64  # held for every rank: kept small
            per_rank.append((code.astype(small), width, np.array(mbs_r, np.int64)))
        else:
            keys_of.append(())
            per_rank.append(None)
        off.append(off[-1] + len(acts))
    tab = _table(s, tuple(keys_of))
    sbase = tab.sbase.tolist()
    kcs, mbs = [], []
    for keys, got, base in zip(keys_of, per_rank, sbase):
        if got is not None:  # each step's shape id, from a table by its code
            code, width, mbs_r = got
            table = np.zeros(len(_KIND_CODE) * width, np.int64)
            for n, (kind, chunk) in enumerate(keys):
                table[_KIND_CODE[kind] * width + chunk] = base + n
            kcs.append(table[code])
            mbs.append(mbs_r)
    kc, mb = (np.concatenate(kcs), np.concatenate(mbs)) if kcs else (np.zeros(0, np.int64),) * 2
    (rec, need, sync, wait, inst_proto, inst_mb, n_chans, missing, in_order, seen, p2p_actions, entry_step,
     entry_inst, entry_start) = kernel.jit(derive, len(kc))(
        np.array(off, np.int64), kc, mb, int(mb.max()) + 1 if len(mb) else 1, *tab.cols, tab.nstart,
        tab.needs, tab.wstart, tab.wait_tab, tab.wait_proto, tab.channels, tab.groups, len(tab.links), tab.sbase)
    # per prototype (few), numbered in order of first appearance among the instances: its group, kind and root
    protos = tab.protos
    uniq, at = np.unique(inst_proto, return_index=True)
    groups, kinds = {}, {}  # group / kind -> its index
    for p in uniq[np.argsort(at, kind="stable")].tolist():
        groups.setdefault(protos[p].group, len(groups))
        kinds.setdefault(protos[p].kind, len(kinds))
    ranks_of = [tuple(group_members(s, group)) for group in groups]
    by_proto = np.array([(groups.get(x.group, -1), kinds.get(x.kind, -1),
                          -1 if x.group not in ("C0", "IB") else root_of(s, x.group)) for x in protos],
                        np.int64).reshape(-1, 3)[inst_proto]
    inst_group, inst_kind, roots = by_proto.T.copy()
    instances = _Instances(protos, inst_proto.copy(), inst_mb.copy())  # not views: their buffers hold every step
    seen, p2p_actions = seen.tolist(), p2p_actions.tolist()
    counts = [{key: seen[first + n] for n, key in enumerate(keys)} for keys, first in zip(keys_of, sbase)]
    arrays = (np.array(off, np.int64), rec, need, sync, wait, roots, inst_group,
              np.cumsum([0] + [len(m) for m in ranks_of], dtype=np.int64),
              np.array([q for m in ranks_of for q in m], np.int64))
    return _Program(*arrays, list(tab.times), list(tab.mems), list(tab.p2ps), n_chans, list(tab.links), instances,
                    inst_kind, list(kinds), _Members(ranks_of, inst_group),
                    counts, p2p_actions, bool(missing), bool(in_order), entry_start, entry_step, entry_inst)


class _Instances(Sequence):
    """instance id -> its Collective, made on the first read (the simulator's loop reads the arrays alone; validate()
    and a deadlock's message read these), one object per instance."""

    def __init__(self, protos: list, proto, mb):
        self._protos, self._proto, self._mb, self._made = protos, proto, mb, None

    def __len__(self) -> int:
        return len(self._proto)

    def __getitem__(self, i):
        if self._made is None:
            self._made = [replace(self._protos[p], mb=m) for p, m in zip(self._proto.tolist(), self._mb.tolist())]
        return self._made[i]


class _Members(Sequence):
    """instance id -> the ranks of its group (a deadlock's message reads it)."""

    def __init__(self, ranks_of: list, group):
        self._ranks_of, self._group = ranks_of, group

    def __len__(self) -> int:
        return len(self._group)

    def __getitem__(self, i):
        return self._ranks_of[int(self._group[i])]


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
