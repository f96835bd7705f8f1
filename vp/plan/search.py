"""The search: every candidate of the space (vp.plan.space) checked, priced by the cost model, bounded, and
simulated by the one simulator where it may enter the answer; the answer is exact.

A candidate is simulated unless a safe bound shows it can enter none of: the top-k by tokens/s, the best of its
method, the Pareto front of tokens/s against peak memory (vp.plan.bounds; docs/planner.md). Candidates are visited
in order of their bound, best first, so a bound is compared with the exact figures of everything that could beat
it. A candidate's memory is priced first, so one that cannot fit costs no pass time, tail or bound. Its peak
memory is exact where the order of its actions is known without building its schedule (methods whose vocabulary
passes the generator places, or which have none); otherwise it is bracketed, and the schedule is built only where
the bracket straddles the device's memory and the candidate is still in the race.
Two candidates with the same schedule and the same costs are simulated once. A candidate's bound falls when it is
visited and its costs become the whole cost model's (communication too), and when an iteration of its schedule has
been simulated: that iteration's critical path, under the candidate's costs, bounds its makespan
(vp.plan.bounds.CriticalPaths). Where it falls below the next candidate's, it goes back in its place, so candidates
are decided in the order of their whole bounds.

A variant with recomputation is first bounded by its recompute=none variant's bound (each of its passes takes at
least as long, and the bound grows with every pass time; tests/test_planner_order.py checks both), and its own pass
times are worked out only when it is reached in that order and could still enter; it then goes back in its place.

tokens/s, MFU, peak memory and bubble are computed as backend=sim computes a record (harness.sim): makespan plus
the tail after the flush (with overlap_grad_reduce, from the simulated iteration), vp.metrics.throughput, static
bytes plus held activations per pipeline rank. A plan must fit the device's capacity less plan.memory_margin
(Problem.budget); the simulated peak is checked again before a plan enters the answer.

Knob variants of one configuration share their schedule, and where only zero or overlap_grad_reduce differ their
costs too (vp.plan.memo: every figure is worked out once per search for the fields it reads), so one simulation
serves them; the top-k lists configurations, each at
its fastest variant, while best per method and the Pareto front take every variant.
"""
import heapq
import itertools
import time
from dataclasses import dataclass
from operator import add, attrgetter
from typing import NamedTuple

from vp.config import RECOMPUTE, RunConfig
from vp.cost import Hardware, pass_costs, static_bytes
from vp.cost.passes import compute_times, pass_times
from vp.cost.costs import exposed_tail_per_rank, tail_parts
from vp.cost.data_parallel import exposed_reduce_per_rank, finals
from vp.cost.memory import comm_buffer_bytes, held_bytes
from vp.metrics import throughput
from vp.plan.bounds import CriticalPaths, TailBound, activation_bounds, makespan_lower_bound
from vp.plan.answer import MEMORY, REL, SIMULATED_MEMORY, Plan, Row, _Race, _rank_key, pareto, top_configurations
from vp.disk_cache import kept_communicators, kept_tables
from vp.plan.memo import Built, Memo, Phases, StageCommunicators
from vp.plan.space import KNOBS, RUN_FIELDS, Problem, Rejection, candidates, configuration
from vp.plan.variants import dominates
from vp.schedule import Costs, Schedule, simulate
from vp.schedule.program import _program
from vp.schedule.simulate import collector_paused
from vp.schedule.methods import get_method

NO_RECOMPUTE = RECOMPUTE[0]  # "none": what the other recompute modes add work to
_but_recompute = attrgetter(*(f for f in RUN_FIELDS if f != "recompute"))  # a variant's recompute=none sibling

__all__ = ["MEMORY", "REL", "SIMULATED_MEMORY", "Plan", "Row", "pareto", "price", "search", "top_configurations"]


