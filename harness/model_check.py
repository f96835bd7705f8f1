"""python -m harness.model_check [--hardware NAME] [--results-dir DIR] [--rounds N] [--sets NAME ...]
[--extra OVERRIDE ...]
(make model-check [ARGS="--rounds 3"])

The cost model against this machine, on the three sets of real runs a measured profile is judged by: the smoke
sweep (six methods at 8k and 64k on 2 processes), tp_smoke (1-D, 2-D and 2.5-D tensor parallelism on 2-8
processes) and a dp 2 x pp 2 mesh (baseline and vocab-2 at 8k and 64k on 4 processes). Every run goes for real
once per round (round r's records in DIR/model_check_<profile>/round<r>/<set>/) and is predicted once with the
profile (DIR/model_check_<profile>/sim/<set>/). It prints, and writes to DIR/model_check_<profile>/README.md, per
run the measured iteration time (the median over the rounds, and the least and most), the predicted one and the
error (predicted / measured - 1), then per set and over every run the median and largest |error| of the iteration
time and the median |error| of peak memory (the rank with the largest), against the targets: iteration time median
at most 10 % and largest at most 25 %, peak memory median at most 10 %.
Rounds spread each run's repeats over the check, so that the machine's speed drifting within minutes falls on every
run alike; with 2 or more rounds each run's least-most says how far the machine moved, which an error reads
against. On a measured CPU profile the check also times the calibration's own passes again (a stage's layers and
the output layer's parts at the profile's shapes, harness.measure.pass_round) before and after every round, and
gives beside each error the error at that round's speed (the prediction times how much slower those passes ran
than in the profile): what is left of an error once the machine's drift since the calibration is taken out. The
targets are judged on the plain error. Runs already in the folder are reused (delete it to measure again).
Exit code 2 when no profile is found (the message says how to make one) or a sweep refused its overrides, 1 when a
run failed in every round, 130 when interrupted (the same command resumes).
"""
import argparse
import statistics
import sys
from pathlib import Path

from hydra import initialize_config_dir

from harness.profiles import CONF
from vp.renamed import refuse_renamed_flags

SETS = {  # name: (what it runs, the sweep's overrides)
    "smoke": ("the smoke sweep: six methods at 8k and 64k, pp 2", ["experiment=smoke"]),
    "tp_smoke": ("tensor parallelism: 1-D tp 2 and 4, 2-D [2,2,1], 2.5-D [2,2,2]", ["experiment=tp_smoke"]),
    "dp2_pp2": ("a dp 2 x pp 2 mesh: baseline and vocab-2 at 8k and 64k",
                ["experiment=smoke", "run.dp=2", "grid.product.method=[baseline,vocab-2]"]),
}
TARGETS = {"time_median": 0.10, "time_largest": 0.25, "memory_median": 0.10}  # |predicted / measured - 1|
SPEED = "speed.json"  # in each round's folder: the calibration's passes timed again before and after the round


def speed_now(profile: dict) -> float | None:
    """How much slower the machine runs now than when the profile was measured: the calibration's passes (the
    profile's `layers` and `output` rows: a stage's layers and the output layer's parts, as the runtime runs them)
    timed again with the same code and timer (harness.measure.pass_round), each row's time over the profile's, the
    median over rows and passes. None for a profile without those rows (built-in, published) or of a GPU."""
    import torch

    from harness.measure import pass_round
    from vp.cost import measure as M
    from vp.cost.tables import rows

    measured, machine = profile.get("measured") or {}, profile.get("machine") or {}
    if machine.get("device", "cpu") != "cpu":
        return None
    then = {"layers": {tuple(int(x) for x in r[:5]): r[5:] for r in rows(measured.get("layers") or [])},
            "output": {(*(int(x) for x in r[:3]), str(r[3])): r[4:] for r in rows(measured.get("output") or [])}}
    if not any(then.values()):
        return None
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # one rank's thread, as the calibration timed them
    try:
        cpu = torch.device("cpu")
        dtype = M.DTYPES[machine.get("dtype", "fp32")]
        now = pass_round({table: list(keys) for table, keys in then.items()}, cpu, dtype, M.Timer(cpu))
    finally:
        torch.set_num_threads(threads)
    ratios = []
    for table, width in (("layers", 5), ("output", 4)):
        for row in now[table]:
            key = tuple(x if isinstance(x, str) else int(x) for x in row[:width])
            ratios += [new / old for new, old in zip(row[width:], then[table][key]) if old > 0]
    return statistics.median(ratios) if ratios else None


