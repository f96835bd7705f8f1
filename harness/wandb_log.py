"""One W&B run per result record, under the record's run id: a rerun replaces the local offline run of that id
(online, it resumes the run and replaces its summary), so W&B never holds two runs of one record.

A run has a readable name (method, pipeline size, model, vocabulary), the record's config, the per-iteration
loss and time as history (x axis `iteration`), the record's metrics as its summary (the same numbers:
iteration_time_s is the record's median), a per-rank table (peak memory, idle fraction, pass times) and the
timeline picture. Offline by default (no network, no account; `wandb sync` uploads later); the API key is
never read or written here."""
import os
import shutil
from pathlib import Path

SUMMARY = ("iteration_time_s", "tokens_per_s", "mfu", "model_flops", "peak_flops")


def run_name(record: dict) -> str:
    """'vocab-2 pp2 small V64k seq256' (+ ' sim a100_80g' for a prediction); a mesh other than a pure pipeline
    names its dp and tp: 'vocab-2 dp2 pp4 tp4 2d ...'."""
    cfg, labels = record["config"], record.get("labels") or {}
    vocab = labels.get("vocab") or cfg["vocab_size"]
    dp, tp = cfg.get("dp", 1), cfg.get("tp", 1)
    mesh = (f"dp{dp} " if dp > 1 else "") + f"pp{cfg['pp']}" + (f" tp{tp} {cfg.get('tp_mode', '1d')}" if tp > 1 else "")
    name = f"{cfg['method']} {mesh} {labels.get('model', '')} V{vocab} seq{cfg['seq_len']}".replace("  ", " ")
    return name + (f" sim {labels['hardware']}" if record.get("backend") == "sim" and labels.get("hardware") else "")


def summary_of(record: dict) -> dict:
    """The W&B summary of a record: its status and error, and its scalar metrics as they are in the record."""
    m = record.get("metrics") or {}
    out = {"status": record["status"], "error": record.get("error") or "", "backend": record["backend"]}
    out.update({k: m[k] for k in SUMMARY if m.get(k) is not None})
    memory = [b for b in m.get("peak_memory_bytes") or [] if b is not None]
    if memory:
        out["max_peak_memory_bytes"] = max(memory)
    return out


def per_rank_rows(record: dict) -> tuple[list[str], list[list]]:
    m = record.get("metrics") or {}
    kinds = sorted(m.get("pass_time_s") or {})
    columns = ["rank", "peak_memory_bytes", "bubble_fraction"] + [f"{k}_s" for k in kinds]

    def at(values, r):
        return values[r] if values and r < len(values) else None

    ranks = len(m.get("peak_memory_bytes") or []) or record["config"]["pp"]  # every rank of dp x pp x tp
    rows = [[r, at(m.get("peak_memory_bytes"), r), at(m.get("bubble_fraction"), r),
             *[at(m["pass_time_s"][k], r) for k in kinds]] for r in range(ranks)]
    return columns, rows


def drop_local_runs(root: Path, run_id: str) -> None:
    """Remove earlier offline runs of this id that were never synced: the new one replaces them."""
    for folder in (root / "wandb").glob(f"offline-run-*-{run_id}"):
        if not list(folder.glob("*.synced")):
            shutil.rmtree(folder, ignore_errors=True)


def log_record(record: dict, logger, root: Path, images: dict[str, Path] | None = None):
    """Log one record as the W&B run of its id; its files go to root/wandb/."""
    import wandb

    os.environ.setdefault("WANDB_SILENT", "true")
    root.mkdir(parents=True, exist_ok=True)
    if logger["mode"] == "offline":
        drop_local_runs(root, record["run_id"])
    m = record.get("metrics") or {}
    run = wandb.init(project=logger.get("project"), entity=logger.get("entity"), mode=logger["mode"],
                     id=record["run_id"], resume="allow", name=run_name(record), group=record.get("experiment"),
                     dir=str(root), job_type=record["backend"], tags=[record["status"]], reinit="finish_previous",
                     config={**record["config"], "backend": record["backend"], **record.get("labels", {})},
                     settings=wandb.Settings(silent=True, console="off", save_code=False,
                                             disable_git=True, x_disable_stats=True))
    try:
        run.define_metric("iteration")
        run.define_metric("iteration/*", step_metric="iteration")
        losses, times = m.get("loss") or [], m.get("iteration_times_s") or []
        first_timed = len(losses) - len(times)  # the times are of the measured iterations, after warm-up
        for i, loss in enumerate(losses):
            row = {"iteration": i, "iteration/loss": loss}
            if i >= first_timed:
                row["iteration/time_s"] = times[i - first_timed]
            run.log(row)
        columns, rows = per_rank_rows(record)
        if m:
            run.log({"per_rank": wandb.Table(columns=columns, data=rows)})
        for key, path in (images or {}).items():
            if path is not None and Path(path).exists():
                run.log({key: wandb.Image(str(path))})
        run.summary.update(summary_of(record))
    finally:
        run.finish()
