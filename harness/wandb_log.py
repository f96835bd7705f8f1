"""One W&B run per harness run: config, per-iteration loss and time, summary metrics, per-rank memory and
pass times as a table, and the schedule timeline. Offline by default (no network, no account; `wandb sync`
uploads later); never reads or writes an API key itself."""
import os
from pathlib import Path


def log_record(record: dict, logger, root: Path, timeline: Path | None = None):
    """Log one record as one W&B run; its files go to root/wandb/."""
    import wandb

    os.environ.setdefault("WANDB_SILENT", "true")
    root.mkdir(parents=True, exist_ok=True)
    m = record.get("metrics") or {}
    run = wandb.init(project=logger.get("project"), entity=logger.get("entity"), mode=logger["mode"],
                     group=record.get("experiment"), name=record["run_id"], id=None, dir=str(root),
                     config={**record["config"], "backend": record["backend"], **record.get("labels", {})},
                     job_type=record["backend"], tags=[record["status"]], reinit="finish_previous",
                     settings=wandb.Settings(silent=True, console="off", save_code=False,
                                             disable_git=True, x_disable_stats=True))
    try:
        for i, loss in enumerate(m.get("loss") or []):
            row = {"loss": loss}
            times = m.get("iteration_times_s") or []
            if i >= len(m.get("loss") or []) - len(times):
                row["iteration_time_s"] = times[i - (len(m["loss"]) - len(times))]
            run.log(row, step=i)
        run.summary.update({"status": record["status"], "error": record.get("error") or ""})
        for key in ("iteration_time_s", "tokens_per_s", "mfu"):
            if m.get(key) is not None:
                run.summary[key] = m[key]
        if m.get("peak_memory_bytes"):
            run.summary["max_peak_memory_bytes"] = max(m["peak_memory_bytes"])
            kinds = sorted(m.get("pass_time_s") or {})
            table = wandb.Table(columns=["rank", "peak_memory_bytes", "bubble_fraction"] + [f"{k}_s" for k in kinds])
            for r, mem in enumerate(m["peak_memory_bytes"]):
                idle = (m.get("bubble_fraction") or [None] * (r + 1))[r]
                table.add_data(r, mem, idle, *[(m["pass_time_s"][k] or [None] * (r + 1))[r] for k in kinds])
            run.log({"per_rank": table})
        if timeline is not None and Path(timeline).exists():
            run.log({"schedule": wandb.Image(str(timeline))})
    finally:
        run.finish()
