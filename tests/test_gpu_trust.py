"""Numbers to trust on CUDA, checked on CPU (issue 41; docs/gpu-path.md): the buffer-lifetime check of the NCCL
emulation, one precision policy, a sync-free microbatch path, the meta-device build, communicators by splitting."""
import os

import pytest
import torch

from vp.channels import channels, run_links
from vp.comm import Comm, make_groups
from vp.nccl import Emulation
from vp.reference import train_reference
from vp.metrics import replica_sum
from vp.run import train_rank
from vp.runtime.loop import RankFailure
from vp.schedule import build
from vp.schedule.methods import METHODS

from test_nccl import tiny

CPU = torch.device("cpu")


def checked_run(rank, world, cfg, form="all", revert_ib=False):
    """Train with VP_CHECK_BUFFERS=1 under the emulation; ('ok', losses) or ('failed', report). revert_ib: the IB
    launch without naming its buffer (the fix of issue 41 undone)."""
    from vp import comm as comm_module

    os.environ["VP_CHECK_BUFFERS"] = "1"
    submit = comm_module.Comm.submit
    if revert_ib:
        def unnamed(self, channel, step, what=None, reads=()):
            return submit(self, channel, step, what, () if channel == "IB" else reads)
        comm_module.Comm.submit = unnamed
    sched = build(cfg.method, cfg.pp, cfg.microbatches, cfg.n_chunks)
    comm = Comm(make_groups(channels(cfg, sched), rank, 2 * cfg.timeout_s), CPU, Emulation.of(form), cfg.timeout_s,
                rank)
    failed = False
    try:
        comm.connect(run_links(sched))
        return "ok", train_rank(cfg, rank, comm, CPU)
    except RankFailure as err:
        failed = True
        return "failed", str(err)
    finally:
        comm_module.Comm.submit = submit
        os.environ.pop("VP_CHECK_BUFFERS", None)
        comm.close(failed=failed)


def test_gpu_trust_buffer_check_fails_with_the_ib_fix_reverted(pools):
    """IB's buffer not named at its launch: the root drops it at its IB while the broadcast may still read it. The
    check poisons it and names the step."""
    cfg = tiny("vocab-2", 2, iterations=1, warmup=0, timeout_s=4.0)  # the peer of the failed rank: its watchdog
    results = pools(2).run(checked_run, cfg, "all", True)
    reports = [r[1] for r in results if r[0] == "failed"]
    assert any("BufferLifetimeError: IB:" in r and "dropped its last reference" in r for r in reports), results


@pytest.mark.parametrize("pp", [2, 4])
@pytest.mark.parametrize("method", list(METHODS))
def test_gpu_trust_every_method_trains_clean_under_the_buffer_check(pools, method, pp):
    """Every method at pp 2 and 4 trains with the check on, loss parity at 1e-5 (fp32)."""
    assert_clean(pools, tiny(method, pp, iterations=1, warmup=0))


def test_gpu_trust_a_tensor_parallel_grid_trains_clean_under_the_buffer_check(pools):
    assert_clean(pools, tiny("vocab-2", 2, layers=4, tp=4, tp_mode="2d", micro_batch_size=2, iterations=1,
                             warmup=0))


def assert_clean(pools, cfg):
    results = pools(cfg.world).run(checked_run, cfg)
    assert all(r[0] == "ok" for r in results), "\n".join(r[1] for r in results if r[0] != "ok")
    losses = replica_sum([r[1] for r in results])
    torch.testing.assert_close(torch.tensor(losses), torch.tensor(train_reference(cfg)[0]), rtol=1e-5, atol=0)


def make_runtime(cfg, rank):
    """(the Runtime of a global rank, as train_rank builds it, its Comm): groups made and connected."""
    from vp.runtime.loop import Runtime
    from vp.run import build_rank_model
    from vp.tp.context import TensorParallel

    sched = build(cfg.method, cfg.pp, cfg.microbatches, cfg.n_chunks)
    comm = Comm(make_groups(channels(cfg, sched), rank, 2 * cfg.timeout_s), CPU, None, cfg.timeout_s, rank)
    comm.connect(run_links(sched))
    where = cfg.mesh.coords(rank)
    tp = TensorParallel.of(cfg.mesh, rank, comm) if cfg.tp > 1 else None
    model = build_rank_model(cfg, sched, where.p, CPU, tp)
    return Runtime(cfg, sched, where.p, model, comm, CPU, replica=where.d, global_rank=rank), comm


