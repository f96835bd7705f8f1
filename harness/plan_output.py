"""What harness.plan prints and writes: the top-k table, best per method, rejections, the JSON object, the
experiment file (a grid of zipped setups, one per plan row: the same RunConfig a sweep job composes) and the
Pareto figure."""
import math
from datetime import datetime, timezone
from pathlib import Path

from omegaconf import OmegaConf

from harness.sim import simulator_version
from vp.cost import PROFILES
from vp.plan import Plan, Problem, Row
from vp.plan.space import KNOBS, divisors

GiB = 2**30
ROW_FIELDS = ("method", "dp", "pp", "tp", "tp_mode", "tp_depth", "micro_batch_size", "microbatches", "chunks",
              *KNOBS, "tokens_per_s", "mfu", "peak_memory_bytes", "headroom_bytes", "headroom")
# how a knob that is on reads in a table (its off value prints nothing)
KNOB_TEXT = {"zero": lambda v: f"zero{v}", "overlap_grad_reduce": lambda v: "overlap",
             "recompute": lambda v: f"rc-{v}", "sequence_parallel": lambda v: "sp"}


def grid_text(row: Row) -> str:
    r = row.run
    if r.tp_mode == "1d":
        return f"t{r.tp}" if r.tp > 1 else "-"
    q = math.isqrt(r.tp // r.tp_depth)
    return f"[{q},{q},{r.tp_depth}]"


def knobs_text(row: Row) -> str:
    """The knobs that are on, e.g. `zero1 overlap rc-full` ('-' for none)."""
    on = [KNOB_TEXT[k](getattr(row.run, k)) for k, (values, _) in KNOBS.items() if getattr(row.run, k) != values[0]]
    return " ".join(on) or "-"


def overrides(row: Row) -> dict:
    """The row as sweep overrides (a grid setup): method= and run.* values, the knobs included (every one, off
    too: a sweep of the file runs exactly these settings whatever the config's defaults)."""
    r = row.run
    out = {"method": r.method, "run.dp": r.dp, "run.pp": r.pp, "run.tp": r.tp, "run.tp_mode": r.tp_mode,
           "run.tp_depth": r.tp_depth, "run.micro_batch_size": r.micro_batch_size, "run.microbatches": r.microbatches}
    out["run.chunks"] = r.chunks
    out["run.redis_last_layers"] = r.redis_last_layers
    out.update({f"run.{k}": getattr(r, k) for k in KNOBS})
    return out


def row_json(row: Row) -> dict:
    d = row.to_dict()
    return {**{k: d[k] for k in ROW_FIELDS}, "redis_last_layers": d["redis_last_layers"], "peak_rank": d["peak_rank"],
            "bubble": d["bubble"], "overrides": [f"{k}={'null' if v is None else v}" for k, v in overrides(row).items()]}


def summary(plan: Plan, experiment_file: str | None) -> dict:
    return {"candidates": plan.candidates, "feasible": plan.feasible, "simulated": plan.simulated,
            "pruned": plan.pruned, "undecided": plan.undecided, "dominated": plan.dominated,
            "memory_budget_bytes": plan.budget,
            "seconds": round(plan.seconds, 2),
            "cpu_seconds": round(plan.cpu_seconds, 2),
            "phases": {k: round(v, 3) for k, v in plan.phases.items()}, "memo": plan.memo,
            "rejected": dict(sorted(plan.rejected.items(), key=lambda kv: -kv[1])),
            "top": [row_json(r) for r in plan.top],
            "best_per_method": {m: row_json(r) for m, r in plan.best_per_method.items()},
            "pareto": [row_json(r) for r in plan.pareto], "experiment_file": experiment_file}


def headroom_text(row: Row) -> str:
    return f"{row.headroom_bytes / GiB:.1f} ({100 * row.headroom:.0f} %)"


def table(plan: Plan, hw) -> str:
    head = ("| # | method | dp x pp x tp | grid | mbs | microbatches | chunks | knobs | tokens/s | MFU % | peak GiB "
            "(pp rank) | headroom GiB (%) | bubble % |\n|--:|:--|:--|:--|--:|--:|--:|:--|--:|--:|--:|--:|--:|")
    lines = [head]
    for i, row in enumerate(plan.top, 1):
        r = row.run
        lines.append(f"| {i} | {r.method} | {r.dp} x {r.pp} x {r.tp} | {grid_text(row)} | {r.micro_batch_size} | "
                     f"{r.microbatches} | {r.n_chunks} | {knobs_text(row)} | {row.tokens_per_s:,.0f} | "
                     f"{100 * row.mfu:.1f} | {row.peak_memory_bytes / GiB:.1f} ({row.peak_rank}) | "
                     f"{headroom_text(row)} | {100 * row.bubble:.1f} |")
    return "\n".join(lines)


def readme(plan: Plan, hw, experiment: str) -> str:
    """plans/<experiment>/README.md: the table, the best per method and how to run them."""
    return "\n".join([f"# {experiment}", "", f"Predicted with hardware={hw.name}: {plan.candidates} candidates, "
                      f"{plan.feasible} feasible, {plan.simulated} simulated.", "", table(plan, hw), "",
                      "Best per method:", "", *[f"- {line.strip()}" for line in best_lines(plan)], "",
                      "![tokens/s against peak memory](pareto.png)", "",
                      f"Run: `python -m harness.sweep experiment={experiment} cluster=slurm cluster.partition=NAME`", ""])


def best_lines(plan: Plan) -> list[str]:
    base = plan.best_per_method.get("baseline")
    out = []
    for method, row in sorted(plan.best_per_method.items(), key=lambda kv: -kv[1].tokens_per_s):
        r = row.run
        ratio = f": {row.tokens_per_s / base.tokens_per_s:.2f}x baseline at its best mesh" if base else ""
        out.append(f"  {method} at its best mesh{ratio} ({r.dp} x {r.pp} x {r.tp} {grid_text(row)}, mbs "
                   f"{r.micro_batch_size}, knobs {knobs_text(row)}, {row.tokens_per_s:,.0f} tokens/s, MFU "
                   f"{100 * row.mfu:.1f} %, {row.peak_memory_bytes / GiB:.1f} GiB, headroom {headroom_text(row)})")
    return out


def describe(plan: Plan, hw, path: Path, experiment: str, folder: Path) -> str:
    lines = [f"{plan.candidates} candidates, {plan.feasible} feasible, {plan.simulated} simulated, "
             f"{plan.pruned} skipped by a safe bound"
             + (f" ({plan.dominated} of them as a knob variant of theirs is as fast with no more memory)"
                if plan.dominated else "")
             + (f", {plan.undecided} skipped before their memory was decided" if plan.undecided else "")
             + f", {plan.seconds:.1f} s ({plan.cpu_seconds:.1f} s of CPU; hardware={hw.name}, "
               f"{hw.memory_bytes / GiB:.2f} GiB per device as torch reports it, plans within "
               f"{plan.budget / GiB:.2f} GiB: plan.memory_margin)", "",
             f"top {len(plan.top)} configurations by predicted tokens/s, each at its fastest knobs:", table(plan, hw),
             "", "best per method:", *best_lines(plan)]
    if plan.rejected:
        lines += ["", "rejected:"]
        for reason, n in sorted(plan.rejected.items(), key=lambda kv: -kv[1]):
            lines.append(f"  {n:>7}  {reason}  (e.g. {plan.examples[reason]})")
    if plan.closest:
        lines += ["", "closest to fitting in memory:"]
        for rej in plan.closest[:3]:
            r = rej.run
            lines.append(f"  {r.method} {r.dp} x {r.pp} x {r.tp} {r.tp_mode} mbs {r.micro_batch_size} knobs "
                         f"{knobs_text(Row(r, 0, 0, 0, 0, 0, 0))}: {rej.excess / GiB:.1f} GiB over; {_fix(rej)}")
    lines += ["", f"experiment file: {path}", f"plan folder: {folder} (README.md, pareto.png, plan.json)",
              f"run the plans:  python -m harness.sweep experiment={experiment} cluster=slurm cluster.partition=NAME",
              f"predict again:  python -m harness.sweep experiment={experiment} backend=sim"]
    return "\n".join(lines)


def _fix(rej) -> str:
    r = rej.run
    hints = ["more pipeline or tensor ranks (fewer replicas)"]
    if r.recompute != "full":
        hints.append("run.recompute=full")
    if r.dp > 1 and not r.zero:
        hints.append("run.zero=1")
    if r.micro_batch_size > 1:
        hints.append("a smaller micro_batch_size")
    hints.append("a device with more memory")
    return "try " + ", ".join(hints)


def no_plan_message(p: Problem, hw, plan: Plan) -> str:
    counts = ", ".join(f"{n} {reason}" for reason, n in sorted(plan.rejected.items(), key=lambda kv: -kv[1]))
    msg = f"all {plan.candidates} candidates were rejected ({counts or 'none generated'})"
    if p.gpus > 3 and divisors(p.gpus) == [1, p.gpus]:
        near = p.gpus_per_node * (p.gpus // p.gpus_per_node)
        msg += (f". plan.gpus={p.gpus} is prime: its only meshes put every device on one axis (dp, pp or tp = "
                f"{p.gpus}); use a count with small factors, e.g. plan.gpus={near} or {near + p.gpus_per_node}")
    elif plan.closest:
        rej = plan.closest[0]
        r = rej.run
        msg += (f". The closest to fitting, {r.method} on {r.dp} x {r.pp} x {r.tp} ({r.tp_mode}) with micro_batch_size "
                f"{r.micro_batch_size}, needs {rej.excess / GiB:.1f} GiB more than the {plan.budget / GiB:.1f} "
                f"GiB a plan may use on {hw.name} (plan.memory_margin): give more GPUs"
                f" (plan.gpus={2 * p.gpus}), a smaller model, or hardware with "
                f"more memory (hardware=h200: {PROFILES['h200'].memory_bytes / GiB:.1f} GiB)")
    elif plan.examples:
        reason = max(plan.rejected, key=plan.rejected.get)
        msg += f". The most common refusal says: {plan.examples[reason]}"
    return msg


def experiment_text(cfg, argv: list[str], plan: Plan, experiment: str, hw) -> str:
    """plan_<name>.yaml: the top-k and the best per method as zipped setups over the planned config."""
    rows, seen = [], set()
    for row in plan.top + list(plan.best_per_method.values()):
        if id(row) not in seen:
            seen.add(id(row))
            rows.append(row)
    run = OmegaConf.to_container(cfg.run, resolve=True)
    for key in ("dp", "pp", "tp", "tp_mode", "tp_depth", "micro_batch_size", "microbatches", "chunks",
                "redis_last_layers", *KNOBS):
        run.pop(key, None)
    body = {"experiment": experiment,
            "model": OmegaConf.to_container(cfg.model, resolve=True),
            "vocab": OmegaConf.to_container(cfg.vocab, resolve=True), "run": run,
            "grid": {"setups": [overrides(r) for r in rows]}}
    stamp = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    head = [
        "# @package _global_",
        f"# Written by python -m harness.plan {' '.join(argv)}",
        f"# on {stamp} (simulator_version {simulator_version()}): {plan.candidates} candidates, {plan.feasible} "
        f"feasible; the top {len(plan.top)} and the best of each method, best first.",
        f"# Run on GPUs: python -m harness.sweep experiment={experiment} cluster=slurm cluster.partition=NAME",
        f"# Predict:     python -m harness.sweep experiment={experiment} backend=sim   (the plan's figures again)",
        "# Both into results/<experiment>/: the report sets measured beside simulated.",
        "# predicted (hardware " + hw.name + "):",
    ]
    for i, r in enumerate(rows, 1):
        head.append(f"#   {i:>2}. {r.run.method} {r.run.dp} x {r.run.pp} x {r.run.tp} {grid_text(r)} mbs "
                    f"{r.run.micro_batch_size} knobs {knobs_text(r)}: {r.tokens_per_s:,.0f} tokens/s, MFU "
                    f"{100 * r.mfu:.1f} %, {r.peak_memory_bytes / GiB:.1f} GiB, headroom {headroom_text(r)}")
    defaults = ["defaults:", f"  - override /model: {cfg.model.name}", f"  - override /vocab: {cfg.vocab.name}",
                f"  - override /hardware: {cfg.hardware.name}"]
    return "\n".join(head + defaults) + "\n" + OmegaConf.to_yaml(OmegaConf.create(body), sort_keys=False)


def figure(plan: Plan, hw, path: Path) -> Path:
    """Tokens/s against peak memory of every simulated feasible plan, one colour per method, the front drawn. Drawn
    with matplotlib alone (seaborn and pandas would be most of what the plan's process imports besides the search)."""
    import colorsys

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    methods = list(dict.fromkeys(r.run.method for r in plan.rows))  # in the rows' order: the best method first
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for i, method in enumerate(methods):  # evenly spaced hues: eleven methods are more than one palette cycle
        rows = [r for r in plan.rows if r.run.method == method]
        ax.scatter([r.peak_memory_bytes / GiB for r in rows], [r.tokens_per_s for r in rows], s=22, label=method,
                   color=colorsys.hls_to_rgb(i / len(methods), 0.55, 0.65), edgecolors="white", linewidths=0.5)
    ax.step([r.peak_memory_bytes / GiB for r in plan.pareto], [r.tokens_per_s for r in plan.pareto], where="post",
            color="black", lw=1, label="Pareto front")
    ax.axvline(hw.memory_bytes / GiB, color="grey", ls="--", lw=0.8)  # the capacity; the budget dotted
    ax.axvline(plan.budget / GiB, color="grey", ls=":", lw=0.8)
    ax.set_xlabel("peak memory (GiB)")
    ax.set_ylabel("tokens/s")
    ax.set_title(f"{plan.simulated} simulated of {plan.feasible} feasible plans ({hw.name})", fontsize=9)
    ax.legend(fontsize=7, loc="best")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
