"""python -m vp.bench sim [--json]: how the schedule simulator's cost grows with the schedule; printed, never asserted.

Each row builds, validates and simulates one schedule (unit costs, as `python -m vp.schedule simulate`) in a fresh
process, so that its peak memory (RSS) is its own; rows run round-robin, `--repeat` times, and the fastest round is
shown with the spread (slowest / fastest). seconds = build + validate + simulate, what the command spends after
parsing its arguments; simulate_s alone is what a sweep repeats per cost model. actions counts every action of the
lowered schedule (passes, collectives, sends and receives). The ratios compare actions per second at each size with
the smallest size of the same method, measured in the same run.
"""
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

METHODS = ("vocab-2", "vhalf-vocab-2", "interleaved-vocab-2")
LADDER = ((32, 128), (64, 256), (128, 512), (256, 1024))
GiB = 2**30


def measure(method: str, pp: int, microbatches: int, chunks: int | None) -> dict:
    """One row, in this process: seconds of each step and the process's peak RSS."""
    from vp.schedule import build, simulate, validate

    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    t0 = time.perf_counter()
    sched = build(method, pp, microbatches, chunks)
    t1 = time.perf_counter()
    validate(sched)
    t2 = time.perf_counter()
    result = simulate(sched)
    t3 = time.perf_counter()
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    actions = sum(len(acts) for acts in sched.ranks)
    return {"method": method, "pp": pp, "microbatches": microbatches, "chunks": sched.chunks, "actions": actions,
            "seconds": t3 - t0, "actions_per_s": actions / (t3 - t0), "build_s": t1 - t0, "validate_s": t2 - t1,
            "simulate_s": t3 - t2, "simulate_actions_per_s": actions / (t3 - t2), "makespan": result.makespan,
            "peak_rss_bytes": rss, "bytes_per_action": (rss - rss0) / actions}


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
    rows = []
    for i, row in enumerate(rounds[0]):
        times = [rnd[i]["seconds"] for rnd in rounds]
        best = min((rnd[i] for rnd in rounds), key=lambda x: x["seconds"])
        rows.append({**best, "spread": max(times) / min(times), "repeat": repeat})
    for row in rows:
        first = next(r for r in rows if r["method"] == row["method"])
        row["actions_per_s_vs_smallest"] = row["actions_per_s"] / first["actions_per_s"]
    if as_json:
        print(json.dumps(rows))
        return rows
    print(f"build + validate + simulate, unit costs, one fresh process per row; best of {repeat} "
          f"(spread = slowest / fastest); ratio = actions/s against the smallest size of the same method")
    print(f"{'method':>20} {'pp':>4} {'mb':>5} {'v':>2} {'actions':>9} {'seconds':>8} {'spread':>6} "
          f"{'actions/s':>10} {'ratio':>5} {'build':>6} {'valid.':>6} {'sim.':>6} {'peak GiB':>8} {'B/action':>8}")
    for r in rows:
        print(f"{r['method']:>20} {r['pp']:>4} {r['microbatches']:>5} {r['chunks']:>2} {r['actions']:>9} "
              f"{r['seconds']:>8.2f} {r['spread']:>6.2f} {r['actions_per_s']:>10.0f} "
              f"{r['actions_per_s_vs_smallest']:>5.2f} {r['build_s']:>6.2f} {r['validate_s']:>6.2f} "
              f"{r['simulate_s']:>6.2f} {r['peak_rss_bytes'] / GiB:>8.2f} {r['bytes_per_action']:>8.0f}")
    return rows


def parse_size(text: str) -> tuple[int, int]:
    pp, sep, m = text.partition("x")
    if not sep or not pp.isdigit() or not m.isdigit() or int(pp) < 2 or int(m) < 1:
        raise ValueError(f"--sizes {text!r}: use PPxMICROBATCHES with pp >= 2, e.g. 32x128")
    return int(pp), int(m)


if __name__ == "__main__":  # one row in this process (what run() starts per row)
    name, pp_arg, m_arg = sys.argv[1:4]
    print(json.dumps(measure(name, int(pp_arg), int(m_arg), None)))
