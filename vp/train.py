"""python -m vp.train --method M --pp P [sizes ...] [--json] [--trace FILE]: one real training run.

Started by a distributed launcher (torchrun sets RANK and WORLD_SIZE), each process runs its rank;
otherwise this starts dp x pp x tp local processes itself (CPU + gloo, or one per GPU with --device cuda).
--microbatches is per data-parallel replica: an iteration is one global batch of dp x microbatches x
micro-batch-size sequences. --tp runs each stage on a tensor-parallel group (docs/tensor-parallel.md).
Rank 0 prints one result record with --json, or a summary, and writes the measured timeline of the measured
iterations as a Chrome/Perfetto trace with --trace. A failed run prints the failing rank's error to stderr,
exits non-zero and prints no record. --emulate-nccl keeps NCCL's rules on a CPU run (docs/gpu-path.md).
"""
import argparse
import json
import math
import os
import sys

from vp.checks import (MAX_LOCAL_RANKS, MAX_TOKENS_PER_MICROBATCH, check_fault, check_memory, check_output_file,
                       check_size, parse_fault)
from vp.config import RunConfig, check_config
from vp.launch import RunFailed, exit_interrupted, launch_local
from vp.renamed import refuse_renamed_flags


def launcher_env(env=os.environ) -> tuple[int, int, int, str] | None:
    """(rank, world, local rank, init method) when started by torchrun or a similar launcher."""
    if "RANK" in env and "WORLD_SIZE" in env:
        return int(env["RANK"]), int(env["WORLD_SIZE"]), int(env.get("LOCAL_RANK", 0)), "env://"
    return None


