"""Result records -> one tidy pandas DataFrame, one row per run: the axes of the paper's tables (backend,
setup, method, vocabulary), the scalar metrics, and the per-rank lists kept as lists."""
import json
import re

import pandas as pd

from harness.report.measured import one_peak_mfu

from vp.mesh import Mesh
from vp.schedule.methods import METHODS
from vp.record import NOT_SEMANTIC, STATUSES
from vp.tp.modes import MODES

METHOD_ORDER = list(METHODS)  # the paper's order: baseline, redis, interleaved, interlaced, vocab-1, ...
STATUS_LABEL = {"failed": "failed", "oom": "OOM", "timeout": "timeout"}
MISSING = "–"
# Config fields that are table axes or follow from them. Any other field that differs between runs of one
# table cell (pad_multiple in experiment=vocab_padding, say) becomes the row's variant, so no run is hidden.
AXES = ("method", "pp", "dp", "tp", "tp_mode", "tp_depth", "seq_len", "vocab_size", "padded_vocab_size",
        "stage_layers", *NOT_SEMANTIC)
CELL = ["group", "mesh_key", "seq_len", "method", "vocab_size"]
COLUMNS = ["run_id", "status", "error", "backend", "hardware", "group", "method", "method_rank", "pp", "dp", "tp",
           "tp_mode", "tp_depth", "gpus", "mesh", "mesh_key", "ranks", "seq_len", "setup", "vocab_size", "vocab",
           "model", "variant", "config_key", "iteration_time_s", "tokens_per_s", "mfu", "max_memory_bytes",
           "peak_memory_bytes", "bubble_fraction", "has_passes", "record"]


def vocab_label(size: int) -> str:
    """32000 -> '32k' (the names of conf/vocab), other sizes as they are."""
    return f"{size // 1000}k" if size % 1000 == 0 else str(size)


def ranks_word(backend: str, device: str | None) -> str:
    """What a run's ranks are: CPU processes for a real CPU run, GPUs otherwise (simulated runs model GPUs)."""
    return "CPU processes" if backend == "real" and device == "cpu" else "GPUs"


def ranks_label(g: pd.DataFrame) -> str:
    """The column name of the rank count of a group of runs: 'GPUs', 'CPU processes', or 'Ranks' when mixed."""
    words = set(g["ranks"])
    return words.pop() if len(words) == 1 else "Ranks"


def mesh_of(cfg: dict) -> Mesh:
    """The device mesh of a record's config (records from before the mesh have dp = tp = 1)."""
    return Mesh(dp=cfg.get("dp", 1), pp=cfg["pp"], tp=cfg.get("tp", 1), tp_mode=cfg.get("tp_mode", "1d"),
                tp_depth=cfg.get("tp_depth", 1))


def mesh_label(mesh: Mesh) -> str:
    """dp x pp x tp, with the tensor mode and, for 2-D/2.5-D, the grid [q,q,d]: '1x8x1', '1x1x16 1d',
    '2x4x8 2.5d [2,2,2]'."""
    mode = f" {mesh.tp_mode} [{mesh.q},{mesh.q},{mesh.depth}]" if mesh.grid else (" 1d" if mesh.tp > 1 else "")
    return f"{mesh.dp}x{mesh.pp}x{mesh.tp}{mode}"


def mesh_key(mesh: Mesh) -> tuple:
    """Sorts meshes by world size (GPUs), then dp, pp, tp, the tensor mode's row and the depth."""
    return (mesh.world, mesh.dp, mesh.pp, mesh.tp, list(MODES).index(mesh.tp_mode), mesh.depth)


def setup_label(mesh: Mesh, seq_len: int, ranks: str = "GPUs") -> str:
    """'8 GPUs, seq 2048' for a pure pipeline (GPUs = pp); '16 GPUs (1x1x16 1d), seq 512' for any other mesh."""
    where = "" if mesh.world == mesh.pp else f" ({mesh_label(mesh)})"
    return f"{mesh.world} {ranks}{where}, seq {seq_len}"


def method_rank(method: str) -> int:
    return METHOD_ORDER.index(method) if method in METHOD_ORDER else len(METHOD_ORDER)


def first_line(error) -> str:
    lines = [line.strip() for line in str(error or "").splitlines() if line.strip()]
    return lines[0][:200] if lines else ""


def natural_key(text: str) -> list:
    """'pad_multiple=24' before 'pad_multiple=96' before 'pad_multiple=192'."""
    return [(0, int(t), "") if t.isdigit() else (1, 0, t) for t in re.split(r"(\d+)", text)]


def _hardware(rec: dict) -> str | None:
    if rec.get("backend") != "sim":
        return None
    hw = (rec.get("env") or {}).get("hardware")
    return (rec.get("labels") or {}).get("hardware") or (hw.get("name") if isinstance(hw, dict) else hw)