def _timings(folder: Path) -> dict:
    """{before, after: speed} of a round as speed.json holds them ({} where none was taken)."""
    import json

    path = folder / SPEED
    return json.loads(path.read_text()) if path.exists() else {}


def round_speed(folder: Path, when: str, profile: dict | None) -> None:
    """Time the machine's speed (speed_now) into folder/speed.json under `when` (before, after), unless there.
    Only around the round's own runs: "before" where the round has not begun (its folder absent), "after" where
    "before" was timed; a round run without a timing (by an earlier check) gets none, since a timing taken now
    would not be its speed."""
    import json

    from vp.files import write_text_atomic

    got = _timings(folder)
    begun = folder.exists() if when == "before" else "before" not in got
    if when in got or profile is None or begun:
        return
    ratio = speed_now(profile)
    if ratio is not None:
        folder.mkdir(parents=True, exist_ok=True)
        write_text_atomic(folder / SPEED, json.dumps({**got, when: ratio}))
        print(f"  the calibration's passes {when} the round: x{ratio:.2f} their profile's time", flush=True)


def read_speed(folder: Path) -> float | None:
    """A round's speed: the mean of its before and after timings (None where none was taken)."""
    got = _timings(folder)
    return statistics.fmean(got.values()) if got else None


def gather(folder: Path, names: list[str], rounds: int) -> list[dict]:
    """One row per run of each set that ended ok measured (in at least one round) and predicted: its set, mesh,
    method and vocabulary, the measured iteration times of its rounds, the prediction, the error against their
    median, the peak memory's error (the rank with the largest, the median over the rounds), and where the rounds'
    speed was timed, the error at each round's speed (the median over the rounds; None where none was timed)."""
    from harness.records import load
    from harness.report.frame import records_frame
    from harness.report.predicted import pairs

    out = []
    speeds = {r: read_speed(folder / f"round{r}") for r in range(1, rounds + 1)}
    for name in names:
        sims = load(folder / "sim" / name)
        runs: dict = {}
        for r, speed in speeds.items():
            for row in pairs(records_frame(load(folder / f"round{r}" / name) + sims)).to_dict("records"):
                if row["status"] == "ok" and row["status_sim"] == "ok":
                    run = runs.setdefault(row["config_key"], {"set": name, "row": row, "measured": [], "memory": [],
                                                              "at_speed": [], "when": []})
                    run["measured"].append(row["iteration_time_s"])
                    if speed is not None:
                        run["at_speed"].append(row["iteration_time_s_sim"] * speed / row["iteration_time_s"] - 1)
                    run["memory"].append(row["err_memory"])
                    env = row["record"].get("env") or {}
                    run["when"] += [t for t in (env.get("start"), env.get("end")) if t]
        for run in runs.values():
            row = run.pop("row")
            median = statistics.median(run["measured"])
            out.append({**run, "mesh": row["mesh"], "method": row["method"], "vocab": row["vocab"],
                        "hardware": row["hardware_sim"], "predicted": row["iteration_time_s_sim"],
                        "median": median, "err_time": row["iteration_time_s_sim"] / median - 1,
                        "err_memory": statistics.median(run["memory"]), "pair": row,
                        "err_at_speed": statistics.median(run["at_speed"]) if run["at_speed"] else None})
    return out


def _pct(x: float) -> str:
    return f"{100 * x:.1f} %"


