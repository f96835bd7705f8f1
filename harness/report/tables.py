"""The paper's tables from the runs frame, as string cells: MFU and peak memory per setup, method and vocabulary
(Tables 3 and 4 of arXiv 2411.05288), throughput relative to a reference method, and measured runs against
simulated runs of the same config (harness.report.predicted). Formats are fixed and rows sorted, so the same records give the same bytes."""
import re
from dataclasses import dataclass

import pandas as pd

from harness.report.frame import MISSING, STATUS_LABEL, method_rank, natural_key, ranks_label

REFERENCES = ("baseline", "interleaved")


@dataclass
class Table:
    name: str  # file stem of its .tex
    title: str
    note: str  # one line: what it shows
    data: pd.DataFrame  # string cells; columns are (top, bottom) pairs, top '' for the row keys
    blocks: int = 2  # leading key columns that form a block (the setup), ruled apart in LaTeX


def slug(group: str) -> str:
    """'sim (a100_80g)' -> 'sim_a100_80g', for file names."""
    return re.sub(r"[^A-Za-z0-9-]+", "_", group).strip("_")


def memory_unit(df: pd.DataFrame) -> tuple[float, str]:
    """GiB as in the paper; MiB when no run reaches 1 GiB (tiny CPU models), so the digits still differ."""
    top = df["max_memory_bytes"].max()
    return (2**30, "GiB") if pd.notna(top) and top >= 2**30 else (2**20, "MiB")


def _num(value, fmt: str) -> str:
    return MISSING if value is None or pd.isna(value) else format(value, fmt)


def _cell(run: dict | None, value, fmt: str) -> str:
    """A run's number (value(run)), or what happened to it: OOM / failed / timeout; '–' where there is no run."""
    if run is None:
        return MISSING
    if run["status"] != "ok":
        return STATUS_LABEL[run["status"]]
    return _num(value(run), fmt)


MESH = "Mesh (dp x pp x tp)"


def _runs_by_cell(g: pd.DataFrame) -> dict:
    """(mesh_key, seq_len, method, variant, vocab_size) -> run; an ok run wins over a failed one of the same cell."""
    cells = {}
    for r in g.to_dict("records"):
        key = (r["mesh_key"], r["seq_len"], r["method"], r["variant"], r["vocab_size"])
        if key not in cells or (cells[key]["status"] != "ok" and r["status"] == "ok"):
            cells[key] = r
    return cells


def _row_keys(g: pd.DataFrame) -> list[tuple]:
    """Every setup (mesh, sequence) x every method of the group (a row of '–' shows a combination never run),
    with variants."""
    setups = sorted(set(zip(g["mesh_key"], g["seq_len"])))
    methods = sorted(set(g["method"]), key=lambda m: (method_rank(m), m))
    variants = {k: sorted(set(v), key=natural_key)
                for k, v in g.groupby(["mesh_key", "seq_len", "method"])["variant"]}
    return [(mk, seq, m, v) for mk, seq in setups for m in methods for v in variants.get((mk, seq, m), [""])]


def _mesh_labels(g: pd.DataFrame) -> dict:
    return dict(zip(g["mesh_key"], g["mesh"]))


def _keys_part(keys: list[tuple], ranks: str, meshes: dict) -> tuple[list[tuple], list[list[str]]]:
    """The key columns: GPUs (the world size, dp x pp x tp), the mesh, sequence, method (and variant)."""
    with_variant = any(k[3] for k in keys)
    columns = [("", ranks), ("", MESH), ("", "Seq"), ("", "Method")] + ([("", "Variant")] if with_variant else [])
    return columns, [[str(mk[0]), meshes[mk], str(seq), m] + ([v] if with_variant else []) for mk, seq, m, v in keys]


def _vocabs(g: pd.DataFrame) -> list[tuple[int, str]]:
    return sorted(set(zip(g["vocab_size"], g["vocab"])))


