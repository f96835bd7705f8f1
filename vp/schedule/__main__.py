"""python -m vp.schedule show|simulate --method M --pp P --microbatches N [--chunks V] [--layers L] ...

show      prints the per-rank action grid (and writes a timeline picture with --png FILE)
simulate  prints makespan, bubble rate, per-rank busy time and peak activations (--json for one JSON object);
          --strict runs every rank's collectives on one ordered queue (NCCL without concurrent communicators)
compile   compiles the simulator's loops into numba's cache beside their modules (make venv runs it), so that a fresh
          clone's first plan does not pay for it; takes no other option
"""
import argparse
import json
import math
import sys

from vp.checks import MAX_SCHEDULE_SIZE, check_output_file, check_schedule_size
from vp.config import RunConfig, check_config
from vp.schedule import build, simulate, unit_costs, validate
from vp.schedule.actions import COMPUTE

COMM_KINDS = ("C0", "C1", "C2", "P2P")


def parse_costs(text: str | None) -> tuple[dict, dict]:
    """'F=1,B=2,...' -> (pass costs, communication costs)."""
    passes, comm = {}, {}
    for item in filter(None, (text or "").split(",")):
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or key not in COMPUTE + COMM_KINDS:
            raise ValueError(f"--costs: cannot read {item!r}; use KIND=NUMBER with KIND in "
                             f"{', '.join(COMPUTE + COMM_KINDS)}")
        try:
            number = float(value)
        except ValueError:
            raise ValueError(f"--costs: {key}={value!r} is not a number") from None
        if not math.isfinite(number) or number < 0:  # nan and inf would print invalid JSON (NaN, Infinity)
            raise ValueError(f"--costs: {key}={value.strip()} must be a finite number >= 0")
        (passes if key in COMPUTE else comm)[key] = number
    return passes, comm


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m vp.schedule", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("command", choices=["show", "simulate", "compile"])
    ap.add_argument("--method")
    ap.add_argument("--pp", type=int)
    ap.add_argument("--microbatches", type=int)
    ap.add_argument("--chunks", type=int, default=None, help="model chunks per rank (interleaved only)")
    ap.add_argument("--layers", type=int, default=None, help="check this layer count's split over the stages")
    ap.add_argument("--costs", default=None, help="e.g. F=1,B=2,W=0,S=0,T=0,IF=0,IB=0,C1=0,P2P=0")
    ap.add_argument("--json", action="store_true", help="simulate: print one JSON object")
    ap.add_argument("--strict", action="store_true",
                    help="simulate with all of a rank's collectives on one ordered queue (CUDA_DEVICE_MAX_CONNECTIONS=1)")
    ap.add_argument("--png", default=None, help="write the timeline picture to this file (.png, .pdf or .svg)")
    ap.add_argument("--max-size", type=int, default=MAX_SCHEDULE_SIZE,
                    help=f"refuse schedules with pp x microbatches x chunks above this (default {MAX_SCHEDULE_SIZE})")
    args = ap.parse_args(argv)
    if args.command == "compile":
        return compile_loops()
    missing = [f"--{name}" for name in ("method", "pp", "microbatches") if getattr(args, name) is None]
    if missing:
        ap.error(f"{args.command} needs {', '.join(missing)}")
    try:
        cfg = RunConfig(method=args.method, pp=args.pp, microbatches=args.microbatches, chunks=args.chunks,
                        layers=args.layers or 1, vocab_size=max(1000, args.pp))
        cfg = cfg.with_(layers=args.layers or args.pp * cfg.n_chunks)
        check_config(cfg)
        check_schedule_size(cfg.pp, cfg.microbatches, cfg.n_chunks, args.max_size, "raise --max-size")
        passes, comm = parse_costs(args.costs)
        if args.png:
            check_output_file(args.png, "--png")
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    sched = validate(build(cfg.method, cfg.pp, cfg.microbatches, cfg.n_chunks))
    share = cfg.layers / cfg.pp
    costs = unit_costs(sched, passes, [n / share for n in cfg.stage_layers], comm)
    result = simulate(sched, costs, strict=args.strict)
    if args.command == "show":
        print(sched.to_text() if args.json else sched.header() + "\n" + sched.grid())
    else:
        out = {"method": cfg.method, "pp": cfg.pp, "microbatches": cfg.microbatches, "chunks": cfg.n_chunks,
               "strict": args.strict, **result.summary()}
        if args.json:
            print(json.dumps(out))
        else:
            print(f"{cfg.method}: pp={cfg.pp} microbatches={cfg.microbatches} chunks={cfg.n_chunks}")
            print(f"  makespan {result.makespan:g}   bubble rate {result.bubble_rate:.4f}")
            for r in range(cfg.pp):
                print(f"  rank {r}: busy {result.busy[r]:g}  bubble {result.bubble_fraction[r]:.3f}  "
                      f"peak activations {result.peak_activations[r]:g}")
    if args.png:
        from vp.schedule.picture import draw
        print(f"wrote {draw(sched, result, args.png)}", file=sys.stderr)
    return 0


def compile_loops() -> int:
    """Run every compiled loop (vp.schedule.kernel.jit) once on a schedule large enough to compile them: the
    vocabulary placer's pass timeline, the program's derivation, the simulator and the critical path's walk. numba
    keeps each in its cache on disk, where later processes load it."""
    from vp.schedule import kernel
    try:
        import numba  # noqa: F401
    except ImportError:
        print("numba is not installed: the simulator's loops run as Python (vp/schedule/kernel.py)")
        return 0
    microbatches = kernel.COMPILE_FROM // 8 + 1  # vocab-1 at pp 4: 8 stage passes per microbatch (F and B x 4)
    sched = validate(build("vocab-1", 4, microbatches, 1))
    simulate(sched, unit_costs(sched), path=True)
    print(f"compiled into numba's cache: {', '.join(sorted(f.__name__ for f in kernel._jitted))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
