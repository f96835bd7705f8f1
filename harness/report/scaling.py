"""Tensor-parallel sections of a report: throughput, MFU and memory per mesh (any run on a dp x pp x tp mesh
other than a pure pipeline), and for pure tensor-parallel runs (one stage, one replica: GPUs = tp) the scaling
of each tensor mode, weak and strong, with the 2.5-D paper's claims (arXiv 2105.14500) beside the ratios here.

Definitions (also in docs/harness.md):
- a run's *model* is its config without the mesh fields (tp, tp_mode, tp_depth and the padding they imply);
- per hardware and tensor mode, a model run on several device counts is a *strong-scaling* series (same model,
  more devices); the runs whose model is run on one device count only form the mode's *weak-scaling* series
  (the model grows with the devices, as experiment=tp_scaling's rule makes it);
- *weak-scaling efficiency* at P devices = model FLOP/s per device at P / that of the same mode's smallest
  configuration in its weak series (= MFU(P) / MFU(P0)): 1 means the per-device throughput held as the model
  grew with the devices;
- *strong-scaling efficiency* at P = (tokens/s at P / tokens/s at P0) / (P / P0);
- a claim's *simulated ratio* is tokens/s of one grid over another's for the same model on the same device count
  (equal to their MFU ratio)."""
import json
from dataclasses import dataclass

import pandas as pd

from harness.report.frame import MISSING, NOT_SEMANTIC, mesh_of, ranks_label
from harness.report.tables import MESH, Table, _frame, _num, memory_unit, slug

MESH_FIELDS = ("tp", "tp_mode", "tp_depth", "pad_multiple", "padded_vocab_size", *NOT_SEMANTIC)
MODE_NAMES = {"1d": "1-D", "2d": "2-D", "2.5d": "2.5-D"}
# what a simulated ratio rests on (docs/cost-model.md)
ASSUMPTIONS = ("Simulated ratios are the cost model's predictions (vp/cost/tensor.py, docs/cost-model.md), not "
               "measurements: each device's share of a stage's GEMMs is timed by its shape on the hardware profile; "
               "each mode's collectives come from the closed form of vp.tp.traffic (the one `vp.bench tp` checks "
               "against measured counts), timed on a two-level network (8 GPUs per node on NVLink, InfiniBand "
               "between nodes, so the COL and DEP groups of a 64-device grid and a 1-D group of 16 or 64 cross "
               "nodes); 1-D's all-reduces block the next GEMM, a grid's SUMMA steps overlap with its GEMMs as the "
               "runtime prefetches them (only the first step's share is exposed), LayerNorm statistics and the "
               "vocabulary layers' collectives stay serial, 2.5-D's depth all-reduce runs once per iteration. "
               "The paper's hardware, model sizes and definition of efficiency are not known (only its abstracts "
               "are), so the ratios compare the modes under this model, not the paper's testbed.")


@dataclass(frozen=True)
class Grid:
    """A tensor-parallel arrangement as the paper names it: mode and [q, q, d] (1-D: tp devices)."""
    mode: str
    q: int
    depth: int = 1

    @property
    def devices(self) -> int:
        return self.q if self.mode == "1d" else self.q * self.q * self.depth

    def __str__(self) -> str:
        return f"1-D {self.q}" if self.mode == "1d" else f"{MODE_NAMES[self.mode]} [{self.q},{self.q},{self.depth}]"


@dataclass(frozen=True)
class Claim:
    kind: str  # weak | strong: which series the two runs come from
    faster: Grid
    than: Grid
    paper: float  # the published ratio
    source: str


CLAIMS = (
    Claim("weak", Grid("2.5d", 4, 4), Grid("2d", 8), 1.45, "arXiv 2105.14500 v1 abstract (weak scaling, 64 devices)"),
    Claim("strong", Grid("2.5d", 4, 4), Grid("1d", 64), 1.38, "arXiv 2105.14500 v2 abstract (strong scaling)"),
    Claim("strong", Grid("2.5d", 4, 4), Grid("2d", 8), 1.53, "arXiv 2105.14500 v2 abstract (strong scaling)"),
)


def _model_key(rec: dict) -> str:
    return json.dumps({k: v for k, v in rec["config"].items() if k not in MESH_FIELDS}, sort_keys=True, default=str)


def _model_name(run: dict) -> str:
    cfg = run["record"]["config"]
    return f"{run['model'] or 'model'} (h {cfg['hidden']}, {cfg['heads']} heads, {cfg['layers']} layers)"