# -- command line ------------------------------------------------------------------------------------
def parse_args(argv=None):
    d = RunConfig()
    ap = argparse.ArgumentParser(prog="python -m vp.train", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--method", default=d.method)
    ap.add_argument("--pp", type=int, default=d.pp)
    ap.add_argument("--dp", type=int, default=d.dp, help="data-parallel replicas (microbatches are per replica)")
    ap.add_argument("--tp", type=int, default=d.tp, help="tensor-parallel devices per pipeline stage (world = dp x pp x tp)")
    ap.add_argument("--tp-mode", default=d.tp_mode, help="1d (Megatron), 2d or 2.5d (SUMMA grid)")
    ap.add_argument("--tp-depth", type=int, default=d.tp_depth, help="2.5d: depth d, tp = q*q*d")
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
    ap.add_argument("--redis-last-layers", type=int, default=None, metavar="N",
                    help="redis: transformer layers on the last stage, as the official --final-stage-num-layers "
                         "(default 0); the rest go to the other stages, remainders on the later ones")
    ap.add_argument("--lr", type=float, default=d.lr)
    ap.add_argument("--timeout-s", type=float, default=d.timeout_s)
    ap.add_argument("--emulate-nccl", nargs="?", const="all", default=None, metavar="lazy|queue|p2p|both|all",
                    help="CPU runs: keep NCCL's rules on gloo (lazy: blocking communicator creation at first use; "
                         "queue: one ordered queue for all of a rank's collectives; p2p: each communicator's "
                         "transfers and collectives in one order, sends done when received; both: lazy and queue; "
                         "all, the default form: every rule); waits end only by the watchdog after --timeout-s "
                         "(docs/gpu-path.md)")
    ap.add_argument("--zero", type=int, default=d.zero, metavar="0|1",
                    help="1: distributed optimizer, Adam states sharded over the dp group, gradients reduce-scattered "
                         "and weights all-gathered after the step (needs --dp >= 2)")
    ap.add_argument("--overlap-grad-reduce", action="store_true",
                    help="launch each gradient bucket's dp reduction during the last backward as its gradients are "
                         "final, on the dp group's own communicator and stream (needs --dp >= 2)")
    ap.add_argument("--bucket-mb", type=float, default=d.bucket_mb,
                    help="MiB of fp32 gradients per dp reduction bucket")
    ap.add_argument("--recompute", default=d.recompute, metavar="none|selective|full",
                    help="activation recomputation: selective recomputes the attention core in backward, full each "
                         "transformer layer from its kept input")
    ap.add_argument("--sequence-parallel", action="store_true",
                    help="1-D tensor parallelism: LayerNorms and the residual stream split over tp along the sequence, "
                         "all-gathers and reduce-scatters in place of the all-reduces (needs --tp >= 2, tp_mode 1d)")
    ap.add_argument("--json", action="store_true", help="print the result record as one JSON object")
    ap.add_argument("--max-tokens", type=int, default=MAX_TOKENS_PER_MICROBATCH,
                    help="refuse micro_batch_size x seq_len above this (a sanity limit against typos)")
    ap.add_argument("--max-memory-gb", type=float, default=None,
                    help="memory the local ranks may use together (default: what this machine has available)")
    ap.add_argument("--max-local-ranks", type=int, default=MAX_LOCAL_RANKS,
                    help="processes this command may start on this machine (the sweep's cluster.max_local_ranks)")
    ap.add_argument("--trace", default=None, metavar="FILE",
                    help="write the measured timeline (Chrome/Perfetto trace JSON) of the measured iterations")
    ap.add_argument("--inject-fault", default=None, metavar="RANK:ACTION[:exit|raise|hang|oom]",
                    help="testing aid: make a rank die, raise, hang or fail as NCCL does when CUDA runs out of "
                         "memory, at an action of the first iteration")
    args = refuse_renamed_flags(ap).parse_args(argv)
    fields = {k: v for k, v in vars(args).items()
              if k not in ("json", "inject_fault", "trace", "max_tokens", "max_memory_gb",
                                                                "max_local_ranks")}
    cfg = RunConfig(**fields)
    fault = parse_fault(args.inject_fault) if args.inject_fault else None
    return cfg, args.json, fault, args


def check_here(cfg: RunConfig, fault, args, launched) -> None:
    """What the config alone cannot tell: the fault spec, the run's size, the trace file, GPUs and memory here."""
    if fault:
        check_fault(cfg, fault)
    check_size(cfg, args.max_tokens, "raise --max-tokens")
    if args.trace:
        check_output_file(args.trace, "--trace", (".json",))
    if not launched and cfg.world > args.max_local_ranks:
        raise ValueError(f"dp x pp x tp = {cfg.world} local processes but --max-local-ranks is "
                         f"{args.max_local_ranks}; use fewer ranks, start the ranks with a launcher (torchrun, "
                         f"SLURM), or raise --max-local-ranks")
    if args.max_memory_gb is not None and not (math.isfinite(args.max_memory_gb) and args.max_memory_gb > 0):
        raise ValueError(f"--max-memory-gb {args.max_memory_gb} must be a positive finite number of GiB (leave it "
                         f"out for what this machine has available)")
    if cfg.device == "cuda":
        import torch

        ranks_here = int(os.environ.get("LOCAL_WORLD_SIZE", 1)) if launched else cfg.world
        have = torch.cuda.device_count()
        if have < ranks_here:
            raise ValueError(f"device=cuda needs {ranks_here} GPU(s) on this machine but {have} are visible; "
                             f"use --device cpu (with --dtype fp32), or run where the GPUs are")
        return
    limit = args.max_memory_gb * 2**30 if args.max_memory_gb else None
    check_memory(cfg, 1 if launched else cfg.world, limit, "raise --max-memory-gb")


def main(argv=None) -> int:
    launched = launcher_env()
    try:
        cfg, as_json, fault, args = parse_args(argv)
        check_config(cfg)
        check_here(cfg, fault, args, launched)
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    trace = args.trace
    if launched and launched[1] != cfg.world:
        print(f"error: the launcher started {launched[1]} processes but dp x pp x tp = {cfg.world}; "
              f"start exactly that many (e.g. torchrun --nproc-per-node {cfg.world})", file=sys.stderr)
        return 2
    try:
        if launched:
            from vp.run import run_rank

            rank, world, local_rank, init = launched
            here = os.environ.get("LOCAL_WORLD_SIZE")  # torchrun: its processes on this node share its GPUs
            record = run_rank(cfg, rank, world, init, local_rank, fault, trace_path=trace,
                              local_world=int(here) if here else None)
        else:
            record = launch_local(cfg, fault, trace)
    except RunFailed as err:
        print(f"run failed ({err.status}): {err}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted: every rank of this run was stopped; no record was written", file=sys.stderr)
        return 130
    if record is None:
        return 0
    if as_json:
        print(json.dumps(record))
    else:
        m = record["metrics"]
        print(f"{cfg.method} {cfg.mesh.describe()}: loss {m['loss']}  iteration {m['iteration_time_s']:.4f} s  "
              f"{m['tokens_per_s']:.0f} tokens/s  MFU {m['mfu']:.3f}")
        print("  peak memory per rank (MiB): " + " ".join(f"{b / 2**20:.1f}" for b in m["peak_memory_bytes"]))
    return 0


if __name__ == "__main__":
    code = main()
    if code == 130:  # Ctrl-C: the ranks are gone; leave without the interpreter's slow shutdown
        exit_interrupted(code)
    sys.exit(code)
