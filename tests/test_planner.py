"""The planner's answers with the production knobs (issue 43): the knobs as axes, what their variants share and
when one dominates another, the device's capacity less the margin and each row's headroom, the bound's rounding
tolerance, and the simulated peak checked again. Names carry `planner`."""
import importlib
import math
import random
from dataclasses import replace

import pytest

from harness.sim import simulate_job
from vp.config import RunConfig
from vp.cost import PROFILES, GiB, pass_costs
from vp.cost.profiles import H100_TOTAL_MIB, check_profile
from vp.plan import Problem, Rejection, candidates, search
from vp.plan.bounds import makespan_lower_bound
from vp.plan.space import KNOBS, configuration
from vp.plan.memo import Memo
from vp.plan.variants import dominates
from vp.schedule import Costs, build, simulate

S = importlib.import_module("vp.plan.search")  # the module (vp.plan exports its search function under that name)
SMALL = RunConfig(layers=8, hidden=512, heads=8, seq_len=256, vocab_size=32000, device="cuda", dtype="bf16")
HW = replace(PROFILES["a100_80g"], memory_bytes=4.0 * GiB)  # tight: memory decides part of the space


def test_planner_searches_each_knob_where_it_applies():
    runs = [c for c in candidates(Problem(SMALL, 8, 16, methods=("baseline", "vocab-2")))
            if not isinstance(c, Rejection)]
    for run in runs:
        if run.dp == 1:
            assert not run.zero and not run.overlap_grad_reduce
        if "sequence_parallel" in KNOBS and (run.tp == 1 or run.tp_mode != "1d"):
            assert not run.sequence_parallel
    replicated = {(r.zero, r.overlap_grad_reduce, r.recompute) for r in runs if r.dp > 1}
    assert len(replicated) == 2 * 2 * 3  # every combination where dp > 1
    assert {r.recompute for r in runs if r.dp == 1} == {"none", "selective", "full"}
    fixed = [c for c in candidates(Problem(SMALL, 8, 16, fixed={"zero": 1, "recompute": "full"},
                                           methods=("baseline",)))]
    runs = [c.run if isinstance(c, Rejection) else c for c in fixed]
    assert all(r.zero == 1 and r.recompute == "full" for r in runs if r is not None)
    refused = [c for c in fixed if isinstance(c, Rejection) and c.run is not None and c.run.dp == 1]
    assert any(c.reason == "zero without data parallelism (dp = 1)" for c in refused)


def test_planner_knob_variants_share_only_what_the_cost_model_shares():
    """The figures priced once per search for the knob variants (vp.plan.memo) are those of pricing each variant
    alone."""
    held, memo = S.StageCommunicators(), Memo()
    runs = [c for c in candidates(Problem(SMALL, 8, 16, methods=("baseline", "vocab-2", "vhalf")))
            if not isinstance(c, Rejection)]
    rng = random.Random(43)
    for run in rng.sample(runs, 60):
        got, alone = S.price(run, HW, held, memo=memo), S.price(run, HW, held)
        if isinstance(alone, Rejection):
            assert isinstance(got, Rejection) and got.message == alone.message
            continue
        assert (got.static, got.costs, got.tail, got.bound) == (alone.static, alone.costs, alone.tail, alone.bound)
        assert S.full_costs(got, HW, memo) == pass_costs(run, HW, S.skeleton(run))


