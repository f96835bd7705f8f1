"""Safe bounds that let the planner skip simulating (or building) a candidate: a lower bound on the simulated
makespan, and lower and upper bounds on each pipeline rank's peak of held activations. docs/planner.md proves
them; tests/test_plan.py checks them against the simulator on every method.

Makespan. The simulator runs each rank's actions one at a time, in order (vp.schedule.simulate). Every F of stage
st of microbatch k needs F of stage st-1 of k (plus the transfer when the stages sit on two ranks), and F of stage
0 waits for the IF all-reduce of k where the vocabulary is parallel; so nothing on rank r but its IF passes can
start before H_r = [IF + its collective] + sum over stages s < r' of (F_s + transfer s -> s+1), r' the lowest
stage on r. A receive holds its rank for its transfer, and every receive of r but its first F's comes after that F;
on a rank but IB's root, IB(k) starts no earlier than the rank's own entry plus IB's collective. Hence
makespan >= H_r + (all of r's compute but IF) + (its receives but one) [+ m IB collectives]   (bound A).
B of stage r' of microbatch k is followed by B of stages r'-1 .. 0 of k (each after its successor's gradient
arrives), then W of stage 0 where W is split; the last B of stage r' on rank r comes after every F and B of rank r
(each is an ancestor of a B of stage r' on the same rank) and after every S of r (the last stage's B(k) waits for
a collective every rank enters after its S(k)), and after every T where that collective follows T (Algorithm 1).
Hence makespan >= H_r + (F, B, S [, T] of r) + (its receives but one, each before an F or a B of r)
+ sum over s < r' of (B_s + transfer s+1 -> s) [+ W_0]   (bound B).
Bounds C and C' start at each rank's first B instead: after the chain it needs (F of every stage, the output
layer's passes and collectives the last stage's B waits for, B back down to the rank's stage), the rank runs every
action after it in the generator's order (C), or those up to its last B of its lowest stage, then the B chain to
stage 0 (C'); of S, T and IB placed by build() only those shown to follow (or, for C', to precede) count.
Bound E: where build() places Algorithm 1's or 2's S(k), C1(k), ..., T(k), ..., S(k+1) on every rank, microbatches
pass the output layer no faster than one per S + C1's collective + T (_output_cycle).
The bound is max over ranks of them all; costs and the generator's order only: no schedule is built.

Activations. Each rank's held activations follow the order of its actions alone (F and S add, W and T free, B frees
its part of F's, a negative part where it recomputes what a split W needs: the simulator's rule), not their timing;
the peak is read at every point where the holding may grow (_held_points). The order of F, B and W is the
generator's (building inserts the vocabulary passes and the transfers between them, which hold nothing), so the F
part is exact without building; where build() inserts S and T (vocabulary-parallel methods other than interlaced),
they alternate S(k) T(k) S(k+1) on every rank (the units are placed in one sorted order in which T(k) precedes
S(k+1)), so at most one S is held: the F part <= peak <= the F part + one S.
"""
from functools import lru_cache
from typing import NamedTuple

import numpy as np

from vp.config import RunConfig
from vp.cost.costs import dp_slowdown, exposed_tail_per_rank, tail_parts
from vp.cost.data_parallel import exposed_reduce_per_rank, reduce_buckets, unhidden_reduce
from vp.cost.profiles import Hardware
from vp.schedule import Costs, Schedule
from vp.schedule.actions import stage_of, stage_ranks
from vp.schedule.methods import METHODS, get_method
from vp.disk_cache import DiskCache
from vp.plan.order_bounds import after_first_b, barrier_counts, between_barriers, first_b_counts