GEMMS = ("aten::mm", "aten::addmm", "aten::addmm_", "aten::bmm", "aten::baddbmm", "aten::baddbmm_", "aten::addbmm",
         "aten::addbmm_", "aten::_scaled_mm")


def profiled_bf16(rank, world, cfg):
    """One iteration in bf16 on CPU (autocast, as on CUDA) under torch.profiler, which records every thread's ops
    with their input dtypes: (fp32 GEMMs as (op, shapes), losses). The run config refuses bf16 on CPU (CPU runs are
    for fp32 parity), so the executor is given it directly."""
    from torch.profiler import profile

    runtime, comm = make_runtime(cfg, rank)
    try:
        runtime.ex.dtype = torch.bfloat16
        with profile(record_shapes=True) as prof:
            loss = runtime.iteration(0)["loss"]
    finally:
        comm.close()
    fp32 = [(e.name, e.input_shapes) for e in prof.events()
            if e.name in GEMMS and "float" in (getattr(e, "input_dtypes", None) or [])]
    return fp32, loss, sum(e.name in GEMMS for e in prof.events())


@pytest.mark.parametrize("method", list(METHODS))
def test_gpu_trust_every_gemm_of_a_bf16_step_runs_in_bf16(pools, method):
    """Under bf16 autocast no GEMM of a step (compute thread and communication threads) takes fp32 inputs: not the
    output layer's grad W (in-place addmm_ escapes autocast), not a backward that runs outside autocast. The loss
    stays within bf16's tolerance of the fp32 reference (docs/gpu-path.md, precision)."""
    cfg = tiny(method, 2, iterations=1, warmup=0)
    results = pools(2).run(profiled_bf16, cfg)
    for fp32, _, gemms in results:
        assert gemms > 0 and not fp32, fp32
    loss = next(r[1] for r in results if r[1] is not None)
    assert abs(loss - train_reference(cfg)[0][0]) < 2e-2 * abs(loss)


def counted_syncs(rank, world, cfg):
    """Host synchronisations per iteration: calls of Tensor.item, tolist, nonzero (method and function) and
    indexing with a boolean tensor, from every thread, during iterations 1 and 2 (after the first, which may set
    things up)."""
    import threading
    import traceback

    counts, lock = [], threading.Lock()
    patched = {}

    def counting(owner, name, boolean_index=False):
        original = getattr(owner, name)
        patched[(owner, name)] = original

        def wrapper(*args, **kwargs):
            if not boolean_index or any(isinstance(a, torch.Tensor) and a.dtype == torch.bool
                                        for a in (args[1] if isinstance(args[1], tuple) else (args[1],))):
                frames = traceback.extract_stack()[:-1]
                # AdamW's step count is a CPU scalar by design (not capturable): not a device sync
                if not any("torch/optim/" in f.filename for f in frames):
                    where = next((f"{f.filename.split('/vp/')[-1]}:{f.name}" for f in reversed(frames)
                                  if "/vp/" in f.filename), "?")
                    with lock:
                        counts.append(f"{name} in {where}")
            return original(*args, **kwargs)
        setattr(owner, name, wrapper)

    per_iteration = []
    runtime, comm = make_runtime(cfg, rank)
    try:
        runtime.iteration(0)
        for owner, name in ((torch.Tensor, "item"), (torch.Tensor, "tolist"), (torch.Tensor, "nonzero"),
                            (torch, "nonzero")):
            counting(owner, name)
        counting(torch.Tensor, "__getitem__", boolean_index=True)
        for it in (1, 2):
            counts.clear()
            runtime.iteration(it)
            per_iteration.append(list(counts))
    finally:
        for (owner, name), original in patched.items():
            setattr(owner, name, original)
        comm.close()
    return per_iteration