def test_planner_dominated_variants_are_no_faster_and_no_smaller():
    """Where dominates(y, x) says so, harness.sim finds y at least as fast as x with no more peak memory."""
    held = S.StageCommunicators()
    by_config: dict = {}
    for c in candidates(Problem(SMALL, 8, 16, methods=("baseline", "vocab-2", "vhalf"))):
        if isinstance(c, Rejection):
            continue
        p = S.price(c, PROFILES["a100_80g"], held)
        p.costs = pass_costs(c, PROFILES["a100_80g"], p.skeleton)
        by_config.setdefault(configuration(c), []).append(p)
    pairs = [(y, x) for group in by_config.values() for y in group for x in group if dominates(y, x)]
    assert len(pairs) > 10 and {x.run.recompute for _, x in pairs} >= {"selective"}
    for y, x in random.Random(1).sample(pairs, 10):
        a, b = (simulate_job(p.run, PROFILES["a100_80g"], "x", {})["metrics"] for p in (y, x))
        assert a["tokens_per_s"] >= b["tokens_per_s"] and max(a["peak_memory_bytes"]) <= max(b["peak_memory_bytes"])


def test_planner_keeps_the_margin_and_shows_headroom():
    problem = Problem(SMALL, 8, 16, methods=("baseline", "vocab-2"), memory_margin=0.1)
    plan = search(problem, HW, top=5)
    assert plan.rows and plan.budget == pytest.approx(0.9 * HW.memory_bytes)
    for row in plan.rows:
        assert row.peak_memory_bytes <= plan.budget
        assert row.headroom_bytes == HW.memory_bytes - row.peak_memory_bytes and row.headroom >= 0.1
    loose = search(replace(problem, memory_margin=0.0), HW, top=5)
    assert max(r.peak_memory_bytes for r in loose.rows) > plan.budget  # the margin turned plans away
    for bad in (-0.1, 1.0, True, "5%"):
        with pytest.raises(ValueError, match="plan.memory_margin"):
            replace(problem, memory_margin=bad)


def test_planner_profiles_carry_the_capacity_torch_reports():
    assert PROFILES["h100"].memory_bytes == H100_TOTAL_MIB * 2**20 < 80 * GiB
    assert PROFILES["h200"].memory_bytes < 141 * GiB
    with pytest.raises(ValueError, match="memory_bytes=.* is not above overhead_bytes"):
        check_profile({**PROFILES["h100"].to_dict(), "memory_bytes": 1.0 * GiB})


def test_planner_bound_above_the_makespan_by_rounding_still_enters():
    """Uniform 1F1B with F = B = 0.7: the bound sums the same passes in another order and exceeds the simulated
    makespan by a rounding error; the race compares with a relative tolerance, so the candidate is simulated."""
    s = build("baseline", 4, 8)
    costs = Costs({**{("F", st): 0.7 for st in range(4)}, **{("B", st): 0.7 for st in range(4)}})
    bound, makespan = makespan_lower_bound(replace(s, ranks=[]), costs), simulate(s, costs).makespan
    assert makespan < bound <= makespan * (1 + S.REL)
    run = SMALL.with_(method="baseline", pp=4, microbatches=8)
    tokens = run.microbatches * run.micro_batch_size * run.seq_len
    race = S._Race(1)
    race.add(S.Row(run, tokens / makespan, 0.5, makespan, 1.0, 0, 0.0))
    twin = S._Priced(run.with_(recompute="selective"), s, costs, [1.0] * 4, 0.0, [0.0] * 4, [0.0] * 4,
                     tokens / bound)
    assert twin.bound < tokens / makespan and race.could_enter(twin)


def test_planner_drops_a_plan_whose_simulated_peak_exceeds_the_budget(monkeypatch):
    """Where the activation bracket said a plan fits and its simulation says it does not, the plan is dropped and
    the reason shown."""
    from vp.plan import bounds

    def low(s, costs):
        lo, hi = bounds.activation_bounds(s, costs)
        return [0.0] * len(lo), [0.0] * len(hi)

    monkeypatch.setattr(S, "activation_bounds", low)
    plan = search(Problem(SMALL, 8, 16, methods=("baseline", "vocab-2")), HW, top=5)
    assert plan.rejected.get(S.SIMULATED_MEMORY)
    assert "simulated peak memory" in plan.examples[S.SIMULATED_MEMORY]
    assert all(r.peak_memory_bytes <= plan.budget for r in plan.rows)


