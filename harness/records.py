"""Result records on disk: written once by a temporary file and a rename, read back for resume and reports.

results/<experiment>/<run_id>.json is a record (run_id: 12 hex digits); files beside it with other names (the
run's trace, `<run_id>.trace.json`) are not. A record file that cannot be read or lacks the design's fields is
reported by name, never skipped silently."""
import json
import math
import re
import sys
from pathlib import Path

from vp.record import STATUSES, make_record, now, write_atomic

RECORD_NAME = re.compile(r"^[0-9a-f]{12}\.json$")
CONFIG_FIELDS = ("method", "pp", "seq_len", "vocab_size")


def trace_path(record_path: Path) -> Path:
    """The Chrome/Perfetto trace of a run, beside its record: <run_id>.trace.json."""
    return Path(record_path).with_suffix(".trace.json")


def finish_run(record: dict, path: Path, logger=None, wandb_root: Path = Path(".")) -> Path:
    """Write the record (atomically), then log it to W&B when a logger is configured."""
    write_atomic(path, record)
    log_run(record, path, logger, wandb_root)
    return path


def log_run(record: dict, path: Path, logger=None, wandb_root: Path = Path(".")) -> None:
    """Log a written record to W&B (with its timeline pictures) when a logger is configured (mode not disabled),
    unless W&B already holds this very record (a live run logged it: harness.live); then mark it logged."""
    if logger is None or logger.get("mode", "disabled") == "disabled":
        return
    from harness.timeline import timeline_images
    from harness.wandb_log import is_logged, log_record, mark_logged

    if is_logged(path):
        return
    images = timeline_images(record, path, trace_path(path)) if record.get("metrics") else {}
    try:
        log_record(record, logger, wandb_root, images)
    finally:
        for picture in images.values():
            picture.unlink(missing_ok=True)
    mark_logged(path)


def failure_record(config: dict, experiment: str, backend: str, labels: dict, status: str, error: str,
                   started: str | None = None) -> dict:
    """The record of a run that ended without one of its own (a dead rank, a time limit, an OOM kill)."""
    env = {"start": started, "end": now()}
    rec = make_record(config, None, env, status=status, error=error[-20000:], experiment=experiment,
                      backend=backend)
    rec["labels"] = labels
    return rec


def problem(rec) -> str | None:
    """Why a parsed record file is not a usable record, or None."""
    if not isinstance(rec, dict):
        return f"not a JSON object but a {type(rec).__name__}"
    for key in ("run_id", "status", "backend", "config"):
        if key not in rec:
            return f"no `{key}` field"
    if rec["status"] not in STATUSES:
        return f"status {rec['status']!r} is not one of {', '.join(STATUSES)}"
    if not isinstance(rec["config"], dict):
        return f"`config` is a {type(rec['config']).__name__}, not a mapping"
    missing = [k for k in CONFIG_FIELDS if k not in rec["config"]]
    if missing:
        return f"`config` lacks {', '.join(missing)}"
    if not isinstance(rec.get("metrics") or {}, dict):
        return "`metrics` is not a mapping"
    if rec["status"] == "ok":
        if not rec.get("metrics"):
            return "status ok but `metrics` is null or empty (an ok run has measured or predicted metrics)"
        bad = _not_finite(rec["metrics"], "metrics")
        if bad:
            return f"status ok but `{bad}` is not a finite number (a diverged or broken run)"
    return None


def _not_finite(value, where: str) -> str | None:
    """The first field under `where` holding NaN or an infinity (JSON's NaN/Infinity), or None."""
    if isinstance(value, float) and not math.isfinite(value):
        return where
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, item in items:
        found = _not_finite(item, f"{where}.{key}" if isinstance(value, dict) else f"{where}[{key}]")
        if found:
            return found
    return None


def read(path: Path) -> dict:
    """One record; ValueError naming the file and what is wrong with it."""
    try:
        rec = json.loads(Path(path).read_text())
    except OSError as err:
        raise ValueError(f"{path}: cannot be read ({err.strerror})") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ValueError(f"{path}: not valid JSON ({err}); a truncated or hand-edited record: rerun its job "
                         f"(the sweep reruns it) or delete the file") from None
    why = problem(rec)
    if why:
        raise ValueError(f"{path}: not a result record: {why}; rerun its job or delete the file")
    return rec


def status_of(path: Path) -> str | None:
    try:
        return read(path)["status"]
    except ValueError:
        return None


def read_records(results_dir: Path, experiment: str | None = None) -> tuple[list[dict], list[str]]:
    """(every record under results_dir or results_dir/<experiment>, sorted; what could not be read, by name)."""
    root = Path(results_dir) / experiment if experiment else Path(results_dir)
    records, unreadable = [], []
    for path in sorted(root.glob("**/*.json") if root.exists() else []):
        if not RECORD_NAME.match(path.name) or "wandb" in path.parts:
            continue
        try:
            records.append(read(path))
        except ValueError as err:
            unreadable.append(str(err))
    return sorted(records, key=lambda r: (r.get("experiment") or "", r["run_id"])), unreadable


def load(results_dir: Path, experiment: str | None = None) -> list[dict]:
    """The readable records; each unreadable one is reported on stderr."""
    records, unreadable = read_records(results_dir, experiment)
    for line in unreadable:
        print(f"warning: skipped {line}", file=sys.stderr)
    return records