def _row(rec: dict) -> dict:
    cfg, metrics, labels = rec["config"], rec.get("metrics") or {}, rec.get("labels") or {}
    hardware = _hardware(rec)
    backend = rec.get("backend", "real")
    memory, bubble = metrics.get("peak_memory_bytes"), metrics.get("bubble_fraction")
    measured = [b for b in memory or [] if b is not None]
    semantic = {k: v for k, v in cfg.items() if k not in NOT_SEMANTIC}
    ranks = ranks_word(backend, cfg.get("device"))
    mesh = mesh_of(cfg)
    label = mesh_label(mesh)
    return {"run_id": rec["run_id"], "status": rec["status"], "error": first_line(rec.get("error")),
            "backend": backend, "hardware": hardware,
            "group": f"{backend} ({hardware})" if hardware else backend,
            "method": cfg["method"], "method_rank": method_rank(cfg["method"]), "pp": cfg["pp"], "dp": mesh.dp,
            "tp": mesh.tp, "tp_mode": mesh.tp_mode, "tp_depth": mesh.depth, "gpus": mesh.world, "mesh": label,
            "mesh_key": mesh_key(mesh), "ranks": ranks, "seq_len": cfg["seq_len"],
            "setup": setup_label(mesh, cfg["seq_len"], ranks),
            "vocab_size": cfg["vocab_size"], "vocab": labels.get("vocab"), "model": labels.get("model"),
            "config_key": json.dumps(semantic, sort_keys=True, default=str),
            "iteration_time_s": metrics.get("iteration_time_s"), "tokens_per_s": metrics.get("tokens_per_s"),
            "mfu": metrics.get("mfu"), "max_memory_bytes": max(measured) if measured else None,
            "peak_memory_bytes": memory or None, "bubble_fraction": bubble or None,
            "has_passes": bool(metrics.get("pass_time_s")), "record": rec}


def _variants(df: pd.DataFrame) -> pd.Series:
    """'k=v, ...' of the config fields that differ between the runs of one cell; '' for a cell of one run."""
    out = pd.Series("", index=df.index, dtype=object)
    for _, cell in df.groupby(CELL, sort=False):
        if len(cell) < 2:
            continue
        configs = [r["config"] for r in cell["record"]]
        keys = sorted({k for c in configs for k in c} - set(AXES))
        varying = [k for k in keys if len({json.dumps(c.get(k), default=str) for c in configs}) > 1]
        for idx, c in zip(cell.index, configs):
            out[idx] = ", ".join(f"{k}={c.get(k)}" for k in varying)
    return out


def records_frame(records: list[dict]) -> pd.DataFrame:
    """One row per run, sorted: real before sim, then setup, method in the paper's order, vocabulary, run id."""
    rows = [_row(r) for r in records]
    df = pd.DataFrame(rows, columns=COLUMNS).drop_duplicates("run_id")
    for column in ("iteration_time_s", "tokens_per_s", "mfu", "max_memory_bytes"):
        df[column] = pd.to_numeric(df[column]).astype(float)  # None (no measurement) -> NaN
    if len(df):
        df["mfu"] = pd.Series(one_peak_mfu(df), index=df.index, dtype=float)  # one peak per CPU node kind
    # a status not written by vp.record reads as failed rather than breaking the whole report
    df["status"] = df["status"].where(df["status"].isin(STATUSES), "failed")
    # one label per vocabulary size: the sweep's name where a record has it, else derived (old records)
    names = {size: sorted(set(g["vocab"].dropna())) for size, g in df.groupby("vocab_size")}
    df["vocab"] = [names[s][0] if names[s] else vocab_label(s) for s in df["vocab_size"]]
    df["variant"] = _variants(df) if len(df) else pd.Series(dtype=object)
    df["group_rank"] = [0 if b == "real" else 1 for b in df["backend"]]
    variants = sorted(set(df["variant"]), key=natural_key)
    df["variant_rank"] = [variants.index(v) for v in df["variant"]]
    df = df.sort_values(["group_rank", "group", "mesh_key", "seq_len", "method_rank", "method", "vocab_size",
                         "variant_rank", "run_id"], kind="stable")
    return df.drop(columns=["group_rank", "variant_rank"]).reset_index(drop=True)


def ok_runs(df: pd.DataFrame, column: str) -> pd.DataFrame:
    """The ok runs that have a value in `column`."""
    return df[(df["status"] == "ok") & df[column].notna()]


def per_rank(df: pd.DataFrame, column: str) -> pd.DataFrame:
    """Long form of a per-rank list column of the ok runs: one row per (run, rank) with `value`."""
    runs = ok_runs(df, column)
    keys = ("group", "setup", "gpus", "mesh_key", "seq_len", "method", "vocab", "vocab_size")
    rows = [{**{k: r[k] for k in keys}, "rank": rank, "value": value}
            for r in runs.to_dict("records") for rank, value in enumerate(r[column]) if value is not None]
    return pd.DataFrame(rows, columns=[*keys, "rank", "value"])


def summary(df: pd.DataFrame) -> str:
    """'22 runs: 16 ok, 1 failed, 2 oom, 1 timeout; backends: real: 19, sim (a100_80g): 3'."""
    counts = df["status"].value_counts()
    statuses = ", ".join(f"{int(counts.get(s, 0))} {s}" for s in STATUSES)
    groups = df.groupby("group", sort=False).size()
    return f"{len(df)} runs: {statuses}; backends: " + ", ".join(f"{g}: {n}" for g, n in groups.items())