def tensor_runs(df: pd.DataFrame) -> pd.DataFrame:
    """Pure tensor-parallel runs (pp = dp = 1, tp > 1), with their grid, model key and scaling series."""
    runs = df[(df["pp"] == 1) & (df["dp"] == 1) & (df["tp"] > 1)].copy()
    if runs.empty:
        return runs.assign(grid=[], model_key=[], series=[])
    meshes = [mesh_of(rec["config"]) for rec in runs["record"]]
    runs["grid"] = [Grid(m.tp_mode, m.q, m.depth) for m in meshes]
    runs["model_key"] = [_model_key(r) for r in runs["record"]]
    counts = runs.groupby(["group", "tp_mode", "model_key"])["gpus"].transform("nunique")
    runs["series"] = ["strong" if n > 1 else "weak" for n in counts]
    return runs


def _efficiency(series: pd.DataFrame, kind: str) -> pd.Series:
    """Per run of one mode's series: weak (MFU / MFU at the fewest devices) or strong efficiency."""
    ok = series[(series["status"] == "ok") & series["tokens_per_s"].notna()]
    out = pd.Series(float("nan"), index=series.index)
    if ok.empty:
        return out
    base = ok.sort_values("gpus").iloc[0]
    for idx, run in ok.iterrows():
        if kind == "weak":
            out[idx] = run["mfu"] / base["mfu"]
        else:
            out[idx] = (run["tokens_per_s"] / base["tokens_per_s"]) / (run["gpus"] / base["gpus"])
    return out


def with_efficiency(runs: pd.DataFrame) -> pd.DataFrame:
    runs = runs.copy()
    runs["efficiency"] = float("nan")
    for (_, _, kind, model), s in runs.groupby(["group", "tp_mode", "series", "model_key"], sort=False):
        if kind == "strong":
            runs.loc[s.index, "efficiency"] = _efficiency(s, "strong")
    for (_, _, kind), s in runs.groupby(["group", "tp_mode", "series"], sort=False):
        if kind == "weak" and s["gpus"].nunique() == len(s):  # one weak model per device count
            runs.loc[s.index, "efficiency"] = _efficiency(s, "weak")
    return runs


def _status_or(run: dict, text: str) -> str:
    return text if run["status"] == "ok" else {"oom": "OOM"}.get(run["status"], run["status"])


def mesh_table(g: pd.DataFrame, group: str) -> Table:
    """Every run on a mesh other than a pure pipeline: tokens/s, per GPU, MFU, the largest peak memory."""
    scale, unit = memory_unit(g)
    ranks = ranks_label(g)
    columns = [("", ranks), ("", MESH), ("", "Model"), ("", "Seq"), ("", "Method"), ("", "Vocab"),
               ("tokens/s", "total"), ("tokens/s", "per device"), ("", "MFU (%)"),
               ("", f"Peak mem per device ({unit})")]
    rows = []
    for r in g.to_dict("records"):
        ok = r["status"] == "ok"
        rows.append([str(r["gpus"]), r["mesh"], _model_name(r), str(r["seq_len"]), r["method"], r["vocab"],
                     _status_or(r, _num(r["tokens_per_s"], ".4g")),
                     _status_or(r, _num(r["tokens_per_s"] / r["gpus"] if ok else None, ".4g")),
                     _status_or(r, _num(r["mfu"] * 100 if ok else None, ".2f")),
                     _status_or(r, _num(r["max_memory_bytes"] / scale if ok else None, ".2f"))])
    return Table(f"tp_mesh_{slug(group)}", f"Throughput, MFU and memory per mesh, {group}",
                 f"Per run: {ranks} (the world size, dp x pp x tp), the mesh with its tensor mode and grid [q,q,d], "
                 f"tokens/s in total and per device, MFU and the largest peak memory over the devices.",
                 _frame(columns, rows), blocks=2)