REPORT = {"item in runtime/loop.py:iteration", "item in runtime/executor.py:total_loss"}


TP_MESHES = {"pp-tp": dict(tp=2, layers=4), "pp-grid": dict(tp=4, tp_mode="2d", micro_batch_size=2, layers=4)}
SYNC_CASES = [(m, "pp", {}) for m in METHODS] + [
    (m, name, mesh) for name, mesh in TP_MESHES.items() for m in ("baseline", "interlaced", "vocab-1", "vocab-2")]


@pytest.mark.parametrize("method,name,mesh", SYNC_CASES, ids=[f"{m}-{n}" for m, n, _ in SYNC_CASES])
def test_gpu_trust_the_microbatch_path_has_no_host_sync(pools, method, name, mesh):
    """The only host synchronisation of a steady-state iteration is the loss report (one .item() at the end, on the
    ranks that know the loss; with a grid, its sum over the batch group): none per microbatch, whatever the count
    of microbatches. Every method on a pipeline; with tensor parallelism, one method of each output-layer kind."""
    cfg = tiny(method, 2, iterations=3, warmup=0, **mesh)
    for per_iteration in pools(cfg.world).run(counted_syncs, cfg):
        for counts in per_iteration:
            # the loss report: the rank's sum over microbatches, and with tensor parallelism its sum over the batch group
            assert set(counts) <= REPORT and len(counts) == len(set(counts)), counts


def host_peak(build) -> tuple[int, object]:
    """(the most bytes torch's CPU allocator held at once while build() ran, above what it held before; its
    result), from torch.profiler's memory events (allocations by the op that made them, frees as [memory])."""
    from torch.profiler import profile

    with profile(profile_memory=True) as prof:
        out = build()
    live = top = 0
    for e in sorted((e for e in prof.events() if e.self_cpu_memory_usage), key=lambda e: e.time_range.start):
        live += e.self_cpu_memory_usage
        top = max(top, live)
    return top, out


def tp_of(cfg, rank):
    from vp.channels import tp_slices
    from vp.tp.context import TensorParallel

    return TensorParallel.of(cfg.mesh, rank, Comm(make_groups(tp_slices(cfg.mesh), rank), CPU))


STAGE = dict(method="baseline", pp=3, layers=6, hidden=192, heads=4, seq_len=16, vocab_size=3000, microbatches=3)


@pytest.mark.parametrize("stage,tp", [(0, 1), (1, 1), (2, 1), (1, 2), (1, 4)])
def test_gpu_trust_building_a_stage_peaks_below_1_3x_its_parameters(stage, tp):
    """On the meta device, materialised parameter by parameter (a tensor-parallel stage: one whole block at a
    time): the host never holds the stage twice, nor a parameter's temporaries, nor the whole stage of a tensor-
    parallel part. A tensor-parallel part holds one whole block besides itself: below 1.3 + tp / layers. The eager
    build it replaces peaked at 1.33x for a one-layer middle stage (randn and its scaled copy) and at tp + 1 times the
    part for tensor parallelism."""
    from vp.config import RunConfig
    from vp.model import build_stage

    cfg = RunConfig(**STAGE, tp=tp)
    tp_ctx = tp_of(cfg, 0) if tp > 1 else None
    top, built = host_peak(lambda: build_stage(cfg, 5, stage, cfg.stage_layers, True, tp_ctx))
    params = sum(p.numel() * p.element_size() for p in built.parameters())
    assert top < (1.3 + (tp / cfg.stage_layers[stage] if tp > 1 else 0)) * params, (top, params, top / params)


