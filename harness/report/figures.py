"""The paper's figures from the runs frame, drawn with matplotlib in seaborn's style (harness.report.facets), each
as PNG and PDF: MFU against vocabulary size, per-rank peak memory and idle fraction (the imbalance vocabulary
parallelism removes), throughput against GPU count, and the schedule timelines of a few runs. A figure without
data is skipped with the reason."""
from dataclasses import dataclass, field
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402
import seaborn as sns  # noqa: E402
from matplotlib.ticker import NullLocator  # noqa: E402

from harness.report.facets import line_panels, rank_rows  # noqa: E402
from harness.report.frame import METHOD_ORDER, ok_runs, per_rank, ranks_label  # noqa: E402
from harness.report.tables import memory_unit, slug  # noqa: E402

DPI = 100
PANEL = dict(height=2.4, aspect=1.25)  # inches per panel: many panels still make a moderate figure


@dataclass
class Figure:
    title: str
    what: str  # one line: what it shows
    paths: list[Path] = field(default_factory=list)  # empty when skipped
    skipped: str = ""  # why it was not drawn


def _methods(data: pd.DataFrame) -> list[str]:
    present = set(data["method"])
    return [m for m in METHOD_ORDER if m in present] + sorted(present - set(METHOD_ORDER))


def _setups(data: pd.DataFrame) -> list[str]:
    return list(data.sort_values(["mesh_key", "seq_len"])["setup"].drop_duplicates())


def _vocabs(data: pd.DataFrame) -> list[str]:
    return list(data.sort_values("vocab_size")["vocab"].drop_duplicates())


def _save(figure: plt.Figure, out: Path, stem: str) -> list[Path]:
    paths = [out / f"{stem}.png", out / f"{stem}.pdf"]
    figure.savefig(paths[0], dpi=DPI)
    figure.savefig(paths[1], metadata={"CreationDate": None})  # no timestamp: rebuilds compare equal
    plt.close(figure)
    return paths


def _log2_ticks(panels: list, values: list, labels: list[str]) -> None:
    for ax in panels:
        ax.set_xscale("log", base=2)
        ax.set_xticks(values, labels)
        ax.xaxis.set_minor_locator(NullLocator())


def mfu_vs_vocab(g: pd.DataFrame, group: str, out: Path) -> Figure:
    fig = Figure(f"MFU against vocabulary size, {group}",
                 "MFU of each method as the vocabulary grows, one panel per setup (ranks, sequence length).")
    data = ok_runs(g, "mfu").assign(mfu_pct=lambda d: d["mfu"] * 100)
    if data.empty:
        fig.skipped = "no ok run records an MFU"
        return fig
    setups = _setups(data)
    figure, panels = line_panels(data, "vocab_size", "mfu_pct", "method", _methods(data), "setup", setups,
                                 col_wrap=4, xlabel="vocabulary size", ylabel="MFU (%)", **PANEL)
    sizes = sorted(set(data["vocab_size"]))
    _log2_ticks(panels, sizes, [data.loc[data["vocab_size"] == s, "vocab"].iloc[0] for s in sizes])
    fig.paths = _save(figure, out, f"mfu_vs_vocab_{slug(group)}")
    return fig


def _per_rank(g: pd.DataFrame, out: Path, column: str, scale: float, ylabel: str, stem: str, fig: Figure) -> Figure:
    data = per_rank(g, column)
    if data.empty:
        fig.skipped = f"no ok run records {column}"
        return fig
    data["value"] = data["value"] / scale
    figure = rank_rows(data, "vocab", _vocabs(data), "method", _methods(data), "setup", _setups(data), ylabel=ylabel)
    fig.paths = _save(figure, out, stem)
    return fig


def memory_per_rank(g: pd.DataFrame, group: str, out: Path) -> Figure:
    fig = Figure(f"Peak memory per rank, {group}",
                 "peak memory of every rank (global rank of dp x pp x tp), one panel per setup and method, one line "
                 "per vocabulary: without vocabulary parallelism the first and last pipeline stages hold more.")
    scale, unit = memory_unit(g)
    return _per_rank(g, out, "peak_memory_bytes", scale, f"peak memory ({unit})", f"memory_per_rank_{slug(group)}",
                     fig)


