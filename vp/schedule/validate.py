"""validate(schedule): every pass exactly once, dependencies in order, sends matched by receives,
collectives entered in one order by all ranks (within each group, and across groups), and no deadlock in the
simulator's default mode nor with one ordered queue of collectives per rank (strict). A violation names rank,
step and action.

The cross-group order: every rank enters its collective instances (C0 C1 C2 IF IB, the naive algorithm's S and T,
of all groups) in its schedule order. Under NCCL with one ordered queue per rank (or communicators that block
until every member arrives) two instances that two ranks enter in opposite orders can deadlock, each rank
waiting in one for the other. The precedence graph (an edge from each instance a rank enters to the next one it
enters) must therefore be acyclic; where every group spans all ranks that means one common order. Sends and
receives are not part of it: each direction of traffic has its own channel and a receive blocks only its consumer.
"""
from collections import Counter, defaultdict
from dataclasses import replace
from operator import itemgetter

import numpy as np

from vp.schedule.actions import KINDS, P2P, Schedule
from vp.schedule.rules import members, rank_keys, shapes
from vp.schedule.program import _program, p2p_in_order
from vp.schedule.costs import Costs
from vp.schedule.simulate import ScheduleError, collector_paused, simulate


def _fail(s: Schedule, r: int, i: int, msg: str):
    raise ScheduleError(f"rank {r}, step {i} ({s.ranks[r][i].text()}): {msg}\n" + s.grid((r, i), 6))


def expected_counts(s: Schedule) -> Counter:
    """How many times each (rank, kind, mb, chunk) must appear."""
    want = Counter()
    for st in range(s.n_stages):
        r, c = s.where(st)
        for mb in range(s.microbatches):
            want[(r, "F", mb, c)] += 1
            want[(r, "B", mb, c)] += 1
            if s.split_w:
                want[(r, "W", mb, c)] += 1
    if s.vocab_parallel:
        kinds = ["S", "T", "IF", "IB", "C0", *s.vocab.collectives]
        for r in range(s.pp):
            for mb in range(s.microbatches):
                for k in kinds:
                    want[(r, k, mb, 0)] += 1
    return want


def _expected_kinds(s: Schedule) -> list[set] | None:
    """Per rank, the (kind, chunk) of the passes and collectives it must run once per microbatch: expected_counts(s)
    where every key is expected once (else None)."""
    kinds = ("F", "B", "W") if s.split_w else ("F", "B")
    out = [[] for _ in range(s.pp)]
    for st in range(s.n_stages):
        r, c = s.where(st)
        out[r] += [(k, c) for k in kinds]
    if s.vocab_parallel:
        for r in range(s.pp):
            out[r] += [(k, 0) for k in ("S", "T", "IF", "IB", "C0", *s.vocab.collectives)]
    sets = [set(x) for x in out]
    return sets if all(len(x) == len(y) for x, y in zip(out, sets)) else None


def _counts_match(s: Schedule) -> bool:
    """Whether every rank's passes and collectives (its actions but sends and receives) are exactly
    expected_counts(s), checked without counting: where each key is expected once (and ranks and microbatches are
    in range, checked before), each rank's (kind, chunk) of passes must be the expected ones, each with every
    microbatch, and there must be no more passes than keys (the simulator's program, built anyway, counts the
    distinct microbatches and the sends and receives). False sends validate() to the count, which names what is
    off."""
    want, m = _expected_kinds(s), s.microbatches
    if want is None:
        return False
    prog = _program(s)
    for acts, counts, n_p2p, kinds in zip(s.ranks, prog.counts, prog.p2p_actions, want):
        passes = {key: n for key, n in counts.items() if key[0] not in P2P}
        if passes.keys() != kinds or any(n != m for n in passes.values()) or len(acts) - n_p2p != m * len(kinds):
            return False
    return True


@collector_paused
def validate(s: Schedule) -> Schedule:
    if len(s.ranks) != s.pp:
        raise ScheduleError(f"schedule has {len(s.ranks)} ranks but pp={s.pp}")
    for r, acts in enumerate(s.ranks):
        if _fields_in_range(s, r, acts):
            continue
        for i, a in enumerate(acts):
            if a.rank != r:
                _fail(s, r, i, f"action says rank {a.rank} but sits in rank {r}'s list")
            if a.kind not in KINDS:
                _fail(s, r, i, f"unknown kind {a.kind!r}")
            if not 0 <= a.mb < s.microbatches or not 0 <= a.chunk < s.chunks:
                _fail(s, r, i, f"microbatch or chunk out of range (microbatches={s.microbatches}, chunks={s.chunks})")
    if not _counts_match(s):  # count, and name the first key that is off
        have = Counter(a for acts in s.ranks for a in acts if a.kind not in P2P)  # an Action equals its plain tuple
        want = expected_counts(s)
        for key in sorted(set(have) | set(want)):
            if have[key] != want[key]:
                r, k, mb, c = key
                where = f"rank {r}: {k}{mb}" + (f".{c}" if c else "")
                raise ScheduleError(f"{where} appears {have[key]} time(s), expected {want[key]}\n" + s.grid())

    if any(sh.peer == r for r, shape in enumerate(shapes(s)) for sh in shape.values()) or not p2p_in_order(s):
        _check_needs_and_links(s)  # raises naming the first rank and step that breaks a check
    if not _one_order(s):
        _check_groups(s)
        check_collective_order(s)
    try:  # what runs with all of a rank's collectives on one ordered queue runs in the default mode too
        simulate(s, Costs(), strict=True)
    except ScheduleError:
        simulate(s, Costs())  # raises ScheduleError naming each blocked rank on a deadlock
        raise  # and with one ordered queue
    return s


