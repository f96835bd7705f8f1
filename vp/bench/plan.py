"""python -m vp.bench plan [--json] [--rounds N] [--problems 30b 70b]: the planner's CPU seconds, never asserted.

Each row runs one planning problem through the real command, `python -m harness.plan ... plan.json=true`, in a fresh
process (its experiment file and figures in a temporary folder), and reads the CPU seconds of that whole process
(user + system, resource.getrusage of the child: imports and Hydra's composition included) beside what the plan
reports of itself: candidates, feasible, simulated, its own CPU seconds (the search alone) and their split by phase
(vp.plan.memo.Phases: the space and its checks, pricing, the walks of built schedules, the full cost model of
the candidates visited, building schedules, the simulator's program of each, simulating) and what the memo computed
of what it was asked. Rounds run round-robin over the problems; the round with the least process CPU time is shown,
with the spread of process CPU times (most / least): the machine is shared, and CPU time is disturbed less than
the wall clock, not at all.

What the planner keeps on disk between processes (vp.disk_cache) lives in a folder of the benchmark's own per
problem, empty at its start: each problem's first round runs cold (cold_cpu_s: its process CPU seconds), and its
later rounds find what the earlier ones kept, as a user's next run of a plan does. With two rounds or more, the
figures shown are the later rounds' (warm); with one, the cold round's.
"""
import json
import os
import resource
import subprocess
import sys
import tempfile
from pathlib import Path

from vp.bench import best_of_rounds
from vp.disk_cache import ENV

# name -> the command line of python -m harness.plan (the problems: docs/planner.md)
PROBLEMS = {
    "30b": ["model=30b", "vocab=256k", "hardware=h100", "plan.gpus=1024", "plan.global_batch=1024",
            "run.seq_len=4096"],
    "70b": ["model=70b", "vocab=256k", "hardware=h100", "plan.gpus=8192", "plan.global_batch=1024",
            "run.seq_len=4096"],
}
ROOT = Path(__file__).resolve().parents[2]


def parse_problem(text: str) -> tuple[str, list[str]]:
    """A name of PROBLEMS, or NAME=OVERRIDES with the overrides separated by commas (e.g.
    small=model=small,vocab=64k,hardware=h100,plan.gpus=16,plan.global_batch=32)."""
    if text in PROBLEMS:
        return text, PROBLEMS[text]
    name, sep, rest = text.partition("=")
    overrides = [x for x in rest.split(",") if x]
    if not sep or not name.isidentifier() or not overrides or any("=" not in x for x in overrides):
        raise ValueError(f"--problems {text!r}: use one of {', '.join(PROBLEMS)} or NAME=KEY=VALUE,KEY=VALUE,... "
                         f"(the overrides of python -m harness.plan)")
    return name, overrides


def measure(name: str, overrides: list[str], cache: str) -> dict:
    """One run of the command in a child process (cache: its VP_CACHE_DIR): its whole CPU time and the plan's own
    figures."""
    with tempfile.TemporaryDirectory(prefix="vp-bench-plan-") as tmp:
        plan_name = f"bench_{name}"
        cmd = [sys.executable, "-m", "harness.plan", *overrides, "plan.json=true", f"plan.name={plan_name}",
               f"plan.out={tmp}/experiment/plan_{plan_name}.yaml", f"plan.figures={tmp}/plans"]
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env={**os.environ, ENV: cache})
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if out.returncode not in (0, 1):  # 1: nothing feasible, still a measured search
        raise RuntimeError(f"{' '.join(cmd)} failed ({out.returncode}):\n{out.stderr[-4000:]}")
    plan = json.loads(out.stdout)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {"problem": name, "overrides": overrides, "process_cpu_s": cpu, "search_cpu_s": plan["cpu_seconds"],
            "search_wall_s": plan["seconds"], "candidates": plan["candidates"], "feasible": plan["feasible"],
            "simulated": plan["simulated"], "phases": plan.get("phases", {}), "memo": plan.get("memo", {})}


def run(problems: list[tuple[str, list[str]]], rounds: int, as_json: bool) -> list[dict]:
    got = []
    with tempfile.TemporaryDirectory(prefix="vp-bench-plan-cache-") as cache:  # a folder per problem
        for n in range(rounds):
            got.append([measure(name, overrides, f"{cache}/{i}") for i, (name, overrides) in enumerate(problems)])
            print(f"  round {n + 1} of {rounds} done", file=sys.stderr, flush=True)
    warm = got[1:] or got
    rows = [{**best, "process_cpu_s_per_round": [r[i]["process_cpu_s"] for r in got], "spread": spread,
             "rounds": rounds, "cache": "warm" if rounds > 1 else "cold", "cold_cpu_s": got[0][i]["process_cpu_s"],
             "cold_search_cpu_s": got[0][i]["search_cpu_s"]}
            for i, (best, _, spread) in enumerate(best_of_rounds(warm, "process_cpu_s"))]
    if as_json:
        print(json.dumps(rows))
        return rows
    shown = (f"best of the {rounds - 1} warm rounds" if rounds > 1 else "one cold round") + " by the process's CPU time"
    print(f"python -m harness.plan per problem, one fresh process per run; {shown} (spread = most / least); search = "
          f"the plan's own cpu_seconds; cold = the first round's, with an empty disk cache (vp.disk_cache)")
    print(f"{'problem':>8} {'process CPU s':>13} {'spread':>6} {'search CPU s':>12} {'cold CPU s':>10} "
          f"{'candidates':>10} {'feasible':>8} {'simulated':>9}")
    for r in rows:
        print(f"{r['problem']:>8} {r['process_cpu_s']:>13.2f} {r['spread']:>6.2f} {r['search_cpu_s']:>12.2f} "
              f"{r['cold_cpu_s']:>10.2f} {r['candidates']:>10} {r['feasible']:>8} {r['simulated']:>9}")
    for r in rows:
        phases = ", ".join(f"{k} {v:.2f}" for k, v in sorted(r["phases"].items(), key=lambda kv: -kv[1]))
        memo = ", ".join(f"{k} {computed}/{calls}" for k, (calls, computed) in r["memo"].items())
        print(f"{r['problem']}: CPU s by phase: {phases}; memo computed/asked: {memo}")
    return rows
