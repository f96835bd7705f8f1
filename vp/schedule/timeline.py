"""The timeline of a schedule's stage passes alone (F, B, W; no vocabulary pass, no collective), which the vocabulary
placers time their passes by (build.stage_timeline): what the one simulator (simulate.py) gives for the lowered
schedule with the vocabulary kept local, worked out over the passes alone, compiled (kernel.jit).

That simulation is simple enough to follow without the simulator's program: a rank runs its passes in order; a
pass whose input comes from another rank (F of a stage after another rank's stage, B of a stage before one) waits
for its receive, which ends its transfer time after both the rank's previous action and the matching send (posted
when the producing pass ends; kernel.run: max(sent, ready) + p2p); any other input is an earlier pass of the rank.
So each pass starts at its rank's clock (or that receive's end) and ends its duration later: the same operations on
the same values as the simulator, so every start and end is equal to the bit (tests/test_build_timeline.py checks
it against simulate() for every method). A schedule it cannot run (a pass whose input never comes, or comes later
on its own rank) is left to the simulator, whose error names the step.
"""
from itertools import chain
from operator import itemgetter

import numpy as np

from vp.schedule.actions import Schedule
from vp.schedule.costs import Costs, unit_costs
from vp.schedule.kernel import jit, kernel

KIND = {"F": 0, "B": 1, "W": 2}  # a stage pass's code in the arrays below
_KINDS = tuple(KIND)


@kernel
def pass_spans(off, kind, mb, stage, rank_of, dur, recv_f, recv_b, p2p_f, p2p_b, n_mb):
    """(ok, starts, ends) of every pass (rank r's: off[r]..off[r + 1]) on the timeline above. kind, mb, stage per
    pass; rank_of[st]; dur[kind, st]; recv_f[st] / recv_b[st]: F / B of stage st receives its input from another rank
    (F of st - 1, B of st + 1), in p2p_f[st] / p2p_b[st] seconds. ok is False where some rank cannot go on."""
    pp = off.shape[0] - 1
    n = kind.shape[0]
    n_st = rank_of.shape[0]
    where = np.full((3, n_st, n_mb), -1, np.int64)  # (kind, stage, microbatch) -> its pass
    for g in range(n):
        if where[kind[g], stage[g], mb[g]] >= 0:  # a pass twice
            return False, np.zeros(n), np.zeros(n)
        where[kind[g], stage[g], mb[g]] = g
    done = np.zeros(n, np.bool_)
    starts, ends = np.zeros(n), np.zeros(n)
    parked = np.full(n, -1, np.int64)  # pass -> the rank waiting for it to end
    idx = off[:pp].copy()
    clock = np.zeros(pp)
    work = np.zeros(pp + 1, np.int64)
    for r in range(pp):  # popped from the end: rank 0 first
        work[r] = pp - 1 - r
    n_work = pp
    while n_work:
        n_work -= 1
        r = work[n_work]
        g, last, t = idx[r], off[r + 1], clock[r]
        while g < last:
            k, st, m = kind[g], stage[g], mb[g]
            src = -1
            if k == 0:
                if st > 0:
                    src = where[0, st - 1, m]
                    if src < 0:
                        return False, starts, ends
                    if not recv_f[st] and not done[src]:  # an input on this rank, later in its order
                        return False, starts, ends
            elif k == 1:
                own = where[0, st, m]
                if own < 0 or not done[own]:
                    return False, starts, ends
                if st < n_st - 1:
                    src = where[1, st + 1, m]
                    if src < 0:
                        return False, starts, ends
                    if not recv_b[st] and not done[src]:
                        return False, starts, ends
            else:
                own = where[1, st, m]
                if own < 0 or not done[own]:
                    return False, starts, ends
            if src >= 0 and (recv_f[st] if k == 0 else recv_b[st]):
                if not done[src]:
                    parked[src] = r
                    break
                sent = ends[src]
                t = (sent if sent > t else t) + (p2p_f[st] if k == 0 else p2p_b[st])
            starts[g] = t
            t = t + dur[k, st]
            ends[g] = t
            done[g] = True
            waiting = parked[g]
            if waiting >= 0:
                parked[g] = -1
                work[n_work] = waiting
                n_work += 1
            g += 1
        idx[r], clock[r] = g, t
    for r in range(pp):
        if idx[r] < off[r + 1]:
            return False, starts, ends
    return True, starts, ends


def stage_spans(s: Schedule, costs: Costs | None = None) -> list[tuple[list, np.ndarray, np.ndarray]] | None:
    """Per rank (its stage passes, their starts, their ends: numpy views) on the timeline above, with costs (default:
    unit_costs); None where a rank holds another kind of action or cannot run its passes (the simulator says why)."""
    costs = costs or unit_costs(s)
    pp, n_st = s.pp, s.n_stages
    flat = list(chain.from_iterable(s.ranks))
    n = len(flat)
    try:
        kind = np.fromiter(map(KIND.__getitem__, map(itemgetter(1), flat)), np.int64, n)
    except KeyError:
        return None
    mb = np.fromiter(map(itemgetter(2), flat), np.int64, n)
    chunk = np.fromiter(map(itemgetter(3), flat), np.int64, n)
    if n and (mb.min() < 0 or chunk.min() < 0 or chunk.max() >= s.chunks):  # before chunks index the stage table
        return None
    sizes = [len(acts) for acts in s.ranks]
    off = np.zeros(pp + 1, np.int64)
    np.cumsum(sizes, out=off[1:])
    table = np.array([[s.stage(r, c) for c in range(s.chunks)] for r in range(pp)], np.int64)
    stage = table[np.repeat(np.arange(pp), sizes), chunk]
    rank_of = np.array(s.stage_ranks, np.int64)
    recv_f = np.array([st > 0 and rank_of[st - 1] != rank_of[st] for st in range(n_st)], np.bool_)
    recv_b = np.array([st < n_st - 1 and rank_of[st + 1] != rank_of[st] for st in range(n_st)], np.bool_)
    p2p_f = np.array([costs.p2p(int(rank_of[st - 1]), int(rank_of[st])) if recv_f[st] else 0.0
                      for st in range(n_st)])
    p2p_b = np.array([costs.p2p(int(rank_of[st + 1]), int(rank_of[st])) if recv_b[st] else 0.0
                      for st in range(n_st)])
    dur = np.array([costs.times(k, range(n_st)) for k in _KINDS], np.float64)
    n_mb = int(mb.max()) + 1 if n else 1
    ok, starts, ends = jit(pass_spans, n)(off, kind, mb, stage, rank_of, dur, recv_f, recv_b, p2p_f, p2p_b, n_mb)
    if not ok:
        return None
    return [(acts, starts[a:b], ends[a:b]) for acts, a, b in zip(s.ranks, off.tolist(), off[1:].tolist())]