@dataclass
class _Priced:
    run: RunConfig
    skeleton: Schedule
    costs: object
    static: list
    tail: float  # exact; with overlap_grad_reduce the least it can be (TailBound)
    act_lo: list
    act_hi: list
    bound: float  # tokens/s no simulation of this candidate can exceed
    tails: TailBound | None = None  # the tail and its bound (tail is tails.at_least: from full costs once visited)
    borrowed: bool = False  # bound: its recompute=none variant's, costs: held bytes only (its own pass times unknown)
    full: bool = False  # costs: the whole cost model's (pass_costs), bound and tail from them
    span: float = 0.0  # the lower bound on the makespan its bound was worked out from (with the tail)
    paths_read: int = 0  # how many critical paths of its schedule (CriticalPaths) its span has read, these costs

    def __post_init__(self):
        self.held(self.act_lo, self.act_hi)

    def held(self, act_lo: list, act_hi: list) -> None:
        """The bracket of each rank's held activations, and from it the peak's (read many times by the race)."""
        self.act_lo, self.act_hi = act_lo, act_hi
        self.memory_lo = max(map(add, self.static, act_lo))
        self.memory_hi = max(map(add, self.static, act_hi))


class _Simulated(NamedTuple):
    """What predict reads of a simulated iteration (vp.schedule.SimResult less its timeline), kept for the candidates
    that share its schedule and costs."""
    makespan: float
    busy: list
    peak_activations: list
    finals: list  # vp.cost.data_parallel.finals: what the overlapped reduction reads


def _tighten(p: _Priced, paths: CriticalPaths, hw: Hardware) -> bool:
    """Raise p's makespan bound to the longest critical path of its schedule found since it last looked (under its
    present costs: a lower bound, vp.plan.bounds.CriticalPaths) and lower its bound to match; whether it fell."""
    longest, p.paths_read = paths.longest(p.run, p.costs, p.paths_read)
    if longest <= p.span:
        return False
    p.span = longest
    p.bound = min(p.bound, _bound(p.run, hw, longest, p.tail))
    return True


def skeleton(run: RunConfig) -> Schedule:
    """The schedule's shape without its actions: all the cost model and the bounds read."""
    spec = get_method(run.method)
    return Schedule(run.method, run.pp, run.microbatches, run.n_chunks, spec.placement, spec.vocab, spec.split_w)


def price(run: RunConfig, hw: Hardware, held: StageCommunicators, budget: float | None = None,
          memo: Memo | None = None, upper: float | None = None) -> _Priced | Rejection:
    """The candidate's memory, costs and bound, or its memory rejection: memory first (static bytes, then the bracket
    of held activations from the generator's order), so a candidate that cannot fit the budget (default: the
    device's capacity) costs no pass time or tail. memo: the search's (vp.plan.memo: what knob variants and
    candidates share, worked out once), else a fresh one (every figure computed). upper: a bound known to be at
    least the candidate's (its recompute=none variant's), taken instead of its own pass times (borrowed; own_bound()
    later)."""
    budget = hw.memory_bytes if budget is None else budget
    memo = Memo() if memo is None else memo
    shape = (run.method, run.pp, run.microbatches, run.n_chunks)
    sk = memo.skeletons.get(shape)
    if sk is None:
        sk = memo.skeletons[shape] = skeleton(run)
    static = memo("fixed", fixed_bytes, run, hw, sk, held)
    zero = [0.0] * run.pp
    if max(static) > budget:
        return memory_rejection(_Priced(run, sk, None, static, 0.0, zero, zero, 0.0), hw, budget, exact=False)
    memory = memo("held", held_bytes, run, hw, sk)
    act_lo, act_hi = memo("bracket", _bracket, run, sk, memory)
    p = _Priced(run, sk, Costs({}, {}, memory), static, 0.0, act_lo, act_hi, 0.0)
    if p.memory_lo > budget * (1 + REL):
        return memory_rejection(p, hw, budget, exact=act_lo == act_hi)
    p.tails = memo("tail", lambda r, sk: TailBound(r, hw, sk, memo("tail parts", tail_parts, r, hw, sk)), run, sk)
    p.tail = p.tails.at_least(sk)  # costs without communication: not the simulation's, so not read
    if upper is not None:  # the costs hold the held bytes alone (what bracket() reads)
        p.bound, p.borrowed = upper, True
        return p
    p.costs = compute_costs(run, hw, sk, memo)
    p.span = memo("span", _sums_span, run, sk, p.costs)
    p.bound = _bound(run, hw, p.span, p.tail)
    return p


def _bracket(_run: RunConfig, sk: Schedule, memory: dict) -> tuple[list[float], list[float]]:
    """The bracket of each pipeline rank's held activations from the generator's order (activation_bounds reads the
    held bytes alone)."""
    return activation_bounds(sk, Costs({}, {}, memory))


