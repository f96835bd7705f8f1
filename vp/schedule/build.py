"""From a method to the schedule every rank executes: generate stage passes, place the vocabulary
passes (vocabulary parallelism), add the p2p sends and receives.

Vocabulary passes are placed in time (the paper's approach of inserting passes into an existing
schedule): the stage passes are simulated with unit costs, and the vocabulary passes are grouped into units,
each with a target time on that timeline:
  C0(k)                the end of the last stage's F(k): its rank broadcasts X(k) right away; the other ranks,
                       which only receive, enter it as early as the collective order lets them, but after their
                       own F(k) (a tensor-parallel F communicates: on one queue it must not wait behind C0(k))
  S(k) + C1(k)         the end of the last stage's F(k); the receiving ranks one stage pass later, so that the
                       broadcast C0(k) runs under that pass (the official 1F1B placement)
  T(k) + C2(k)         where S(k+1) goes (a step holds T of k-1, then S of k); where the last stage's B(k) waits
                       for a collective after T (Algorithm 1's C2), no later than the pass before that B
  IF(k)                the start of the first stage's F(k-1) (one forward ahead of its consumer)
  IB(k)                the end of the first stage's B(k)
Microbatch 0's units, which open every collective group, go at their targets on every rank (no early C0, no
delayed S), so that a lazily created communicator never blocks a rank before work the others wait for.
The units, sorted by target time, are the one order in which every rank enters the collectives (the
cross-group order that validate() checks: under NCCL two ranks entering two collectives in opposite orders can
deadlock). Each rank puts a unit before the first of its stage passes that starts at or after the target (plus
the receivers' one-pass delay), but never before the unit that precedes it in that order.
A family with a vocab_placer places them its own way instead (V-Half: vp/schedule/vhalf_vocab.py).
"""
from itertools import accumulate, repeat
from operator import itemgetter
from dataclasses import replace
from typing import NamedTuple

import numpy as np

from vp.schedule.actions import KINDS, P2P, Action, Schedule
from vp.schedule.methods import VOCAB, chunks_for, get_method
from vp.schedule.costs import Costs
from vp.schedule.simulate import collector_paused, simulate
from vp.schedule.timeline import stage_spans

RECEIVES = ("RF", "RB")
_RECEIVES = frozenset(RECEIVES)
_PASSES = frozenset(KINDS) - frozenset(P2P)


def lower(s: Schedule) -> Schedule:
    """Add SF/SB right after the pass that produces what they send and RF/RB right before their consumer."""
    out = []
    last = s.n_stages - 1

    def around(r: int, kind: str, chunk: int) -> tuple[str | None, str | None]:
        """The receive before and the send after a pass of (kind, chunk) on rank r, where its neighbour stage is
        on another rank."""
        if kind not in ("F", "B"):
            return None, None
        st = s.stage(r, chunk)
        prev = st > 0 and s.where(st - 1)[0] != r
        nxt = st < last and s.where(st + 1)[0] != r
        if kind == "F":
            return ("RF" if prev else None), ("SF" if nxt else None)
        return ("RB" if nxt else None), ("SB" if prev else None)

    new = tuple.__new__  # Action(...) without its signature's call
    for r, acts in enumerate(s.ranks):
        seq, known = [], {}
        append = seq.append
        for a in acts:
            _, kind, mb, chunk = a
            got = known.get((kind, chunk))
            if got is None:
                got = known[(kind, chunk)] = around(r, kind, chunk)
            before, after = got
            if before:
                append(new(Action, (r, before, mb, chunk)))
            append(a)
            if after:
                append(new(Action, (r, after, mb, chunk)))
        out.append(seq)
    return replace(s, ranks=out)


class _Unit(NamedTuple):
    """Vocabulary passes that go together; `key` sorts the units into the one collective order."""
    key: tuple
    actions: tuple  # ((kind, mb), ...)
    root: int | None  # the rank that places it at its target time (key[0]); the others are receivers
    receivers: float | None  # when receivers place it: this long after the target, or None: as early as allowed


