"""Predicted against measured: every run that has a real record and a sim record of the same config (a sweep with
backend=both, or a real and a simulated sweep into one results folder), side by side with the error of each
prediction, error = predicted / measured - 1. A report with such pairs opens with this table, a line of median and
largest errors, and a figure of predicted against measured."""
import statistics
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402
from matplotlib.ticker import FormatStrFormatter, NullFormatter  # noqa: E402

from harness.report.figures import DPI, Figure  # noqa: E402
from harness.report.frame import MISSING, ranks_label  # noqa: E402
from harness.report.tables import Table, _cell, _frame, _keys_part, _mesh_labels, _num, memory_unit  # noqa: E402

TITLE = "Predicted vs measured"
METRICS = (("iteration_time_s", "Iteration time (s)", ".4g"), ("tokens_per_s", "Tokens/s", ".4g"))


def pairs(df: pd.DataFrame) -> pd.DataFrame:
    """One row per (real run, sim run) of the same config, with the sim's columns suffixed _sim, and the errors
    err_time, err_tokens (predicted / measured - 1) and err_memory (of the rank where |error| is largest) where
    both ended ok."""
    real, sim = df[df["backend"] == "real"], df[df["backend"] == "sim"]
    out = real.merge(sim, on="config_key", suffixes=("", "_sim"))
    if out.empty:
        return out
    out["hardware_sim"] = out["hardware_sim"].fillna(MISSING)
    out = out.sort_values(["mesh_key", "seq_len", "method_rank", "method", "vocab_size", "variant",
                           "hardware_sim", "run_id"], kind="stable").reset_index(drop=True)
    both = (out["status"] == "ok") & (out["status_sim"] == "ok")
    out["err_time"] = (out["iteration_time_s_sim"] / out["iteration_time_s"] - 1).where(both)
    out["err_tokens"] = (out["tokens_per_s_sim"] / out["tokens_per_s"] - 1).where(both)
    out["err_memory"] = [_worst(m, p) if ok else float("nan")
                         for m, p, ok in zip(out["peak_memory_bytes"], out["peak_memory_bytes_sim"], both)]
    return out


def _worst(measured, predicted) -> float:
    errors = [p / m - 1 for m, p in zip(measured or [], predicted or []) if m and p is not None]
    return max(errors, key=abs) if errors else float("nan")


def _pct(value) -> str:
    return _num(value * 100 if pd.notna(value) else value, "+.1f")


def table(p: pd.DataFrame) -> Table:
    keys = [(r["mesh_key"], r["seq_len"], r["method"], r["variant"]) for r in p.to_dict("records")]
    columns, rows = _keys_part(keys, ranks_label(p), _mesh_labels(p))
    columns += [("", "Vocab"), ("", "Hardware")]
    scale, unit = memory_unit(p)
    for _, what, _ in METRICS:
        columns += [(what, "measured"), (what, "predicted"), (what, "error (%)")]
    columns += [(f"Peak memory per rank ({unit})", "measured"), (f"Peak memory per rank ({unit})", "predicted"),
                (f"Peak memory per rank ({unit})", "error (%)")]
    for r, row in zip(p.to_dict("records"), rows):
        sim = {"status": r["status_sim"], **{col: r[f"{col}_sim"] for col, _, _ in METRICS},
               "peak_memory_bytes": r["peak_memory_bytes_sim"]}
        row += [r["vocab"], r["hardware_sim"]]
        for (col, _, fmt), err in zip(METRICS, ("err_time", "err_tokens")):
            row += [_cell(r, lambda x: x[col], fmt), _cell(sim, lambda x: x[col], fmt), _pct(r[err])]
        row += [_cell(r, lambda x: _ranks(x["peak_memory_bytes"], scale), ""),
                _cell(sim, lambda x: _ranks(x["peak_memory_bytes"], scale), ""), _pct(r["err_memory"])]
    return Table("predicted_vs_measured", TITLE,
                 "Runs with both a real record and a sim record of the same config: iteration time, tokens/s and "
                 "peak memory of each rank as measured and as predicted by the cost model with the sim record's "
                 "hardware profile; error = predicted / measured - 1 (memory: the rank with the largest error).",
                 _frame(columns, rows), blocks=3)


SOURCES_TITLE = "Where the iteration-time error comes from"


