"""Figures of the tensor-parallel scaling (harness.report.scaling), drawn by harness.report.facets, as PNG and PDF:
per hardware, the weak-scaling series of each tensor mode against the device count (efficiency, model TFLOP/s per
device, peak memory per device), and the strong-scaling series (tokens/s and peak memory per device against
devices)."""
from pathlib import Path

import pandas as pd
from harness.report.facets import line_panels
from harness.report.figures import PANEL, Figure, _log2_ticks, _save
from harness.report.scaling import MODE_NAMES, tensor_runs, with_efficiency
from harness.report.tables import memory_unit, slug

MODE_ORDER = list(MODE_NAMES.values())


def _long(runs: pd.DataFrame, measures: dict) -> pd.DataFrame:
    """One row per (run, measure): devices, mode, measure name, value."""
    rows = [{"devices": r["gpus"], "mode": MODE_NAMES[r["tp_mode"]], "measure": name, "value": value(r)}
            for r in runs.to_dict("records") for name, value in measures.items()]
    return pd.DataFrame(rows).dropna(subset=["value"])


def _draw(data: pd.DataFrame, out: Path, stem: str, measures: list[str]) -> list[Path]:
    modes = [m for m in MODE_ORDER if m in set(data["mode"])]
    figure, panels = line_panels(data, "devices", "value", "mode", modes, "measure", measures, sharey=False,
                                 xlabel="devices (GPUs)", **PANEL)
    devices = sorted(set(data["devices"]))
    _log2_ticks(panels, devices, [str(d) for d in devices])
    return _save(figure, out, stem)


def _per_gpu_tflops(r: dict) -> float | None:
    flops = r["record"]["metrics"].get("model_flops")
    return flops / r["iteration_time_s"] / r["gpus"] / 1e12 if flops and r["iteration_time_s"] else None


def scaling_figures(df: pd.DataFrame, out: Path) -> list[Figure]:
    runs = with_efficiency(tensor_runs(df))
    figures = []
    for group, g in runs.groupby("group", sort=False):
        ok = g[(g["status"] == "ok") & g["tokens_per_s"].notna()]
        scale, unit = memory_unit(ok) if not ok.empty else (2**30, "GiB")
        memory = f"peak memory per device ({unit})"
        for kind in ("weak", "strong"):
            series = ok[ok["series"] == kind]
            title = f"{kind.capitalize()} scaling per tensor mode, {group}"
            if kind == "weak":
                measures = {"weak-scaling efficiency": lambda r: r["efficiency"],
                            "model TFLOP/s per device": _per_gpu_tflops,
                            memory: lambda r: r["max_memory_bytes"] / scale}
                what = ("per tensor mode, against the devices, as the model grows with them: weak-scaling "
                        "efficiency (model FLOP/s per device relative to the mode's smallest configuration), "
                        "model TFLOP/s per device and peak memory per device.")
            else:
                measures = {"tokens/s": lambda r: r["tokens_per_s"],
                            "strong-scaling efficiency": lambda r: r["efficiency"],
                            memory: lambda r: r["max_memory_bytes"] / scale}
                what = ("per tensor mode, one fixed model on more devices: tokens/s, strong-scaling efficiency "
                        "and peak memory per device.")
            fig = Figure(title, what)
            if series["gpus"].nunique() < 2:
                fig.skipped = f"no {kind}-scaling series over two or more device counts"
            else:
                fig.paths = _draw(_long(series, measures), out, f"{kind}_scaling_{slug(group)}", list(measures))
            figures.append(fig)
    return figures
