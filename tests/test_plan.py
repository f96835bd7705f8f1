"""The planner (vp.plan, harness.plan): its bounds hold against the simulator, its first choices are those of an
exhaustive simulation through backend=sim, rejections carry their reason, a written plan reproduces its figures
through harness.sweep backend=sim, and bad input is refused with what would fit."""
import json
import random
from dataclasses import replace

import pytest

from harness.sim import simulate_job
from vp.config import RunConfig
from vp.cost import PROFILES, GiB
from vp.plan import MEMORY, Problem, Rejection, candidates, search
from vp.plan.space import KNOBS, configuration
from vp.plan.variants import knob_index
from vp.plan.bounds import activation_bounds, makespan_lower_bound
from vp.schedule import Costs, build, simulate
from vp.schedule.methods import METHODS

SMALL = RunConfig(layers=8, hidden=512, heads=8, seq_len=256, vocab_size=32000, device="cuda", dtype="bf16")


def _random_costs(s, rng) -> Costs:
    comp = {(k, st): rng.uniform(0.1, 2) for k in "FBW" for st in range(s.n_stages)}
    if not s.split_w:
        comp.update({("W", st): 0.0 for st in range(s.n_stages)})
    comp.update({(k, None): rng.uniform(0, 1) for k in ("S", "T", "IF", "IB")})
    comm = {k: rng.uniform(0, 0.5) for k in ("C0", "C1", "C2", "IF", "IB", "S", "T")}
    comm.update({("P2P", a, b): rng.uniform(0, 0.3) for a in range(s.pp) for b in range(s.pp) if a != b})
    memory = {("F", st): rng.uniform(1, 3) for st in range(s.n_stages)}
    memory[("S", None)] = rng.uniform(0, 2)
    return Costs(comp, comm, memory)


@pytest.mark.parametrize("method", list(METHODS))
def test_bounds_hold_against_the_simulator(method):
    """Random pass, collective and transfer times: the makespan bound never exceeds the simulated makespan; the
    activation bracket from the generator's order holds the simulated peak; the walk of the built schedule is it."""
    rng = random.Random(method)
    chunks = 2 if METHODS[method].family.chunks == 0 else None
    for pp in (2, 3, 4):
        for m in (pp, 2 * pp, 3 * pp):
            s = build(method, pp, m, chunks)
            skeleton = replace(s, ranks=[])
            for _ in range(3):
                costs = _random_costs(s, rng)
                result = simulate(s, costs)
                assert makespan_lower_bound(skeleton, costs) <= result.makespan * (1 + 1e-12)
                lo, hi = activation_bounds(skeleton, costs)
                exact, _ = activation_bounds(s, costs)
                for r in range(pp):
                    assert exact[r] == pytest.approx(result.peak_activations[r], rel=1e-12)
                    assert lo[r] <= exact[r] * (1 + 1e-12) and exact[r] <= hi[r] * (1 + 1e-12)


def test_bound_is_tight_for_uniform_1f1b():
    """With equal stages and free transfers the bound is 1F1B's makespan, (m + p - 1)(F + B): pruning bites."""
    s = build("baseline", 4, 8)
    costs = Costs({**{("F", st): 1.0 for st in range(4)}, **{("B", st): 2.0 for st in range(4)}})
    assert makespan_lower_bound(replace(s, ranks=[]), costs) == simulate(s, costs).makespan == 33.0


def _exhaustive(problem, hw):
    """Every candidate through harness.sim (what backend=sim records) that fits the device less the plan's margin,
    best first (a tie to the lower knob index): the reference."""
    rows = []
    for c in candidates(problem):
        if isinstance(c, Rejection):
            continue
        rec = simulate_job(c, hw, "x", {})
        peak = max(rec["metrics"]["peak_memory_bytes"])
        if rec["status"] == "ok" and peak <= problem.budget(hw.memory_bytes):
            rows.append((-rec["metrics"]["tokens_per_s"], peak, knob_index(c), c))
    return [(t, m, c) for t, m, _, c in sorted(rows, key=lambda t: t[:3])]


