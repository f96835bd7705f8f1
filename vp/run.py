"""One process of a run: its process groups, its part of the model, the iterations, and (on rank 0) the record.

Everything that starts processes (vp.launch for local processes, torchrun, the harness's submitit tasks) calls
run_rank in each of them; vp.train is the command line around it.
"""
import socket
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist

from vp.channels import channels, run_links
from vp.comm import Comm, abort_all, make_groups
from vp.config import RunConfig
from vp.hostenv import cpu_model, cuda_connections, device_index, nccl_environment
from vp.metrics import Metrics, RankMeasurement, device_peak
from vp.nccl import Emulation
from vp.model import build_stage, vocab_rows
from vp.record import git_commit, make_record, now
from vp.runtime.executor import RankModel
from vp.runtime.loop import Runtime
from vp.schedule import build
from vp.schedule import validate as validate_schedule
from vp.tp.context import TensorParallel
from vp.trace import write_trace
from vp.vocab.output import Shard


def build_rank_model(cfg: RunConfig, sched, rank: int, device: torch.device,
                     tp: TensorParallel | None = None) -> RankModel:
    """rank: the pipeline rank; tp: this process's place in its stage's tensor-parallel group (tp > 1)."""
    vp_on = sched.vocab_parallel
    stages = {c: build_stage(cfg, cfg.seed, sched.stage(rank, c), cfg.stage_layers, not vp_on, tp, device)
              for c in range(sched.chunks)}
    if not vp_on:
        return RankModel(stages, tp=tp)
    # vocabulary shards over pipeline ranks x tensor-parallel columns: shard p * columns + c (vp.mesh "vocab")
    columns, c = (tp.columns, tp.c) if tp is not None else (1, 0)
    shard = Shard.of(rank * columns + c, cfg.pp * columns, cfg.padded_vocab_size, cfg.vocab_size)
    end = shard.start + shard.rows

    def rows(name):
        return torch.nn.Parameter(vocab_rows(cfg.seed, name, cfg.vocab_size, shard.start, end, cfg.hidden).to(device))

    return RankModel(stages, shard, rows("head.weight"), rows("embed.weight"), tp=tp)


def train_rank(cfg: RunConfig, rank: int, comm: Comm, device: torch.device, fault=None,
               free_before_groups: int | None = None, observer=None) -> RankMeasurement:
    """Run every iteration on this (global) rank, process groups already up (channels(cfg): with tp > 1 also the
    tensor-parallel ones of vp.tp.context); returns its measurements. free_before_groups (CUDA): the device's free
    bytes before the process groups were made, to measure the memory outside the allocator (NCCL's buffers).
    observer: called after each iteration with (iteration, loss or None where this rank does not know it, seconds);
    it must return at once (the harness's live W&B logging hands the values to another process)."""
    where = cfg.mesh.coords(rank)
    tp = TensorParallel.of(cfg.mesh, rank, comm, cfg.sequence_parallel) if cfg.tp > 1 else None
    sched = validate_schedule(build(cfg.method, cfg.pp, cfg.microbatches, cfg.n_chunks))
    model = build_rank_model(cfg, sched, where.p, device, tp)
    runtime = Runtime(cfg, sched, where.p, model, comm, device, fault, replica=where.d, global_rank=rank)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    results = []
    for it in range(cfg.iterations):
        results.append(runtime.iteration(it))
        if observer is not None:
            observer(it, results[-1]["loss"], results[-1]["seconds"])
    n_params = sum(p.numel() for p in model.parameters())
    breakdown = runtime.held_memory()
    if device.type == "cuda":
        peak = torch.cuda.max_memory_allocated(device)
        detail = {"allocated": peak, "reserved": torch.cuda.max_memory_reserved(device)}
        if free_before_groups is not None:  # taken since then and not the allocator's: NCCL's buffers, workspaces
            detail["outside_allocator"] = (free_before_groups - torch.cuda.mem_get_info(device)[0]
                                           - torch.cuda.memory_reserved(device))
        breakdown["activations"] = peak - sum(breakdown.values())  # what the allocator held beyond them
    else:  # fp32 parameters, gradients and AdamW moments as held; activations as accounted
        breakdown["activations"] = runtime.meter.peak
        static = breakdown["parameters"] + breakdown["gradients"] + breakdown["optimizer_states"]
        detail = {"static": static, "activations": runtime.meter.peak}
        peak = static + runtime.meter.peak
    breakdown["comm_buffers"] = 0  # in-place collectives; NCCL's own buffers are metrics.comm_buffer_bytes
    its, mbs = cfg.iterations, cfg.iterations * cfg.microbatches
    return RankMeasurement(
        rank=rank, replica=where.d, host=socket.gethostname(),
        device=torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        losses=[r["loss"] for r in results], seconds=[r["seconds"] for r in results],
        events=[r["events"] for r in results[cfg.warmup:]], cpu=[r["cpu"] for r in results[cfg.warmup:]],
        peak_memory_bytes=peak, memory_detail=detail, memory_breakdown=breakdown,
        parameters=n_params, bytes_sent=sum(comm.bytes_sent.values()) / its,
        bytes_by_channel={k: v / its for k, v in comm.by_channel(comm.bytes_sent).items()},
        collectives={k: v / its for k, v in comm.by_op(comm.calls).items()},
        barriers_per_microbatch=sum(comm.barriers.values()) / mbs, communicators=comm.communicators(),
        links=comm.held().links)


