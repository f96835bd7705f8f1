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
from vp.bench.sequence import modelled_activations

FP32 = Hardware("fp32", 1.0, bytes_per_param=16.0, act_bytes=4)  # the CPU runs: fp32 weights, gradients, 2 moments
SMALL = 0.002  # MiB per bucket: several buckets, parameters straddling them


def run_each(rank, world, cfgs):
    """Several runs one after another on the same pool (one start of the processes for all of them)."""
    return [run_mesh(rank, world, cfg) for cfg in cfgs]


def sp_cfg(method: str, **kw) -> RunConfig:
    """mesh_cfg's tiny model, sequence parallel; two iterations (the second's loss after one optimizer step)."""
    return mesh_cfg(method, **{"sequence_parallel": True, "iterations": 2, "warmup": 1, **kw})


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
    """Every method, its activations and p2p sends [b, s/t, h], gives the plain run's loss (fp32, 1e-5) and sends the
    bytes the cost model predicts on every channel; the memory model's static parts hold. One iteration each, for
    the suite's time: the gradients of every part (the deferred all-gathers of a split backward, the sums of the
    sequence-sharded parameters' shares) are checked through the optimizer step by the two-iteration runs below.
    Three of them (the synchronous output layer, split backward and chunks with vocabulary passes) under NCCL's
    rules on gloo (emulate_nccl): the new collectives keep one order on every device of a group."""
    emulated = ("interlaced", "vhalf-vocab-2", "interleaved-vocab-1")
    cfgs = [sp_cfg(m, tp=2, iterations=1, warmup=0, emulate_nccl="all" if m in emulated else None) for m in METHODS]
    check_runs(pools(4).run(run_each, cfgs), cfgs, memory=True)


def test_prod_features_sequence_parallel_zero1_overlap_recompute_memory(pools):
    """With the distributed optimizer and overlapped, bucketed reduce-scatters on dp 2 x tp 2 (the LayerNorms'
    gradient shares summed over tp after the dp reduction), and with full recomputation on pp 2 x tp 2 under V-Half's
    split backward with two sequences per micro-batch: the plain run's losses. And on a model whose layers outweigh
    its output layer, the activations the memory meter holds shrink with sequence parallelism as the memory model
    says (34 s b h / t per layer against 10 s b h + 24 s b h / t), within 5 % on every rank, as a ratio and as the
    sequence-parallel run's own figure."""
    sizes = dict(hidden=64, heads=4, seq_len=32, vocab_size=500)
    cfgs = [sp_cfg("baseline", pp=1, dp=2, tp=2, zero=1, overlap_grad_reduce=True, bucket_mb=SMALL),
            sp_cfg("vhalf-vocab-2", tp=2, recompute="full", micro_batch_size=2), sp_cfg("vocab-1", tp=2, **sizes)]
    runs = pools(4).run(run_each, cfgs + [cfgs[-1].with_(sequence_parallel=False)])
    check_runs([r[:3] for r in runs], cfgs, memory=True)
    sp, plain = cfgs[-1], cfgs[-1].with_(sequence_parallel=False)
    model = {c.sequence_parallel: modelled_activations(c) for c in (sp, plain)}
    for with_sp, without in (r[2:] for r in runs):
        p = sp.mesh.coords(with_sp.rank).p
        measured = with_sp.memory_breakdown["activations"] / without.memory_breakdown["activations"]
        assert measured < 0.9
        assert measured == pytest.approx(model[True][p] / model[False][p], rel=0.05), (with_sp.rank, measured)
        # and the run's own figure, as for the other knobs (the plain run's last stage is short by the final
        # LayerNorm's input, a known gap of the model the paper figures are pinned to: docs/design.md)
        assert with_sp.memory_breakdown["activations"] == pytest.approx(model[True][p], rel=0.05), with_sp.rank


@pytest.mark.parametrize("change, words", [
    (dict(), "tp=1"),  # tp = 1
    (dict(tp=4, tp_mode="2d", micro_batch_size=2), "tp_mode=2d"),
    (dict(tp=2, seq_len=9), "seq_len=9 is not divisible by tp=2"),
    (dict(tp=2, sequence_parallel="yes"), "must be true or false"),
])
def test_prod_features_sequence_parallel_refusals(change, words):
    cfg = {"method": "vocab-2", "pp": 2, "sequence_parallel": True, **change}
    with pytest.raises(ValueError, match=words) as err:
        check_config(RunConfig(**cfg))
    assert "sequence_parallel" in str(err.value)