def own_bound(p: _Priced, hw: Hardware, memo: Memo) -> None:
    """A borrowed bound replaced by the candidate's own (its costs without communication, as price() computes)."""
    p.costs = compute_costs(p.run, hw, p.skeleton, memo)
    p.span = memo("span", _sums_span, p.run, p.skeleton, p.costs)
    p.bound = _bound(p.run, hw, p.span, p.tail)
    p.borrowed = False


def _span(_run: RunConfig, sk: Schedule, costs: Costs) -> float:
    return makespan_lower_bound(sk, costs)


def _sums_span(_run: RunConfig, sk: Schedule, costs: Costs) -> float:
    """The makespan's bounds A, B and E: what a candidate enters the order with (its whole bound, _span of the full
    costs, decides it)."""
    return makespan_lower_bound(sk, costs, order=False)


def _bound(run: RunConfig, hw: Hardware, span: float, tail: float) -> float:
    """tokens/s no simulation can exceed, from a lower bound on the makespan and on the tail."""
    return throughput(run, span + tail, run.world, hw.peak_flops)["tokens_per_s"]


def full_costs(p: _Priced, hw: Hardware, memo: Memo) -> Costs:
    """pass_costs of a priced candidate, from its memoised work, pass times and held bytes (memoised: "full")."""
    return memo("full", lambda run, sk, c: pass_costs(run, hw, sk, memo("compute", compute_times, run, hw, sk),
                                                      c.memory, c.compute), p.run, p.skeleton, p.costs)


def fixed_bytes(run: RunConfig, hw: Hardware, sk: Schedule, held: StageCommunicators) -> list[float]:
    """Per stage, what a device holds whatever the schedule's order: parameters, gradients and optimizer state, and
    NCCL's buffers of the communicators it holds, exactly as harness.sim counts them for the record's peak."""
    return [s + comm_buffer_bytes(h, hw) for s, h in zip(static_bytes(run, hw, sk), held.of_stages(run))]


def compute_costs(run: RunConfig, hw: Hardware, sk: Schedule, memo: Memo | None = None) -> Costs:
    """pass_costs without communication between passes: each pass's seconds as pass_costs times it before the CPU
    time of the collectives it launches (vp.cost.passes.pass_times: its own work and its stage's tensor-parallel
    collectives, never less than its own work), and no transfer or collective time (comm empty); the held memory is
    pass_costs'. Every time is at most pass_costs', so a bound from these is a bound. The search prices every
    candidate so, and asks pass_costs itself only of those it visits (full_costs, from these pass times)."""
    memo = Memo() if memo is None else memo
    return Costs(memo("pass", _pass_times, run, hw, sk, memo), {}, memo("held", held_bytes, run, hw, sk))


def _pass_times(run: RunConfig, hw: Hardware, sk: Schedule, memo: Memo) -> dict:
    """pass_times from the memoised work (asked for only where the pass times are not memoised yet)."""
    return pass_times(run, hw, sk, memo("compute", compute_times, run, hw, sk))


def bracket(p: _Priced, built: Built) -> None:
    """p's held activations, exact: its built schedule walked (where the generator's order left a bracket that
    straddles the budget: price())."""
    p.held(*activation_bounds(built(p.run), p.costs))


def memory_rejection(c: _Priced, hw: Hardware, budget: float, exact: bool) -> Rejection:
    peak = c.memory_lo
    rank = max(range(len(c.static)), key=lambda r: c.static[r] + c.act_lo[r])
    at_least = "" if exact else "at least "
    return Rejection(c.run, MEMORY, f"peak memory {at_least}{peak / 2**30:.1f} GiB on pipeline rank {rank} "
                     f"(static {c.static[rank] / 2**30:.1f} GiB + activations {c.act_lo[rank] / 2**30:.1f} GiB) "
                     f"exceeds the {budget / 2**30:.1f} GiB a plan may use on {hw.name} ({_budget_text(hw, budget)})",
                     peak - budget)


def _budget_text(hw: Hardware, budget: float) -> str:
    margin = 1 - budget / hw.memory_bytes
    return f"its {hw.memory_bytes / 2**30:.2f} GiB less the {100 * margin:.0f} % of plan.memory_margin"


def _costs_key(costs) -> tuple:
    """Equal for equal costs, whatever order their dicts were filled in (sets of their items: no sorting of keys of
    mixed types)."""
    share = getattr(costs, "sharing", None)  # CPU ranks sharing cores (vp.schedule.sharing): part of the result
    shared = None if share is None else (share.cores, share.devices, frozenset(share.cpu.items()), share.wake_s,
                                         share.crowding)
    return tuple(frozenset(d.items()) for d in (costs.compute, costs.comm, costs.memory)) + (shared,)