def _top_configurations(ref, k):
    out, seen = [], set()
    for t, m, c in ref:
        if configuration(c) not in seen and len(out) < k:
            seen.add(configuration(c))
            out.append((t, m, c))
    return out


def test_first_choices_equal_an_exhaustive_simulation():
    """With every knob searched: the pruned search's top-k configurations, best per method and Pareto front are those
    of an exhaustive simulation through harness.sim, within the device less the planner's margin."""
    hw = replace(PROFILES["a100_80g"], memory_bytes=4.0 * GiB)  # tight (NCCL buffers included): memory rejects part of the space
    problem = Problem(SMALL, 8, 16, methods=("baseline", "vocab-2", "interleaved", "vhalf-vocab-1", "redis"))
    plan = search(problem, hw, top=5)
    ref = _exhaustive(problem, hw)
    assert plan.rejected.get(MEMORY) and plan.simulated < plan.feasible == len(ref)
    assert {k for _, _, c in ref for k in KNOBS if getattr(c, k) != KNOBS[k][0][0]} == set(KNOBS)  # every knob on
    assert [(r.run, r.tokens_per_s) for r in plan.top] == [(c, -t) for t, _, c in _top_configurations(ref, 5)]
    for method, row in plan.best_per_method.items():
        assert row.tokens_per_s == max(-t for t, _, c in ref if c.method == method)
    front = search(problem, hw, top=5, prune=False).pareto
    assert [r.run for r in plan.pareto] == [r.run for r in front]


def test_rejections_name_their_reason():
    base = SMALL.with_(layers=6, heads=6, hidden=384)
    plan = search(Problem(base, 8, 8, methods=("baseline", "interleaved")), replace(
        PROFILES["a100_80g"], memory_bytes=2.2 * GiB), top=3)
    for reason in ("layers not divisible over the stages (pp x chunks)", "microbatches < pp",
                   "heads, hidden or ffn not divisible over tp", MEMORY):
        assert plan.rejected.get(reason), (reason, plan.rejected)
    assert "use a multiple of" in plan.examples["layers not divisible over the stages (pp x chunks)"]
    assert sum(plan.rejected.values()) + plan.feasible + plan.undecided == plan.candidates
    assert plan.closest and all(r.excess > 0 for r in plan.closest)


def test_fixed_axes_are_kept():
    plan = search(Problem(SMALL, 8, 16, fixed={"method": "vocab-2", "tp": 2}), PROFILES["a100_80g"], top=3)
    assert plan.rows and all(r.run.method == "vocab-2" and r.run.tp == 2 for r in plan.rows)


def test_plan_writes_an_experiment_that_the_sweep_reproduces(user_conf, capsys):
    """plan.json=true prints the summary; the experiment file's jobs, through harness.sweep backend=sim, are the
    plan's RunConfigs and reproduce its tokens/s."""
    from harness import plan as P
    from harness_util import records, sweep

    code = P.run(["model=tiny", "vocab=8k", "hardware=a100_80g", "plan.gpus=4", "plan.global_batch=8",
                  "run.seq_len=128", "plan.top=2", "plan.json=true", "plan.name=t",
                  "plan.methods=[baseline,vocab-2,interleaved,vhalf]"])
    assert code == 0
    data = json.loads(capsys.readouterr().out)
    assert {"candidates", "feasible", "seconds", "rejected", "top", "best_per_method", "experiment_file"} <= set(data)
    assert data["experiment_file"] == str(user_conf / "conf" / "experiment" / "plan_t.yaml")
    assert (user_conf / "plans" / "plan_t" / "pareto.png").stat().st_size > 0
    assert sweep(user_conf, "experiment=plan_t", "backend=sim")[0] == 0
    done = records(user_conf, "plan_t")
    rows = data["top"] + list(data["best_per_method"].values())
    assert len(done) == len({tuple(r["overrides"]) for r in rows})
    for row in rows:
        match = [r for r in done if all(r["config"][k] == row[k] for k in
                                           ("method", "dp", "pp", "tp", "tp_mode", "micro_batch_size", "chunks",
                                            *KNOBS))]
        assert match and match[0]["metrics"]["tokens_per_s"] == row["tokens_per_s"], row
        assert max(match[0]["metrics"]["peak_memory_bytes"]) == row["peak_memory_bytes"]