def _fields_in_range(s: Schedule, r: int, acts: list) -> bool:
    """Every action of rank r names rank r, a known kind, a microbatch and a chunk in range (checked in C)."""
    if not acts:
        return True
    keys = rank_keys(s)[r]  # its distinct (rank, kind, chunk)
    mbs = list(map(itemgetter(2), acts))
    return (all(rank == r and kind in KINDS and 0 <= chunk < s.chunks for rank, kind, chunk in keys)
            and 0 <= min(mbs) and max(mbs) < s.microbatches)


def _check_needs_and_links(s: Schedule):
    """Every action's inputs earlier on its rank, no send or receive within a rank, each link's traffic received as
    sent: raised with the first rank and step that breaks one."""
    links = defaultdict(lambda: ([], []))  # (src, dst, kind) -> (keys sent, keys received), in order
    for r, (acts, shape) in enumerate(zip(s.ranks, shapes(s))):
        seen = set()
        for i, a in enumerate(acts):
            sh = shape[(a.kind, a.chunk)]
            mb = a.mb
            for kind, chunk in sh.needs:
                if (kind, mb, chunk) not in seen:
                    _fail(s, r, i, f"needs {kind}{mb}" + (f".{chunk}" if chunk else "") + f" earlier on rank {r}")
            seen.add((a.kind, mb, a.chunk))
            if sh.peer is not None:
                peer, key = sh.peer, (sh.match[0], mb, sh.match[1])
                if peer == r:
                    _fail(s, r, i, "a send or receive between two chunks of the same rank; pass it locally")
                sender = a.kind[0] == "S"
                links[(r, peer, key[0]) if sender else (peer, r, key[0])][0 if sender else 1].append(key)
    for (src, dst, kind), (sent, received) in sorted(links.items()):
        what = "activations" if kind == "F" else "gradients"
        if sent == received:
            continue
        if sorted(sent) != sorted(received):
            extra = sorted(set(sent) ^ set(received))[0]
            side = "send without a receive" if extra in sent else "receive without a send"
            raise ScheduleError(f"{side}: {what} of microbatch {extra[1]} from stage {extra[2]}, rank {src} -> "
                                f"rank {dst}\n" + s.grid())
        if sent != received:  # one channel per direction and kind is first in, first out
            i = next(i for i, (x, y) in enumerate(zip(sent, received)) if x != y)
            raise ScheduleError(f"{what} rank {src} -> rank {dst} are received in another order than sent: "
                                f"send {i} is microbatch {sent[i][1]} of stage {sent[i][2]}, receive {i} "
                                f"expects microbatch {received[i][1]} of stage {received[i][2]}\n" + s.grid())


def _one_order(s: Schedule) -> bool:
    """Whether every rank enters the same instances, each once, in one order, and every group spans all ranks:
    the common case, in which _check_groups and check_collective_order pass; read from the program's arrays."""
    prog = _program(s)
    counts = np.diff(prog.entry_start)
    if prog.missing or not len(counts) or (counts != counts[0]).any():
        return False
    order = prog.entry_inst.reshape(len(counts), counts[0])
    first = order[0]
    return bool((order == first).all() and len(np.unique(first)) == len(first)) and \
        all(members(s, group) == range(s.pp) for group in {prog.instances[x].group for x in first.tolist()})


def _check_groups(s: Schedule):
    """Every rank enters each group's collectives in the same order."""
    entries = collective_entries(s)
    first = [inst for _, inst in entries[0]] if entries else []
    if all([inst for _, inst in seq] == first for seq in entries[1:]) and \
            all(members(s, inst.group) == range(s.pp) for inst in set(first)):
        return  # every rank enters the same instances in the same order, and every group spans all ranks
    groups = defaultdict(lambda: defaultdict(list))
    for r, seq in enumerate(entries):
        for _, entry in seq:
            groups[entry.group][r].append(entry)
    for group, per_rank in groups.items():
        ref = per_rank.get(members(s, group)[0], [])
        for r in members(s, group):
            seq = per_rank.get(r, [])
            if seq != ref:
                pos = next((i for i, (x, y) in enumerate(zip(seq, ref)) if x != y), min(len(seq), len(ref)))
                shown = [[c.text() for c in x[pos:pos + 3]] for x in (seq, ref)]
                raise ScheduleError(f"collective group {group}: rank {r} enters "
                                    f"{shown[0]} where rank {members(s, group)[0]} enters {shown[1]} (position {pos}); "
                                    f"all ranks must enter a group's collectives in the same order\n" + s.grid())


