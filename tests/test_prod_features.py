"""Production-run knobs (issue 42): the distributed optimizer (zero 1), overlapped gradient reduction, and their
refusals; multi-process parity against the single-process model (gloo processes, fp32, 1e-5)."""
import subprocess
import sys

import pytest
import torch

from test_mesh_train import assert_cost_model_counts, assert_reference_losses, mesh_cfg, run_mesh
from vp.comm import Comm, make_groups
from vp.config import RunConfig, check_config
from vp.cost import Hardware, pass_costs, tail_s
from vp.cost.data_parallel import exposed_reduce_per_rank, reduce_s
from vp.cost.memory import rank_params, stage_params, static_breakdown, static_bytes
from vp.schedule import build, simulate
from vp.runtime.data_parallel import DataParallel

FP32 = Hardware("fp32", 1.0, bytes_per_param=16.0, act_bytes=4)  # the CPU runs: fp32 weights, gradients, 2 moments
SMALL = 0.002  # MiB per bucket: a few buckets even in the tests' tiny models, parameters straddling them


# every method runs with dp 2 in test_mesh_train through the same DataParallel (zero 0, no overlap); here with zero
# 1 and the overlap: interleaved chunks with the vocabulary layers local, 1F1B with vocabulary passes, V-Half's split
# backward with vocabulary passes (baseline: the grid test below)
FAMILIES = ["interleaved", "vocab-1", "vhalf-vocab-2"]


@pytest.mark.parametrize("method", FAMILIES)
def test_prod_features_zero1_overlap_dp2_x_pp2(pools, method):
    """zero 1 with overlapped, bucketed reduce-scatters trains each method as the single-process model does."""
    cfg = mesh_cfg(method, dp=2, zero=1, overlap_grad_reduce=True, bucket_mb=SMALL)
    results = pools(4).run(run_mesh, cfg)
    assert_reference_losses(results, cfg)
    assert_cost_model_counts(results, cfg)


@pytest.mark.parametrize("knobs", [dict(), dict(zero=1), dict(overlap_grad_reduce=True, bucket_mb=SMALL),
                                   dict(zero=1, bucket_mb=SMALL)])
def test_prod_features_each_knob_alone_dp2_x_pp2(pools, knobs):
    """Each knob alone; and the memory model's parameters, gradients and optimizer states per rank
    (vp.cost.memory.static_breakdown, an fp32 profile) are what each rank held, within 5 %."""
    cfg = mesh_cfg("vhalf-vocab-2", dp=2, **knobs)
    results = pools(4).run(run_mesh, cfg)
    assert_reference_losses(results, cfg)
    assert_cost_model_counts(results, cfg)
    model = static_breakdown(cfg, FP32, build(cfg.method, cfg.pp, cfg.microbatches, cfg.n_chunks))
    for r in results:
        want = model[cfg.mesh.coords(r.rank).p]
        for part, nbytes in want.items():
            assert r.memory_breakdown[part] == pytest.approx(nbytes, rel=0.05), (r.rank, part)
        assert r.memory_breakdown["activations"] > 0


def test_prod_features_zero1_on_dp2_x_2d_grid(pools):
    """A SUMMA grid's replicated parameters (summed over the batch group after the dp reduce-scatter) and its
    vocabulary shards under the distributed optimizer: dp 2 x [2, 2, 1], 8 processes."""
    cfg = mesh_cfg("baseline", pp=1, dp=2, tp=4, tp_mode="2d", micro_batch_size=2, zero=1,
                   overlap_grad_reduce=True, bucket_mb=SMALL)
    results = pools(8).run(run_mesh, cfg)
    assert_reference_losses(results, cfg)
    assert_cost_model_counts(results, cfg)


def _params(seed: int) -> list[torch.nn.Parameter]:
    g = torch.Generator().manual_seed(seed)
    return [torch.nn.Parameter(torch.randn(*shape, generator=g)) for shape in ((7, 5), (13,), (3, 11), (1,))]