def test_prod_features_sequence_parallel_collectives():
    """Per 1-D layer, sequence parallelism replaces each all-reduce by an all-gather and a reduce-scatter: the same
    bytes on the wire in a ring, twice the collectives; plus the all-gathers again for the weight gradients (W) and
    the once-per-iteration sum of the LayerNorms' and biases' shares."""
    from vp.tp.traffic import ITERATION, layer_collectives, wire_bytes
    from vp.cost.tensor import tp_shape

    cfg = RunConfig(method="vocab-2", pp=2, tp=4, hidden=64, heads=4, seq_len=32, microbatches=4)
    plain, sp = (layer_collectives(tp_shape(c)) for c in (cfg, cfg.with_(sequence_parallel=True)))
    for kind in ("F", "B"):
        mine = [c for c in sp if c.pass_kind == kind]
        theirs = [c for c in plain if c.pass_kind == kind]
        assert wire_bytes(mine) == pytest.approx(wire_bytes(theirs))
        assert sum(c.calls for c in mine) == 2 * sum(c.calls for c in theirs)
        assert {c.op for c in mine} == {"all_gather", "reduce_scatter"}
    (again,) = [c for c in sp if c.pass_kind == "W"]
    assert (again.op, again.calls, again.elements) == ("all_gather", 2 * cfg.microbatches, 32 * 64 / 4)
    (shares,) = [c for c in sp if c.pass_kind == ITERATION]
    assert (shares.channel, shares.elements) == ("tp", 6 * 64)


def test_prod_features_sequence_parallel_in_the_cost_model():
    """The memory model keeps 34 s b h / t per layer (Korthikanti et al.: 10 s b h + 24 s b h / t without sequence
    parallelism), 1/t of a fully recomputed layer's input; the elementwise work splits t ways, so F is no slower
    while the collectives' bytes are the same; a middle stage's p2p sends are 1/t."""
    from vp.cost.traffic import payloads

    hw = Hardware("h", 989e12)
    cfg = check_config(RunConfig(method="vocab-2", pp=4, tp=4, layers=16, hidden=2048, heads=16, seq_len=2048,
                                 vocab_size=32000, microbatches=8))
    sp = cfg.with_(sequence_parallel=True)
    sched = build(cfg.method, cfg.pp, cfg.microbatches, cfg.n_chunks)
    plain_costs, sp_costs = pass_costs(cfg, hw, sched), pass_costs(sp, hw, sched)
    assert sp_costs.mem("F", 1) == pytest.approx(plain_costs.mem("F", 1) * (34 / 4) / (10 + 24 / 4))
    full, sp_full = (pass_costs(c.with_(recompute="full"), hw, sched) for c in (cfg, sp))
    assert sp_full.mem("F", 1) == pytest.approx(full.mem("F", 1) / 4)
    assert sp_costs.time("F", 1) < plain_costs.time("F", 1)
    assert payloads(sp, sched)["SF"][0][1] == payloads(cfg, sched)["SF"][0][1] / 4
    assert rank_tp_collectives(sp, sched, 1) != rank_tp_collectives(cfg, sched, 1)


def test_prod_features_sequence_parallel_is_a_hydra_axis(tmp_path, monkeypatch):
    """run.sequence_parallel is an axis a sweep varies (simulated here): the records carry it and hold fewer
    activation bytes with it, the report's tables tell the two runs apart by it; without 1-D tp the sweep is refused
    before anything is submitted."""
    from harness_util import sweep
    from test_harness_runs import records

    monkeypatch.chdir(tmp_path)
    setups = ", ".join(f"{{model: 4b, run.pp: 4, vocab: 32k, run.sequence_parallel: {sp}}}" for sp in ("false", "true"))
    grid = ["experiment=paper_1f1b", "backend=sim", f"grid.setups=[{setups}]",
            "grid.product={run.seq_len: [2048], method: [vocab-2]}", "run.tp=2"]
    code, lines = sweep(tmp_path, *grid, report=True)
    assert code == 0 and "2 jobs" in lines[0], lines
    recs = {r["config"]["sequence_parallel"]: r["metrics"]["memory_breakdown"][0]
            for r in records(tmp_path, "paper_1f1b")}
    assert recs[True]["activations"] < recs[False]["activations"]
    tables = "".join(p.read_text() for p in (tmp_path / "reports" / "paper_1f1b").rglob("*.md"))
    assert "sequence_parallel=True" in tables and "sequence_parallel=False" in tables  # the rows' variant
    code, _ = sweep(tmp_path, *grid[:4])  # tp 1
    assert code == 2


