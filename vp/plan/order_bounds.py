"""Makespan bounds from the generator's order (docs/planner.md, bounds C, C' and D), beside bounds A, B and E of
vp.plan.bounds: what each rank runs after its first B, and, where the generator places synchronous output-layer
passes (the naive algorithm's S and T barriers), the work between consecutive barriers. The order's counts are taken
once per (method, pp, microbatches, chunks) (vp.plan.bounds); a candidate's bound is then a few sums over its costs."""
import numpy as np

from vp.schedule import Costs, Schedule
from vp.schedule.methods import get_method


def first_b_counts(order: list, sk: Schedule) -> tuple:
    """From the generator's order (per rank, (kind, microbatch, chunk)), per rank (arrays over ranks): the stage of
    each chunk; the stage of its first B; per chunk the (F, B, W) counts from that B on, and from it up to its last
    B of its lowest stage (that stage); the counts of the other kinds (_OTHERS) in those two spans where the
    generator places them; how many microbatches have an F of the rank after that first B."""
    chunks = sk.chunks
    stage = [[sk.stage(r, c) for c in range(chunks)] for r in range(sk.pp)]
    counts, others, pivot, low, desc = [[], []], [[], []], [], [], []
    for r, acts in enumerate(order):
        i = next(n for n, a in enumerate(acts) if a[0] == "B")
        lowest = min(range(chunks), key=stage[r].__getitem__)
        j = next(n for n in range(len(acts) - 1, -1, -1) if acts[n][0] == "B" and acts[n][2] == lowest)  # the last
        pivot.append(stage[r][acts[i][2]])
        low.append(stage[r][lowest])
        fbw, rest = [[0, 0, 0] for _ in range(chunks)], [0] * len(_OTHERS)
        for part, span in ((1, acts[i:j + 1]), (0, acts[j + 1:])):  # from i to j, then (with it) from i on
            for kind, _, c in span:
                if kind in _FBW:
                    fbw[c][_FBW[kind]] += 1
                else:
                    rest[_OTHERS.index(kind)] += 1
            counts[part].append([list(x) for x in fbw])
            others[part].append(list(rest))
        desc.append(len({a[1] for a in acts[i:] if a[0] == "F"}))
    return (np.array(stage), np.array(pivot), np.array(low), np.array(counts, dtype=float),
            np.array(others, dtype=float), np.array(desc, dtype=float))


_OTHERS = ("S", "T", "IF", "IB", "C0")
_FBW = {"F": 0, "B": 1, "W": 2}


def _vocab_chain(s: Schedule, costs: Costs) -> float:
    """The least time from the end of the last stage's F(k) to the start of its B(k): the output layer's passes and
    collectives that B(k) waits for (none where the vocabulary is not parallel)."""
    v, comm, t = s.vocab, costs.comm.get, costs.time
    if not v.parallel:
        return 0.0
    c0 = comm("C0", 0.0) if s.pp > 1 else 0.0  # a receiver's S(k) waits for the broadcast of X(k)
    if v.synchronous:  # S(k), T(k) barriers; B(k) needs T(k) on its rank
        return max(comm("S", 0.0), c0) + t("S", None) + comm("T", 0.0) + t("T", None)
    chain = c0 + t("S", None) + comm("C1", 0.0)  # C1(k) is entered after S(k) on every rank
    if v.grad_x_from in v.after_t:  # Algorithm 1: T(k) waits for C1(k), B(k) for C2(k) entered after T(k)
        chain += t("T", None) + comm("C2", 0.0)
    return chain