def bubble_per_rank(g: pd.DataFrame, group: str, out: Path) -> Figure:
    fig = Figure(f"Idle fraction per rank, {group}",
                 "fraction of the iteration each rank is idle (pipeline bubble), one panel per setup and method, "
                 "one line per vocabulary.")
    return _per_rank(g, out, "bubble_fraction", 1.0, "idle fraction", f"bubble_per_rank_{slug(group)}", fig)


def throughput_vs_gpus(g: pd.DataFrame, group: str, out: Path) -> Figure:
    fig = Figure(f"Throughput against GPU count, {group}",
                 "tokens/s of each method against the number of GPUs (the world size, dp x pp x tp), one panel "
                 "per vocabulary, one line style per sequence length.")
    data = ok_runs(g, "tokens_per_s").assign(seq=lambda d: "seq " + d["seq_len"].astype(str))
    if data.empty:
        fig.skipped = "no ok run records tokens/s"
        return fig
    vocabs = _vocabs(data)
    figure, panels = line_panels(data, "gpus", "tokens_per_s", "method", _methods(data), "vocab", vocabs,
                                 col_wrap=4, style="seq",
                                 style_order=sorted(set(data["seq"]), key=lambda s: int(s.split()[1])),
                                 col_title="vocabulary {}", xlabel=ranks_label(data), ylabel="tokens/s", **PANEL)
    gpus = sorted(set(data["gpus"]))
    _log2_ticks(panels, gpus, [str(p) for p in gpus])
    fig.paths = _save(figure, out, f"throughput_vs_gpus_{slug(group)}")
    return fig


def timelines(g: pd.DataFrame, group: str, out: Path, source: Path) -> Figure:
    """Per method, of the smallest setup at its largest vocabulary: the measured timeline (from the run's trace)
    and, beside it, the schedule replayed with the record's pass times."""
    from harness.records import trace_path
    from harness.timeline import draw_measured, draw_replayed

    fig = Figure(f"Schedule timelines, {group}",
                 "per method, the first measured iteration as the run's trace recorded it (seconds; `_measured`), "
                 "beside its schedule replayed with the record's mean pass times (`_replayed`; the cost model's "
                 "for simulated runs), for the smallest setup at its largest vocabulary (PNG only).")
    data = g[(g["status"] == "ok") & g["has_passes"]]
    if data.empty:
        fig.skipped = "no ok run records pass times"
        return fig
    first = data.sort_values(["mesh_key", "seq_len", "vocab_size"], ascending=[True, True, False]).iloc[0]
    data = data[(data["mesh_key"] == first["mesh_key"]) & (data["seq_len"] == first["seq_len"])
                & (data["vocab_size"] == first["vocab_size"])]
    fig.what += f" Here: {first['setup']}, vocabulary {first['vocab']}."
    failed, no_trace = [], []
    for method in _methods(data):
        run = data[data["method"] == method].sort_values(["variant", "run_id"]).iloc[0]
        stem = out / f"timeline_{slug(group)}_{method}"
        trace = trace_path(source / f"{run['run_id']}.json")
        try:
            if run["backend"] == "real" and trace.exists():
                fig.paths.append(draw_measured(run["record"], trace, stem.with_name(stem.name + "_measured.png")))
            elif run["backend"] == "real":
                no_trace.append(method)
            fig.paths.append(draw_replayed(run["record"], stem.with_name(stem.name + "_replayed.png")))
        except ValueError as err:  # a record whose config no longer builds a schedule, or a broken trace
            failed.append(f"{method} ({err})")
        plt.close("all")
    notes = (["no trace (run before traces were recorded) for " + ", ".join(no_trace)] if no_trace else []) + \
        (["not drawn for " + "; ".join(failed)] if failed else [])
    fig.skipped = "; ".join(notes)
    return fig


def all_figures(df: pd.DataFrame, out: Path, source: Path) -> list[Figure]:
    figures = []
    for group, g in df.groupby("group", sort=False):
        with sns.axes_style("whitegrid"), sns.plotting_context("paper"):  # scoped: timelines keep their style
            figures += [draw(g, group, out) for draw in (mfu_vs_vocab, memory_per_rank, bubble_per_rank,
                                                          throughput_vs_gpus)]
        figures.append(timelines(g, group, out, source))
    return figures
