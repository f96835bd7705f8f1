"""From a method to the schedule every rank executes: generate stage passes, place the vocabulary
passes (vocabulary parallelism), add the p2p sends and receives.

Vocabulary passes are placed in time (the paper's approach of inserting passes into an existing
schedule): the stage passes are simulated with unit costs, and each vocabulary pass goes on every rank
before the first stage pass that starts at or after its target time:
  C0(k)                at the end of the last stage's F(k) on its rank; on the other ranks, which only
                       receive, at the end of F(k-1) (entering early lets the broadcast finish early)
  S(k), C1(k)          at the end of the last stage's F(k)  (S of k right after X(k) exists)
  T(k), C2(k)          at the end of the last stage's F(k+1) (so a step holds T of k-1, then S of k);
                       where the last stage's B(k) waits for a collective after T (Algorithm 1's C2), no
                       later than that B's start
  IF(k)                at the start of the first stage's F(k-1) (one forward ahead of its consumer)
  IB(k)                at the end of the first stage's B(k)
Because every pass lands after the passes it needs and before those that need it, in one consistent
timeline, the result cannot deadlock; validate() checks it anyway.
"""
from dataclasses import replace

from vp.schedule.actions import Action, Schedule
from vp.schedule.methods import VOCAB, chunks_for, get_method
from vp.schedule.simulate import simulate

ORDER = {"C0": 0, "S": 1, "T": 2, "IF": 3, "IB": 4}  # among passes of one microbatch at one spot


def lower(s: Schedule) -> Schedule:
    """Add SF/SB right after the pass that produces what they send and RF/RB right before their consumer."""
    out = []
    last = s.n_stages - 1
    for r, acts in enumerate(s.ranks):
        seq = []
        for a in acts:
            st = s.stage(r, a.chunk) if a.kind in ("F", "B") else None
            if a.kind == "F" and st > 0 and s.where(st - 1)[0] != r:
                seq.append(Action(r, "RF", a.mb, a.chunk))
            if a.kind == "B" and st < last and s.where(st + 1)[0] != r:
                seq.append(Action(r, "RB", a.mb, a.chunk))
            seq.append(a)
            if a.kind == "F" and st < last and s.where(st + 1)[0] != r:
                seq.append(Action(r, "SF", a.mb, a.chunk))
            if a.kind == "B" and st > 0 and s.where(st - 1)[0] != r:
                seq.append(Action(r, "SB", a.mb, a.chunk))
        out.append(seq)
    return replace(s, ranks=out)


def insert_vocab_passes(s: Schedule) -> Schedule:
    """Place S/T/IF/IB and C0/C1/C2 into a schedule of stage passes (see the module docstring)."""
    base = simulate(lower(replace(s, vocab=VOCAB["local"])))
    times = {(a.rank, a.kind, a.mb, a.chunk): (t0, t1) for tl in base.timeline for a, t0, t1 in tl}
    last_rank, last_chunk = s.where(s.n_stages - 1)
    first_rank, first_chunk = s.where(0)
    m = s.microbatches
    x_ready = [times[(last_rank, "F", k, last_chunk)][1] for k in range(m)]
    f0_start = [times[(first_rank, "F", k, first_chunk)][0] for k in range(m)]
    b0_end = [times[(first_rank, "B", k, first_chunk)][1] for k in range(m)]
    b_last = [times[(last_rank, "B", k, last_chunk)][0] for k in range(m)]
    step = (x_ready[-1] - x_ready[-2]) if m > 1 else 1.0

    t_feeds_b = s.vocab.grad_x_from in s.vocab.after_t  # Algorithm 1: B(k) of the last stage waits for C2(k)

    def t_target(k):  # T of k goes where S of k+1 goes; never after a B(k) that waits for it
        t = x_ready[k + 1] if k + 1 < m else x_ready[k] + step
        return min(t, b_last[k]) if t_feeds_b else t

    out = []
    for r, acts in enumerate(s.ranks):
        inserts = []  # (target time, microbatch, order, actions)
        for k in range(m):
            # the root broadcasts X(k) once it exists; receivers enter early (their S waits for the data)
            c0_at = x_ready[k] if r == last_rank else (x_ready[k - 1] if k else -1.0)
            inserts.append((c0_at, k, ORDER["C0"], [("C0", k)]))
            inserts.append((x_ready[k], k, ORDER["S"], [("S", k)] + [(c, k) for c in s.vocab.after_s]))
            inserts.append((t_target(k), k, ORDER["T"], [("T", k)] + [(c, k) for c in s.vocab.after_t]))
            inserts.append((f0_start[k - 1] if k else -1.0, k, ORDER["IF"], [("IF", k)]))
            inserts.append((b0_end[k], k, ORDER["IB"], [("IB", k)]))
        inserts.sort(key=lambda x: x[:3])
        starts = [times[(r, a.kind, a.mb, a.chunk)][0] for a in acts]
        seq, j = [], 0
        for i, a in enumerate(acts):
            while j < len(inserts) and inserts[j][0] <= starts[i]:
                seq += [Action(r, kind, k) for kind, k in inserts[j][3]]
                j += 1
            seq.append(a)
        for _, _, _, group in inserts[j:]:
            seq += [Action(r, kind, k) for kind, k in group]
        out.append(seq)
    return replace(s, ranks=out)


def build(method: str, pp: int, microbatches: int, chunks: int | None = None) -> Schedule:
    """The lowered schedule of a method (the object the validator, simulator and runtime all take)."""
    spec = get_method(method)
    n_chunks = chunks_for(spec, chunks)
    order = spec.family.generate(pp, microbatches, n_chunks, spec.vocab)
    ranks = [[Action(r, *a) for a in acts] for r, acts in enumerate(order)]
    s = Schedule(method, pp, microbatches, n_chunks, spec.placement, spec.vocab, spec.split_w, ranks)
    if spec.vocab.parallel and not spec.family.places_vocab:
        s = insert_vocab_passes(s)
    return lower(s)
