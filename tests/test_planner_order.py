"""The search's order of work changes what it works out, never its answer: memory priced before pass times, the
recompute variants first bounded by their recompute=none variant's bound, and every candidate decided in the order
of its whole bound (vp.plan.search; docs/planner.md, "Ranking, and why the answer is exact")."""
import importlib
from dataclasses import replace

from vp.config import RunConfig
from vp.cost import PROFILES, GiB, pass_costs
from vp.plan import MEMORY, Problem, Rejection, candidates, search
from vp.plan.answer import REL
from vp.plan import memo as memo_module
from vp.plan.memo import Memo
from vp.plan.search import StageCommunicators, compute_costs, price, skeleton

SMALL = RunConfig(layers=8, hidden=512, heads=8, seq_len=256, vocab_size=32000, device="cuda", dtype="bf16")
# a small space with every family of schedule, vocabulary-parallel ones among them: what both whole searches run
PROBLEM = Problem(SMALL, 8, 16, methods=("baseline", "vocab-1", "interleaved-vocab-2", "vhalf-vocab-2", "redis"))


def test_planner_recompute_variants_bound_no_higher_than_their_recompute_none_variant(hw_name="h100"):
    """Recomputation adds work to B and changes no other pass: every pass of a recompute variant takes at least as long
    as its recompute=none variant's, so its makespan bound is no lower and its throughput bound no higher. The search
    takes the recompute=none variant's bound for the others until they could enter (vp.plan.search)."""
    from vp.plan.answer import REL
    from vp.plan.search import NO_RECOMPUTE

    hw, memo, held, checked = PROFILES[hw_name], Memo(), StageCommunicators(), 0
    assert NO_RECOMPUTE == memo_module.RunConfig().recompute  # the default, first of vp.config.RECOMPUTE
    for run in candidates(Problem(SMALL, 16, 32)):
        if isinstance(run, Rejection) or run.recompute != NO_RECOMPUTE:
            continue
        base = price(run, hw, held, memo=memo)
        if isinstance(base, Rejection):
            continue
        for mode in ("selective", "full"):
            other = price(run.with_(recompute=mode), hw, held, memo=memo)
            assert other.costs.compute.keys() == base.costs.compute.keys(), run
            assert all(other.costs.compute[k] >= t for k, t in base.costs.compute.items()), (run, mode)
            assert other.costs.compute != base.costs.compute, (run, mode)  # B recomputes: the test can fail
            assert other.tail == base.tail and other.bound <= base.bound * (1 + REL), (run, mode)
            checked += 1
    assert checked > 300


def test_planner_borrowed_bounds_change_nothing_but_the_work(monkeypatch):
    """The search's answer, counts and every simulated row are the same when each recompute variant is priced alone
    (none borrows its recompute=none variant's bound); with borrowing, fewer pass times are worked out."""
    S = importlib.import_module("vp.plan.search")
    hw = PROFILES["h100"]
    fast = search(PROBLEM, hw, top=5)
    monkeypatch.setattr(S, "NO_RECOMPUTE", "no such mode")  # no variant is recompute=none: none lends its bound
    slow = search(PROBLEM, hw, top=5)
    assert fast.memo["compute"][1] < slow.memo["compute"][1]
    for field in ("candidates", "feasible", "simulated", "pruned", "undecided", "dominated", "rejected", "examples"):
        assert getattr(fast, field) == getattr(slow, field), field
    key = lambda row: (row.run, row.tokens_per_s, row.peak_memory_bytes, row.bubble)  # noqa: E731
    for field in ("rows", "top", "pareto"):
        assert list(map(key, getattr(fast, field))) == list(map(key, getattr(slow, field))), field