def test_bad_input_says_what_would_fit(user_conf, capsys):
    from harness import plan as P

    common = ["model=tiny", "vocab=8k", "run.seq_len=128", "plan.global_batch=8"]
    assert P.run(common + ["plan.gpus=7"]) == 1
    assert "plan.gpus=7 is prime" in capsys.readouterr().err
    assert P.run(["model=30b", "vocab=256k", "hardware=a100_80g", "run.seq_len=4096", "plan.gpus=4",
                  "plan.global_batch=8", "method=baseline"]) == 1  # 8 fit with full recomputation
    err = capsys.readouterr().err
    assert "needs" in err and "GiB more" in err and "plan.gpus=8" in err
    assert P.run(common) == 2
    assert "plan.gpus is not set" in capsys.readouterr().err
    assert P.run(common + ["plan.gpus=4", "method=baseline,vocab-2"]) == 2
    assert "searches the axes itself" in capsys.readouterr().err
    assert P.run(common + ["plan.gpus=4", "plan.figures=/proc/nope"]) == 2  # refused before the search
    assert "plan.figures=/proc/nope/plan_" in capsys.readouterr().err
    assert not (user_conf / "conf").exists()  # nothing written by a refused or empty plan


def test_plan_check_says_which_profile_it_needs(user_conf, capsys):
    from harness import plan_check

    assert plan_check.main([]) == 2
    err = capsys.readouterr().err
    assert "calibrate --measure" in err and "HARDWARE=NAME" in err
    assert plan_check.main(["--hardware", "nosuchbox"]) == 2
    assert "Could not find 'hardware/nosuchbox'" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        plan_check.main(["--bottom", "-1"])
    assert "--bottom 0 or more" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        plan_check.main(["--rounds", "0"])
    assert "--rounds 0: every plan runs at least once" in capsys.readouterr().err
    rows = list(range(10))
    assert plan_check.pick(rows, 5, 2) == [0, 1, 2, 3, 4, 8, 9]
    assert plan_check.pick(rows, 5, 0) == [0, 1, 2, 3, 4]  # was every row: rows[-0:] is the whole list
    assert plan_check.pick(rows, 3, 2, first=[0, 4, 9]) == [0, 4, 9, 8]  # the top configurations, none twice


def test_plan_check_gathers_each_plans_runs_over_its_rounds(tmp_path):
    """One tokens/s per round and plan from the records that ended ok (a failed run counts in no round; of two
    records of one plan in a round, the newest)."""
    import json

    from harness.plan_check import measured_rounds

    def record(r, name, method, status, tokens):
        folder = tmp_path / f"round{r}" / "plan_x"
        folder.mkdir(parents=True, exist_ok=True)
        config = {"method": method, "dp": 1, "pp": 4, "tp": 1, "tp_mode": "1d", "tp_depth": 1, "micro_batch_size": 2,
                  "chunks": 1, "redis_last_layers": None}
        (folder / f"{name:0>12}.json").write_text(json.dumps({"status": status, "config": config,
                                                              "metrics": {"tokens_per_s": tokens}}))

    record(1, "a", "vocab-1", "ok", 500.0)
    record(2, "a", "vocab-1", "ok", 700.0)
    record(1, "b", "baseline", "ok", 300.0)
    record(1, "c", "vocab-1", "ok", 100.0)  # left by an earlier check in round 1: older than "a"
    import os
    os.utime(tmp_path / "round1" / "plan_x" / f"{'c':0>12}.json", (1, 1))
    record(2, "b", "baseline", "failed", 0.0)
    (tmp_path / "round2" / "plan_x" / "notes.json").write_text("{}")  # not a record's name
    got = measured_rounds(tmp_path, 2, "plan_x")
    off = tuple(values[0] for values, _ in KNOBS.values())  # records without knob fields: every knob off
    assert got == {("vocab-1", 1, 4, 1, "1d", 1, 2, 1, None, *off): [500.0, 700.0],
                   ("baseline", 1, 4, 1, "1d", 1, 2, 1, None, *off): [300.0]}
    assert measured_rounds(tmp_path, 1, "plan_x")[("vocab-1", 1, 4, 1, "1d", 1, 2, 1, None, *off)] == [500.0]