def step_twice(rank, world, zero, overlap):
    """Two AdamW steps of a few parameters, each replica's gradients its own; -> the weights, and per step how
    many buckets were launched before finish() (from the gradient hooks)."""
    comm = Comm(make_groups({"dp": [[0, 1]]}, rank), torch.device("cpu"))
    try:
        params = _params(0)
        dp = DataParallel(params, comm, zero, overlap, bucket_mb=40 * 4 / 2**20)  # 40 elements per bucket
        opt = torch.optim.AdamW(dp.step_params, lr=0.1, betas=(0.9, 0.95), weight_decay=0.01)
        early = []
        for it in range(3):
            dp.zero_grad()
            for mb in range(2):  # two microbatches' contributions, each through autograd
                loss = sum(((p * (rank + 1 + it + mb)) ** 2).sum() for p in params)
                loss.backward()
            dp.finish(60.0)
            early.append(dp.early)
            opt.step()
            dp.after_step()
        return [p.detach().clone() for p in params], early
    finally:
        comm.close()


def test_prod_features_zero1_step_gives_the_replicated_weights(pools):
    """The optimizer step under zero 1 (sharded states, reduce-scatter, all-gather) leaves every replica the same
    weights as the replicated optimizer on all-reduced gradients; and AdamW over the summed gradients by hand."""
    plain = pools(2).run(step_twice, 0, False)
    sharded = pools(2).run(step_twice, 1, False)
    for (w0, _), (w1, _) in zip(plain, sharded):
        for a, b in zip(w0, w1):
            torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)
    params = _params(0)
    opt = torch.optim.AdamW(params, lr=0.1, betas=(0.9, 0.95), weight_decay=0.01)
    for it in range(3):
        opt.zero_grad()
        for rank in range(2):
            for mb in range(2):
                sum(((p * (rank + 1 + it + mb)) ** 2).sum() for p in params).backward()
        opt.step()
    for a, b in zip(params, sharded[0][0]):
        torch.testing.assert_close(a.detach(), b, rtol=1e-6, atol=1e-6)