@pytest.mark.parametrize("tp,mode", [(1, "1d"), (2, "1d"), (4, "2d")])
def test_gpu_trust_the_meta_build_gives_the_eager_builds_weights(tp, mode):
    """The same seed gives the same weights, bit for bit: the meta build against the eager one (the stage built in
    fp32 on the host, for tensor parallelism cut from the whole stage), and the in-place draw against randn * std."""
    from vp.config import RunConfig
    from vp.model import Stage, build_stage, seeded_normal
    from vp.tp.stage import TensorParallelStage
    from vp.vocab.output import Shard
    from vp.model import vocab_rows

    out = torch.empty(7, 5)
    gen = torch.Generator().manual_seed(__import__("zlib").crc32(b"5/x"))
    assert torch.equal(seeded_normal((7, 5), 5, "x", 0.3, out=out), torch.randn((7, 5), generator=gen) * 0.3)
    cfg = RunConfig(**{**STAGE, "hidden": 32, "vocab_size": 2500}, tp=tp, tp_mode=mode)
    for stage in range(cfg.pp):
        first, last = stage == 0, stage == cfg.pp - 1
        tp_ctx = tp_of(cfg, 1 if tp > 1 else 0) if tp > 1 else None
        meta_built = build_stage(cfg, 5, stage, cfg.stage_layers, True, tp_ctx)
        eager = Stage(cfg, 5, 2 * stage, 2, first, last, local_vocab=tp == 1)
        if tp_ctx is not None:
            shard = Shard.of(tp_ctx.c, tp_ctx.columns, cfg.padded_vocab_size, cfg.vocab_size)
            rows = lambda n: vocab_rows(5, n, cfg.vocab_size, shard.start, shard.start + shard.rows, cfg.hidden)
            eager = TensorParallelStage(eager, tp_ctx, shard, rows("embed.weight") if first else None,
                                        rows("head.weight") if last else None)
        a, b = dict(meta_built.named_parameters()), dict(eager.named_parameters())
        assert a.keys() == b.keys()
        assert all(torch.equal(a[k], b[k]) for k in a), [k for k in a if not torch.equal(a[k], b[k])]


@pytest.mark.parametrize("mesh", [dict(tp=8), dict(tp=8, tp_mode="2.5d", tp_depth=2)], ids=["1d", "2.5d"])
@pytest.mark.parametrize("method", list(METHODS))
def test_gpu_trust_1024_ranks_make_few_world_wide_creations_and_hold_few_communicators(method, mesh):
    """dp 8 x pp 16 x tp 8: at most 32 world-wide creation calls (splits) and 24 communicators per rank, where one
    new_group per group made thousands; python -m vp.bench comms prints the same figures."""
    from vp.bench.comms import config, report

    r = report(config(method, 8, 16, **mesh))
    assert r["world_wide_creations"] <= 32 and r["communicators_per_rank_max"] <= 24, r
    assert r["world_wide_creations_without_split"] > 1000


def split_run(rank, world, cfg):
    """Train with make_groups splitting: split_group stood in for by one new_group per group (gloo cannot split),
    counting the world-wide calls; ('ok', measurement, calls) on every rank."""
    import torch.distributed as dist

    from vp import comm_groups as comm_module

    calls = []

    def fake_split(split_ranks, timeout, pg_options, group_desc):
        calls.append((group_desc, [list(g) for g in split_ranks]))
        mine = None
        for g in split_ranks:  # disjoint groups of one split: every rank in at most one
            pg = dist.new_group(g, timeout=timeout)
            mine = pg if rank in g else mine
        return mine

    splitting = comm_module.splitting
    comm_module.splitting = lambda: fake_split
    try:
        sched = build(cfg.method, cfg.pp, cfg.microbatches, cfg.n_chunks)
        comm = Comm(make_groups(channels(cfg, sched), rank, 2 * cfg.timeout_s), CPU, Emulation.of("all"),
                    cfg.timeout_s, rank)
    finally:
        comm_module.splitting = splitting
    try:
        comm.connect(run_links(sched))
        return train_rank(cfg, rank, comm, CPU), calls
    finally:
        comm.close()