def sp_layers(rank, world, kinds):
    """On 1-D t = 2 with sequence parallelism: the output, grad of the input and grad of every parameter (after the
    once-per-iteration sums) of each kind, this device's positions of the input and output gradient."""
    from test_tp_layers import SEED, H, VOCAB, references
    from tp_util import place, tagged_grads
    from vp.config import padded_vocab_size
    from vp.model import vocab_rows
    from vp.tp.block import shard_block
    from vp.tp.context import TensorParallel
    from vp.tp.grads import reduce_replicated
    from vp.tp.sequence import sequence_block
    from vp.tp.vocab import VocabEmbedding, VocabOutput
    from vp.vocab.output import Shard
    from vp.wgrad import WeightGradStore

    _, mesh, me, comm = place(rank, world, ["1d-2"])
    try:
        tp = TensorParallel.of(mesh, me, comm, sequence_parallel=True)
        out = {}
        for kind in kinds:
            parts, data = references()
            x = sequence_block(data["x"], tp).clone().requires_grad_()
            dy = sequence_block(data["dy"], tp)
            store = WeightGradStore() if kind == "block_split_w" else None
            if kind == "vocab":
                shard = Shard.of(tp.c, tp.columns, padded_vocab_size(VOCAB, None, tp.columns), VOCAB)
                rows = (shard.start, shard.start + shard.rows)
                m = torch.nn.ModuleDict({"embed": VocabEmbedding(vocab_rows(SEED, "embed", VOCAB, *rows, H), shard, tp),
                                         "head": VocabOutput(vocab_rows(SEED, "head", VOCAB, *rows, H), shard, tp)})
                y = m["embed"](data["ids"])
                loss = m["head"](x, data["targets"], data["weights"])
                (loss + (y * dy).sum()).backward()
            else:
                m = shard_block(parts["block"], tp)
                y, loss = m(x, store), None
                y.backward(dy)
                if store is not None:
                    store.flush()
            reduce_replicated([m], tp)
            out[kind] = (y.detach(), x.grad, tagged_grads(m, False), None if loss is None else loss.detach())
        return tp.c, out
    finally:
        comm.close()


def test_prod_features_sequence_parallel_layers_match_single_process(pools):
    """The 1-D block (whole and with V-Half's split backward: the weight gradients' all-gathers deferred to W) and the
    vocabulary layers with sequence parallelism, on t = 2 gloo processes: output and input gradient by positions,
    every parameter's gradient (the sequence-sharded ones after their sum over tp, equal on both devices) as the
    single-process fp32 model's."""
    from test_tp_layers import HEADS, VOCAB, close, reference_of
    from tp_util import assemble, unpermute_qkv

    kinds = ["block", "block_split_w", "vocab"]
    per_device = dict(pools(2).run(sp_layers, kinds))
    for i, kind in enumerate(kinds):
        ref_y, ref_dx, ref_grads, ref_loss = reference_of(kind)
        got = [per_device[c][kind] for c in range(2)]
        close(torch.cat([g[0] for g in got], 1), ref_y, f"{kind}: output")
        close(torch.cat([g[1] for g in got], 1), ref_dx, f"{kind}: grad of the input")
        assert set(got[0][2]) == set(ref_grads), (kind, sorted(got[0][2]), sorted(ref_grads))
        for name, (tag, _) in got[0][2].items():
            full = assemble(tag, {(0, c, 0): per_device[c][kind][2][name][1] for c in range(2)}, 2, 1)
            full = unpermute_qkv(name, full, HEADS, 2)
            close(full[:VOCAB] if kind == "vocab" else full, ref_grads[name], f"{kind}: grad of {name}")
        if ref_loss is not None:
            close(got[0][3], ref_loss, "loss")


def test_prod_features_sequence_parallel_cli_refuses_grids():
    """vp.train's --sequence-parallel reaches the config's checks: a 2-D grid is refused before any process starts."""
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-m", "vp.train", "--pp", "1", "--method", "baseline", "--tp", "4",
                          "--tp-mode", "2d", "--micro-batch-size", "2", "--sequence-parallel"], capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 2 and "sequence_parallel" in out.stderr and "tp_mode=1d" in out.stderr, out.stderr
