"""python -m vp.train --method M --pp P [sizes ...] [--json]: one real training run.

Started by a distributed launcher (torchrun sets RANK and WORLD_SIZE), each process runs its rank;
otherwise this starts `pp` local processes itself (CPU + gloo, or one per GPU with --device cuda).
Rank 0 prints one result record (DESIGN.md) with --json, or a summary. A failed run prints the failing
rank's error to stderr, exits non-zero and prints no record.
"""
import argparse
import json
import os
import socket
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist

from vp.comm import PIPELINE_CHANNELS, Comm, make_groups
from vp.mesh import Mesh
from vp.config import RunConfig, validate
from vp.launch import RunFailed, run_local
from vp.metrics import device_peak, summarize
from vp.model import build_stage, vocab_rows
from vp.record import git_commit, make_record, now
from vp.runtime.executor import RankModel
from vp.runtime.loop import Runtime
from vp.schedule import build
from vp.schedule import validate as validate_schedule
from vp.vocab.output import Shard


def build_rank_model(cfg: RunConfig, sched, rank: int, device: torch.device) -> RankModel:
    vp_on = sched.vocab_parallel
    stages = {c: build_stage(cfg, cfg.seed, sched.stage(rank, c), cfg.stage_layers, local_vocab=not vp_on).to(device)
              for c in range(sched.chunks)}
    if not vp_on:
        return RankModel(stages)
    shard = Shard.of(rank, cfg.pp, cfg.padded_vocab_size, cfg.vocab_size)
    end = shard.start + shard.rows

    def rows(name):
        return torch.nn.Parameter(vocab_rows(cfg.seed, name, cfg.vocab_size, shard.start, end, cfg.hidden).to(device))

    return RankModel(stages, shard, rows("head.weight"), rows("embed.weight"))


def train_rank(cfg: RunConfig, rank: int, comm: Comm, device: torch.device, fault=None) -> dict:
    """Run every iteration on this rank (process groups already up); returns this rank's measurements."""
    sched = validate_schedule(build(cfg.method, cfg.pp, cfg.microbatches, cfg.n_chunks))
    model = build_rank_model(cfg, sched, rank, device)
    runtime = Runtime(cfg, sched, rank, model, comm, device, fault)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    results = [runtime.iteration(it) for it in range(cfg.iterations)]
    measured = results[cfg.warmup:]
    pass_s, pass_n = {}, {}
    for r in measured:
        for kind, times in r["pass_s"].items():
            pass_s.setdefault(kind, []).extend(times)
    for kind, times in pass_s.items():
        pass_n[kind] = len(times) // len(measured)
        pass_s[kind] = sum(times) / len(times)
    busy = [sum(sum(t) for t in r["pass_s"].values()) for r in measured]
    idle = sum(1 - b / r["seconds"] for b, r in zip(busy, measured)) / len(measured)
    n_params = sum(p.numel() for p in model.parameters())
    if device.type == "cuda":
        peak = torch.cuda.max_memory_allocated(device)
        detail = {"allocated": peak, "reserved": torch.cuda.max_memory_reserved(device)}
    else:  # fp32 parameter, gradient and two AdamW moments; activations as accounted
        static = 16 * n_params
        detail = {"static": static, "activations": runtime.meter.peak}
        peak = static + runtime.meter.peak
    its, mbs = cfg.iterations, cfg.iterations * cfg.microbatches
    return {
        "rank": rank,
        "host": socket.gethostname(),
        "losses": [r["loss"] for r in results],
        "seconds": [r["seconds"] for r in results],
        "pass_s": pass_s,
        "optimizer_s": sum(r["optimizer_s"] for r in measured) / len(measured),
        "pass_n": pass_n,
        "idle": idle,
        "peak_memory_bytes": peak,
        "memory_detail": detail,
        "parameters": n_params,
        "bytes_sent": sum(comm.bytes_sent.values()) / its,
        "collectives": {k: v / its for k, v in comm.by_op(comm.calls).items()},
        "barriers": sum(comm.barriers.values()) / mbs,
        "executed": [a.text(sched.chunks > 1) for a in results[-1]["executed"]],
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
    }


