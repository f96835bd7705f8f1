"""python -m harness.plan_check [--hardware NAME] [--results-dir DIR] [--rounds N]  (make plan-check [HARDWARE=NAME])

The planner against reality on this machine: plans a small vocabulary-heavy GPT on 4 CPU processes with a
profile of this machine (default: the one `python -m harness.calibrate --measure` writes), every knob searched
(zero, overlap_grad_reduce, recompute), runs the predicted top 5 configurations (each at its fastest knobs) and
the bottom 2 feasible plans for real through harness.sweep in rounds (every plan once a round; round r's
records in DIR/plan_check_<profile>/round<r>/), and prints the rank correlation of the plans' median measured
tokens/s against the predicted, ending with the line `spearman <value> measured-best-at-predicted-rank <k>`.
Rounds spread each plan's runs over the check, so that the machine's speed drifting within minutes falls on every
plan alike. Runs already in that folder are reused (delete it to measure again).
Exit code 2 when no profile is found (the message says how to make one), 1 when a run failed.
"""
import argparse
import json
import statistics
import sys
from pathlib import Path

from hydra import initialize_config_dir

from harness.measure import default_name
from harness.profiles import CONF, user_conf_dir
from vp.plan.space import KNOBS
from vp.renamed import refuse_renamed_flags

# 4 measured iterations after a warm-up, their median: one run's iterations varied by up to 50 % on the loaded
# development machine, and the predicted top 5 lie within 1-2 % of each other
MODEL = ["model=small", "vocab=64k", "run.seq_len=128", "plan.gpus=4", "plan.global_batch=8", "run.device=cpu",
         "run.dtype=fp32", "run.iterations=5", "run.warmup=1", "run.timeout_s=300"]


def default_profile() -> str:
    """The name `harness.calibrate --measure` gives this machine's profile, checked to exist."""
    name = default_name("cpu")
    if not (user_conf_dir() / "hardware" / f"{name}.yaml").exists():
        raise ValueError(f"no measured profile {name} of this machine in {user_conf_dir() / 'hardware'}; run "
                         f"`python -m harness.calibrate --measure` first (about a minute), or give "
                         f"make plan-check HARDWARE=NAME")
    return name


def spearman(xs: list[float], ys: list[float]) -> float:
    import pandas as pd

    return float(pd.Series(xs).rank().corr(pd.Series(ys).rank()))


def pick(rows: list, top: int, bottom: int, first: list | None = None) -> list:
    """The predicted top `top` (of `first` where given: the plan's top configurations) and bottom `bottom` of the
    ranked rows, none twice (bottom 0: none; rows[-0:] is all of them)."""
    head = (rows if first is None else first)[:top]
    return head + [r for r in rows[len(rows) - bottom:] if r not in head]


def plan_key(method, dp, pp, tp, tp_mode, tp_depth, micro_batch_size, chunks, redis_last_layers, *knobs) -> tuple:
    """What tells the plans of a check apart (a record's config fields; a plan row's run fields), knobs in KNOBS'
    order."""
    return method, dp, pp, tp, tp_mode, tp_depth, micro_batch_size, chunks, redis_last_layers, *knobs


def run_key(r) -> tuple:
    """plan_key of a RunConfig."""
    return plan_key(r.method, r.dp, r.pp, r.tp, r.tp_mode, r.tp_depth, r.micro_batch_size, r.n_chunks,
                    r.redis_last_layers, *(getattr(r, k) for k in KNOBS))