def makespan_lower_bound(s: Schedule, costs: Costs, order: bool = True) -> float:
    """A lower bound on simulate(s, costs).makespan from the costs and the schedule's shape (s.ranks unused).
    order=False: bounds A, B and E alone (sums of the costs; the generator's order unread), the cheaper and looser bound
    the search first orders candidates by."""
    pp, m, v = s.pp, s.microbatches, s.vocab
    stages = s.n_stages
    rank_of, own_of, crossing = _geometry(s.placement, pp, s.chunks)
    p2p = costs.p2p if costs.comm else None  # no communication (the search's first costs): no transfer
    f, b = costs.times("F", range(stages)), costs.times("B", range(stages))
    w_ = costs.times("W", range(stages)) if s.split_w else [0.0] * stages
    head = [0.0] * stages  # earliest start of any F of stage st
    back = [0.0] * stages  # what must follow the end of a B of stage st
    down = [0.0] * stages  # B of stages 1 .. st, each with its transfer to the stage below
    head[0] = costs.time("IF", None) + costs.comm.get("IF", 0.0) if v.parallel else 0.0
    back[0] = w_[0]
    into = [0.0] * (stages + 1)  # into[st]: the transfer stage st's F receives; out[st]: the one B of st - 1 does
    out = [0.0] * (stages + 1)
    for st in range(1, stages):
        if p2p is not None and crossing[st]:  # stages st - 1 and st on two ranks: a transfer each way
            up, dn = p2p(rank_of[st - 1], rank_of[st]), p2p(rank_of[st], rank_of[st - 1])
            into[st], out[st] = up, dn
        else:
            up = dn = 0.0
        head[st] = head[st - 1] + f[st - 1] + up
        back[st] = back[st - 1] + b[st - 1] + dn
        down[st] = down[st - 1] + b[st] + dn
    vocab = {k: m * costs.time(k, None) for k in ("S", "T", "IF", "IB")} if v.parallel else {}
    others = sum(t for k, t in vocab.items() if k != "IF")
    waits = m * costs.comm.get("IB", 0.0) if v.parallel else 0.0  # a rank but IB's root: IB(k) after its entry
    s_, t_ = vocab.get("S", 0.0), (vocab["T"] if v.grad_x_from in v.after_t else None)
    best, first = 0.0, rank_of[0]
    for r, own in enumerate(own_of):
        if len(own) == 1:  # one chunk: the sums below of one term
            low = st = own[0]
            fb, w = m * (f[st] + b[st]), m * w_[st]
            recv = m * (into[st] + out[st + 1]) - into[low]
        else:
            low = min(own)
            fb = m * sum(f[st] + b[st] for st in own)
            w = m * sum(w_[st] for st in own)
            # its receives, each its transfer long on the rank, but the first F's (in head[low])
            recv = m * sum(into[st] + out[st + 1] for st in own) - into[low]
        a = head[low] + fb + w + others + recv + (waits if r != first else 0.0)
        b_ = head[low] + fb + s_ + back[low] + recv
        if t_ is not None:
            b_ += t_
        best = max(best, a, b_)
    if v.parallel and not v.synchronous and not get_method(s.method).family.places_vocab:
        best = max(best, _output_cycle(s, costs, b, back))
    if not order:
        return float(best)
    _, _, after, barriers = _generated(s.method, pp, m, s.chunks)
    fbw = np.array([f, b, w_]).T
    return float(max(best, after_first_b(s, costs, after, fbw, head, back, down),
                     between_barriers(s, costs, barriers, head)))


def _output_cycle(s: Schedule, costs: Costs, b: list[float], back: list[float]) -> float:
    """Bound E, of the output layer's passes placed by build() (S(k), its collectives, ..., T(k), ..., S(k+1) on every
    rank, in that order): T(k) waits for the all-reduces after S(k) (C1), which complete no earlier than the rank's
    own entry after S(k) plus their communication, and S(k+1) follows T(k); so on any rank S(k+1) starts at least a
    period P = S + C1 + T after S(k), and T(m-1) ends no earlier than m P. The last stage's B(m-1) waits for the
    collective that hands it grad X (after S(m-1) or after T(m-1)), then the B chain runs down to stage 0 (back)."""
    v, m, comm = s.vocab, s.microbatches, costs.comm
    s_, t_ = costs.time("S", None), costs.time("T", None)
    period = s_ + max((comm.get(c, 0.0) for c in v.after_s), default=0.0) + t_
    grad_x = comm.get(v.grad_x_from, 0.0) + ((m - 1) * period + s_ if v.grad_x_in_s else m * period)
    last = s.n_stages - 1
    return max(m * period, grad_x + b[last] + back[last])


