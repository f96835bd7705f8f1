"""python -m vp.gpucheck [--device cuda|cpu] [--out DIR] [--budget-s 480] [--parts NAME ...] [--gpus N]
(scripts/gpu-check.sh)

--gpus N (N >= 2, one node): the node form to run before a sweep: preflight, trust and pipeline (every method on up
to N GPUs over NCCL against the reference loss, its step time and communicators, and the fault path), with the
budget the pipeline needs (default 900 s).

Runs the parts of the GPU check (vp/gpucheck/__init__.py) one by one, each in its own process with its own
timeout (cut to what is left of --budget-s), and appends each part's result to DIR/gpu-check.json and
DIR/gpu-check.md as soon as it ends. Exit 0 when every part that ran passed, 1 when one failed, timed out or
crashed, 2 on bad input. DIR (default results/gpu-check/<UTC time>) must not hold a report already.
"""
import argparse
import json
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

from vp.gpucheck import NODE_PARTS, PARTS
from vp.gpucheck.report import Report


def parse(argv):
    ap = argparse.ArgumentParser(prog="scripts/gpu-check.sh", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                    help="cuda: the check itself; cpu: the same code at tiny shapes (what the test suite runs)")
    ap.add_argument("--out", type=Path, default=None,
                    help="folder of the report (default results/gpu-check/<UTC time>)")
    ap.add_argument("--budget-s", type=float, default=480.0, help="wall-clock budget of all parts (default 480)")
    ap.add_argument("--parts", nargs="+", default=list(PARTS), metavar="NAME",
                    help=f"parts to run, in this order: {' '.join(PARTS)} (default all)")
    ap.add_argument("--gpus", type=int, default=None,
                    help="the node form on N >= 2 GPUs: preflight, trust, pipeline (default budget 900 s)")
    ap.add_argument("--part", help=argparse.SUPPRESS)  # internal: run one part in this process
    args = ap.parse_args(argv)
    if args.gpus is not None:
        if args.gpus < 2:
            ap.error(f"--gpus {args.gpus}: the node form needs 2 or more GPUs; leave --gpus out on one GPU")
        if "--parts" not in (argv if argv is not None else sys.argv[1:]):
            args.parts = list(NODE_PARTS)
        if "--budget-s" not in (argv if argv is not None else sys.argv[1:]):
            args.budget_s = 900.0
    unknown = [p for p in args.parts + ([args.part] if args.part else []) if p not in PARTS]
    if unknown:
        ap.error(f"--parts: unknown {unknown}; choose from {', '.join(PARTS)}")
    if not args.budget_s > 0:
        ap.error(f"--budget-s {args.budget_s}: give a positive number of seconds (default 480)")
    if args.out is None:
        args.out = Path("results/gpu-check") / datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S")
    return args


def run_part(args) -> int:
    """One part in this process: its result goes to DIR/parts/NAME.json (read by the parent)."""
    import importlib
    import inspect

    import torch

    from vp.hostenv import die_with_parent
    from vp.record import write_atomic

    die_with_parent()  # a check stopped by its user (or the machine's lease) leaves no part running on the GPU
    device = torch.device("cuda", 0) if args.device == "cuda" else torch.device("cpu")
    module = importlib.import_module(f"vp.gpucheck.{args.part}")
    params = inspect.signature(module.run).parameters
    extra = {"budget_s": args.budget_s} if "budget_s" in params else {}
    if "gpus" in params and args.gpus:
        extra["gpus"] = args.gpus
    result = json.loads(json.dumps(module.run(device, args.out, **extra), default=str))  # any figure, as text
    write_atomic(args.out / "parts" / f"{args.part}.json", result)
    return 0


def main(argv=None) -> int:
    args = parse(argv)
    if args.part:
        return run_part(args)
    if args.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            print("error: --device cuda, but this torch sees no CUDA device (torch.cuda.is_available() is False); "
                  "run on the GPU machine, or --device cpu to exercise the check at tiny shapes", file=sys.stderr)
            return 2
    try:
        report = Report.start(args.out, args.device, argv if argv is not None else sys.argv[1:])
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    deadline = time.monotonic() + args.budget_s
    for name in [p for p in PARTS if p in args.parts]:
        left = deadline - time.monotonic()
        if left < 5:
            report.add(name, {"status": "skipped", "reason": f"the budget of {args.budget_s:.0f} s is spent"})
            continue
        timeout = max(PARTS[name], left - 30) if name == "pipeline" and args.gpus else PARTS[name]
        report.add(name, run_child(args, name, min(timeout, left)))
        print(report.line(name), flush=True)
    verdict = report.finish()
    print(f"{verdict}; report in {args.out / 'gpu-check.md'} and {args.out / 'gpu-check.json'}")
    return 1 if report.failed() or not report.ran() else 0


def run_child(args, name: str, timeout: float) -> dict:
    """One part in a fresh process (python -m vp.gpucheck --part NAME): its result, or how it ended."""
    cmd = [sys.executable, "-m", "vp.gpucheck", "--part", name, "--device", args.device, "--out", str(args.out),
           "--budget-s", str(timeout)] + (["--gpus", str(args.gpus)] if args.gpus else [])
    started = time.monotonic()
    result_file = args.out / "parts" / f"{name}.json"
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        ended = {"returncode": proc.returncode, "stderr": proc.stderr[-4000:]}
    except subprocess.TimeoutExpired as err:
        stderr = err.stderr.decode(errors="replace") if isinstance(err.stderr, bytes) else err.stderr or ""
        ended = {"status": "timeout", "reason": f"still running after its timeout of {timeout:.0f} s",
                 "stderr": stderr[-4000:]}
    seconds = round(time.monotonic() - started, 1)
    if "status" in ended:
        return {**ended, "seconds": seconds}
    if ended["returncode"] or not result_file.exists():
        return {"status": "crashed", "reason": f"exit code {ended['returncode']}", "seconds": seconds,
                "stderr": ended["stderr"]}
    result = json.loads(result_file.read_text())
    ok = result.get("ok")
    status = "passed" if ok else "FAILED" if ok is False else "skipped"
    return {"status": status, "seconds": seconds, "result": result}


if __name__ == "__main__":
    sys.exit(main())