def test_spearman_of_ranks():
    from harness.plan_check import spearman

    assert spearman([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert spearman([1, 2, 3, 4], [40, 30, 20, 10]) == pytest.approx(-1.0)


@pytest.mark.parametrize("method", sorted(METHODS))
def test_communicators_do_not_depend_on_the_microbatch_count(method):
    """What lets the planner count NCCL buffers from the smallest schedule of a kind (vp.plan.memo.StageCommunicators:
    fewest_microbatches, below what a run needs)."""
    from vp.channels import rank_communicators
    from vp.plan.memo import fewest_microbatches

    for pp in (2, 4, 8):
        fewest = fewest_microbatches(method, pp)
        runs = [RunConfig(method=method, pp=pp, microbatches=m, layers=16) for m in (fewest, pp, 2 * pp, 3 * pp)]
        held = [rank_communicators(r, build(method, pp, r.microbatches, r.n_chunks)) for r in runs]
        assert held[0] == held[1] == held[2] == held[3]
        assert fewest == (pp if "interleaved" in method else 1)


@pytest.mark.parametrize("method", sorted(METHODS))
def test_communicators_of_replica_0_are_the_same_for_every_dp_above_1(method):
    """What lets the planner count NCCL buffers of a mesh with dp > 1 from its dp = 2 form (vp.plan.search)."""
    from vp.channels import rank_communicators

    for tp, mode, depth in ((1, "1d", 1), (4, "2d", 1), (2, "1d", 1), (8, "2.5d", 2)):
        base = RunConfig(method=method, pp=4, microbatches=4, layers=8, tp=tp, tp_mode=mode, tp_depth=depth, heads=8,
                         hidden=64)
        sched = build(method, 4, 4, base.n_chunks)
        held = []
        for dp in (2, 3, 4):
            run = replace(base, dp=dp)
            world = rank_communicators(run, sched)
            device0 = [run.mesh.rank(0, p, 0) for p in range(4)]
            held.append(tuple(world[r] for r in device0))
            some = device0 + [run.world - 1]  # what the planner asks: a few ranks' alone, counted the same
            assert rank_communicators(run, sched, some) == {r: world[r] for r in some}
        assert held[0] == held[1] == held[2]
        one = rank_communicators(base, sched)
        assert tuple(one[p * tp] for p in range(4)) != held[0]  # dp = 1 holds no gradient all-reduce: kept apart


def test_the_simulation_cache_tells_apart_costs_that_share_cores_differently():
    """Two candidates with the same pass times but a different split of a node's cores (devices per pipeline rank)
    simulate differently (vp.schedule.sharing), so the planner's cache key holds the sharing too."""
    from vp.plan.search import _costs_key
    from vp.schedule import Costs
    from vp.schedule.sharing import Sharing

    base = dict(compute={("F", 0): 1.0}, comm={}, memory={})
    keys = {_costs_key(Costs(**base)), _costs_key(Costs(**base, sharing=Sharing(2.0, 1.0))),
            _costs_key(Costs(**base, sharing=Sharing(2.0, 2.0)))}
    assert len(keys) == 3 and _costs_key(Costs(**base, sharing=Sharing(2.0, 2.0))) in keys
    # equal costs filled in another order share the key; other costs do not
    one, other = {("F", 0): 1.0, ("B", None): 2.0, "P2P": 0.5}, {"P2P": 0.5, ("B", None): 2.0, ("F", 0): 1.0}
    assert _costs_key(Costs(one, one, one)) == _costs_key(Costs(other, other, other))
    assert _costs_key(Costs(one, one, one)) != _costs_key(Costs(one, {**one, "P2P": 0.25}, one))
