"""Where V-Half puts the vocabulary passes: by time, as the official implementation of the paper's V-Half runs does
(zero-bubble-pipeline-parallelism, branch v-half-vocab: scheduler/passes.py, add_embedding_passes;
scheduler/communication.py, add_vocab_communication_nodes and reorder_communication).

The stage passes are timed with the official unit costs (runtime.py's V schedule: every F, B and W of a stage 1000,
a transfer between ranks 1; passes.py add_time). On that timeline, with s(k) the end of the last stage's F(k) plus
one B (the room the broadcast of its output gets), and w = p/2 + 1:

  C0(k), S(k)  at s(k): the broadcast of X(k), then S on every rank
  C1(k)        at s(k) + 1
  T(k)         at s(k+1), before S(k+1) (its loss gradient rides on the broadcast of X(k+1)); the last one a
               backward and two passes later (s(m-1) + 2 B + 2 F)
  C2(k)        at T's time + 1 (Algorithm 1)
  IF(k)        the first w before everything, in order; IF(k) of k >= w at s(k - w)
  IB(k)        at s(k + w + 2); the last w + 2 after everything, in order

Every rank sorts its passes by time (the same times on every rank: one order of collectives for all); at equal
times collectives come first, by microbatch (C0, C1, IB; every C2 after all others), then stage passes, then IF,
T and S. IF enters its all-reduce at its end, as the official runtime launches IF's reduction right after IF. IB
enters its broadcast at its start (this project's rules), so it goes where the official broadcast goes, ahead of
a stage pass at the same time, with its computation (which the official runtime runs after that pass).
"""
from __future__ import annotations

from dataclasses import replace
from typing import Callable

import numpy as np

from vp.schedule.actions import Action, Schedule
from vp.schedule.costs import Costs

UNIT, HOP = 1000.0, 1.0  # the official unit cost of a stage pass and of a transfer between ranks


def official_costs(s: Schedule) -> Costs:
    """The official generator's timing costs: F, B and W of every stage take UNIT, a transfer HOP."""
    compute = {(k, st): UNIT for k in ("F", "B", "W") for st in range(s.n_stages)}
    return Costs(compute, {"P2P": HOP})


def vocab_times(s: Schedule, times: dict, end: float | None = None) -> dict[tuple[str, int], float]:
    """(kind, microbatch) -> the official time of each vocabulary pass and collective (see the module), from the
    stage passes' start and end times on the official unit timeline (times[(rank, kind, mb, chunk)]: of the first
    and the last stage's ranks at least) and the timeline's end (default: the last end in times).

    Where the official times would deadlock (an odd pipeline, few microbatches: the official runs had neither), a
    pass moves as little as it must: IF(k) to just before the first stage's F(k), which waits for its reduction;
    IB(k) to just after the first stage's B(k), whose gradient it broadcasts; S(k), C1(k), T(k), C2(k) to just
    before the last stage's B(k), which waits for grad X from them."""
    v, m, w = s.vocab, s.microbatches, s.pp // 2 + 1
    r, c = s.last_rank, s.last_chunk
    st = [times[(r, "F", k, c)][1] + UNIT for k in range(m)]
    tt = st[1:] + [st[-1] + 4 * UNIT]
    end = max(t1 for _, t1 in times.values()) if end is None else end
    out = {}
    r0, c0 = s.first_rank, s.first_chunk
    for k in range(m):
        out[("IF", k)] = min(st[k - w] if k >= w else k - m, times[(r0, "F", k, c0)][0] - HOP)
        out[("IB", k)] = max(st[k + w + 2] if k + w + 2 < m else end + k, times[(r0, "B", k, c0)][0] + HOP)
        b = times[(r, "B", k, c)][0]  # the last stage's B(k), which waits for v.grad_x_from
        t_k = min(tt[k], b - HOP) if v.grad_x_from in v.after_t else tt[k]
        s_k = min(st[k], t_k - HOP, b - HOP)
        out[("C0", k)] = out[("S", k)] = s_k
        out[("T", k)] = t_k
        for c1 in v.after_s:
            out[(c1, k)] = s_k + HOP
        for c2 in v.after_t:
            out[(c2, k)] = t_k + HOP
    return out


_COLLECTIVE_ORDER = {"C0": 1, "C1": 2, "IB": 4}  # comm ids per microbatch (official: T's broadcast 0, IF's 3)
_COMPUTE_ORDER = {"IF": 1, "T": 2, "S": 3}  # appended after the stage passes, in this order


def _key(kind: str, k: int, t: float, m: int) -> tuple:
    """Sort key of a vocabulary action at time t: collectives first (by their official comm id), then stage passes
    (0), then IF, T, S."""
    if kind in _COLLECTIVE_ORDER:
        return (t, 0, k * 5 + _COLLECTIVE_ORDER[kind])
    if kind == "C2":  # REDUCE_OUTPUT_EMBD_T: its ids follow every other vocabulary collective
        return (t, 0, 5 * m + k)
    return (t, 1, _COMPUTE_ORDER[kind], k)


def place_vocab_passes(s: Schedule, stage_timeline: Callable) -> Schedule:
    """Each rank's stage passes and vocabulary passes (S T IF IB C0 C1 C2), merged by their official times;
    stage_timeline(s, costs) times the stage passes (build.stage_timeline: per rank its stage passes, their starts
    and ends). A rank's stage passes start in its order and the vocabulary passes are sorted, so each
    of the latter goes before the first stage pass that starts at its time or later (a collective: it sorts first
    at equal times) or after every one that starts at its time or earlier (IF, T, S): one binary search each."""
    m = s.microbatches
    spans = stage_timeline(s, official_costs(s))
    times = {}  # the first and the last stage's ranks: all vocab_times reads of them
    for r in {s.first_rank, s.last_rank}:
        acts, starts, ends = spans[r]
        times.update(zip(acts, zip(starts.tolist(), ends.tolist())))  # an Action is its tuple
    at = vocab_times(s, times, max(float(ends.max()) for _, _, ends in spans if len(ends)))
    vocab = sorted(_key(kind, k, t, m) + (kind, k) for (kind, k), t in at.items())
    when = np.array([key[0] for key in vocab])
    first = np.array([key[1] == 0 for key in vocab])  # collectives: before the stage passes at their time
    ranks = []
    for r, (acts, (_, on_timeline, _)) in enumerate(zip(s.ranks, spans)):
        starts = on_timeline  # of acts, in order
        pos = np.where(first, np.searchsorted(starts, when, "left"), np.searchsorted(starts, when, "right"))
        cuts = pos.tolist() + [len(acts)]
        seq = acts[:cuts[0]]
        for key, lo, hi in zip(vocab, cuts, cuts[1:]):
            seq.append(Action(r, key[-2], key[-1]))
            seq += acts[lo:hi]
        ranks.append(seq)
    return replace(s, ranks=ranks)
