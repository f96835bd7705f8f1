"""The opening of a report: what its runs show, in two or three sentences computed from the runs frame (the
fastest method at the largest vocabulary against baseline, how that changes with the vocabulary, and the
idle time of the ranks), and the commands to run next."""
import pandas as pd

from harness.report.frame import ok_runs

NEXT = ("Next: `make paper-tables` predicts the paper's grids with the cost model (`reports/paper_1f1b/`, "
        "`reports/paper_vhalf/`); `python -m harness.sweep experiment=paper_1f1b cluster=slurm "
        "cluster.partition=NAME` runs that grid on a GPU cluster; `python -m harness.sweep -m "
        "method=baseline,vocab-2 vocab=8k,64k` runs a slice of this one; a real run's measured timeline is "
        "`<run_id>.trace.json` beside its record (open it in ui.perfetto.dev).")


def _x(ratio: float) -> str:
    return f"{ratio:.2f}x"


def _idle(run: dict) -> tuple[int, float] | None:
    """(rank, fraction) of the most idle rank of a run."""
    idle = [(r, f) for r, f in enumerate(run.get("bubble_fraction") or []) if f is not None]
    return max(idle, key=lambda x: x[1]) if idle else None


def group_findings(g: pd.DataFrame, group: str) -> list[str]:
    runs = ok_runs(g, "tokens_per_s")
    if runs.empty or runs["method"].nunique() < 2:  # one method: nothing to compare methods by
        return []
    setup = runs.sort_values(["mesh_key", "seq_len"]).iloc[0]
    runs = runs[(runs["mesh_key"] == setup["mesh_key"]) & (runs["seq_len"] == setup["seq_len"])]
    verb = "measured" if group == "real" else f"predicted ({group})"
    vocabs = sorted(set(zip(runs["vocab_size"], runs["vocab"])))
    size, label = vocabs[-1]
    at = runs[runs["vocab_size"] == size].sort_values("tokens_per_s", ascending=False)
    best = at.iloc[0]
    base = at[at["method"] == "baseline"]
    if base.empty:
        return [f"On {setup['setup']} at vocabulary {label} ({verb}), {best['method']} is the fastest method "
                f"({best['tokens_per_s']:.4g} tokens/s)."]
    ratio = best["tokens_per_s"] / base.iloc[0]["tokens_per_s"]
    out = [f"On {setup['setup']} at vocabulary {label} ({verb}), {best['method']} is the fastest method: "
           f"{_x(ratio)} the throughput (tokens/s) of baseline, which keeps the whole output layer on its last "
           f"rank."]
    ratios = []
    for v, name in vocabs:
        here = runs[runs["vocab_size"] == v]
        b, m = here[here["method"] == "baseline"], here[here["method"] == best["method"]]
        if not b.empty and not m.empty:
            ratios.append((name, m.iloc[0]["tokens_per_s"] / b.iloc[0]["tokens_per_s"]))
    if len(ratios) > 1:
        (small, r0), (large, r1) = ratios[0], ratios[-1]
        trend = "grows" if r1 > 1.05 * r0 else "shrinks" if r1 < 0.95 * r0 else "stays about the same"
        out.append(f"That speedup {trend} with the vocabulary: {_x(r0)} at {small}, {_x(r1)} at {large}.")
    idle_base, idle_best = _idle(base.iloc[0]), _idle(best)
    if idle_base and idle_best and best["method"] != "baseline":
        out.append(f"Baseline's most idle rank (rank {idle_base[0]}) waits {idle_base[1]:.0%} of each iteration; "
                   f"with {best['method']} no rank waits more than {idle_best[1]:.0%}.")
    return out


def findings(df: pd.DataFrame, extra: list[str] = (), with_next: bool = True) -> str:
    """The report's opening paragraph: the findings of the measured runs (else the first group), `extra` (the
    tensor-parallel claims), then NEXT (with_next=False: the report's first screen puts it after its table)."""
    groups = list(df.groupby("group", sort=False))
    groups.sort(key=lambda kv: kv[0] != "real")
    lines = next((found for name, g in groups if (found := group_findings(g, name))), []) + list(extra)
    ok = df[df["status"] == "ok"]
    if not lines and not ok.empty:
        lines.append(f"Every run here uses {', '.join(sorted(set(ok['method'])))}; the tables compare the runs by "
                     f"mesh (dp x pp x tp, whose product is the device count).")
    failed = int((df["status"] != "ok").sum())
    if failed:
        lines.append(f"{failed} run(s) did not finish; they are listed at the end.")
    if not lines:
        lines = ["No run finished ok, so there is nothing to compare yet; the failures are listed at the end."]
    return " ".join(lines) + ("\n\n" + NEXT if with_next else "")
