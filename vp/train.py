"""python -m vp.train --method M --pp P [sizes ...] [--json] [--trace FILE]: one real training run.

Started by a distributed launcher (torchrun sets RANK and WORLD_SIZE), each process runs its rank;
otherwise this starts dp x pp local processes itself (CPU + gloo, or one per GPU with --device cuda).
--microbatches is per data-parallel replica: an iteration is one global batch of dp x microbatches x
micro-batch-size sequences.
Rank 0 prints one result record with --json, or a summary, and writes the measured timeline of the measured
iterations as a Chrome/Perfetto trace with --trace. A failed run prints the failing rank's error to stderr,
exits non-zero and prints no record.
"""
import argparse
import json
import os
import sys

from vp.config import RunConfig, check_config
from vp.launch import RunFailed, launch_local


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
    ap.add_argument("--dp", type=int, default=d.dp, help="data-parallel replicas (microbatches are per replica)")
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
    ap.add_argument("--json", action="store_true", help="print the result record as one JSON object")
    ap.add_argument("--trace", default=None, metavar="FILE",
                    help="write the measured timeline (Chrome/Perfetto trace JSON) of the measured iterations")
    ap.add_argument("--inject-fault", default=None, metavar="RANK:ACTION[:exit|raise|hang]",
                    help="testing aid: make a rank die, raise or hang at an action of the first iteration")
    args = ap.parse_args(argv)
    fields = {k: v for k, v in vars(args).items() if k not in ("json", "inject_fault", "trace")}
    cfg = RunConfig(**fields)
    fault = None
    if args.inject_fault:
        parts = args.inject_fault.split(":")
        if len(parts) not in (2, 3) or not parts[0].isdigit() or (len(parts) == 3 and parts[2] not in FAULT_MODES):
            raise ValueError(f"--inject-fault={args.inject_fault!r}: use RANK:ACTION[:exit|raise|hang], "
                             f"e.g. 1:F2:exit")
        fault = (int(parts[0]), parts[1], parts[2] if len(parts) == 3 else "exit")
    return cfg, args.json, fault, args.trace


def main(argv=None) -> int:
    try:
        cfg, as_json, fault, trace = parse_args(argv)
        check_config(cfg)
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    launched = launcher_env()
    if launched and launched[1] != cfg.world:
        print(f"error: the launcher started {launched[1]} processes but dp x pp = {cfg.world}; "
              f"start exactly that many (e.g. torchrun --nproc-per-node {cfg.world})", file=sys.stderr)
        return 2
    try:
        if launched:
            from vp.run import run_rank

            rank, world, local_rank, init = launched
            record = run_rank(cfg, rank, world, init, local_rank, fault, trace_path=trace)
        else:
            record = launch_local(cfg, fault, trace)
    except RunFailed as err:
        print(f"run failed ({err.status}): {err}", file=sys.stderr)
        return 1
    if record is None:
        return 0
    if as_json:
        print(json.dumps(record))
    else:
        m = record["metrics"]
        print(f"{cfg.method} dp={cfg.dp} pp={cfg.pp}: loss {m['loss']}  iteration {m['iteration_time_s']:.4f} s  "
              f"{m['tokens_per_s']:.0f} tokens/s  MFU {m['mfu']:.3f}")
        print("  peak memory per rank (MiB): " + " ".join(f"{b / 2**20:.1f}" for b in m["peak_memory_bytes"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
