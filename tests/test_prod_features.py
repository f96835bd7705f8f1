"""Production-run knobs (issue 42): the distributed optimizer (zero 1), overlapped gradient reduction, and their
refusals; multi-process parity against the single-process model (gloo processes, fp32, 1e-5)."""
import subprocess
import sys

import pytest
import torch

from test_mesh_train import assert_cost_model_counts, assert_reference_losses, mesh_cfg, run_mesh
from vp.comm import Comm, make_groups
from vp.config import RunConfig, check_config
from vp.runtime.data_parallel import DataParallel

SMALL = 0.002  # MiB per bucket: a few buckets even in the tests' tiny models, parameters straddling them


# one method per schedule family and vocabulary placement (every method runs with dp 2 in test_mesh_train, through
# the same DataParallel): 1F1B with the vocabulary layers local, interleaved chunks, vocabulary passes, V-Half's
# split backward with vocabulary passes, the synchronous algorithm
FAMILIES = ["baseline", "interleaved", "vocab-1", "vhalf-vocab-2", "interlaced"]


@pytest.mark.parametrize("method", FAMILIES)
def test_prod_features_zero1_overlap_dp2_x_pp2(pools, method):
    """zero 1 with overlapped, bucketed reduce-scatters trains each method as the single-process model does."""
    cfg = mesh_cfg(method, dp=2, zero=1, overlap_grad_reduce=True, bucket_mb=SMALL)
    results = pools(4).run(run_mesh, cfg)
    assert_reference_losses(results, cfg)
    assert_cost_model_counts(results, cfg)


@pytest.mark.parametrize("knobs", [dict(zero=1), dict(overlap_grad_reduce=True, bucket_mb=SMALL),
                                   dict(zero=1, bucket_mb=SMALL)])
def test_prod_features_each_knob_alone_dp2_x_pp2(pools, knobs):
    cfg = mesh_cfg("vhalf-vocab-2", dp=2, **knobs)
    results = pools(4).run(run_mesh, cfg)
    assert_reference_losses(results, cfg)
    assert_cost_model_counts(results, cfg)


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
    (dict(dp=2, zero=2), "zero=2 is unknown"),
    (dict(dp=2, bucket_mb=0), "bucket_mb=0"),
])
def test_prod_features_refusals(change, words):
    with pytest.raises(ValueError, match=words):
        check_config(RunConfig(method="vocab-2", pp=2, **change))


def test_prod_features_cli_refuses_zero_without_dp():
    out = subprocess.run([sys.executable, "-m", "vp.train", "--pp", "2", "--zero", "1"], capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 2 and "zero=1" in out.stderr and "dp >= 2" in out.stderr, out.stderr