@lru_cache(maxsize=1024)
def _geometry(placement: str, pp: int, chunks: int) -> tuple:
    """Of a pipeline's placement: the rank of each stage, each rank's stages (by chunk), and whether each stage sits
    on another rank than the stage before it."""
    stages, rank_of = pp * chunks, stage_ranks(placement, pp, chunks)
    own = tuple(tuple(stage_of(placement, pp, r, c) for c in range(chunks)) for r in range(pp))
    return rank_of, own, tuple(st > 0 and rank_of[st] != rank_of[st - 1] for st in range(stages))


def _held_points(order: list, split_w: bool, chunks: int) -> np.ndarray:
    """The distinct vectors of held counts (per chunk before its B, per chunk between B and W, then S) at each
    point where a rank's holding may grow, as the rows of one array: a rank's peak for given bytes per count is one
    matrix-vector product (_peak). F and S add; B releases its part of what F holds (Costs.mem("B")), which is
    negative where B recomputes what W needs, so where W is split the holding after B is a point too; W and T only
    release."""
    held = [0] * (2 * chunks + 1)
    points = set()
    for kind, _, c in order:
        if kind == "F":
            held[c] += 1
        elif kind == "S":
            held[-1] += 1
        elif kind == "B":
            held[c] -= 1
            if not split_w:
                continue
            held[chunks + c] += 1
        elif kind == "W":
            held[chunks + c] -= 1
            continue
        elif kind == "T":
            held[-1] -= 1
            continue
        else:
            continue
        points.add(tuple(held))
    return np.array(sorted(points), dtype=float).reshape(-1, len(held))


def _generated(method: str, pp: int, microbatches: int, chunks: int) -> tuple:
    """What the search reads of the generator's order, generated once per shape: per rank its held-count vectors;
    its last action's (kind, chunk) where the built schedule ends with it (None where build() places vocabulary
    passes, which may follow it; lowering adds no action after a rank's last pass but its send, which ends with
    it); the counts of bounds C, C' and D (vp.plan.order_bounds). Methods of one family and vocabulary algorithm
    (baseline and redis: layers moved between stages change no order) share them."""
    spec = get_method(method)
    return _generated_order(spec.family.name, spec.vocab.name, pp, microbatches, chunks)


@lru_cache(maxsize=4096)
def _generated_order(family: str, vocab: str, pp: int, microbatches: int, chunks: int) -> tuple:
    """_generated, from all it reads of the method: its family and vocabulary algorithm; kept on disk between
    processes (vp.disk_cache: what the code alone makes, read back only by the same code)."""
    key = (family, vocab, pp, microbatches, chunks)
    got = ORDERS.get(key)
    if got is None:
        got = _from_order(*key)
        ORDERS.put(key, got)
    return got


ORDERS = DiskCache("orders")


def _from_order(family: str, vocab: str, pp: int, microbatches: int, chunks: int) -> tuple:
    spec = next(m for m in METHODS.values() if m.family.name == family and m.vocab.name == vocab)
    order = spec.family.generate(pp, microbatches, chunks, spec.vocab)
    points = _stacked(tuple(_held_points(acts, spec.split_w, chunks) for acts in order), spec.placement, pp,
                      chunks)
    placed = spec.vocab_parallel and not spec.family.places_vocab
    last = tuple(None if placed or not acts else (acts[-1][0], acts[-1][2]) for acts in order)
    sk = Schedule(spec.name, pp, microbatches, chunks, spec.placement, spec.vocab, spec.split_w)
    return points, last, first_b_counts(order, sk), barrier_counts(order, spec, microbatches)


def generated_points(method: str, pp: int, microbatches: int, chunks: int) -> "Points":
    """Per rank, the held-count vectors of the generator's order (S and T only where the generator places them)."""
    return _generated(method, pp, microbatches, chunks)[0]