def measured_rounds(folder: Path, rounds: int, experiment: str) -> dict[tuple, list[float]]:
    """Per plan (plan_key), the tokens/s of its run in each round that has one ended ok (folder/round<r>/
    <experiment>/; of several records of one plan in a round, left by an earlier check, the newest)."""
    out: dict = {}
    for r in range(1, rounds + 1):
        newest: dict = {}
        for path in (folder / f"round{r}" / experiment).glob("????????????.json"):
            rec = json.loads(path.read_text())
            if rec["status"] == "ok":
                c = rec["config"]
                key = plan_key(c["method"], c["dp"], c["pp"], c["tp"], c["tp_mode"], c["tp_depth"],
                               c["micro_batch_size"], c["chunks"], c.get("redis_last_layers"),
                               *(c.get(k, values[0]) for k, (values, _) in KNOBS.items()))
                mtime = path.stat().st_mtime
                if key not in newest or mtime > newest[key][0]:
                    newest[key] = (mtime, rec["metrics"]["tokens_per_s"])
        for key, (_, tokens) in newest.items():
            out.setdefault(key, []).append(tokens)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m harness.plan_check", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--hardware", default=None, help="a profile of this machine (default: the measured one)")
    ap.add_argument("--results-dir", default="results",
                    help="the runs go to <results-dir>/plan_check_<profile>/round<r>/ (default results)")
    ap.add_argument("--rounds", type=int, default=3, help="runs of every plan, one per round (default 3)")
    ap.add_argument("--top", type=int, default=5)
    ap.add_argument("--bottom", type=int, default=2)
    args = refuse_renamed_flags(ap).parse_args(argv)
    if args.top < 1 or args.bottom < 0:
        ap.error(f"--top {args.top} --bottom {args.bottom}: --top takes 1 or more plans, --bottom 0 or more")
    if args.rounds < 1:
        ap.error(f"--rounds {args.rounds}: every plan runs at least once; give 1 or more")
    try:
        hardware = args.hardware or default_profile()
    except ValueError as err:
        print(f"plan-check refused: {err}", file=sys.stderr)
        return 2
    from harness import plan as P
    from harness.plan_output import experiment_text, knobs_text
    from vp.files import write_text_atomic
    from harness.sweep import run as sweep
    from vp.plan import search

    name = f"check_{hardware}".replace(".", "_")
    overrides = MODEL + [f"hardware={hardware}", f"plan.name={name}", f"plan.top={args.top}", "plan.prune=false"]
    try:
        cfg, given = P.compose_plan(overrides)
        problem, hw = P.problem_of(cfg, given)
    except ValueError as err:
        print(f"plan-check refused: {err}", file=sys.stderr)
        return 2
    plan = search(problem, hw, top=args.top, prune=False, log=lambda s: print(s, flush=True))
    if len(plan.rows) < args.top + args.bottom:
        print(f"plan-check: only {len(plan.rows)} feasible plans, fewer than {args.top} + {args.bottom}",
              file=sys.stderr)
        return 1
    chosen = pick(plan.rows, args.top, args.bottom, plan.top)
    plan.top, plan.best_per_method = chosen, {}
    experiment = f"plan_{name}"
    path = P.experiment_path(cfg, name)
    write_text_atomic(path, experiment_text(cfg, overrides, plan, experiment, hw))
    print(f"plan: {len(plan.rows)} feasible of {plan.candidates}; running the predicted top {args.top} "
          f"configurations and ranks {len(plan.rows) - args.bottom + 1}-{len(plan.rows)} for real ({path})",
          flush=True)
    folder = Path(args.results_dir) / experiment
    for r in range(1, args.rounds + 1):
        print(f"round {r} of {args.rounds}", flush=True)
        with initialize_config_dir(str(CONF), version_base="1.3"):
            code = sweep([f"experiment={experiment}", "cluster=local", "logger=off", "report=false",
                          f"results_dir={folder}/round{r}"])
        if code:
            return 1
    measured = measured_rounds(folder, args.rounds, experiment)
    pred, meas, ranks = [], [], []
    print(f"predicted rank  plan                                         predicted tokens/s  measured tokens/s "
          f"(median of {args.rounds} rounds: least-most)")
    for i, row in enumerate(chosen):
        r = row.run
        got = measured.get(run_key(r), [])
        rank = plan.rows.index(row) + 1  # among every feasible plan, knob variants included
        what = (f"{r.method} {r.dp}x{r.pp}x{r.tp} {r.tp_mode} mbs {r.micro_batch_size} m {r.microbatches} "
                f"{knobs_text(row)}")
        median = statistics.median(got) if len(got) == args.rounds else None
        spread = f"{min(got):,.0f}-{max(got):,.0f}" if got else ""
        print(f"{rank:>14}  {what:<44} {row.tokens_per_s:>18,.0f}  "
              f"{'failed' if median is None else f'{median:,.0f}':>17} {spread}")
        if median is not None:
            pred.append(row.tokens_per_s)
            meas.append(median)
            ranks.append(rank)
    if len(meas) < len(chosen):
        print(f"plan-check: {len(chosen) - len(meas)} of the plans failed in a round (results in "
              f"{folder}/round*/{experiment})", file=sys.stderr)
        return 1
    best = ranks[max(range(len(meas)), key=meas.__getitem__)]
    print(f"spearman {spearman(pred, meas):.3f} measured-best-at-predicted-rank {best}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