def test_prod_features_overlap_launches_buckets_from_the_hooks(pools):
    """With overlap, after the first iteration (which counts each gradient's accumulations) every bucket is launched
    by the gradient hooks before finish(); without it, none is."""
    for zero in (0, 1):
        (_, early), _ = pools(2).run(step_twice, zero, True)
        n_buckets = -(-sum(p.numel() for p in _params(0)) // 40)
        assert early == [0, n_buckets, n_buckets], early
        (_, early), _ = pools(2).run(step_twice, zero, False)
        assert early == [0, 0, 0]


@pytest.mark.parametrize("change, words", [
    (dict(zero=1), "dp >= 2"),
    (dict(overlap_grad_reduce=True), "dp >= 2"),
    (dict(dp=2, zero=2), r"zero=2 \(sharded gradients\) is not built.*use zero=1"),
    (dict(dp=2, zero=3), "zero=3 is unknown"),
    (dict(dp=2, bucket_mb=0), "bucket_mb=0"),
    (dict(bucket_mb=4.0), "bucket_mb=4.0 sizes the data-parallel reduction's buckets, but dp=1"),
])
def test_prod_features_refusals(change, words):
    with pytest.raises(ValueError, match=words):
        check_config(RunConfig(method="vocab-2", pp=2, **change))


def test_prod_features_cli_refuses_zero_without_dp():
    out = subprocess.run([sys.executable, "-m", "vp.train", "--pp", "2", "--zero", "1"], capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 2 and "zero=1" in out.stderr and "dp >= 2" in out.stderr, out.stderr


def test_prod_features_memory_model_shards_optimizer_states():
    """Zero 1 keeps 1/dp of the optimizer states (fp32 master and moments); weights and gradients stay whole;
    zero 0 is bytes_per_param per parameter as before."""
    hw = Hardware("h", 1.0)  # bf16: 2 + 4 + 12 bytes per parameter
    cfg = RunConfig(method="vocab-2", pp=2, dp=4, layers=4, hidden=64, heads=4, vocab_size=1000)
    sched = build(cfg.method, cfg.pp, cfg.microbatches, cfg.n_chunks)
    n = rank_params(cfg, sched)
    assert static_bytes(cfg, hw, sched) == [k * 18.0 + hw.overhead_bytes for k in n]
    sharded = static_bytes(cfg.with_(zero=1), hw, sched)
    assert sharded == pytest.approx([k * (2 + 4 + 12 / 4) + hw.overhead_bytes for k in n])
    parts = static_breakdown(cfg.with_(zero=1), hw, sched)
    assert [p["optimizer_states"] for p in parts] == pytest.approx([k * 3.0 for k in n])
    assert sum(stage_params(cfg, sched)[0]) + sum(stage_params(cfg, sched)[1]) == sum(n)


def test_prod_features_simulator_prices_the_overlap():
    """The tail after the flush: with overlap, only what the dp stream has left when the rank's pipeline flushes
    (at least the reduction of the gradients made last); dp 1 has no reduction at all."""
    hw = Hardware("slow-dp", 1e12, ib_bandwidth=2e9, link_bandwidth=2e9, gpus_per_node=2)
    cfg = check_config(RunConfig(method="vocab-2", pp=2, dp=2, layers=8, hidden=256, heads=4, seq_len=64,
                                 vocab_size=4096, microbatches=8))
    sched = build(cfg.method, cfg.pp, cfg.microbatches, cfg.n_chunks)
    result = simulate(sched, pass_costs(cfg, hw, sched))
    whole = [reduce_s(cfg, hw, p, n) for p, n in enumerate(rank_params(cfg, sched))]
    over = cfg.with_(overlap_grad_reduce=True, bucket_mb=1.0)  # about 12 buckets per stage
    exposed = exposed_reduce_per_rank(over, hw, sched, result)
    _, shards = stage_params(cfg, sched)
    # each rank's layers become final bucket by bucket during its last B, its vocabulary shard at its last IB (its
    # flush on both ranks here): at least that shard's reduction is exposed, and less than the whole reduction
    for p in range(cfg.pp):
        assert reduce_s(cfg, hw, p, shards[p]) * (1 - 1e-9) <= exposed[p] < 0.6 * whole[p], (p, exposed, whole)
    one = cfg.with_(overlap_grad_reduce=True, bucket_mb=64.0)  # one bucket per stage: final only at B's end
    assert max(exposed_reduce_per_rank(one, hw, sched, result)) > max(exposed)
    assert tail_s(over, hw, sched, result) < tail_s(cfg, hw, sched, result)
    assert tail_s(over, hw, sched) == tail_s(cfg, hw, sched)  # without a timeline, nothing is hidden
    assert exposed_reduce_per_rank(cfg.with_(dp=1), hw, sched, result) == [0.0, 0.0]


def run_mesh_plain_reference(results, cfg):
    """The losses of `cfg` are the plain run's (no recomputation, no dp knobs) on the single-process model."""
    assert_reference_losses(results, cfg.with_(recompute="none", zero=0, overlap_grad_reduce=False))


@pytest.mark.parametrize("method, recompute", [("vhalf-vocab-2", "full"), ("vhalf-vocab-2", "selective"),
                                               ("interleaved-vocab-1", "full")])
def test_prod_features_recompute_pp2(pools, method, recompute):
    """Recomputation on pipelines, V-Half's split backward (B recomputes, W uses what B made) included: the plain
    run's losses; full recomputation holds less than none (the memory meter's peak activations)."""
    cfg = mesh_cfg(method, layers=8 if method.startswith("vhalf") else 8, recompute=recompute)
    results = pools(2).run(run_mesh, cfg)
    run_mesh_plain_reference(results, cfg)
    if recompute == "full":
        plain = pools(2).run(run_mesh, cfg.with_(recompute="none"))
        for kept, whole in zip(results, plain):
            assert kept.memory_breakdown["activations"] < 0.8 * whole.memory_breakdown["activations"]


def test_prod_features_recompute_full_zero1_overlap_on_dp2_x_pp2(pools):
    """Every knob at once on dp 2 x pp 2: the plain run's losses."""
    cfg = mesh_cfg("vhalf-vocab-2", dp=2, zero=1, overlap_grad_reduce=True, bucket_mb=SMALL, recompute="full")
    run_mesh_plain_reference(pools(4).run(run_mesh, cfg), cfg)


@pytest.mark.parametrize("recompute", ["full", "selective"])
def test_prod_features_recompute_pp2_x_tp2(pools, recompute):
    """Recomputed 1-D tensor-parallel layers (their collectives run again inside B): the plain run's losses."""
    cfg = mesh_cfg("vocab-2", tp=2, recompute=recompute)
    run_mesh_plain_reference(pools(4).run(run_mesh, cfg), cfg)


def test_prod_features_recompute_in_the_cost_model():
    """B carries the forward again (full) or the attention core (selective); full keeps one s b h per layer."""
    hw = Hardware("h", 989e12)
    cfg = RunConfig(method="vhalf-vocab-2", pp=4, layers=16, hidden=2048, heads=16, seq_len=2048, vocab_size=32000,
                    microbatches=8)
    sched = build(cfg.method, cfg.pp, cfg.microbatches, cfg.n_chunks)
    costs = {r: pass_costs(cfg.with_(recompute=r), hw, sched) for r in ("none", "selective", "full")}
    b = {r: c.time("B", 0) for r, c in costs.items()}
    assert b["none"] < b["selective"] < b["full"]
    assert b["full"] - b["none"] == pytest.approx(costs["none"].time("F", 0), rel=0.05)
    assert costs["full"].mem("F", 0) == pytest.approx(costs["none"].mem("F", 0) / 17)  # 2 of 34 s b h
    assert costs["selective"].mem("F", 0) == costs["none"].mem("F", 0)
    with pytest.raises(ValueError, match="recompute='some' is unknown"):
        check_config(cfg.with_(recompute="some"))


def test_prod_features_are_hydra_axes_of_a_sim_sweep(tmp_path, monkeypatch):
    """run.zero, run.overlap_grad_reduce and run.recompute are axes a sweep varies (simulated here); the records
    carry them and the modelled memory_breakdown; zero 1 holds fewer optimizer bytes, full recomputation fewer
    activations; zero without dp is refused before anything is submitted."""
    from harness.report.frame import records_frame
    from harness_util import sweep
    from test_harness_runs import records

    monkeypatch.chdir(tmp_path)
    setups = ", ".join(f"{{model: 4b, run.pp: 8, vocab: 32k, run.zero: {z}, run.recompute: {r}}}"
                       for z in (0, 1) for r in ("none", "full"))
    grid = ["experiment=paper_1f1b", "backend=sim", f"grid.setups=[{setups}]",
            "grid.product={run.seq_len: [2048], method: [vocab-2]}", "run.dp=2", "run.overlap_grad_reduce=true"]
    code, lines = sweep(tmp_path, *grid)
    assert code == 0 and "4 jobs" in lines[0], lines
    recs = {(r["config"]["zero"], r["config"]["recompute"]): r["metrics"]["memory_breakdown"][0]
            for r in records(tmp_path, "paper_1f1b")}
    assert recs[(1, "none")]["optimizer_states"] == pytest.approx(recs[(0, "none")]["optimizer_states"] / 2)
    assert recs[(0, "full")]["activations"] < recs[(0, "none")]["activations"]
    # the report's tables tell the runs of one cell apart by the fields that differ (harness.report.frame)
    variants = set(records_frame(records(tmp_path, "paper_1f1b"))["variant"])
    assert variants == {f"recompute={r}, zero={z}" for z in (0, 1) for r in ("none", "full")}, variants
    code, _ = sweep(tmp_path, *grid[:4])  # dp 1
    assert code == 2