def collective_entries(s: Schedule) -> list[list[tuple[int, object]]]:
    """Per rank, the collective instances it enters, in order, with the step that enters each (one object per
    instance, shared by the ranks): read from the simulator's program of the schedule, which resolves them."""
    def make(s: Schedule) -> list[list[tuple[int, object]]]:
        prog = _program(s)
        if prog.missing:
            return _entries_from_rules(s)  # no instance is resolved past a missing input: from the rules
        instances, starts = prog.instances, prog.entry_start.tolist()
        steps, insts = prog.entry_step.tolist(), list(map(instances.__getitem__, prog.entry_inst.tolist()))
        return [list(zip(steps[a:b], insts[a:b])) for a, b in zip(starts, starts[1:])]
    return s.memo("collective_entries", make)


def _entries_from_rules(s: Schedule) -> list[list[tuple[int, object]]]:
    made = {}  # (group, kind, mb) -> its Collective
    out = []
    for acts, shape in zip(s.ranks, shapes(s)):
        seq = []
        for i, a in enumerate(acts):
            e = shape[(a.kind, a.chunk)].entry
            if e:
                inst = made.get((e.group, e.kind, a.mb))
                if inst is None:
                    inst = made[(e.group, e.kind, a.mb)] = replace(e, mb=a.mb)
                seq.append((i, inst))
        out.append(seq)
    return out


def crossed(entries: list[list[tuple[int, object]]]) -> list[tuple[int, tuple, tuple]] | None:
    """A cycle of the cross-group precedence graph, or None when it is acyclic.

    entries: per rank, (step, instance) in the order the rank enters them. The cycle comes back as segments
    (rank, (step, instance) entered first, (step, instance) entered later), each held by one rank's order,
    each segment's later instance being the next segment's first: two segments for two crossed ranks."""
    first = [inst for _, inst in entries[0]] if entries else []
    if len(set(first)) == len(first) and all([inst for _, inst in seq] == first for seq in entries[1:]):
        return None  # one common order, each instance once: the graph is a chain
    nodes = _cyclic(entries)
    if not nodes:
        return None
    pos = [{inst: n for n, (_, inst) in enumerate(seq)} for seq in entries]
    for a in range(len(entries)):  # two ranks in opposite orders: the common case, and the clearest message
        for b in range(a + 1, len(entries)):
            common = [(pos[a][inst], step, inst) for step, inst in entries[b] if inst in pos[a]]
            for (pa, sb, y), (pa2, sb2, x) in zip(common, common[1:]):
                if pa2 < pa:  # rank b enters y then x; rank a enters x before y
                    return [(a, entries[a][pa2], entries[a][pa]), (b, (sb, y), (sb2, x))]
    before = {}  # instance -> [(rank, the instance that rank entered just before)]
    for r, seq in enumerate(entries):
        for (_, x), (_, y) in zip(seq, seq[1:]):
            before.setdefault(y, []).append((r, x))
    cur = next(inst for seq in entries for _, inst in seq if inst in nodes)
    walked, at = [], {}  # walk back through predecessors left until one repeats
    while cur not in at:
        at[cur] = len(walked)
        r, prev = next((r, x) for r, x in before[cur] if x in nodes)
        walked.append((r, prev, cur))
        cur = prev
    segments = []  # the cycle forwards, consecutive edges of one rank merged
    for r, x, y in reversed(walked[at[cur]:]):
        if segments and segments[-1][0] == r:
            segments[-1][2] = y
        else:
            segments.append([r, x, y])
    step = [{inst: i for i, inst in seq} for seq in entries]
    return [(r, (step[r][x], x), (step[r][y], y)) for r, x, y in segments]


def _cyclic(entries: list[list[tuple[int, object]]]) -> set:
    """The instances on or behind a cycle of the precedence graph (Kahn's algorithm, linear in the entries); empty
    when it is acyclic."""
    nexts, count = {}, Counter()  # instance -> the instances some rank enters right after it; in-degree
    nodes = {inst for seq in entries for _, inst in seq}
    for seq in entries:
        for (_, x), (_, y) in zip(seq, seq[1:]):
            nexts.setdefault(x, []).append(y)
            count[y] += 1
    ready = [x for x in nodes if not count[x]]
    while ready:  # what is left afterwards lies on or behind a cycle
        x = ready.pop()
        nodes.discard(x)
        for y in nexts.get(x, []):
            count[y] -= 1
            if not count[y]:
                ready.append(y)
    return nodes


def check_collective_order(s: Schedule):
    """Raise naming the ranks, instances and steps where ranks enter collectives in orders that can deadlock."""
    cycle = crossed(collective_entries(s))
    if cycle:
        parts = [f"rank {r} enters {x.text()} (step {i}) before {y.text()} (step {j})" for r, (i, x), (j, y) in cycle]
        raise ScheduleError("collectives entered in crossed orders across groups: " + "; but ".join(parts)
                            + "; under NCCL (one ordered queue per rank) each rank would wait for the other\n"
                            + s.grid((cycle[0][0], cycle[0][1][0]), 8))