def test_gpu_trust_groups_made_by_splitting_train_like_the_reference(pools):
    """Every group comes from one split call per creation split, each split's groups disjoint; the run trains under
    every NCCL rule with loss parity at 1e-5."""
    from vp.channels import creation_splits

    cfg = tiny("interleaved-vocab-2", 4, dp=2, microbatches=4, iterations=1, warmup=0)
    results = pools(8).run(split_run, cfg)
    sched = build(cfg.method, cfg.pp, cfg.microbatches, cfg.n_chunks)
    splits = creation_splits(channels(cfg, sched))
    for _, calls in results:
        assert [name for name, _ in calls] == [name for name, _ in splits]
        for _, groups in calls:
            ranks = [r for g in groups for r in g]
            assert len(ranks) == len(set(ranks))
    assert len(splits) < sum(len(g) for g in channels(cfg, sched).values())
    losses = replica_sum([m for m, _ in results])
    torch.testing.assert_close(torch.tensor(losses), torch.tensor(train_reference(cfg)[0]), rtol=1e-5, atol=0)


def test_gpu_trust_side_streams_come_from_the_loaded_cuda_runtime_at_high_priority(monkeypatch):
    """The CUDA runtime is found among the process's libraries (/proc/self/maps); without one (this CPU torch),
    the side stream is a pool stream of high priority (priority -1)."""
    from vp import comm_stream

    maps = ("7f00-7f01 r-xp 0 08:01 1 /usr/lib/libc.so.6\n"
            "7f02-7f03 r-xp 0 08:01 2 /site-packages/nvidia/cuda_runtime/lib/libcudart.so.12\n")
    opened = []
    monkeypatch.setattr(comm_stream.ctypes, "CDLL", lambda path: opened.append(path) or "lib")
    assert comm_stream._cudart(maps) == "lib" and opened == ["/site-packages/nvidia/cuda_runtime/lib/libcudart.so.12"]
    assert comm_stream._cudart("7f00-7f01 r-xp 0 08:01 1 /usr/lib/libc.so.6\n") is None
    made = []
    monkeypatch.setattr(comm_stream, "_cudart", lambda: None)
    monkeypatch.setattr(torch.cuda, "Stream", lambda device, priority=0: made.append(priority) or "pool stream")
    assert comm_stream.side_stream(torch.device("cuda", 0)) == "pool stream" and made == [-1]


def test_gpu_trust_the_one_gpu_parts_fit_the_default_budget():
    """A lent GPU machine gives the check 8 minutes: the one-GPU parts' timeouts (every part but the multi-GPU
    pipeline) add up to at most the default --budget-s, so no part is cut short by the budget."""
    from vp.gpucheck import PARTS
    from vp.gpucheck.__main__ import parse

    one_gpu = sum(seconds for name, seconds in PARTS.items() if name != "pipeline")
    assert one_gpu <= parse([]).budget_s <= 480, (one_gpu, PARTS)


def test_gpu_trust_node_form_flags_are_the_worker_config():
    """The node form starts vp.train with flags that parse back to exactly the config it means to run."""
    from vp.gpucheck.pipeline import train_flags, worker_config
    from vp.train import parse_args

    for method in ("vocab-2", "interleaved", "vhalf-vocab-1"):
        cfg = worker_config(method, 4)
        assert parse_args(train_flags(cfg))[0] == cfg, method


def test_gpu_trust_node_form_runs_every_rank_under_torchrun_strict_about_syncs():
    """The node form's launch: torchrun starts the ranks (here on CPU over gloo), each through
    vp.gpucheck.node_rank; the loss is the single-process reference's, every rank reports its syncs inside actions
    (none), and a rank made to raise fails the run naming it."""
    from vp.gpucheck.pipeline import launch_torchrun, worker_config
    from vp.launch import RunFailed
    from vp.reference import train_reference

    cfg = worker_config("vocab-2", 2).with_(device="cpu", dtype="fp32", iterations=2, warmup=0, timeout_s=60)
    record, syncs = launch_torchrun(cfg)
    assert syncs == {0: [], 1: []}, syncs
    assert record["metrics"]["loss"] == pytest.approx(train_reference(cfg)[0], rel=1e-5)
    with pytest.raises(RunFailed, match=r"^rank 1\b") as failed:
        launch_torchrun(cfg, fault=(1, "F2", "raise"))
    assert failed.value.status == "failed" and "F2" in str(failed.value), failed.value
