"""python -m vp.bench sim [--json]: how the schedule simulator's cost grows with the schedule; printed, never asserted.

Each row builds, validates and simulates one schedule (unit costs, as `python -m vp.schedule simulate`) in a fresh
process, so that its peak memory (RSS) is its own; rows run round-robin, `--rounds` times, and the round with the
least CPU time is shown with the spread of CPU times (most / least). seconds = build + validate + simulate on the
wall clock, what the command spends after parsing its arguments; cpu_s the same on the process's CPU clock, which a
loaded machine disturbs less (build, validate, simulate: each step's CPU seconds; simulate alone is what a sweep
repeats per cost model). actions counts every action of the lowered schedule (passes, collectives, sends and
receives). ratio compares actions per CPU second at each size with the smallest size of the same method, measured
in the same run: 1.0 is a cost linear in the schedule's size.
"""
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

from vp.bench import best_of_rounds

METHODS = ("vocab-2", "vhalf-vocab-2", "interleaved-vocab-2")
LADDER = ((32, 128), (64, 256), (128, 512), (256, 1024))
GiB = 2**30


def measure(method: str, pp: int, microbatches: int, chunks: int | None) -> dict:
    """One row, in this process: seconds of each step and the process's peak RSS."""
    from vp.schedule import build, simulate, validate

    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    c0, t0 = time.process_time(), time.perf_counter()
    sched = build(method, pp, microbatches, chunks)
    c1 = time.process_time()
    validate(sched)
    c2 = time.process_time()
    result = simulate(sched)
    c3, t3 = time.process_time(), time.perf_counter()
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    actions = sum(len(acts) for acts in sched.ranks)
    return {"method": method, "pp": pp, "microbatches": microbatches, "chunks": sched.chunks, "actions": actions,
            "seconds": t3 - t0, "actions_per_s": actions / (t3 - t0), "cpu_s": c3 - c0,
            "actions_per_cpu_s": actions / (c3 - c0), "build_cpu_s": c1 - c0, "validate_cpu_s": c2 - c1,
            "simulate_cpu_s": c3 - c2, "makespan": result.makespan, "peak_rss_bytes": rss,
            "bytes_per_action": (rss - rss0) / actions}


def _in_child(method: str, pp: int, microbatches: int) -> dict:
    cmd = [sys.executable, "-m", "vp.bench.sim", method, str(pp), str(microbatches)]
    out = subprocess.run(cmd, cwd=Path(__file__).resolve().parents[2], capture_output=True, text=True)
    if out.returncode:
        raise RuntimeError(f"{method} pp={pp} microbatches={microbatches} failed:\n{out.stderr}")
    return json.loads(out.stdout)


def run(methods, sizes, repeat: int, as_json: bool) -> list[dict]:
    rounds = []
    for n in range(repeat):
        rounds.append([_in_child(method, pp, m) for method in methods for pp, m in sizes])
        print(f"  round {n + 1} of {repeat} done", file=sys.stderr, flush=True)
    rows = [{**best, "spread": spread, "repeat": repeat} for best, _, spread in best_of_rounds(rounds, "cpu_s")]
    for row in rows:
        first = next(r for r in rows if r["method"] == row["method"])
        row["ratio"] = row["actions_per_cpu_s"] / first["actions_per_cpu_s"]
    if as_json:
        print(json.dumps(rows))
        return rows
    print(f"build + validate + simulate, unit costs, one fresh process per row; best of {repeat} by CPU time "
          f"(spread = most / least); ratio = actions per CPU second against the smallest size of the same method")
    print(f"{'method':>20} {'pp':>4} {'mb':>5} {'v':>2} {'actions':>9} {'seconds':>8} {'cpu_s':>7} {'spread':>6} "
          f"{'actions/cpu_s':>13} {'ratio':>5} {'build':>6} {'valid.':>6} {'sim.':>6} {'peak GiB':>8} {'B/action':>8}")
    for r in rows:
        print(f"{r['method']:>20} {r['pp']:>4} {r['microbatches']:>5} {r['chunks']:>2} {r['actions']:>9} "
              f"{r['seconds']:>8.2f} {r['cpu_s']:>7.2f} {r['spread']:>6.2f} {r['actions_per_cpu_s']:>13.0f} "
              f"{r['ratio']:>5.2f} {r['build_cpu_s']:>6.2f} {r['validate_cpu_s']:>6.2f} {r['simulate_cpu_s']:>6.2f} "
              f"{r['peak_rss_bytes'] / GiB:>8.2f} {r['bytes_per_action']:>8.0f}")
    return rows


def parse_size(text: str) -> tuple[int, int]:
    """PPxMICROBATCHES, pp x microbatches within the schedule size limit (vp.checks.MAX_SCHEDULE_SIZE; the ladder's
    largest size is that limit, which interleaved's two chunks double)."""
    from vp.checks import MAX_SCHEDULE_SIZE, check_schedule_size

    pp, sep, m = text.partition("x")
    if not sep or not pp.isdigit() or not m.isdigit() or int(pp) < 2 or int(m) < 1:
        raise ValueError(f"--sizes {text!r}: use PPxMICROBATCHES with pp >= 2, e.g. 32x128")
    check_schedule_size(int(pp), int(m), 1, MAX_SCHEDULE_SIZE, f"pick a size within it (--sizes {text})")
    return int(pp), int(m)


if __name__ == "__main__":  # one row in this process (what run() starts per row)
    name, pp_arg, m_arg = sys.argv[1:4]
    print(json.dumps(measure(name, int(pp_arg), int(m_arg), None)))