def scaling_table(runs: pd.DataFrame, group: str, kind: str) -> Table | None:
    runs = runs[runs["series"] == kind].assign(mode_rank=lambda d: [list(MODE_NAMES).index(m) for m in d["tp_mode"]])
    runs = runs.sort_values(["mode_rank", "gpus", "model_key"], kind="stable")
    if runs.empty or runs["gpus"].nunique() < 2:
        return None
    scale, unit = memory_unit(runs)
    what = "weak-scaling efficiency" if kind == "weak" else "strong-scaling efficiency"
    columns = [("", "Mode"), ("", ranks_label(runs)), ("", "Grid"), ("", "Model"), ("", "tokens/s"),
               ("", "model TFLOP/s per device"), ("", "MFU (%)"), ("", what), ("", f"Peak mem per device ({unit})")]
    rows = []
    for r in runs.to_dict("records"):
        ok = r["status"] == "ok"
        flops = r["record"]["metrics"].get("model_flops") if ok else None
        per_gpu = flops / r["iteration_time_s"] / r["gpus"] / 1e12 if flops and r["iteration_time_s"] else None
        rows.append([MODE_NAMES[r["tp_mode"]], str(r["gpus"]), str(r["grid"]), _model_name(r),
                     _status_or(r, _num(r["tokens_per_s"], ".4g")), _status_or(r, _num(per_gpu, ".3g")),
                     _status_or(r, _num(r["mfu"] * 100 if ok else None, ".2f")),
                     _status_or(r, _num(r["efficiency"], ".3f")),
                     _status_or(r, _num(r["max_memory_bytes"] / scale if ok else None, ".2f"))])
    note = ("Each mode's weak-scaling series (the model grows with the devices): efficiency = model FLOP/s per "
            "device relative to the same mode's smallest configuration (MFU / MFU there)." if kind == "weak" else
            "Each mode on one fixed model at several device counts: efficiency = (tokens/s / tokens/s at the "
            "fewest devices) / (devices / fewest devices).")
    return Table(f"{kind}_scaling_{slug(group)}", f"{kind.capitalize()} scaling per tensor mode, {group}", note,
                 _frame(columns, rows), blocks=1)


def _find(runs: pd.DataFrame, kind: str, grid: Grid) -> pd.DataFrame:
    return runs[(runs["series"] == kind) & (runs["grid"] == grid)]


def claim_ratio(runs: pd.DataFrame, claim: Claim) -> tuple[float | None, str]:
    """(tokens/s of claim.faster / claim.than for one model in one group, or None, what was compared)."""
    for _, a in _find(runs, claim.kind, claim.faster).iterrows():
        b = _find(runs, claim.kind, claim.than)
        b = b[b["model_key"] == a["model_key"]]
        if b.empty:
            continue
        b = b.iloc[0]
        if a["status"] != "ok" or b["status"] != "ok":
            return None, f"{claim.faster}: {a['status']}, {claim.than}: {b['status']}"
        return a["tokens_per_s"] / b["tokens_per_s"], f"{a['model']}"
    return None, "not run"


def claims_table(runs: pd.DataFrame) -> tuple[Table | None, list[str]]:
    groups = list(runs.groupby("group", sort=False))
    if not groups or not any(not _find(g, c.kind, c.faster).empty for _, g in groups for c in CLAIMS):
        return None, []
    columns = [("", "Claim"), ("", "Series"), ("", "Paper")] + [(group, "simulated" if "sim" in group else
                                                                 "measured") for group, _ in groups]
    rows, notes = [], []
    for c in CLAIMS:
        row = [f"{c.faster} / {c.than}", c.kind, f"{c.paper:.2f}x"]
        found = []
        for group, g in groups:
            ratio, what = claim_ratio(g, c)
            row.append(f"{ratio:.2f}x" if ratio is not None else (MISSING if what == "not run" else what))
            if ratio is not None:
                found.append(f"{ratio:.2f}x on {group}")
        if found:
            notes.append(f"{c.faster} over {c.than} ({c.kind} scaling, tokens/s): {', '.join(found)}; the paper "
                         f"reports {c.paper:.2f}x ({c.source}).")
        rows.append(row)
    return Table("paper_claims", "The 2.5-D paper's claims beside these runs",
                 "Each claim of arXiv 2105.14500 (abstracts) as a ratio of throughputs of two tensor-parallel "
                 "grids on the same number of devices and the same model, beside the ratio of these runs' tokens/s "
                 "(weak: the weak-scaling series' model at that device count; strong: the fixed model).",
                 _frame(columns, rows), blocks=1), notes


def scaling_tables(df: pd.DataFrame) -> tuple[list[Table], list[str]]:
    """The tensor-parallel tables of an experiment and the claim sentences (empty for pure pipelines)."""
    # every run of a group that has a run on a mesh other than a pure pipeline (its tp = 1 runs for reference)
    tables = [mesh_table(g, group) for group, g in df.groupby("group", sort=False) if (g["gpus"] != g["pp"]).any()]
    runs = with_efficiency(tensor_runs(df))
    if runs.empty:
        return tables, []
    for group, g in runs.groupby("group", sort=False):
        tables += [t for t in (scaling_table(g, group, "weak"), scaling_table(g, group, "strong")) if t]
    claims, notes = claims_table(runs)
    return tables + ([claims] if claims else []), notes