def predict(c: _Priced, hw: Hardware, cache: dict, built: Built, paths: CriticalPaths | None = None) -> Row:
    """The record backend=sim would write, reduced to the plan's figures (harness.sim.simulate_job); paths: where the
    iteration's critical path goes."""
    run, sched = c.run, built(c.run)
    key = (run.method, run.pp, run.microbatches, run.n_chunks, _costs_key(c.costs))
    if key not in cache:  # kept small: what the rows read of the iteration, not its timeline
        result = simulate(sched, c.costs, path=paths is not None)
        cache[key] = _Simulated(result.makespan, result.busy, result.peak_activations, finals(result, sched))
        if paths is not None:
            paths.add(run, result.path)
    result = cache[key]
    if run.overlap_grad_reduce:  # what the dp stream has left at the flush of this simulated iteration
        # the tail's parts but the exposed reduction, and the buckets: the TailBound's (c.tails), worked out already
        if c.tails is not None:
            parts, buckets = (c.tails.per_rank, c.tails.slower), c.tails.buckets
        else:
            parts, buckets = tail_parts(run, hw, c.skeleton), None
        exposed = exposed_reduce_per_rank(run, hw, sched, final=result.finals, buckets=buckets)
        tail = max(exposed_tail_per_rank(parts, exposed))
    else:
        tail = c.tail
    seconds = result.makespan + tail
    thr = throughput(run, seconds, run.world, hw.peak_flops)
    peak = [s + a for s, a in zip(c.static, result.peak_activations)]
    rank = max(range(len(peak)), key=peak.__getitem__)
    bubble = sum(1.0 - b / seconds for b in result.busy) / len(result.busy)
    return Row(run, thr["tokens_per_s"], thr["mfu"], seconds, peak[rank], rank, bubble, hw.memory_bytes)


