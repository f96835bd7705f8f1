"""Sequence parallelism for 1-D tensor parallelism (issue 42, --sequence-parallel): loss parity with the plain run on
pp 2 x tp 2 for every method, with the distributed optimizer and overlapped reduction on dp 2 x tp 2, with full
recomputation; the traffic the cost model predicts is what vp.comm counts; refusals; the cost and memory models."""
import pytest
import torch

from test_mesh_train import assert_cost_model_counts, assert_reference_losses, mesh_cfg, run_mesh
from vp.config import RunConfig, check_config
from vp.cost import Hardware, pass_costs
from vp.cost.memory import static_breakdown
from vp.cost.tensor import rank_tp_collectives
from vp.schedule import build
from vp.schedule.methods import METHODS

FP32 = Hardware("fp32", 1.0, bytes_per_param=16.0, act_bytes=4)  # the CPU runs: fp32 weights, gradients, 2 moments
SMALL = 0.002  # MiB per bucket: several buckets, parameters straddling them


def run_each(rank, world, cfgs):
    """Several runs one after another on the same pool (one start of the processes for all of them)."""
    return [run_mesh(rank, world, cfg) for cfg in cfgs]


def sp_cfg(method: str, **kw) -> RunConfig:
    """mesh_cfg's tiny model, two iterations (one measured), sequence parallel."""
    return mesh_cfg(method, sequence_parallel=True, iterations=2, warmup=1, **kw)


def check_runs(runs, cfgs, memory=False):
    for results, cfg in zip(zip(*runs), cfgs):
        plain = cfg.with_(sequence_parallel=False, zero=0, overlap_grad_reduce=False, recompute="none")
        assert_reference_losses(results, plain)
        if cfg.recompute == "none":  # recomputed layers issue their forward's collectives again in B: not modelled
            assert_cost_model_counts(results, cfg)
        if memory:  # parameters, gradients and optimizer states as the memory model has them, within 5 %
            sched = build(cfg.method, cfg.pp, cfg.microbatches, cfg.n_chunks)
            model = static_breakdown(cfg, FP32, sched)
            for r in results:
                for part, nbytes in model[cfg.mesh.coords(r.rank).p].items():
                    assert r.memory_breakdown[part] == pytest.approx(nbytes, rel=0.05), (cfg.method, r.rank, part)


def test_prod_features_sequence_parallel_every_method_pp2_x_tp2(pools):
    """Every method, its activations and p2p sends [b, s/t, h], trains with the plain run's losses (fp32, 1e-5), and
    sends the bytes the cost model predicts on every channel; the memory model's static parts hold."""
    cfgs = [sp_cfg(m, tp=2) for m in METHODS]
    check_runs(pools(4).run(run_each, cfgs), cfgs, memory=True)


def test_prod_features_sequence_parallel_zero1_overlap_recompute(pools):
    """With the distributed optimizer and overlapped, bucketed reduce-scatters on dp 2 x tp 2 (the LayerNorms'
    gradient shares summed over tp after the dp reduction), and with full recomputation on pp 2 x tp 2 under V-Half's
    split backward: the plain run's losses."""
    cfgs = [sp_cfg("baseline", pp=1, dp=2, tp=2, zero=1, overlap_grad_reduce=True, bucket_mb=SMALL),
            sp_cfg("vhalf-vocab-2", tp=2, recompute="full")]
    check_runs(pools(4).run(run_each, cfgs), cfgs, memory=True)