def link_probe(comm: Comm, sizes=(4096, 262144, 4194304), reps: int = 3) -> list[list[float]]:
    """[bytes, seconds] of one message between pipeline ranks 0 and 1 (half a ping-pong, best of reps),
    for fitting a link model (python -m harness.calibrate); counters are reset afterwards."""
    out = []
    me = comm.index("fwd+")
    if me in (0, 1):
        for size in sizes:
            buf = torch.zeros(size // 4, device=comm.device)
            best = float("inf")
            for _ in range(reps):
                t0 = time.perf_counter()
                if me == 0:
                    comm.isend(buf, 1, "fwd+").wait()
                    comm.irecv(buf, 1, "fwd-").wait()
                else:
                    comm.irecv(buf, 0, "fwd+").wait()
                    comm.isend(buf, 0, "fwd-").wait()
                if comm.device.type == "cuda":
                    torch.cuda.synchronize()
                best = min(best, (time.perf_counter() - t0) / 2)
            out.append([size, best])
    comm.reset_counts()
    return out


def run_rank(cfg: RunConfig, rank: int, world: int, init_method: str, local_rank: int = 0, fault=None,
             experiment: str | None = None) -> dict | None:
    """One process of a run: process groups, training, gathering; returns the record on rank 0."""
    if world != cfg.pp:
        raise ValueError(f"world size {world} differs from pp={cfg.pp}; launch exactly pp processes")
    device = torch.device("cuda", local_rank) if cfg.device == "cuda" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    started = now()
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo", init_method=init_method, rank=rank,
                            world_size=world, timeout=timedelta(seconds=cfg.timeout_s))
    comm = None
    try:
        mesh = Mesh(pp=cfg.pp)
        comm = Comm(make_groups({ch: mesh.groups("pp") for ch in PIPELINE_CHANNELS}, rank, cfg.timeout_s), device)
        peak, how = device_peak(device)
        probe = link_probe(comm)
        mine = train_rank(cfg, rank, comm, device, fault)
        mine["peak_flops"] = peak
        gathered = [None] * world
        dist.all_gather_object(gathered, mine)
    except BaseException:
        if comm is not None:  # peers may be blocked with us: leave their groups alone, exit promptly
            comm.close(failed=True)
        raise
    comm.close()
    dist.destroy_process_group()
    if rank != 0:
        return None
    peak = sum(r["peak_flops"] for r in gathered) / world
    metrics = summarize(cfg, gathered, peak)
    env = {"torch": torch.__version__, "python": sys.version.split()[0], "device": gathered[0]["device"],
           "hosts": sorted({r["host"] for r in gathered}), "git_commit": git_commit(), "start": started,
           "end": now(), "peak_flops_source": how, "world_size": world, "link_probe": probe}
    return make_record(cfg.to_dict(), metrics, env, experiment=experiment)


def launcher_env(env=os.environ) -> tuple[int, int, int, str] | None:
    """(rank, world, local rank, init method) when started by torchrun or a similar launcher."""
    if "RANK" in env and "WORLD_SIZE" in env:
        return int(env["RANK"]), int(env["WORLD_SIZE"]), int(env.get("LOCAL_RANK", 0)), "env://"
    return None


FAULT_MODES = ("exit", "raise", "hang")


# -- command line ------------------------------------------------------------------------------------
def parse_args(argv=None):
    d = RunConfig()
    ap = argparse.ArgumentParser(prog="python -m vp.train", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--method", default=d.method)
    ap.add_argument("--pp", type=int, default=d.pp)
    ap.add_argument("--chunks", type=int, default=None)
    ap.add_argument("--layers", type=int, default=d.layers)
    ap.add_argument("--hidden", type=int, default=d.hidden)
    ap.add_argument("--heads", type=int, default=d.heads)
    ap.add_argument("--ffn-hidden", type=int, default=None)
    ap.add_argument("--seq-len", type=int, default=d.seq_len)
    ap.add_argument("--vocab-size", type=int, default=d.vocab_size)
    ap.add_argument("--pad-multiple", type=int, default=None)
    ap.add_argument("--microbatches", type=int, default=d.microbatches)
    ap.add_argument("--micro-batch-size", type=int, default=d.micro_batch_size)
    ap.add_argument("--iterations", type=int, default=d.iterations)
    ap.add_argument("--warmup", type=int, default=d.warmup)
    ap.add_argument("--seed", type=int, default=d.seed)
    ap.add_argument("--device", default=d.device)
    ap.add_argument("--dtype", default=d.dtype)
    ap.add_argument("--redis-last-layers", type=int, default=None)
    ap.add_argument("--lr", type=float, default=d.lr)
    ap.add_argument("--timeout-s", type=float, default=d.timeout_s)
    ap.add_argument("--json", action="store_true", help="print the result record as one JSON object")
    ap.add_argument("--inject-fault", default=None, metavar="RANK:ACTION[:exit|raise|hang]",
                    help="testing aid: make a rank die, raise or hang at an action of the first iteration")
    args = ap.parse_args(argv)
    fields = {k: v for k, v in vars(args).items() if k not in ("json", "inject_fault")}
    cfg = RunConfig(**fields)
    fault = None
    if args.inject_fault:
        parts = args.inject_fault.split(":")
        if len(parts) not in (2, 3) or not parts[0].isdigit() or (len(parts) == 3 and parts[2] not in FAULT_MODES):
            raise ValueError(f"--inject-fault={args.inject_fault!r}: use RANK:ACTION[:exit|raise|hang], "
                             f"e.g. 1:F2:exit")
        fault = (int(parts[0]), parts[1], parts[2] if len(parts) == 3 else "exit")
    return cfg, args.json, fault


def main(argv=None) -> int:
    try:
        cfg, as_json, fault = parse_args(argv)
        validate(cfg)
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    launched = launcher_env()
    if launched and launched[1] != cfg.pp:
        print(f"error: the launcher started {launched[1]} processes but pp={cfg.pp}; "
              f"start exactly pp processes (e.g. torchrun --nproc-per-node {cfg.pp})", file=sys.stderr)
        return 2
    try:
        if launched:
            rank, world, local_rank, init = launched
            record = run_rank(cfg, rank, world, init, local_rank, fault)
        else:
            record = run_local(cfg, fault)
    except RunFailed as err:
        print(f"run failed ({err.status}): {err}", file=sys.stderr)
        return 1
    if record is None:
        return 0
    if as_json:
        print(json.dumps(record))
    else:
        m = record["metrics"]
        print(f"{cfg.method} pp={cfg.pp}: loss {m['loss']}  iteration {m['iteration_time_s']:.4f} s  "
              f"{m['tokens_per_s']:.0f} tokens/s  MFU {m['mfu']:.3f}")
        print("  peak memory per rank (MiB): " + " ".join(f"{b / 2**20:.1f}" for b in m["peak_memory_bytes"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
