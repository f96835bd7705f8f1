"""Every method on a dp x pp x tp mesh trains like the single-process model (real gloo processes)."""
import pytest
import torch

from vp.channels import channels
from vp.comm import Comm, make_groups
from vp.config import RunConfig, check_config
from vp.metrics import replica_sum
from vp.reference import train_reference
from vp.run import train_rank
from vp.cost import rank_params, traffic
from vp.cost.tensor import rank_tp_collectives
from vp.schedule import build
from vp.schedule.methods import METHODS


def mesh_cfg(method: str, **kw) -> RunConfig:
    """One transformer layer per stage (per chunk of a stage): parity with the single-process model, the traffic
    per channel and the parameters per rank are claims of the mesh, whatever the depth, and every layer adds a round
    of tensor-parallel collectives to each run (most of these tests' CPU on 2 cores). redis keeps two per stage, so
    that it has a layer to move off the last stage."""
    chunks = METHODS[method].family.chunks or 2
    base = dict(method=method, pp=2, layers=2 * chunks * (2 if method == "redis" else 1), hidden=32, heads=2, seq_len=8, vocab_size=203,
                microbatches=4, iterations=3, warmup=1)
    return check_config(RunConfig(**{**base, **kw}))


ONCE = ("dep", "batch")  # a grid's channels used once per iteration: replicated gradients, the loss


def run_mesh_counting(rank, world, cfg):
    """This rank's measurements, and the calls per iteration its Comm made on the grid's once-per-iteration
    channels."""
    comm = Comm(make_groups(channels(cfg), rank), torch.device("cpu"))
    try:
        measured = train_rank(cfg, rank, comm, torch.device("cpu"))
        return measured, {ch: n / cfg.iterations for (ch, _), n in comm.calls.items() if ch in ONCE}
    finally:
        comm.close()


def run_mesh(rank, world, cfg):
    return run_mesh_counting(rank, world, cfg)[0]


def assert_once_per_iteration_calls(counted, cfg):
    """The cost model's calls on those channels are the runtime's: every stage's replicated gradients of a channel
    in one flat buffer, the vocabulary shards' in another, the loss once (vp.cost.tensor.rank_tp_collectives)."""
    sched = build(cfg.method, cfg.pp, cfg.microbatches, cfg.n_chunks)
    for (measured, calls) in counted:
        model: dict = {}
        for c in rank_tp_collectives(cfg, sched, cfg.mesh.coords(measured.rank).p):
            if c.channel in ONCE:
                model[c.channel] = model.get(c.channel, 0) + c.calls
        assert calls == model, (measured.rank, calls, model)


def assert_reference_losses(results, cfg):
    ref, _ = train_reference(cfg)
    torch.testing.assert_close(torch.tensor(replica_sum(results)), torch.tensor(ref), rtol=1e-5, atol=0)


def assert_cost_model_counts(results, cfg):
    """The cost model's bytes per channel (pipeline, vocabulary and tensor-parallel ones, from vp.tp.traffic's
    closed form) and parameters per device are what each rank's Comm counted and its model holds."""
    sched = build(cfg.method, cfg.pp, cfg.microbatches, cfg.n_chunks)
    pipeline_rank = [cfg.mesh.coords(r.rank).p for r in results]
    sent, params = traffic(cfg, sched), rank_params(cfg, sched)
    assert [r.bytes_by_channel for r in results] == [sent[p] for p in pipeline_rank]
    assert [r.parameters for r in results] == [params[p] for p in pipeline_rank]


@pytest.mark.parametrize("method", list(METHODS))
def test_every_method_on_pp2_x_tp2(pools, method):
    """Tensor-parallel (1-D) stages inside every schedule; the vocabulary-parallel methods split the vocabulary
    over the 4 pipeline x tensor ranks (shard p * tp + t)."""
    cfg = mesh_cfg(method, tp=2)
    results = pools(4).run(run_mesh, cfg)
    assert_reference_losses(results, cfg)
    assert_cost_model_counts(results, cfg)


@pytest.mark.parametrize("method", list(METHODS))
def test_every_method_on_dp2_x_pp2(pools, method):
    cfg = mesh_cfg(method, dp=2)
    results = pools(4).run(run_mesh, cfg)
    assert_reference_losses(results, cfg)
    assert_cost_model_counts(results, cfg)


@pytest.mark.parametrize("method", ["baseline", "vocab-2"])
def test_pp2_x_2d_grid(pools, method):
    """SUMMA stages on [2, 2, 1]: the micro-batch split over grid rows, the vocabulary over pp x grid columns."""
    cfg = mesh_cfg(method, tp=4, tp_mode="2d", micro_batch_size=2)
    counted = pools(8).run(run_mesh_counting, cfg)
    results = [measured for measured, _ in counted]
    assert_reference_losses(results, cfg)
    assert_cost_model_counts(results, cfg)
    assert_once_per_iteration_calls(counted, cfg)


def test_pp2_x_25d_grid_with_vocabulary_parallelism(pools):
    """16 processes: 2.5-D [2, 2, 2] stages (the batch split over 4 token blocks, weights reduced over depth)
    in a vocab-2 pipeline, vocabulary shards over pipeline ranks x grid columns."""
    cfg = mesh_cfg("vocab-2", tp=8, tp_mode="2.5d", tp_depth=2, micro_batch_size=4, microbatches=2)
    counted = pools(16).run(run_mesh_counting, cfg)
    results = [measured for measured, _ in counted]
    assert_reference_losses(results, cfg)
    assert_cost_model_counts(results, cfg)
    assert_once_per_iteration_calls(counted, cfg)


def test_vocabulary_shards_over_pp_x_tp_balance_memory(pools):
    """A vocabulary-heavy model on pp 2 x tp 2: vocab-2's four ranks hold a quarter of each vocabulary matrix and
    stay within 15% of each other; baseline's last stage holds the output layer and its logits."""
    sizes = dict(layers=4, hidden=32, heads=2, seq_len=64, micro_batch_size=2, vocab_size=8000, iterations=1,
                 warmup=0, tp=2)
    peaks = {m: [r.peak_memory_bytes for r in pools(4).run(run_mesh, mesh_cfg(m, **sizes))]
             for m in ("baseline", "vocab-2")}
    assert max(peaks["vocab-2"]) / min(peaks["vocab-2"]) < 1.15, peaks
    assert min(peaks["baseline"][2:]) > 1.3 * max(peaks["baseline"][:2]), peaks