def _pass_seconds(metrics: dict, times: str = "pass_time_s") -> dict:
    """{(kind, rank): seconds per iteration} of a record's compute passes: the mean time times the count."""
    out = {}
    for kind, per_rank in (metrics.get(times) or {}).items():
        counts = (metrics.get("pass_count") or {}).get(kind) or []
        for rank, (seconds, count) in enumerate(zip(per_rank, counts)):
            if seconds is not None and count:
                out[(kind, rank)] = seconds * count
    return out


def _own_work(real: dict, sim: dict) -> dict:
    """{pass kind: seconds per iteration over every device} of the passes' own work as the cost model predicts it
    for one device computing alone (vp.cost.passes.compute_times with the sim record's hardware profile: no
    sharing of cores, no tensor-parallel collectives), to set beside the CPU time the ranks spent in them."""
    from vp.config import RunConfig
    from vp.cost.passes import compute_times
    from vp.cost.profiles import Hardware
    from vp.schedule import build

    profile = (sim.get("env") or {}).get("hardware")
    if not profile:
        return {}
    cfg = RunConfig.from_dict(real["config"])
    sched = build(cfg.method, cfg.pp, cfg.microbatches, cfg.n_chunks)
    out = {}
    for (kind, stage), seconds in compute_times(cfg, Hardware.from_dict(profile), sched).items():
        devices = cfg.dp * cfg.tp * (cfg.pp if stage is None else 1)  # (kind, None): one pass on every rank
        out[kind] = out.get(kind, 0.0) + seconds * cfg.microbatches * devices
    return out


def sources(p: pd.DataFrame) -> Table | None:
    """Per run measured on CPU processes (whose records hold each pass's CPU time, pass_cpu_time_s): the
    iteration's error beside the error of its passes as simulated (sharing cores, tensor-parallel collectives
    inside) against their measured wall time, the error of the passes' own work (one device alone: _own_work)
    against the CPU time the ranks spent in them, the share of the passes' wall time the ranks did not compute
    (waiting for a core, or inside a pass for its tensor-parallel collectives), and the time after the flush (the
    slowest rank's tail, measured and predicted). Passes summed over every rank and pass of an iteration; None where
    no pair has CPU times."""
    keys, picked = [], []
    for r in p.dropna(subset=["err_time"]).to_dict("records"):
        real, sim = r["record"]["metrics"], r["record_sim"]["metrics"]
        wall, cpu = _pass_seconds(real), _pass_seconds(real, "pass_cpu_time_s")
        if not cpu:
            continue
        predicted, own = _pass_seconds(sim), _own_work(r["record"], r["record_sim"])
        common = [k for k in cpu if k in wall and k in predicted]
        if not common or not own:
            continue
        total = {name: sum(d[k] for k in common) for name, d in (("wall", wall), ("cpu", cpu), ("pred", predicted))}
        total["own"] = sum(own.get(kind, 0.0) for kind in {k for k, _ in common})
        keys.append((r["mesh_key"], r["seq_len"], r["method"], r["variant"]))
        picked.append((r, total, max(real.get("tail_s") or [0.0]), max(sim.get("tail_s") or [0.0])))
    if not picked:
        return None
    columns, rows = _keys_part(keys, ranks_label(p), _mesh_labels(p))
    columns += [("", "Vocab"), ("Iteration time", "error (%)"), ("Passes", "error vs wall (%)"),
                ("Passes", "own work vs CPU time (%)"), ("Passes", "not computing (%)"),
                ("After the flush (s)", "measured"), ("After the flush (s)", "predicted")]
    for (r, total, tail, tail_sim), row in zip(picked, rows):
        row += [r["vocab"], _pct(r["err_time"]), _pct(total["pred"] / total["wall"] - 1),
                _pct(total["own"] / total["cpu"] - 1), _num(100 * (1 - total["cpu"] / total["wall"]), ".1f"),
                _num(tail, ".3g"), _num(tail_sim, ".3g")]
    own = sorted(100 * (t["own"] / t["cpu"] - 1) for _, t, _, _ in picked)
    idle = [100 * (1 - t["cpu"] / t["wall"]) for _, t, _, _ in picked]
    summary = (f"Over {len(picked)} runs the passes' own work was predicted {statistics.median(own):+.1f} % against "
               f"the CPU time the ranks spent in it (median; {own[0]:+.1f} to {own[-1]:+.1f} %), and the ranks did not "
               f"compute {statistics.median(idle):.1f} % of their passes' wall time (median). ")
    return Table("error_sources", SOURCES_TITLE,
                 summary + "Per run on CPU processes: the iteration time's error beside its compute passes' (all ranks' passes "
                 "of an iteration: as simulated against the measured wall time, and their own work, predicted for "
                 "one device computing alone, against the CPU time the ranks' threads spent in them), the share of "
                 "the passes' wall time the ranks did not compute "
                 "(they waited for a core: other ranks, communication threads, the system; with tp > 1 also their "
                 "collectives inside the pass), and the time after the pipeline's flush (slowest rank).",
                 _frame(columns, rows), blocks=3)


