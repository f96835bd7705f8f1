"""A simulated iteration's critical path (vp/schedule/critical.py) and what the planner bounds by it: the path sums
to the makespan under the costs it was simulated with, and to at most the makespan under any other costs of the same
schedule; the search that reads it answers as the one that does not, with fewer simulations."""
import importlib
import random
from dataclasses import replace

import pytest

from vp.config import RunConfig
from vp.cost import PROFILES
from vp.plan import search
from vp.plan.bounds import makespan_lower_bound
from vp.plan.space import Problem
from vp.schedule import build, kernel, simulate
from vp.schedule.costs import Costs, unit_costs
from vp.schedule.methods import METHODS, get_method
from vp.schedule.sharing import Sharing

COMPILED, PYTHON = 0, 10**12  # kernel.COMPILE_FROM: every walk compiled, none


def _costs(s, rng: random.Random) -> Costs:
    """Random pass, collective and per-link transfer times (the collectives' own launch times too)."""
    u = unit_costs(s)
    compute = {k: rng.uniform(0.0, 2.0) for k in u.compute}
    compute.update({(k, None): rng.uniform(0.0, 0.1) for k in ("C0", "C1", "C2")})
    comm = {k: rng.uniform(0.0, 1.0) for k in ("C0", "C1", "C2", "IF", "IB", "S", "T")}
    comm.update({("P2P", a, b): rng.uniform(0.0, 0.5) for a in range(s.pp) for b in range(s.pp) if a != b})
    return Costs(compute, comm, u.memory)


def _schedules():
    for method in METHODS:
        chunks = None if get_method(method).family.chunks else 2
        for pp in (2, 3, 4):
            for m in (pp, 2 * pp + 1, 3 * pp):
                try:
                    yield build(method, pp, m, chunks)
                except (AssertionError, ValueError):  # a shape the method refuses
                    continue


@pytest.mark.parametrize("mode", [COMPILED, PYTHON], ids=["compiled", "python"])
def test_planner_critical_path_sums_to_the_makespan_and_bounds_other_costs(mode, monkeypatch):
    monkeypatch.setattr(kernel, "COMPILE_FROM", mode)
    monkeypatch.setattr(kernel, "_jitted", {})
    rng, checked = random.Random(11), 0
    for s in _schedules():
        runs = []
        for _ in range(3):
            costs = _costs(s, rng)
            result = simulate(s, costs, path=True)
            assert result.path is not None
            assert result.path.seconds(costs) == pytest.approx(result.makespan, rel=1e-12), (s.method, s.pp)
            runs.append((costs, result))
        for _, one in runs:  # one iteration's path, under another's costs: at most that one's makespan
            for costs, other in runs:
                assert one.path.seconds(costs) <= other.makespan * (1 + 1e-12), (s.method, s.pp, s.microbatches)
        checked += 1
    assert checked > 90


def test_planner_critical_path_is_left_out_where_it_bounds_nothing():
    """Strict mode orders collectives by time and processor sharing lengthens a step by what runs beside it: no
    path (the search then bounds by its own bounds alone); a simulation that is not asked for one has none."""
    s = build("vocab-1", 4, 8)
    costs = _costs(s, random.Random(3))
    assert simulate(s, costs).path is None
    assert simulate(s, costs, strict=True, path=True).path is None
    shared = replace(costs, sharing=Sharing(cores=2, devices=4, cpu={}, wake_s=0.0, crowding=1.0))
    assert simulate(s, shared, path=True).path is None


def test_planner_bound_counts_each_receive_and_each_wait_for_the_input_layers_root():
    """A rank's receives block it for their transfer, and a rank but the input layer's root waits for IB's
    communication after it enters: the makespan bound counts both (bound A), so with free passes it is the
    simulated makespan's; without them it would be one transfer and nothing of IB."""
    s = build("vocab-1", 4, 8)
    m, comm = s.microbatches, {("P2P", a, b): 1.0 for a in range(4) for b in range(4) if a != b}
    comm["IB"] = 0.5
    costs = Costs({k: 0.0 for k in unit_costs(s).compute}, comm, unit_costs(s).memory)
    bound = makespan_lower_bound(replace(s, ranks=[]), costs)
    # a middle rank: every F and every B receives (2m transfers), one of them before its first F, and m IB waits
    assert bound >= 1.0 + (2 * m - 1) * 1.0 + m * 0.5
    assert bound <= simulate(s, costs).makespan * (1 + 1e-12)


SMALL = RunConfig(layers=8, hidden=512, heads=8, seq_len=256, vocab_size=32000, device="cuda", dtype="bf16")
# every family of schedule, vocabulary-parallel ones among them (tests/test_planner_order.py's)
PROBLEM = Problem(SMALL, 8, 16, methods=("baseline", "vocab-1", "interleaved-vocab-2", "vhalf-vocab-2", "redis"))


def test_planner_search_with_critical_paths_answers_the_same_with_fewer_simulations(monkeypatch):
    """The search raises a candidate's makespan bound to the longest critical path of its schedule simulated so far
    (vp.plan.bounds.CriticalPaths): the same answer as without, from fewer simulations."""
    S = importlib.import_module("vp.plan.search")
    hw = PROFILES["h100"]
    with_paths = search(PROBLEM, hw, top=5)
    monkeypatch.setattr(S, "_tighten", lambda p, paths, hw: False)
    without = search(PROBLEM, hw, top=5)
    assert with_paths.simulated < without.simulated
    assert with_paths.candidates == without.candidates and with_paths.rejected == without.rejected
    key = lambda row: (row.run, row.tokens_per_s, row.peak_memory_bytes, row.bubble)  # noqa: E731
    for field in ("top", "pareto"):
        assert list(map(key, getattr(with_paths, field))) == list(map(key, getattr(without, field))), field
    assert {m: key(r) for m, r in with_paths.best_per_method.items()} == \
        {m: key(r) for m, r in without.best_per_method.items()}
