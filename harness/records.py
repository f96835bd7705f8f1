"""Result records on disk: written once by a temporary file and a rename, read back for resume and reports."""
import json
from pathlib import Path

from vp.record import make_record, now, write_atomic


def finish_run(record: dict, path: Path, logger=None, wandb_root: Path = Path(".")) -> Path:
    """Write the record (atomically), then log it to W&B when a logger is configured."""
    write_atomic(path, record)
    if logger is not None and logger.get("mode", "disabled") != "disabled":
        from harness.timeline import draw_timeline
        from harness.wandb_log import log_record
        picture = draw_timeline(record, path.with_suffix(".png")) if record.get("metrics") else None
        try:
            log_record(record, logger, wandb_root, picture)
        finally:
            if picture is not None:
                picture.unlink(missing_ok=True)
    return path


def failure_record(config: dict, experiment: str, backend: str, labels: dict, status: str, error: str,
                   started: str | None = None) -> dict:
    """The record of a run that ended without one of its own (a dead rank, a time limit, an OOM kill)."""
    env = {"start": started, "end": now()}
    rec = make_record(config, None, env, status=status, error=error[-20000:], experiment=experiment,
                      backend=backend)
    rec["labels"] = labels
    return rec


def status_of(path: Path) -> str | None:
    try:
        return json.loads(Path(path).read_text()).get("status")
    except (OSError, json.JSONDecodeError):
        return None


def load(results_dir: Path, experiment: str | None = None) -> list[dict]:
    """Every record under results/ (or results/<experiment>/), sorted by run id; unreadable files skipped."""
    root = Path(results_dir) / experiment if experiment else Path(results_dir)
    out = []
    for path in sorted(root.glob("**/*.json") if root.exists() else []):
        if path.name.startswith(".") or "wandb" in path.parts:
            continue
        try:
            rec = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError):
            continue
        if isinstance(rec, dict) and "run_id" in rec and "status" in rec:
            out.append(rec)
    return sorted(out, key=lambda r: (r.get("experiment") or "", r["run_id"]))