def link_probe(comm: Comm, me: int, pp: int, sizes=(4096, 262144, 4194304), reps: int = 3) -> list[list[float]]:
    """[bytes, seconds] of one message between pipeline ranks 0 and 1 (half a ping-pong, best of reps), for fitting
    a link model (python -m harness.calibrate); me: this rank's pipeline index; counters are reset afterwards."""
    out = []
    if me in (0, 1) and pp > 1:
        for size in sizes:
            buf = torch.zeros(size // 4, device=comm.device)
            best = float("inf")
            for _ in range(reps):
                t0 = time.perf_counter()
                if me == 0:
                    comm.isend(buf, 1, "fwd+").wait()
                    comm.irecv(buf, 1, "bwd-").wait()
                else:
                    comm.irecv(buf, 0, "fwd+").wait()
                    comm.isend(buf, 0, "bwd-").wait()
                if comm.device.type == "cuda":
                    torch.cuda.synchronize()
                best = min(best, (time.perf_counter() - t0) / 2)
            out.append([size, best])
    comm.reset_counts()
    return out


def run_rank(cfg: RunConfig, rank: int, world: int, init_method: str, local_rank: int = 0, fault=None,
             experiment: str | None = None, trace_path: str | None = None,
             local_world: int | None = None, observer=None) -> dict | None:
    """One process of a run: process groups, training, gathering; returns the record on rank 0, which also
    writes the Chrome trace of the measured iterations to trace_path when given. local_world: the processes on this
    node when they all see the same GPUs (vp.launch, torchrun; None: unknown, e.g. SLURM with per-task binding).
    observer: see train_rank (vp never imports a logger; the caller supplies one)."""
    if world != cfg.world:
        raise ValueError(f"world size {world} differs from dp x pp x tp = {cfg.world}; launch exactly that many "
                         f"processes")
    device = torch.device("cpu")
    if cfg.device == "cuda":  # device_id: NCCL creates the world's communicator now, and each group's in new_group
        cuda_connections()  # before this process's CUDA context exists
        device = torch.device("cuda", device_index(local_rank, torch.cuda.device_count(), local_world))
        torch.cuda.set_device(device)
        nccl_environment()
        if cfg.dtype == "fp32":  # an fp32 run's GEMMs on TF32 tensor cores, as every framework's fp32 baseline does
            torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
    # the CUDA context exists once this returns; what NCCL allocates from here on, the allocator does not see
    free_before_groups = torch.cuda.mem_get_info(device)[0] if device.type == "cuda" else None
    emulate = Emulation.of(cfg.emulate_nccl)
    pg_timeout = cfg.timeout_s * (2 if emulate else 1)  # emulating NCCL, the watchdog's timeout comes first
    started = now()
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo", init_method=init_method, rank=rank,
                            world_size=world, timeout=timedelta(seconds=pg_timeout),
                            device_id=device if device.type == "cuda" else None)
    comm = None
    try:
        sched = build(cfg.method, cfg.pp, cfg.microbatches, cfg.n_chunks)
        comm = Comm(make_groups(channels(cfg, sched), rank, pg_timeout), device, emulate, cfg.timeout_s, rank)
        comm.connect(run_links(sched))
        peak, how = device_peak(device)
        probe = link_probe(comm, cfg.mesh.coords(rank).p, cfg.pp)
        mine = train_rank(cfg, rank, comm, device, fault, free_before_groups, observer)
        mine.peak_flops = peak
        gathered = [None] * world
        dist.all_gather_object(gathered, mine)
    except BaseException as err:
        err.failed_at = time.time()  # before the abort below makes the peers fail (vp.failure: first in time)
        if comm is not None:  # peers may be blocked with us: abort our communicators, so they fail now
            comm.close(failed=True)
        abort_all()
        raise
    comm.close()
    dist.destroy_process_group()
    if rank != 0:
        return None
    metrics = Metrics.from_measurements(cfg, gathered)
    env = {"torch": torch.__version__, "python": sys.version.split()[0], "device": gathered[0].device,
           "hosts": sorted({r.host for r in gathered}), "git_commit": git_commit(), "start": started,
           "end": now(), "peak_flops_source": how, "world_size": world, "link_probe": probe,
           "cpu_model": cpu_model(), "tf32": device.type == "cuda" and torch.backends.cuda.matmul.allow_tf32}
    record = make_record(cfg.to_dict(), metrics.to_dict(), env, experiment=experiment)
    if trace_path:
        write_trace(trace_path, [r.events for r in gathered], [r.seconds[cfg.warmup:] for r in gathered],
                    {"run_id": record["run_id"], "method": cfg.method, "dp": cfg.dp, "pp": cfg.pp})
    return record
