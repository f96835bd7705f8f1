"""vp.train with tensor-parallel stages reproduces the single-process loss curve and parameters (fp32, 3
iterations), depth replicas stay identical, and bad tensor-parallel input is refused before any process starts."""
import functools
import json

import pytest
import torch

from test_runtime import assert_parameters_close
from test_train_cli import train
from tp_util import GRIDS, PLACEMENTS, TESTED, assemble, mesh_of, place, placed, tagged_grads, unpermute_qkv
from vp.config import RunConfig
from vp.reference import train_reference
from vp.run import build_rank_model
from vp.runtime.loop import Runtime
from vp.schedule import build
from vp.tp.context import TensorParallel
from vp.train import main

SIZES = dict(method="baseline", pp=1, layers=2, hidden=16, heads=4, seq_len=8, vocab_size=101, microbatches=2,
             micro_batch_size=4, iterations=3, warmup=1)


def config(name: str) -> RunConfig:
    tp, mode, depth = GRIDS[name]
    return RunConfig(tp=tp, tp_mode=mode, tp_depth=depth, **SIZES)


@functools.cache
def reference() -> tuple[list[float], dict]:
    """The single-process run (its vocabulary padding differs from the grids', which changes no real row)."""
    return train_reference(RunConfig(**SIZES))


def snapshot(model, grid: bool) -> dict:
    """name -> (layout tag, value) of every parameter (tagged_grads reads .grad: hand it the values)."""
    out = {}
    for st in model.stages.values():
        for p in st.parameters():
            p.grad = p.detach().clone()
        out.update(tagged_grads(st, grid))
    return out


def train_grid(rank, world, names):
    """Train each grid's run side by side; returns losses, the parameters at start and after 3 AdamW steps."""
    name, mesh, me, comm = place(rank, world, names, pipeline=True)
    try:
        if name is None:
            return None
        cfg = config(name)
        tp = TensorParallel.of(mesh, me, comm)
        sched = build(cfg.method, cfg.pp, cfg.microbatches, cfg.n_chunks)
        model = build_rank_model(cfg, sched, 0, torch.device("cpu"), tp)
        start = snapshot(model, mesh.grid)
        runtime = Runtime(cfg, sched, 0, model, comm, torch.device("cpu"))
        losses = [runtime.iteration(it)["loss"] for it in range(cfg.iterations)]
        return name, (tp.r, tp.c, tp.k), losses, start, snapshot(model, mesh.grid)
    finally:
        comm.close()


@pytest.fixture(scope="module")
def trained(pools):
    out = {}
    for res in placed(pools(8), train_grid, PLACEMENTS):
        out.setdefault(res[0], {})[res[1]] = res[2:]
    return out


def full_parameters(per_device: dict, which: int, name: str, cfg: RunConfig) -> dict:
    """Assemble every parameter from the devices (replicas must be bitwise equal) in the reference's names."""
    mesh = mesh_of(name)
    tags = next(iter(per_device.values()))[which]
    out = {}
    for pname, (tag, _) in tags.items():
        full = assemble(tag, {c: v[which][pname][1] for c, v in per_device.items()}, mesh.q, mesh.depth)
        key = pname.replace("embed.weight", "embed").replace("head.weight", "head").replace("pos.weight", "pos")
        out[key] = unpermute_qkv(pname, full, cfg.heads, mesh.q)
    for key in ("embed", "head"):
        out[key] = out[key][:cfg.vocab_size]
    return out


@pytest.mark.parametrize("name", TESTED)
def test_training_matches_the_single_process_reference(trained, name):
    cfg = config(name)
    per_device = trained[name]
    ref_losses, ref_params = reference()
    for losses, _, _ in per_device.values():  # every device reports the whole iteration loss
        torch.testing.assert_close(torch.tensor(losses), torch.tensor(ref_losses), rtol=1e-5, atol=0)
    ref_params = {k: v[:cfg.vocab_size] if k in ("embed", "head") else v for k, v in ref_params.items()}
    params = full_parameters(per_device, 2, name, cfg)  # assemble() asserts every replica bitwise equal
    assert set(params) == set(ref_params)
    assert_parameters_close(params, ref_params)