def after_first_b(s: Schedule, costs: Costs, shape: tuple, fbw: np.ndarray, head: list, back: list,
                  down: list) -> float:
    """Bounds C and C' (docs/planner.md): from the earliest start of each rank's first B, what the rank runs after it,
    in the generator's order; C' up to the rank's last B of its lowest stage, then what must follow that B.
    shape: first_b_counts(); fbw[stage]: (F, B, W) seconds; down[st]: B of stages 1 .. st with their transfers."""
    t, m, last = costs.time, s.microbatches, s.n_stages - 1
    stage, pivot, low, counts, others, desc = shape
    start = head[last] + t("F", last) + _vocab_chain(s, costs) + down[last] - np.asarray(down)  # of a B of stage st
    work = (counts * fbw[stage]).sum(axis=(2, 3)) + others @ np.array([t(k, None) for k in _OTHERS])
    v = s.vocab
    if v.parallel and not get_method(s.method).family.places_vocab:  # S, T, IB placed by build()
        work[0] += desc * (t("S", None) + t("T", None)) + m * t("IB", None)
        work[1] += desc * (t("S", None) + (t("T", None) if v.grad_x_from in v.after_t else 0.0))
    begin = start[pivot]
    return float(max((begin + work[0]).max(), (begin + work[1] + np.asarray(back)[low]).max()))


_KINDS = ("F", "B", "W", "IF", "IB", "C0")  # what a rank runs between two barriers (stage passes by its own stage)
_KIND_INDEX = {kind: i for i, kind in enumerate(_KINDS)}


def barrier_counts(order: list, spec, microbatches: int) -> tuple | None:
    """Where the generator places S(k) T(k) pairs on every rank (synchronous output layer): per rank, the counts of
    each kind (_KINDS) before S(0), the same from the rank's first F on, and after T(m-1); the segments between
    T(k-1) and S(k), k >= 1, grouped by their counts on every rank: (counts[pattern, rank, kind], how many k have
    the pattern). None elsewhere."""
    if not (spec.vocab.synchronous and spec.family.places_vocab) or spec.family.chunks != 1:
        return None
    per_rank, from_f = [], []
    for acts in order:
        f = next(i for i, a in enumerate(acts) if a[0] == "F")
        counts = [0] * len(_KINDS)
        for kind, _, _ in acts[f:next(i for i, a in enumerate(acts) if a[0] == "S")]:
            counts[_KIND_INDEX[kind]] += 1
        from_f.append(counts)
        segments, cur = [], [0] * len(_KINDS)
        for i, (kind, _, _) in enumerate(acts):
            if kind == "S":
                if acts[i + 1][0] != "T":  # T(k) right after S(k): nothing of the rank between the two barriers
                    return None
                segments.append(tuple(cur))
                cur = [0] * len(_KINDS)
            elif kind != "T":
                cur[_KIND_INDEX[kind]] += 1
        segments.append(tuple(cur))
        per_rank.append(segments)
    patterns: dict = {}
    for k in range(1, microbatches):
        key = tuple(segments[k] for segments in per_rank)
        patterns[key] = patterns.get(key, 0) + 1
    return (np.array([segments[0] for segments in per_rank], dtype=float), np.array(from_f, dtype=float),
            np.array([segments[-1] for segments in per_rank], dtype=float),
            np.array(list(patterns), dtype=float), np.array(list(patterns.values()), dtype=float))


def between_barriers(s: Schedule, costs: Costs, shape: tuple | None, head: list) -> float:
    """Bound D: where every rank enters S(k) and T(k) barriers in turn, no barrier completes before every rank has
    run what its order puts before it since the previous one (0 where there are no such barriers; shape:
    barrier_counts())."""
    if shape is None:
        return 0.0
    first, from_f, last, patterns, times = shape
    t, comm = costs.time, costs.comm.get
    per = np.array([[t(k, s.stage(r, 0)) if k in "FBW" else t(k, None) for k in _KINDS] for r in range(s.pp)])
    begin = [head[s.stage(r, 0)] for r in range(s.pp)]  # no F of rank r starts earlier
    entry = max(max(a, b + c) for a, b, c in zip((first * per).sum(1), begin, (from_f * per).sum(1)))
    m, c_s = s.microbatches, comm("S", 0.0)
    barriers = m * (t("S", None) + comm("T", 0.0) + t("T", None)) + (m - 1) * c_s
    between = float(times @ (patterns * per).sum(2).max(1)) if len(times) else 0.0
    return entry + c_s + barriers + between + float((last * per).sum(1).max())