def test_planner_rows_are_what_backend_sim_records_with_every_knob():
    """Each knob's rows, the overlapped gradient reduction's included (its tail from the simulated iteration), have
    the tokens/s and peak memory harness.sim records for the same RunConfig, to the last bit."""
    plan = search(Problem(SMALL, 8, 16, methods=("baseline", "vocab-2")), PROFILES["a100_80g"], top=3, prune=False)
    picked = {}
    for row in plan.rows:
        r = row.run
        picked.setdefault((r.zero, r.overlap_grad_reduce, r.recompute), row)
    assert len(picked) == 12
    # why overlap_grad_reduce is not pruned by rule: one bucket's latency each makes it slower where little overlaps
    by = {(configuration(r.run), r.run.zero, r.run.recompute, r.run.overlap_grad_reduce): r for r in plan.rows}
    gain = [r.tokens_per_s - by[k[:3] + (False,)].tokens_per_s for k, r in by.items() if k[3] and k[:3] + (False,) in by]
    assert min(gain) < 0 < max(gain)
    for row in picked.values():
        rec = simulate_job(row.run, PROFILES["a100_80g"], "x", {})["metrics"]
        assert rec["tokens_per_s"] == row.tokens_per_s and max(rec["peak_memory_bytes"]) == row.peak_memory_bytes