def _units(s: Schedule, times) -> list[_Unit]:
    """The vocabulary units of every microbatch in the order every rank enters their collectives (times(r): the
    (start, end) of each stage pass of rank r on the unit-cost timeline, by (kind, microbatch, chunk))."""
    v, m = s.vocab, s.microbatches
    last, first = (s.last_rank, s.last_chunk), (s.first_rank, s.first_chunk)
    at_last, at_first = times(last[0]), times(first[0])
    x_ready = [at_last[("F", k, last[1])][1] for k in range(m)]
    f0_start = [at_first[("F", k, first[1])][0] for k in range(m)]
    b0_end = [at_first[("B", k, first[1])][1] for k in range(m)]
    step = (x_ready[-1] - x_ready[-2]) if m > 1 else 1.0
    later = 1.0 / s.chunks  # one stage pass: a chunk's F at unit cost
    before_b = _start_of_pass_before(s, at_last, last)  # microbatch -> start of the pass before the last stage's B
    t_feeds_b = v.grad_x_from in v.after_t  # Algorithm 1: B(k) of the last stage waits for C2(k)
    t_at = [x_ready[k + 1] if k + 1 < m else x_ready[k] + step for k in range(m)]
    if t_feeds_b:
        t_at = [min(t, before_b[k]) for k, t in enumerate(t_at)]
    b_last = [at_last[("B", k, last[1])][0] for k in range(m)]

    def delay(at, needed_at):  # one pass later on receivers, if that still leaves a pass before it is needed
        return max(0.0, min(later, needed_at - later - at))

    s_needed = [min(t_at[k], b_last[k]) if v.grad_x_in_s else t_at[k] for k in range(m)]
    # microbatch 0 opens every group: all ranks meet it at its target, so that a communicator created lazily on
    # its first collective blocks no rank longer than the timeline does
    s_delay = [delay(x_ready[k], s_needed[k]) if k else 0.0 for k in range(m)]
    units = []
    for k in range(m):
        units.append(_Unit((x_ready[k], 0, k), (("C0", k),), s.last_rank, None if k else 0.0))
        units.append(_Unit((x_ready[k], 3, k), (("S", k),) + tuple((c, k) for c in v.after_s), s.last_rank,
                           s_delay[k]))
        # T(k) sorts before S(k+1) at the same time, but after S(k) where the bound above pulls it that early
        t_key = (t_at[k], 2, k) if t_at[k] > x_ready[k] else (x_ready[k], 4, k)
        t_delay = delay(t_at[k], b_last[k]) if t_feeds_b else (s_delay[k + 1] if k + 1 < m else later)
        t_delay = t_delay if k else 0.0
        units.append(_Unit(t_key, (("T", k),) + tuple((c, k) for c in v.after_t), s.last_rank, t_delay))
        units.append(_Unit((f0_start[k - 1] if k else -1.0, 5, k), (("IF", k),), None, 0.0))
        units.append(_Unit((b0_end[k], 1, k), (("IB", k),), s.first_rank, 0.0))
    return sorted(units)


def _start_of_pass_before(s: Schedule, at: dict, where: tuple[int, int]) -> dict[int, float]:
    """For each microbatch k, the start of the stage pass that precedes B(k) of the stage at (rank, chunk)."""
    r, chunk = where
    acts = s.ranks[r]
    out = {}
    for i, a in enumerate(acts):
        if a.kind == "B" and a.chunk == chunk and i:
            prev = acts[i - 1]
            out[a.mb] = at[(prev.kind, prev.mb, prev.chunk)][0]
    return out


def _after_inputs(s: Schedule, r: int, acts: list[Action]) -> dict[int, int]:
    """Per microbatch k, the earliest position on rank r of a unit with C0(k): after the rank's own passes that
    the unit's root needs before it can enter (the rank's F(k) of every stage before the last). Entered any
    earlier, the collective would sit on the rank's queue ahead of a pass that communicates (a tensor-parallel
    stage's all-reduces), which the root waits for: a deadlock on one queue."""
    inner = {c for c in range(s.chunks) if s.stage(r, c) < s.n_stages - 1}
    return dict([(a[2], i + 1) for i, a in enumerate(acts) if a[1] == "F" and a[3] in inner])  # the last F(k)


def stage_timeline(s: Schedule, costs: Costs | None = None) -> list[tuple[list, np.ndarray, np.ndarray]]:
    """Per rank, its stage passes (s.ranks[r]) with their starts and ends (numpy arrays) in the simulation of s
    lowered with its vocabulary kept local (unit_costs unless costs are given): what both vocabulary placers time
    their passes by. From vp.schedule.timeline, equal to the simulator's to the bit; where that cannot run the
    passes, from the simulator itself (which raises why)."""
    spans = stage_spans(s, costs)
    if spans is None:
        low = lower(replace(s, vocab=VOCAB["local"]))
        spans = []
        for acts, lowered, (_, starts, ends) in zip(s.ranks, low.ranks, simulate(low, costs).rank_spans()):
            at = [i for i, a in enumerate(lowered) if a[1] not in P2P]
            spans.append((acts, starts[at], ends[at]))
    return spans