def summary(rows: list[dict], what: str) -> str:
    """'<what>: N runs, iteration time median |error| x %, largest y % (run), mean error +-b %; peak memory median
    |error| z %' (and how far the rounds of a run were apart, where there were several). The mean error keeps its
    sign: a bias (the model too fast or too slow for most runs) against errors that scatter both ways."""
    times = [abs(r["err_time"]) for r in rows]
    worst = max(rows, key=lambda r: abs(r["err_time"]))
    bias = statistics.fmean(r["err_time"] for r in rows)
    line = (f"{what}: {len(rows)} runs, iteration time median |error| {_pct(statistics.median(times))}, largest "
            f"{_pct(max(times))} ({worst['method']} {worst['mesh']} {worst['vocab']}), mean error {100 * bias:+.1f} % "
            f"({'predicted faster than measured' if bias < 0 else 'predicted slower than measured'} on average); "
            f"peak memory median |error| "
            f"{_pct(statistics.median(abs(r['err_memory']) for r in rows))}")
    spread = [max(r["measured"]) / min(r["measured"]) - 1 for r in rows if len(r["measured"]) > 1]
    if spread:
        line += f"; a run's rounds apart by {_pct(statistics.median(spread))} (median; most {_pct(max(spread))})"
    return line


def verdict(rows: list[dict]) -> str:
    """Each target, met or not, over every run."""
    times = [abs(r["err_time"]) for r in rows]
    memory = [abs(r["err_memory"]) for r in rows]
    checks = ((f"iteration time median |error| at most {_pct(TARGETS['time_median'])}",
               statistics.median(times) <= TARGETS["time_median"]),
              (f"largest at most {_pct(TARGETS['time_largest'])}", max(times) <= TARGETS["time_largest"]),
              (f"peak memory median |error| at most {_pct(TARGETS['memory_median'])}",
               statistics.median(memory) <= TARGETS["memory_median"]))
    return "Targets: " + "; ".join(f"{text}: {'met' if ok else 'NOT met'}" for text, ok in checks) + "."