def test_planner_prints_and_writes_each_rows_knobs_and_headroom(user_conf, capsys):
    """The table shows the knobs and headroom; the JSON rows and the experiment file's setups carry every knob."""
    import json

    from harness import plan as P

    argv = ["model=tiny", "vocab=8k", "hardware=h100", "plan.gpus=4", "plan.global_batch=8", "run.seq_len=128",
            "plan.top=3", "plan.name=k", "plan.methods=[baseline,vocab-2]", "plan.memory_margin=0.1"]
    assert P.run(argv) == 0
    out = capsys.readouterr().out
    assert "| knobs |" in out and "| headroom GiB (%) |" in out and "plans within" in out
    assert P.run(argv + ["plan.json=true", "run.zero=1"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["memory_budget_bytes"] == pytest.approx(0.9 * PROFILES["h100"].memory_bytes)
    for row in data["top"]:
        assert row["zero"] == 1 and row["dp"] > 1 and 0.1 <= row["headroom"] < 1
        assert {f"run.{k}={row[k]}" for k in KNOBS} <= set(row["overrides"])
    text = (user_conf / "conf" / "experiment" / "plan_k.yaml").read_text()
    assert "run.recompute:" in text and "run.overlap_grad_reduce:" in text and "knobs zero1" in text
    assert P.run(argv + ["plan.memory_margin=1.5"]) == 2
    assert "plan.memory_margin=1.5 is out of range" in capsys.readouterr().err


def test_planner_transfers_hold_the_receiver_only():
    """The simulator's rule for a pipeline transfer, which the runtime's rendezvous point-to-point follows
    (docs/planner.md; scripts/p2p-late-receive.py): a send takes no time on its rank, and a receive reached long
    after its send still takes the whole transfer."""
    s = build("baseline", 2, 4)
    costs = Costs({**{("F", st): 1.0 for st in range(2)}, **{("B", st): 2.0 for st in range(2)}}, {"P2P": 0.5})
    result = simulate(s, costs)
    sent = {}
    for actions, starts, ends in result.spans:
        for a, start, end in zip(actions, starts, ends):
            if a.kind in ("SF", "SB"):
                assert end == start
                sent[(a.kind[1], a.mb)] = start
    late = 0
    for actions, starts, ends in result.spans:
        for a, start, end in zip(actions, starts, ends):
            if a.kind in ("RF", "RB"):
                assert end == pytest.approx(max(start, sent[(a.kind[1], a.mb)]) + 0.5)
                late += start > sent[(a.kind[1], a.mb)] + 0.5
    assert late  # some receives come long after their send, and still wait the transfer


@pytest.mark.parametrize("base,fixed", [
    (SMALL, {}),
    (SMALL.with_(seq_len=250, recompute="full", zero=1), {}),  # SP refused where 250 % tp; a base's knobs overridden
    (SMALL, {"zero": 1}), (SMALL, {"sequence_parallel": True}), (SMALL, {"overlap_grad_reduce": True}),
])
def test_planner_space_checks_a_configuration_once_for_its_knob_variants(base, fixed):
    """The space checks each configuration once and each knob variant's own checks only (vp.config.check_knobs):
    every candidate, refused or not, with its reason and message, is what the full checks give it alone,
    including the variants whose knobs are refused (a fixed knob where it does not apply)."""
    from vp.plan.space import check

    problem = Problem(base, 16, 16, fixed=fixed, methods=("baseline", "vocab-2", "interleaved-vocab-1", "redis"))
    reasons = set()
    for c in candidates(problem):
        run = c.run if isinstance(c, Rejection) else c
        alone = check(problem, run)
        if isinstance(c, Rejection):
            assert isinstance(alone, Rejection) and alone == c, (c, alone)
            reasons.add(c.reason)
        else:
            assert alone is run
    assert len(reasons) >= 3 and ("zero" in str(reasons)) == ("zero" in fixed)


def test_planner_costs_mems_and_times_are_mem_and_time_of_each_stage():
    """Costs.mems and Costs.times (what the bounds read at once) are Costs.mem and Costs.time stage by stage,
    defaults and W included."""
    rng = random.Random(7)
    for _ in range(50):
        memory = {(k, st): rng.uniform(-1e9, 1e9) for k in "FBS" for st in range(6) if rng.random() < 0.5}
        memory.update({(k, None): rng.uniform(0, 1e9) for k in "FBS" if rng.random() < 0.3})
        costs = Costs(dict(memory), {}, memory)
        for kind in "FBWS":
            assert costs.mems(kind, range(6)) == [costs.mem(kind, st) for st in range(6)]
            assert costs.times(kind, range(6)) == [costs.time(kind, st) for st in range(6)]


def test_planner_race_pareto_check_is_every_row_so_far():
    """The race's Pareto front is a staircase (memory and tokens/s both rising) of the rows added so far that no other
    is as fast with no more memory, and its check (by bisection) says a candidate could enter exactly where no row
    added so far is at least as fast as its bound with no more memory than its least, ties and repeats included."""
    rng = random.Random(3)
    sizes = []
    for _ in range(60):  # races of a dozen rows, on few values (ties) and some of any value
        race, rows = S._Race(1), []
        for _ in range(12):
            mem = rng.choice((1.0, 2.0, 3.0, 4.0, rng.uniform(0, 4)))
            tps = rng.choice((1.0, 2.0, 3.0, 4.0, rng.uniform(0, 4)))
            row = S.Row(SMALL, tps, 0.0, 1.0, mem, 0, 0.0)
            race.add(row)
            race.best_k, race.by_method = {None: math.inf}, {SMALL.method: math.inf}  # the front alone decides
            rows.append(row)
            points = {(r.peak_memory_bytes, r.tokens_per_s) for r in rows}
            front = sorted(p for p in points if not any(q != p and q[0] <= p[0] and q[1] >= p[1] for q in points))
            assert list(zip(race.front_mem, race.front_tps)) == front  # memory and tokens/s both rising
            for _ in range(5):
                lo, bound = rng.choice((mem, rng.uniform(0, 4))), rng.choice((tps, rng.uniform(0, 4)))
                c = S._Priced(SMALL, None, None, [lo], 0.0, [0.0], [0.0], bound)
                brute = not any(r.tokens_per_s >= bound * (1 + S.REL) and r.peak_memory_bytes <= lo * (1 - S.REL)
                                for r in rows)
                assert race.could_enter(c) == brute, (rows, lo, bound)
        sizes.append(len(front))
    assert max(sizes) > 3