@pytest.mark.parametrize("name", [g for g in TESTED if GRIDS[g][2] > 1])
def test_depth_replicas_are_identical_at_start_and_after_adamw_steps(trained, name):
    per_device = trained[name]
    mesh = mesh_of(name)
    for which in (1, 2):  # parameters before training, after 3 AdamW steps
        for pname, (tag, _) in next(iter(per_device.values()))[which].items():
            for r in range(mesh.q):
                for c in range(mesh.q):
                    copies = [per_device[(r, c, k)][which][pname][1] for k in range(mesh.depth)]
                    assert all(torch.equal(copies[0], x) for x in copies[1:]), (which, pname, r, c)


def test_cli_runs_a_deep_grid_and_matches_the_reference():
    """The real entry point: python -m vp.train starts the processes of a 2.5-D [1, 1, 2] grid."""
    args = ["--method", "baseline", "--pp", "1", "--tp", "2", "--tp-mode", "2.5d", "--tp-depth", "2", "--layers", "2",
            "--hidden", "16", "--heads", "4", "--seq-len", "8", "--vocab-size", "101", "--microbatches", "2",
            "--micro-batch-size", "4", "--iterations", "3", "--warmup", "1", "--json"]
    out = train(*args)
    assert out.returncode == 0, out.stderr
    rec = json.loads(out.stdout)
    assert (rec["config"]["tp"], rec["config"]["tp_mode"], rec["config"]["tp_depth"]) == (2, "2.5d", 2)
    assert {"method", "pp", "layers", "padded_vocab_size", "stage_layers", "seed"} <= set(rec["config"])
    assert rec["metrics"]["devices"] == 2 and len(rec["metrics"]["bytes_sent"]) == 2
    assert {"dep", "batch"} <= set(rec["metrics"]["bytes_by_channel"][0])
    torch.testing.assert_close(torch.tensor(rec["metrics"]["loss"]), torch.tensor(reference()[0]),
                               rtol=1e-5, atol=0)


BASE = ["--method", "baseline", "--pp", "1", "--layers", "2", "--hidden", "16", "--heads", "4", "--seq-len", "8",
        "--vocab-size", "101", "--micro-batch-size", "4"]


@pytest.mark.parametrize("args,message", [
    (["--tp", "8", "--tp-mode", "2d"], "tp=8 is not q*q*1 for tp_mode=2d"),
    (["--tp", "4", "--tp-mode", "2.5d", "--tp-depth", "2"], "tp=4 is not q*q*2 for tp_mode=2.5d"),
    (["--tp", "4", "--tp-mode", "3d"], "tp_mode='3d' is unknown; use one of 1d, 2d, 2.5d"),
    (["--tp", "2", "--tp-depth", "2"], "tp_depth=2 needs tp_mode=2.5d"),
    (["--tp", "2", "--heads", "1"], "heads=1 is not divisible by tp=2 (tp_mode=1d)"),
    (["--tp", "4", "--tp-mode", "2d", "--heads", "1"], "heads=1 is not divisible by the 2 grid columns of tp_mode=2d"),
    (["--tp", "4", "--hidden", "18", "--heads", "2"], "hidden=18 is not divisible by tp=4"),
    (["--tp", "4", "--tp-mode", "2d", "--ffn-hidden", "31"], "ffn_hidden=31 is not divisible by the 2 grid columns"),
    (["--tp", "8", "--tp-mode", "2.5d", "--tp-depth", "2", "--micro-batch-size", "2"],
     "micro_batch_size=2 is not divisible by d*q=4"),
    (["--tp", "4", "--pad-multiple", "6"], "pad_multiple=6 is not divisible by the 4 vocabulary shards"),
    (["--tp", "1", "--tp-mode", "2d"], "tp_mode=2d needs tensor parallelism, but tp=1"),
    (["--tp", "2", "--method", "vocab-2", "--pp", "2", "--pad-multiple", "6"],
     "pad_multiple=6 is not divisible by the 4 vocabulary shards"),
    (["--tp", "2", "--method", "vocab-2", "--pp", "2", "--vocab-size", "3"],
     "vocab_size=3 is smaller than the 4 vocabulary shards"),
    (["--tp", "0"], "tp=0 must be a positive integer"),
])
def test_bad_tensor_parallel_input_is_refused_before_any_process_starts(capsys, args, message):
    argv = list(BASE)
    for flag, value in zip(args[::2], args[1::2]):
        if flag in argv:
            argv[argv.index(flag) + 1] = value
        else:
            argv += [flag, value]
    assert main(argv) == 2
    err = capsys.readouterr()
    assert message in err.err and err.out == ""