@collector_paused
def search(problem: Problem, hw: Hardware, top: int = 10, prune: bool = True, log=None) -> Plan:
    """The plan: every candidate counted (feasible or rejected per reason), the exact top-k configurations, best per
    method and Pareto front. prune=False simulates every feasible candidate (the exhaustive reference). Python's
    cyclic collector is paused throughout, as for build and simulate: the search allocates millions of small acyclic
    objects (freed by their reference counts) while it holds its schedules, and each collection walked all of them
    (about a sixth of the CPU time at 30b on 1024 GPUs)."""
    t0, c0 = time.perf_counter(), time.process_time()
    plan, priced, held, said, uppers = Plan(), [], StageCommunicators(), t0, {}
    budget, memo, phase = problem.budget(hw.memory_bytes), Memo(), Phases()
    plan.budget = budget
    with phase("disk cache"):  # what earlier processes worked out of this profile and problem (vp.disk_cache)
        kept = kept_tables(hw), kept_communicators(held, problem.base)
    # the hot phases timed inline (Phases.add), with as few clock reads as they allow (one is a system call, about
    # a microsecond): pricing per candidate priced, the space (the candidates and vp.config's checks) as the rest
    clock, loop, pricing = time.process_time, time.process_time(), 0.0
    for c in candidates(problem):
        plan.candidates += 1
        if log and time.perf_counter() - said > 30:
            said = time.perf_counter()
            log(f"  {plan.candidates} candidates priced, {len(priced)} within memory, {said - t0:.0f} s")
        if isinstance(c, Rejection):
            plan.reject(c)
            continue
        at = clock()  # price: static bytes, held activations, costs without communication, tail, bound
        key = _but_recompute(c) if prune and "recompute" in KNOBS else None
        p = price(c, hw, held, budget, memo, None if c.recompute == NO_RECOMPUTE else uppers.get(key))
        if key is not None and c.recompute == NO_RECOMPUTE and not isinstance(p, Rejection):
            uppers[key] = p.bound * (1 + REL)  # the variants' pass times sum as this one's, plus theirs
        pricing += clock() - at
        if isinstance(p, Rejection):
            plan.reject(p)
        else:
            priced.append(p)
    phase.add("price", pricing)
    phase.add("space", clock() - loop - pricing)
    # best bound first; a tie keeps the order of the space
    heap = [(-p.bound, i, p) for i, p in enumerate(priced)]
    heapq.heapify(heap)
    order = itertools.count(len(heap))
    if log:
        log(f"{plan.candidates} candidates priced, {len(priced)} within memory (static bytes and the activations' "
            f"bracket), {time.perf_counter() - t0:.1f} s; bounding and simulating")
    race, cache, built, said = _Race(top), {}, Built(), time.perf_counter()
    paths = CriticalPaths() if prune else None
    simulated: dict = {}  # configuration -> its simulated knob variants that fit (_Priced)
    while heap:
        _, _, p = heapq.heappop(heap)
        if log and time.perf_counter() - said > 30:
            said = time.perf_counter()
            log(f"  {len(priced) - len(heap)} of {len(priced)} visited, {plan.simulated} simulated, "
                f"{said - t0:.0f} s")
        if p.borrowed and race.could_enter(p):  # its own bound, and back in its place in the order
            with phase("price"):
                own_bound(p, hw, memo)
            heapq.heappush(heap, (-p.bound, next(order), p))
            continue
        if prune and not p.borrowed and heap and race.could_enter(p):  # the critical paths of its schedule found
            with phase("paths"):  # since it was bounded
                fell = _tighten(p, paths, hw)
            if fell and p.bound < -heap[0][0]:
                heapq.heappush(heap, (-p.bound, next(order), p))
                continue
        if not p.borrowed and not p.full and (not prune or race.could_enter(p)):  # the whole cost model now
            with phase("full costs"):
                p.costs = full_costs(p, hw, memo)
                p.tail = p.tails.at_least(p.skeleton, p.costs)
                p.span = memo("full span", _span, p.run, p.skeleton, p.costs)
                p.bound = _bound(p.run, hw, p.span, p.tail)
                p.full, p.paths_read = True, 0
            if prune:
                with phase("paths"):
                    _tighten(p, paths, hw)
            if prune and heap and p.bound < -heap[0][0]:  # others come first now: back in its place in the order
                heapq.heappush(heap, (-p.bound, next(order), p))
                continue
        skip = prune and not race.could_enter(p)
        if prune and not skip and any(dominates(y, p) for y in simulated.get(configuration(p.run), ())):
            skip = True
            plan.dominated += 1
        if skip:
            if p.memory_hi <= budget:
                plan.feasible += 1
                plan.pruned += 1
            else:
                plan.undecided += 1
            continue
        if p.memory_hi > budget:  # the bracket straddles the budget: walk the built schedule
            with phase("build"):
                built(p.run)
            with phase("bracket"):
                bracket(p, built)
            if p.memory_lo > budget:
                plan.reject(memory_rejection(p, hw, budget, exact=True))
                continue
        with phase("build"):
            sched = built(p.run)
        with phase("program"):  # what the simulator derives from a schedule once, whatever its costs
            _program(sched)
        with phase("simulate"):
            row = predict(p, hw, cache, built, paths)
        if row.peak_memory_bytes > budget:  # the simulated peak, checked again: the plan is dropped, with why
            over = row.peak_memory_bytes - budget
            plan.reject(Rejection(p.run, SIMULATED_MEMORY, f"simulated peak memory {row.peak_memory_bytes / 2**30:.2f}"
                                  f" GiB on pipeline rank {row.peak_rank} exceeds the {budget / 2**30:.2f} GiB a plan"
                                  f" may use on {hw.name} ({_budget_text(hw, budget)})", over))
            continue
        plan.feasible += 1
        plan.simulated += 1
        plan.rows.append(row)
        race.add(row)
        simulated.setdefault(configuration(p.run), []).append(p)
    with phase("answer"):
        _answer(plan, top)
    with phase("disk cache"):
        for k in kept:
            k.save()
    plan.phases = phase.seconds
    plan.memo = {name: (memo.calls[name], memo.computed[name]) for name in memo.calls}
    plan.seconds, plan.cpu_seconds = time.perf_counter() - t0, time.process_time() - c0
    return plan


def _answer(plan: Plan, top: int) -> None:
    plan.rows.sort(key=_rank_key)
    plan.top = top_configurations(plan.rows, top)
    for row in plan.rows:
        plan.best_per_method.setdefault(row.run.method, row)
    plan.pareto = pareto(plan.rows)
    plan.closest = [rej for _, _, rej in sorted(plan.closest, key=lambda x: (-x[0], -x[1]))]