def test_planner_candidates_are_decided_in_order_of_their_whole_bounds(monkeypatch):
    """A candidate's bound falls when it is visited (its costs become the whole cost model's: communication added);
    where it falls below the next candidate's it goes back into the order, so every candidate is decided (simulated
    or skipped) in the order of its whole bound, whatever bound it entered the order with. A search that prices every
    candidate with the whole cost model from the start simulates the same candidates at the same bounds in the same
    order (ties aside), with the same answer and counts; without going back, the first simulates more."""
    S = importlib.import_module("vp.plan.search")
    hw, simulated = PROFILES["h100"], []
    real_predict = S.predict
    monkeypatch.setattr(S, "predict", lambda c, *a: simulated.append((c.bound, c.run)) or real_predict(c, *a))
    loose = search(PROBLEM, hw, top=5)
    loose_order, simulated[:] = list(simulated), []
    monkeypatch.setattr(S, "compute_costs", lambda run, hw, sk, memo=None: pass_costs(run, hw, sk))
    monkeypatch.setattr(S, "full_costs", lambda p, hw, memo: p.costs)
    whole = search(PROBLEM, hw, top=5)
    assert [b for b, _ in simulated] == [b for b, _ in loose_order]  # bounds falling: each simulated at its own
    assert sorted(map(repr, simulated)) == sorted(map(repr, loose_order))
    for field in ("candidates", "feasible", "simulated", "pruned", "undecided", "dominated", "rejected"):
        assert getattr(loose, field) == getattr(whole, field), field
    key = lambda row: (row.run, row.tokens_per_s, row.peak_memory_bytes, row.bubble)  # noqa: E731
    for field in ("top", "pareto"):
        assert list(map(key, getattr(loose, field))) == list(map(key, getattr(whole, field))), field


def test_planner_prices_memory_first(monkeypatch):
    """A candidate's memory is priced before its pass times: one whose static bytes plus the least its held
    activations can be exceed the budget is rejected without compute_costs, the tail or a bound; one that fits has
    them."""
    S = importlib.import_module("vp.plan.search")
    hw = replace(PROFILES["a100_80g"], memory_bytes=4.0 * GiB)  # tight: activations reject part of the space
    timed = []
    real = S.compute_costs
    monkeypatch.setattr(S, "compute_costs", lambda run, *a: timed.append(run) or real(run, *a))
    memo, held, by_activations = Memo(), StageCommunicators(), 0
    for run in candidates(PROBLEM):
        if isinstance(run, Rejection):
            continue
        before = len(timed)
        p = price(run, hw, held, memo=memo)
        if isinstance(p, Rejection):
            assert p.reason == MEMORY and not timed[before:] and run not in timed, run
            by_activations += max(S.fixed_bytes(run, hw, S.skeleton(run), held)) <= hw.memory_bytes
        else:
            assert p.costs.compute and p.bound > 0 and p.memory_lo <= hw.memory_bytes * (1 + REL), run
    assert by_activations > 5  # rejected by the bracket of their activations, not by static bytes alone


def test_planner_first_costs_hold_the_tensor_parallel_collectives_and_no_more_than_the_whole_model():
    """A candidate is first priced with each pass's seconds as the whole cost model has them before the CPU time of
    the collectives it launches (its own work and its stage's tensor-parallel collectives: pass_times) and no
    communication between passes: so every time is at most the whole model's, and where tp > 1 the passes are
    longer than their own work (the bound is tighter than from the work alone)."""
    from vp.cost.passes import compute_times, pass_times

    hw, memo, checked = PROFILES["h100"], Memo(), 0
    for run in candidates(Problem(SMALL, 16, 32, methods=("vocab-1", "interleaved", "vhalf-vocab-2"))):
        if isinstance(run, Rejection) or run.tp < 2:
            continue
        sk = skeleton(run)
        first, whole = compute_costs(run, hw, sk, memo), pass_costs(run, hw, sk)
        assert first.compute == pass_times(run, hw, sk) and not first.comm and first.memory == whole.memory, run
        assert all(t <= whole.compute[k] for k, t in first.compute.items()), run
        work = compute_times(run, hw, sk)
        assert any(first.compute[k] > t for k, t in work.items()), run
        checked += 1
    assert checked > 50