def insert_vocab_passes(s: Schedule) -> Schedule:
    """Place S/T/IF/IB and C0/C1/C2 into a schedule of stage passes (see the module docstring); lowered.

    The vocabulary passes send and receive nothing, so they go straight into the lowered stage passes (whose
    timeline places them): a unit placed before stage pass i goes before i's receive, as lower() would put it.
    Each rank's position of a unit is the running maximum of its bound (a binary search of the rank's starts, the
    C0 bound), taken in bulk over arrays; the ranks differ only in which units they are the root of."""
    low, spans = lower(replace(s, vocab=VOCAB["local"])), stage_timeline(s)
    held: dict = {}

    def times(r: int) -> dict:  # (kind, mb, chunk) -> (start, end) of rank r's actions on the timeline
        if r not in held:
            acts, starts, ends = spans[r]
            held[r] = {(a.kind, a.mb, a.chunk): (t0, t1) for a, t0, t1 in zip(acts, starts.tolist(), ends.tolist())}
        return held[r]

    units = _units(s, times)
    vocab_kinds = [kind for u in units for kind, _ in u.actions]  # every unit's passes, in the collective order
    vocab_mbs = [k for u in units for _, k in u.actions]
    ends = [0] + list(accumulate(len(u.actions) for u in units))  # unit i's passes are [ends[i]:ends[i + 1]]
    c0 = [(i, k) for i, u in enumerate(units) for kind, k in u.actions if kind == "C0"]
    c0_at, c0_mb = np.array([i for i, _ in c0], np.int64), [k for _, k in c0]
    never = float("-inf")  # searchsorted(starts, never) == 0: no bound (a receiver placing C0 as early as allowed)
    targets = {}  # (is the last rank, is the first rank) -> each unit's target time on such a rank
    new = tuple.__new__  # Action(...) without its signature's call
    out = []
    for r, (acts, lowered, (_, on_timeline, _)) in enumerate(zip(s.ranks, low.ranks, spans)):
        role = (r == s.last_rank, r == s.first_rank)
        want = targets.get(role)
        if want is None:
            want = targets[role] = np.array([u.key[0] if r == u.root else never if u.receivers is None
                                             else u.key[0] + u.receivers for u in units])
        kinds = list(map(itemgetter(1), lowered))
        at = np.flatnonzero(np.fromiter(map(_PASSES.__contains__, kinds), bool, len(kinds)))  # the stage passes
        received = np.append(np.fromiter(map(_RECEIVES.__contains__, kinds), bool, len(kinds)), False)  # [-1]: none
        group = np.append(at - received[at - 1], len(lowered))  # where each stage pass begins (with its receive)
        pos = np.searchsorted(on_timeline, want)  # the first stage pass starting at or after each target
        after = _after_inputs(s, r, acts)
        if len(c0_at):
            pos[c0_at] = np.maximum(pos[c0_at], [after.get(k, 0) for k in c0_mb])
        pos = np.maximum.accumulate(pos)  # never before the previous unit: one collective order on every rank
        vocab = list(map(new, repeat(Action), zip(repeat(r), vocab_kinds, vocab_mbs, repeat(0))))
        moves = np.flatnonzero(pos[1:] != pos[:-1]) + 1  # the units where the position moves on
        cuts = group[pos[np.append(0, moves)]].tolist() + [len(lowered)]  # lowered[:cuts[0]], then per move
        firsts = [0] + [ends[i] for i in moves.tolist()] + [len(vocab)]  # its units' passes, the stage passes after
        seq = lowered[:cuts[0]]
        for j in range(len(cuts) - 1):
            seq += vocab[firsts[j]:firsts[j + 1]]
            seq += lowered[cuts[j]:cuts[j + 1]]
        out.append(seq)
    return replace(s, ranks=out)


def _generated(method: str, pp: int, microbatches: int, chunks: int | None) -> tuple:
    """(the method's row, the schedule of the passes its generator orders, not lowered)."""
    spec = get_method(method)
    n_chunks = chunks_for(spec, chunks)
    order = spec.family.generate(pp, microbatches, n_chunks, spec.vocab)
    ranks = [list(map(tuple.__new__, repeat(Action), map((r,).__add__, acts))) for r, acts in enumerate(order)]
    return spec, Schedule(method, pp, microbatches, n_chunks, spec.placement, spec.vocab, spec.split_w, ranks)


@collector_paused
def build(method: str, pp: int, microbatches: int, chunks: int | None = None) -> Schedule:
    """The lowered schedule of a method (the object the validator, simulator and runtime all take)."""
    spec, s = _generated(method, pp, microbatches, chunks)
    if spec.vocab.parallel and not spec.family.places_vocab:
        place = spec.family.vocab_placer
        if place is None:
            return insert_vocab_passes(s)  # lowered already
        s = place(s, stage_timeline)
    return lower(s)


def vocab_kinds(v) -> tuple[str, ...]:
    """The vocabulary passes and collectives both placers put on every rank for each microbatch (build()'s units,
    V-Half's official times): C0, S and the collectives after it, T and those after it, IF, IB."""
    return ("C0", "S", *v.after_s, "T", *v.after_t, "IF", "IB")


@collector_paused
def build_unplaced(method: str, pp: int, microbatches: int, chunks: int | None = None) -> Schedule:
    """build()'s actions, lowered, but where build() times the places of the vocabulary passes they go at the end of
    each rank instead: every rank runs the same (kind, microbatch, chunk)s as in build(), in another order (tests/
    test_build_timeline.py checks it for every method). For what reads only which actions a rank runs (the
    communicators it holds: vp.plan.memo.StageCommunicators), without the timing; not a schedule to run."""
    spec, s = _generated(method, pp, microbatches, chunks)
    if spec.vocab.parallel and not spec.family.places_vocab:
        kinds, m = vocab_kinds(spec.vocab), s.microbatches
        s = replace(s, ranks=[acts + [Action(r, kind, k, 0) for k in range(m) for kind in kinds]
                              for r, acts in enumerate(s.ranks)])
    return lower(s)
