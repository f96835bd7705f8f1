"""The first screen of every report: the answer to the question the sweep asked. Which method wins, by how much,
at what memory, against the two baselines the paper compares with: naive 1F1B (`baseline`, the whole output layer
on the last stage) and interleaved 1F1B (`interleaved`). A compact table (one row per setup and vocabulary) and its
figure (each method's throughput over baseline against its peak memory); the predicted-against-measured section
and the full tables follow it.

The runs compared are the measured ones where there are any, else those of the first predicted group (one
hardware profile), as the findings sentence above the table does."""
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

from harness.report.figures import DPI, Figure, _methods, _save  # noqa: E402
from harness.report.findings import NEXT  # noqa: E402
from harness.report.frame import MISSING, STATUS_LABEL, ok_runs, ranks_label  # noqa: E402
from harness.report.render import markdown  # noqa: E402
from harness.report.tables import REFERENCES, Table, _frame, memory_unit, slug  # noqa: E402

TITLE = "Which method wins"
STEM = "winner"  # file stem of its table (.tex) and figure


def compared_group(df: pd.DataFrame) -> tuple[str, pd.DataFrame] | None:
    """(group name, its runs): the measured runs if any ended ok, else the first group with an ok run."""
    groups = sorted(df.groupby("group", sort=False), key=lambda kv: kv[0] != "real")
    return next(((name, g) for name, g in groups if not ok_runs(g, "tokens_per_s").empty), None)


def _ref_cell(best: pd.Series, cell: pd.DataFrame, reference: str, value) -> str:
    ref = cell[cell["method"] == reference]
    if ref.empty:
        return MISSING
    ref = ref.iloc[0]
    if ref["status"] != "ok" or pd.isna(ref["tokens_per_s"]):
        return STATUS_LABEL.get(ref["status"], MISSING)
    return value(ref)


def table(group: str, g: pd.DataFrame) -> Table:
    """Per setup (ranks, mesh, sequence, variant) and vocabulary: the fastest method, its tokens/s over each
    baseline's, and the peak memory of it and of the baselines."""
    scale, unit = memory_unit(g)
    ranks = ranks_label(g)
    columns = [("", ranks), ("", "Mesh"), ("", "Seq"), ("", "Vocab"), ("", "Fastest"),
               *[("tokens/s over", ref) for ref in REFERENCES],
               *[(f"Peak memory ({unit})", who) for who in ("fastest", *REFERENCES)]]
    rows = []
    keys = g.sort_values(["mesh_key", "seq_len", "variant", "vocab_size"])[
        ["mesh_key", "seq_len", "variant", "vocab_size"]].drop_duplicates()
    for mk, seq, variant, size in keys.itertuples(index=False):
        cell = g[(g["mesh_key"] == mk) & (g["seq_len"] == seq) & (g["variant"] == variant) & (g["vocab_size"] == size)]
        ok = ok_runs(cell, "tokens_per_s")
        if ok.empty:
            continue
        best = ok.sort_values("tokens_per_s", ascending=False).iloc[0]
        mesh = best["mesh"] + (f" ({variant})" if variant else "")
        row = [str(mk[0]), mesh, str(seq), best["vocab"], best["method"]]
        row += [_ref_cell(best, cell, ref, lambda r: f"{best['tokens_per_s'] / r['tokens_per_s']:.2f}x")
                for ref in REFERENCES]
        memory = (lambda r: MISSING if pd.isna(r["max_memory_bytes"]) else f"{r['max_memory_bytes'] / scale:.2f}")
        row += [memory(best)] + [_ref_cell(best, cell, ref, memory) for ref in REFERENCES]
        rows.append(row)
    note = (f"{group}: per setup and vocabulary the method with the most tokens/s, how many times the tokens/s of "
            f"naive 1F1B (baseline) and of interleaved 1F1B it reaches, and the peak memory (the largest over ranks) "
            f"of it and of the two; {MISSING} marks a baseline not run, OOM/failed/timeout how it ended.")
    return Table(f"{STEM}_{slug(group)}", f"{TITLE} ({group})", note, _frame(columns, rows), blocks=3)


def figure(group: str, g: pd.DataFrame, out) -> Figure:
    """One panel per setup at its largest vocabulary: each method's tokens/s over baseline's against its peak
    memory; up and to the left is better."""
    fig = Figure(f"{TITLE} ({group})", "each method's tokens/s over baseline against its peak memory, per setup, at "
                                       "the largest vocabulary.")
    runs = ok_runs(g, "tokens_per_s")
    panels = []
    for _, setup in runs.sort_values(["mesh_key", "seq_len"]).groupby(["mesh_key", "seq_len"], sort=False):
        at = setup[setup["vocab_size"] == setup["vocab_size"].max()]
        base = at[at["method"] == "baseline"]
        if not base.empty and len(at) > 1:
            panels.append(at.assign(over=at["tokens_per_s"] / base.iloc[0]["tokens_per_s"]))
    if not panels:
        fig.skipped = "no setup has an ok baseline run beside another method"
        return fig
    scale, unit = memory_unit(g)
    methods = _methods(pd.concat(panels))
    colors = {m: plt.get_cmap("tab10")(i % 10) for i, m in enumerate(methods)}
    shown = panels[:6]
    figure_, axes = plt.subplots(1, len(shown), figsize=(3.2 * len(shown), 3.0), squeeze=False, dpi=DPI)
    for ax, data in zip(axes[0], shown):
        for run in data.sort_values("method").itertuples():
            ax.scatter(run.max_memory_bytes / scale, run.over, color=colors[run.method], label=run.method, s=30)
            ax.annotate(run.method, (run.max_memory_bytes / scale, run.over), fontsize=7,
                        xytext=(3, 3), textcoords="offset points")
        ax.axhline(1.0, color="grey", lw=0.6, ls="--")
        ax.set_title(f"{data.iloc[0]['setup']}, {data.iloc[0]['vocab']}", fontsize=8)
        ax.set_xlabel(f"peak memory ({unit})", fontsize=8)
        ax.tick_params(labelsize=7)
    axes[0][0].set_ylabel("tokens/s over baseline", fontsize=8)
    figure_.tight_layout()
    fig.paths = _save(figure_, out, f"{STEM}_{slug(group)}")
    if len(panels) > len(shown):
        fig.skipped = f"{len(panels) - len(shown)} more setups are in the table only"
    return fig


def first_screen(df: pd.DataFrame, out, findings: str) -> tuple[list[str], Table | None, Figure | None]:
    """The README's opening section (its Markdown lines), and its table and figure for the report's lists."""
    lines = [f"## {TITLE}", "", findings, ""]
    chosen = compared_group(df)
    t = fig = None
    if chosen is not None and chosen[1]["method"].nunique() > 1:
        group, g = chosen
        t, fig = table(group, g), figure(group, g, out)
        picture = f"![{fig.title}]({fig.paths[0].name})" if fig.paths else f"(No figure: {fig.skipped}.)"
        lines += [t.note, "", markdown(t), "", picture, ""]
    return lines + [NEXT, ""], t, fig