def _frame(columns: list[tuple], rows: list[list[str]]) -> pd.DataFrame:
    return pd.DataFrame(rows, columns=pd.MultiIndex.from_tuples(columns), dtype=object)


def mfu_memory(g: pd.DataFrame, group: str) -> Table:
    cells, keys, vocabs = _runs_by_cell(g), _row_keys(g), _vocabs(g)
    scale, unit = memory_unit(g)
    columns, rows = _keys_part(keys, ranks_label(g), _mesh_labels(g))
    for _, label in vocabs:
        columns += [(label, "MFU (%)"), (label, f"Mem ({unit})")]
    for key, row in zip(keys, rows):
        for size, _ in vocabs:
            run = cells.get((*key, size))
            row.append(_cell(run, lambda r: r["mfu"] * 100, ".2f"))
            row.append(_cell(run, lambda r: r["max_memory_bytes"] / scale, ".2f"))
    return Table(f"mfu_memory_{slug(group)}", f"MFU and peak memory, {group}",
                 f"MFU in percent and peak memory in {unit} (the largest over ranks) per setup (GPUs = world size "
                 f"dp x pp x tp, the mesh, sequence), method and vocabulary; OOM, failed and timeout say how a run "
                 f"ended, – marks a run that does not exist.", _frame(columns, rows), blocks=3)


def reference_run(cells: dict, key: tuple, reference: str) -> dict | None:
    """The ok run of the reference method with a throughput for the cell key (mesh_key, seq_len, method, variant,
    vocab_size) of _runs_by_cell: same setup, vocabulary and variant (else the reference without a variant)."""
    mk, seq, _, variant, size = key
    ref = cells.get((mk, seq, reference, variant, size)) or cells.get((mk, seq, reference, "", size))
    return None if ref is None or ref["status"] != "ok" or pd.isna(ref["tokens_per_s"]) else ref


def throughput_ratio(run: dict, ref: dict) -> float:
    """tokens/s of a run over its reference run's (reference_run); above 1 is faster."""
    return run["tokens_per_s"] / ref["tokens_per_s"]


def speedup(g: pd.DataFrame, group: str, reference: str) -> Table | None:
    """tokens/s of each method over the reference method's, same setup, vocabulary and variant."""
    cells, keys, vocabs = _runs_by_cell(g), _row_keys(g), _vocabs(g)
    if not ((g["method"] == reference) & (g["status"] == "ok") & g["tokens_per_s"].notna()).any():
        return None
    top = f"tokens/s relative to {reference}"
    columns, rows = _keys_part(keys, ranks_label(g), _mesh_labels(g))
    columns += [(top, label) for _, label in vocabs]
    for (mk, seq, method, variant), row in zip(keys, rows):
        for size, _ in vocabs:
            run = cells.get((mk, seq, method, variant, size))
            ref = reference_run(cells, (mk, seq, method, variant, size), reference)
            if ref is None:
                row.append(MISSING if run is None or run["status"] == "ok" else STATUS_LABEL[run["status"]])
            else:
                row.append(_cell(run, lambda r: throughput_ratio(r, ref), ".3f"))
    return Table(f"speedup_vs_{reference}_{slug(group)}", f"Throughput relative to {reference}, {group}",
                 f"tokens/s of each method divided by that of {reference} for the same setup and vocabulary, "
                 f"where {reference} ran ok; above 1 is faster.", _frame(columns, rows), blocks=3)


def all_tables(df: pd.DataFrame) -> tuple[list[Table], list[str]]:
    """The tables of one experiment, one set per backend (and sim hardware), and why any was left out."""
    tables, skipped = [], []
    for group, g in df.groupby("group", sort=False):
        tables.append(mfu_memory(g, group))
        for reference in REFERENCES:
            table = speedup(g, group, reference)
            if table is None:
                skipped.append(f"Throughput relative to {reference}, {group}: no ok {reference} run.")
            else:
                tables.append(table)
    return tables, skipped
