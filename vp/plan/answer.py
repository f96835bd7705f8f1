"""The planner's answer: its rows (the figures backend=sim would record, and the headroom), the plan (counts,
rejections, top-k configurations, best per method, Pareto front) and the race that tells the search which
candidates could still enter it (docs/planner.md, "Ranking")."""
import bisect
import heapq
from dataclasses import dataclass, field

from vp.config import RunConfig
from vp.plan.space import KNOBS, Rejection, configuration
from vp.plan.variants import knob_index


MEMORY = "peak memory above the device's"
SIMULATED_MEMORY = "simulated peak memory above the device's"
# relative tolerance of comparing a bound with an exact figure: the bound sums the same costs in another order, and
# can exceed the simulated makespan by a rounding error
REL = 1e-9


@dataclass
class Row:
    run: RunConfig
    tokens_per_s: float
    mfu: float
    iteration_s: float
    peak_memory_bytes: float  # the largest over devices
    peak_rank: int  # the pipeline rank that holds it
    bubble: float  # mean idle fraction of the iteration (the record's bubble_rate)
    capacity: float = 0.0  # the device's memory as torch reports it (the profile's memory_bytes)

    @property
    def headroom_bytes(self) -> float:
        """What the peak leaves free of the device's capacity."""
        return self.capacity - self.peak_memory_bytes

    @property
    def headroom(self) -> float:
        return self.headroom_bytes / self.capacity if self.capacity else 0.0

    def to_dict(self) -> dict:
        r = self.run
        return {"method": r.method, "dp": r.dp, "pp": r.pp, "tp": r.tp, "tp_mode": r.tp_mode, "tp_depth": r.tp_depth,
                "micro_batch_size": r.micro_batch_size, "microbatches": r.microbatches, "chunks": r.n_chunks,
                "redis_last_layers": r.redis_last_layers, **{k: getattr(r, k) for k in KNOBS},
                "tokens_per_s": self.tokens_per_s, "mfu": self.mfu, "iteration_s": self.iteration_s,
                "peak_memory_bytes": self.peak_memory_bytes, "peak_rank": self.peak_rank, "bubble": self.bubble,
                "headroom_bytes": self.headroom_bytes, "headroom": self.headroom}


@dataclass
class Plan:
    candidates: int = 0
    feasible: int = 0
    simulated: int = 0
    pruned: int = 0  # feasible, skipped by a bound (never in the answer)
    undecided: int = 0  # skipped by a bound before their memory was decided (counted in neither feasible nor rejected)
    budget: float = 0.0  # bytes a plan may use on a device: its capacity less plan.memory_margin
    dominated: int = 0  # skipped: a simulated knob variant of theirs is as fast with no more memory (vp.plan.variants)
    seconds: float = 0.0  # wall clock
    cpu_seconds: float = 0.0  # this process's CPU time (the wall clock of a machine shared with others is not)
    rejected: dict = field(default_factory=dict)  # reason -> count
    examples: dict = field(default_factory=dict)  # reason -> the check's message for one candidate
    closest: list = field(default_factory=list)  # memory rejections nearest to fitting: (excess bytes, RunConfig)
    phases: dict = field(default_factory=dict)  # phase -> CPU seconds (vp.plan.memo.Phases)
    memo: dict = field(default_factory=dict)  # memoised value -> (calls, computed): what the memo saved
    rows: list = field(default_factory=list)  # every simulated feasible candidate, best first
    top: list = field(default_factory=list)
    best_per_method: dict = field(default_factory=dict)
    pareto: list = field(default_factory=list)  # by peak memory, rising; each row faster than all before it

    def reject(self, rej: Rejection) -> None:
        self.rejected[rej.reason] = self.rejected.get(rej.reason, 0) + 1
        self.examples.setdefault(rej.reason, rej.message)
        if rej.reason == MEMORY:
            heapq.heappush(self.closest, (-rej.excess, -self.rejected[MEMORY], rej))  # a tie keeps the first seen
            if len(self.closest) > 5:
                heapq.heappop(self.closest)


class _Race:
    """What a candidate must beat to enter the answer: the k-th best configuration (each at its fastest knob variant
    so far: the values only rise, so the k-th does too), its method's best, the Pareto front. Each comparison of a
    bound keeps a relative tolerance (REL): the bound may exceed the exact figure by a rounding error."""

    def __init__(self, top: int):
        self.top, self.by_config, self.best_k, self.by_method = top, {}, {}, {}
        # the Pareto front so far as a staircase: peak memory rising, tokens/s rising with it (no point weakly
        # dominates another), so the fastest point within a memory is the last one at or below it (bisect)
        self.front_mem: list[float] = []
        self.front_tps: list[float] = []

    def could_enter(self, c) -> bool:  # c: vp.plan.search._Priced (its bound, run and memory_lo)
        bound = c.bound * (1 + REL)
        if len(self.best_k) < self.top or bound >= min(self.best_k.values()):
            return True
        if bound >= self.by_method.get(c.run.method, -1.0):
            return True
        i = bisect.bisect_right(self.front_mem, c.memory_lo * (1 - REL))  # points with no more memory: [0, i)
        return not (i and self.front_tps[i - 1] >= bound)

    def add(self, row: Row) -> None:
        cfg, tps = configuration(row.run), row.tokens_per_s
        value = self.by_config[cfg] = max(self.by_config.get(cfg, -1.0), tps)
        if cfg in self.best_k or len(self.best_k) < self.top:
            self.best_k[cfg] = value
        else:
            low = min(self.best_k, key=self.best_k.get)
            if value > self.best_k[low]:
                del self.best_k[low]
                self.best_k[cfg] = value
        m = row.run.method
        self.by_method[m] = max(self.by_method.get(m, -1.0), tps)
        mem, mems, front = row.peak_memory_bytes, self.front_mem, self.front_tps
        i = bisect.bisect_right(mems, mem)
        if i and front[i - 1] >= tps:  # a point with no more memory is as fast
            return
        j = bisect.bisect_left(mems, mem)  # the points it weakly dominates: from j on, while no faster
        k = bisect.bisect_right(front, tps, lo=j)
        mems[j:k], front[j:k] = [mem], [tps]


def top_configurations(rows: list[Row], top: int) -> list[Row]:
    """The first `top` rows of distinct configurations (ranked rows: each configuration at its best knob variant)."""
    out, seen = [], set()
    for row in rows:
        cfg = configuration(row.run)
        if cfg not in seen:
            seen.add(cfg)
            out.append(row)
            if len(out) == top:
                break
    return out


def _rank_key(row: Row) -> tuple:
    r = row.run
    return (-row.tokens_per_s, row.peak_memory_bytes, r.method, r.dp, r.pp, r.tp, r.tp_mode, r.tp_depth,
            r.micro_batch_size, r.n_chunks, r.redis_last_layers or 0, knob_index(r))


def pareto(rows: list[Row]) -> list[Row]:
    """Rows no other row beats in both tokens/s (higher) and peak memory (lower), by memory rising."""
    front, best = [], -1.0
    for row in sorted(rows, key=lambda r: (r.peak_memory_bytes, -r.tokens_per_s)):
        if row.tokens_per_s > best:
            front.append(row)
            best = row.tokens_per_s
    return front