def last_passes(method: str, pp: int, microbatches: int, chunks: int) -> tuple:
    """Per rank, (kind, chunk) of its last action in the built schedule, or None where not known without building."""
    return _generated(method, pp, microbatches, chunks)[1]


class TailBound:
    """The tail after the flush (vp.cost.tail_s) without a simulation: exact without overlap_grad_reduce; with it, a
    lower bound: what no iteration can hide of the reduction (vp.cost.data_parallel.unhidden_reduce: the buckets made
    final by each rank's last pass), from the durations of those passes where the costs give them exactly."""

    def __init__(self, run: RunConfig, hw: Hardware, sk: Schedule, parts: tuple | None = None):
        """parts: vp.cost.costs.tail_parts of the run where the caller has them (they read neither
        overlap_grad_reduce nor bucket_mb, so a search works them out once for those variants)."""
        self.overlap = run.overlap_grad_reduce
        exposed = [0.0] * run.pp if self.overlap else exposed_reduce_per_rank(run, hw, sk)
        self.per_rank = exposed_tail_per_rank(tail_parts(run, hw, sk) if parts is None else parts, exposed)
        self.exact = max(self.per_rank)
        if self.overlap:
            self.slower, self.buckets = dp_slowdown(run, hw), reduce_buckets(run, hw, sk)
            self._plain: dict = {}  # microbatches -> at_least without costs (the key fixes the rest of the shape)

    def at_least(self, sk: Schedule, costs: Costs | None = None) -> float:
        """The tail, or with overlap_grad_reduce the least it can be; costs: the simulation's (pass_costs), whose
        durations of the last passes tighten it (not where processor sharing lengthens them); None: without them."""
        if not self.overlap:
            return self.exact
        if costs is None and sk.microbatches in self._plain:
            return self._plain[sk.microbatches]
        last = last_passes(sk.method, sk.pp, sk.microbatches, sk.chunks)
        exact = costs is not None and costs.sharing is None
        seconds = [costs.time(at[0], sk.stage(p, at[1])) if exact and at else None for p, at in enumerate(last)]
        unhidden = unhidden_reduce(self.buckets, last, seconds)
        got = max(t + self.slower * u for t, u in zip(self.per_rank, unhidden))
        if costs is None:
            self._plain[sk.microbatches] = got
        return got


class Stack(NamedTuple):
    """Held-count vectors of every rank as the rows of one array: rows[i] belongs to rank[i], rank r's rows start at
    starts[r] (a rank without points has one zero row)."""
    rows: np.ndarray
    rank: np.ndarray
    starts: np.ndarray


class Points(NamedTuple):
    """Every rank's held-count vectors (_held_points) stacked, so that all ranks' peaks are a few array operations
    (_peaks): all of them (every, in small integers), and of each rank only those no other of its vectors is at least
    as large as in every column (top, as floats: where no column's bytes are negative, a peak is at one of them);
    columns[r, j]: where rank r's column j takes its bytes per count in _peaks' vector (F of each stage, then W of
    each stage, then S), top_column: the columns of each top row; a rank without points has one zero row, and its
    peak is 0 (empty[r])."""
    every: Stack
    top: Stack
    columns: np.ndarray
    top_column: np.ndarray
    empty: np.ndarray


def _stack(blocks: list, dtype) -> Stack:
    sizes = np.array([len(b) for b in blocks])
    return Stack(np.concatenate(blocks).astype(dtype), np.repeat(np.arange(len(blocks), dtype=np.int32), sizes),
                 np.concatenate(([0], np.cumsum(sizes)[:-1])))


def _maximal(rows: np.ndarray) -> np.ndarray:
    """The rows that no other row is at least as large as in every column (rows distinct): the largest remaining
    row in lexicographic order is one (a row at least as large in every column would come after it), and every row
    it is at least as large as goes."""
    rest, keep = rows[np.lexsort(rows.T[::-1])[::-1]], []
    while len(rest):
        keep.append(rest[0])
        rest = rest[1:][~(rest[1:] <= rest[0]).all(axis=1)]
    return np.array(keep).reshape(-1, rows.shape[1])