def render(rows: list[dict], names: list[str], hardware: str, rounds: int, speeds: dict | None = None) -> str:
    """The check as markdown: a table of every run, then a line per set, one over every run, the targets, and
    where the rounds' speed was timed (`speeds`: {round: speed}), what the error is at that speed."""
    from harness.report.predicted import drift_line
    import pandas as pd

    when = sorted(t for r in rows for t in r["when"])
    span = f", {when[0]} to {when[-1]}" if when else ""
    lines = [f"# Model check: {hardware}", "",
             f"Every run measured in {rounds} round{'s' if rounds > 1 else ''}{span} (`python -m harness.model_check "
             f"--hardware {hardware} --rounds {rounds}`), and predicted by the cost model with the profile "
             f"{hardware}; error = predicted / measured - 1, the measured iteration time the median over the rounds.",
             "", "| Set | Mesh | Method | Vocab | Iteration time (s) measured | least-most | predicted | error (%) | "
             "error at the round's speed (%) | Peak memory error (%) |", "|:--|:--|:--|:--|--:|:--|--:|--:|--:|--:|"]
    for r in rows:
        at = "" if r["err_at_speed"] is None else f"{100 * r['err_at_speed']:+.1f}"
        lines.append(f"| {r['set']} | {r['mesh']} | {r['method']} | {r['vocab']} | {r['median']:.4g} | "
                     f"{min(r['measured']):.4g}-{max(r['measured']):.4g} | {r['predicted']:.4g} | "
                     f"{100 * r['err_time']:+.1f} | {at} | {100 * r['err_memory']:+.1f} |")
    lines.append("")
    for name in names:
        mine = [r for r in rows if r["set"] == name]
        if mine:
            lines += [f"- {summary(mine, f'{name} ({SETS[name][0]})')}"]
    lines += [f"- {summary(rows, 'every run')}", "", verdict(rows)]
    if speeds:
        at = [abs(r["err_at_speed"]) for r in rows if r["err_at_speed"] is not None]
        lines += ["", "The calibration's own passes, timed again before and after each round, took " +
                  ", ".join(f"x{v:.2f} (round {r})" for r, v in speeds.items()) + " their profile's time: the "
                  "machine's speed against the calibration's. At each round's speed (the prediction times that) the "
                  f"error is median |error| {_pct(statistics.median(at))}, largest {_pct(max(at))}: what is the "
                  "model's once the machine's drift is taken out. The targets are judged on the plain error."]
    drift = drift_line(pd.DataFrame([r["pair"] for r in rows]))
    if drift:
        lines += ["", drift.strip()]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m harness.model_check", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--hardware", default=None, help="a profile of this machine (default: the measured one)")
    ap.add_argument("--results-dir", default="results",
                    help="results folder: the runs go to <results-dir>/model_check_<profile>/ (default results)")
    ap.add_argument("--rounds", type=int, default=1, help="real runs of every job, one per round (default 1)")
    ap.add_argument("--sets", nargs="+", default=list(SETS), metavar="NAME",
                    help=f"which sets (default all: {' '.join(SETS)})")
    ap.add_argument("--extra", nargs="*", default=[], metavar="OVERRIDE",
                    help="more overrides for every sweep of the check, e.g. run.iterations=5")
    args = refuse_renamed_flags(ap).parse_args(argv)
    if args.rounds < 1:
        ap.error(f"--rounds {args.rounds}: every run goes at least once; give 1 or more")
    unknown = [s for s in args.sets if s not in SETS]
    if unknown:
        ap.error(f"--sets {' '.join(unknown)}: no such set; the sets are {', '.join(SETS)}")
    from harness.plan_check import default_profile

    try:
        hardware = args.hardware or default_profile()
    except ValueError as err:
        print(f"model-check refused: {err}", file=sys.stderr)
        return 2
    from harness.sweep import run as sweep
    from vp.files import write_text_atomic

    folder = Path(args.results_dir) / f"model_check_{hardware}".replace(".", "_")
    common = ["logger=off", "report=false", *args.extra]
    for name in args.sets:
        print(f"{name}: predicted with {hardware}", flush=True)
        with initialize_config_dir(str(CONF), version_base="1.3"):
            code = sweep([*SETS[name][1], "backend=sim", f"hardware={hardware}", f"results_dir={folder}/sim/{name}",
                          *common])
        if code:  # 2: refused (the sweep said why), 130: interrupted
            return code
    profile = measured_profile(hardware)
    for r in range(1, args.rounds + 1):
        round_speed(folder / f"round{r}", "before", profile)
        for name in args.sets:
            print(f"round {r} of {args.rounds}: {name}", flush=True)
            with initialize_config_dir(str(CONF), version_base="1.3"):
                code = sweep([*SETS[name][1], "backend=real", "cluster=local",
                              f"results_dir={folder}/round{r}/{name}", *common])
            if code:  # a failed run is left out of its round (a run failed in every round fails the check)
                return code
        round_speed(folder / f"round{r}", "after", profile)
    rows = gather(folder, args.sets, args.rounds)
    if not rows:
        print(f"model-check: no run ended ok both measured and predicted (records in {folder})", file=sys.stderr)
        return 1
    speeds = {r: read_speed(folder / f"round{r}") for r in range(1, args.rounds + 1)}
    text = render(rows, args.sets, hardware, args.rounds, {r: v for r, v in speeds.items() if v is not None})
    write_text_atomic(folder / "README.md", text)
    print(text + f"\nwritten to {folder / 'README.md'}")
    missing = _missing(folder, args.sets, rows)
    if missing:
        print(f"model-check: {missing} run(s) failed in every round (records in {folder}/round*/)", file=sys.stderr)
        return 1
    return 0


def measured_profile(name: str) -> dict | None:
    """The profile `name` from the user's profile folder (a measured one: what `harness.calibrate --measure`
    writes), None for a built-in profile or one not found there."""
    from harness.profiles import read_profile, user_conf_dir

    path = user_conf_dir() / "hardware" / f"{name}.yaml"
    return read_profile(path) if path.exists() else None


def _missing(folder: Path, names: list[str], rows: list[dict]) -> int:
    """How many predicted jobs have no run that ended ok in any round."""
    from harness.records import load

    predicted = sum(1 for name in names for rec in load(folder / "sim" / name) if rec["status"] == "ok")
    return predicted - len(rows)


if __name__ == "__main__":
    sys.exit(main())
