"""A report on W&B: each report build logs one run per experiment (job_type=report, its id derived from the
experiment, so a rebuild replaces it) holding the report's comparison as W&B Tables and its figures as images, and
logs every record of the experiment that W&B does not hold yet (harness.wandb_log's `.logged` markers).

The numbers come from the code that writes reports/<experiment>/README.md: the runs frame (frame.records_frame), the
tables (tables.all_tables, predicted.table), and the reference lookup of the throughput ratios
(tables.reference_run, tables.throughput_ratio). `comparison` is the same comparison in long form, one row per run,
with numeric cells a W&B user can sort, filter and plot."""
from pathlib import Path

import pandas as pd

from harness.records import RECORD_NAME, read_records
from harness.report import predicted
from harness.report.frame import records_frame
from harness.report.tables import REFERENCES, Table, _runs_by_cell, all_tables, reference_run, throughput_ratio

COMPARISON = ["run_id", "group", "method", "vocab", "vocab_size", "model", "mesh", "gpus", "dp", "pp", "tp", "tp_mode",
              "seq_len", "variant", "status", "mfu", "tokens_per_s", "iteration_time_s",
              *[f"ratio_to_{r}" for r in REFERENCES], "max_memory_bytes", "memory_balance", "peak_memory_bytes"]


def _number(value):
    return None if value is None or pd.isna(value) else float(value)


def comparison(df: pd.DataFrame) -> tuple[list[str], list[list]]:
    """One row per run: its method, vocabulary, mesh, MFU, throughput, the throughput ratio to each reference method
    (baseline and interleaved, where that ran ok in the same setup and vocabulary: the report's speedup tables),
    its peak memory (the largest over ranks), the balance (smallest over largest rank) and each rank's peak."""
    rows = []
    for _, g in df.groupby("group", sort=False):
        cells = _runs_by_cell(g)
        for r in g.to_dict("records"):
            key = (r["mesh_key"], r["seq_len"], r["method"], r["variant"], r["vocab_size"])
            ratios = []
            for reference in REFERENCES:
                ref = reference_run(cells, key, reference)
                ok = ref is not None and r["status"] == "ok" and not pd.isna(r["tokens_per_s"])
                ratios.append(throughput_ratio(r, ref) if ok else None)
            memory = [b for b in r["peak_memory_bytes"] or [] if b is not None]
            rows.append([r["run_id"], r["group"], r["method"], r["vocab"], int(r["vocab_size"]), r["model"], r["mesh"],
                         int(r["gpus"]), int(r["dp"]), int(r["pp"]), int(r["tp"]), r["tp_mode"], int(r["seq_len"]),
                         r["variant"], r["status"], _number(r["mfu"]), _number(r["tokens_per_s"]),
                         _number(r["iteration_time_s"]), *ratios, _number(r["max_memory_bytes"]),
                         min(memory) / max(memory) if memory and max(memory) else None,
                         ", ".join(f"{b / 2**20:.1f}" for b in memory) + (" MiB" if memory else "")])
    return list(COMPARISON), rows


def table_cells(table: Table) -> tuple[list[str], list[list[str]]]:
    """A report table as W&B Table columns and rows: its string cells as in README.md, the two header rows joined
    ('64k / MFU (%)')."""
    columns = [f"{top} / {bottom}" if top else bottom for top, bottom in table.data.columns]
    return columns, table.data.astype(str).values.tolist()


def report_tables(df: pd.DataFrame) -> dict[str, tuple[list, list]]:
    """W&B Tables of one experiment: `comparison` (long form), and every table of the report under its file name."""
    tables, _ = all_tables(df)
    pairs = predicted.pairs(df)
    if not pairs.empty:
        tables.insert(0, predicted.table(pairs))
    return {"comparison": comparison(df), **{f"tables/{t.name}": table_cells(t) for t in tables}}


def log_report(results_dir: Path, reports_dir, experiment: str, logger: dict, root: Path, log=print) -> bool:
    """Log the records W&B lacks, then the experiment's report run; False (and a line in log) when W&B failed. A
    W&B failure never fails the caller: the report on disk and the records stay as they are."""
    from harness.report.build import report_dir_for
    from harness.wandb_log import derived_id, log_tables

    if logger is None or logger.get("mode", "disabled") == "disabled":
        return True
    records, _ = read_records(Path(results_dir), experiment)
    if not logger.get("sim"):
        records = [r for r in records if r["backend"] != "sim"]
    if not records:
        return True
    try:
        log_unlogged(Path(results_dir), experiment, logger, root, log)
        out = report_dir_for(Path(results_dir), reports_dir) / experiment
        df = records_frame(records)
        images = {f"figures/{p.stem}": p for p in sorted(out.glob("*.png"))}
        sweeps = sorted({(r.get("labels") or {}).get("sweep") for r in records} - {None})
        log_tables(derived_id("report", experiment), f"report {experiment}", experiment, "report", report_tables(df),
                   images, logger, root, {"experiment": experiment, "runs": len(records), "sweeps": sweeps})
    except Exception as err:  # noqa: BLE001 - W&B trouble never costs a report
        log(f"W&B: the report run of {experiment} was not logged ({type(err).__name__}: {err}); the report and the "
            f"records are kept, the next report build logs it")
        return False
    log(f"W&B: report run {derived_id('report', experiment)} ({len(records)} runs) in {root / 'wandb'}"
        if logger["mode"] == "offline" else f"W&B: report run {derived_id('report', experiment)} logged")
    return True


def log_unlogged(results_dir: Path, experiment: str, logger: dict, root: Path, log=print) -> int:
    """Log each record of the experiment that W&B does not hold (never logged, or rewritten since); the count."""
    from harness.records import log_run, read
    from harness.wandb_log import is_logged

    count = 0
    for path in sorted((Path(results_dir) / experiment).glob("*.json")):
        if not RECORD_NAME.match(path.name) or is_logged(path):
            continue
        try:
            record = read(path)
        except ValueError:  # the report names the file as unreadable
            continue
        if record.get("backend") == "sim" and not logger.get("sim"):
            continue
        log_run(record, path, logger, root)
        count += 1
    if count:
        log(f"W&B: logged {count} record(s) of {experiment} that W&B did not hold yet")
    return count