def _stacked(per_rank: tuple, placement: str, pp: int, chunks: int) -> Points:
    """per_rank: each rank's vectors (_held_points) of a pipeline of this placement, pp and chunks."""
    stage = np.array(_geometry(placement, pp, chunks)[1], dtype=np.int64).reshape(pp, chunks)  # [rank, chunk]
    columns = np.concatenate((stage, pp * chunks + stage, np.full((pp, 1), 2 * pp * chunks)), axis=1)
    blocks = [p if len(p) else np.zeros((1, 2 * chunks + 1)) for p in per_rank]
    top = _stack([_maximal(b) for b in blocks], float)
    return Points(_stack(blocks, np.int32), top, columns, columns[top.rank],
                  np.array([not len(p) for p in per_rank], dtype=bool))


def built_points(s: Schedule) -> Points:
    """Per rank, the held-count vectors of a built schedule (exact, S and T included)."""
    return s.memo("plan_held_points", lambda s: _stacked(tuple(
        _held_points([(a.kind, a.mb, a.chunk) for a in acts], s.split_w, s.chunks) for acts in s.ranks),
        s.placement, s.pp, s.chunks))


def _peaks(points: Points, s: Schedule, costs: Costs) -> list[float]:
    """Each rank's peak of held bytes at its points: per rank, the bytes one count of each column holds (F of each
    of its chunks, W of each, S) dotted with each point, the largest."""
    if not s.pp:
        return []
    stages = range(s.n_stages)
    f, b = costs.mems("F", stages), costs.mems("B", stages)
    per_count = np.array(f + [x - y for x, y in zip(f, b)] + [costs.mem("S", None)])  # F, W (what it releases), S
    # no column's bytes negative: a vector at least as large as another in every column holds at least as many
    # bytes (each product and each partial sum rounds the same way for both), so the peak is at a top one
    if per_count.min() >= 0:
        rows, column, starts = points.top.rows, points.top_column, points.top.starts
    else:
        rows, column, starts = points.every.rows, points.columns[points.every.rank], points.every.starts
    held = np.einsum("ij,ij->i", rows, per_count[column])
    peaks = np.maximum.reduceat(held, starts)
    peaks[points.empty] = 0.0
    return peaks.tolist()


def activation_bounds(s: Schedule, costs: Costs) -> tuple[list[float], list[float]]:
    """(lower, upper) bounds on each rank's peak held activation bytes; equal where they are exact. A schedule
    with actions is walked exactly; a skeleton (no actions) from the generator's order."""
    if s.ranks:
        exact = _peaks(built_points(s), s, costs)
        return exact, exact
    spec = get_method(s.method)
    f_part = _peaks(generated_points(s.method, s.pp, s.microbatches, s.chunks), s, costs)
    if not spec.vocab_parallel or spec.family.places_vocab:
        return f_part, f_part
    one_s = costs.mem("S", None)
    return [max(f, one_s) for f in f_part], [f + one_s for f in f_part]


class CriticalPaths:
    """The critical paths of the iterations the search has simulated (vp.schedule.critical), per schedule: each is a
    path of every iteration of that schedule, so its length under a candidate's costs is a lower bound on the
    candidate's makespan (the costs without communication bound it too: every time in them is at most the whole
    model's). simulate() leaves the path out where it bounds nothing (processor sharing)."""

    def __init__(self):
        self.of: dict = {}  # (method, pp, microbatches, chunks): what the built schedule is a function of -> paths

    def add(self, run: RunConfig, path) -> None:
        known = self.of.setdefault((run.method, run.pp, run.microbatches, run.n_chunks), [])
        if path is not None and path not in known:
            known.append(path)

    def longest(self, run: RunConfig, costs: Costs, since: int = 0) -> tuple[float, int]:
        """(the longest under costs of run's schedule's paths but the first `since`, or 0; how many are known)."""
        known = self.of.get((run.method, run.pp, run.microbatches, run.n_chunks), ())
        if len(known) <= since:
            return 0.0, len(known)
        return max(path.seconds(costs) for path in known[since:]), len(known)