def _ranks(values, scale: float) -> str:
    return " ".join(MISSING if v is None else f"{v / scale:.1f}" for v in values or [])


def errors_line(p: pd.DataFrame) -> str:
    """'Over N runs: iteration time median |error| x %, largest y %, mean error +-b %; ...' of the ok pairs (the mean
    with its sign: a bias of the model, where the median of |error| does not say which way it errs)."""
    ok = p.dropna(subset=["err_time"])
    if ok.empty:
        return "No run ended ok both measured and predicted, so no error is given."
    parts = []
    for col, what in (("err_time", "iteration time"), ("err_tokens", "tokens/s"), ("err_memory", "peak memory")):
        e = ok[col].dropna()
        if len(e):
            parts.append(f"{what} median |error| {e.abs().median() * 100:.1f} %, largest {e.abs().max() * 100:.1f} %"
                         + (f", mean error {e.mean() * 100:+.1f} %" if col == "err_time" else ""))
    profiles = ", ".join(sorted(set(ok["hardware_sim"])))
    return f"Over {len(ok)} runs predicted with {profiles}: " + "; ".join(parts) + "." + drift_line(ok)


def drift_line(ok: pd.DataFrame) -> str:
    """' The calibration of P timed the same passes in rounds ...' for each measured profile whose machine
    records how far its rounds disagreed (harness.measure.spread): the machine's own drift while it was measured,
    against which a run's error reads; '' where no profile says."""
    said = {}
    for r in ok.to_dict("records"):
        machine = (((r["record_sim"].get("env") or {}).get("hardware") or {}).get("machine") or {})
        if machine.get("rounds"):
            said[r["hardware_sim"]] = machine["rounds"]
    return "".join(
        f" The calibration of {name} timed the same passes in rounds spread over it, which differed by " +
        " and ".join(f"{100 * v:.0f} % ({table})" for table, v in rounds.items()) +
        " (largest round over smallest, median over shapes): this machine's speed moved that much while it was "
        "measured, and a run's error reads against it." for name, rounds in sorted(said.items()))


def figure(p: pd.DataFrame, out: Path) -> Figure:
    fig = Figure("Predicted against measured",
                 "iteration time and peak memory (every rank) of each run, predicted by the cost model against "
                 "measured; the diagonal is exact, the band +-10 %.")
    ok = p.dropna(subset=["err_time"])
    if ok.empty:
        fig.skipped = "no run ended ok both measured and predicted"
        return fig
    scale, unit = memory_unit(ok)
    f, axes = plt.subplots(1, 2, figsize=(8, 3.6))
    panels = ((ok["iteration_time_s"], ok["iteration_time_s_sim"], "iteration time (s)"),
              ([m / scale for ms in ok["peak_memory_bytes"] for m in ms],
               [s / scale for ss in ok["peak_memory_bytes_sim"] for s in ss], f"peak memory per rank ({unit})"))
    for ax, (measured, predicted, what) in zip(axes, panels):
        measured, predicted = list(measured), list(predicted)
        lo, hi = min(measured + predicted) * 0.8, max(measured + predicted) * 1.25
        ax.fill_between([lo, hi], [lo * 0.9, hi * 0.9], [lo * 1.1, hi * 1.1], color="0.9", label="+-10 %")
        ax.plot([lo, hi], [lo, hi], color="0.4", lw=0.8)
        ax.scatter(measured, predicted, s=14, zorder=3)
        ax.set(xscale="log", yscale="log", xlim=(lo, hi), ylim=(lo, hi), xlabel=f"measured {what}",
               ylabel=f"predicted {what}")
        for axis in (ax.xaxis, ax.yaxis):
            axis.set_major_formatter(FormatStrFormatter("%g"))
            axis.set_minor_formatter(NullFormatter())
    axes[0].legend(loc="upper left", frameon=False)
    f.tight_layout()
    fig.paths = [out / "predicted_vs_measured.png", out / "predicted_vs_measured.pdf"]
    f.savefig(fig.paths[0], dpi=DPI)
    f.savefig(fig.paths[1], metadata={"CreationDate": None})
    plt.close(f)
    return fig
