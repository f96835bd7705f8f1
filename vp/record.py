"""The result record (docs/design.md): one JSON object per run, the same for measured and simulated runs."""
import hashlib
import json
import subprocess
from datetime import datetime, timezone
from pathlib import Path

from vp.files import write_json_atomic

STATUSES = ("ok", "failed", "oom", "timeout")
NOT_SEMANTIC = ("timeout_s",)  # changing these does not change what a run measures
# fields added later: hashed only when set, so older run ids hold
OMITTED_AT_DEFAULT = {"emulate_nccl": None, "zero": 0, "overlap_grad_reduce": False, "bucket_mb": 25.0,
                      "recompute": "none", "sequence_parallel": False}


def run_id(config: dict, backend: str, hardware: dict | None = None) -> str:
    """A hash of the semantic config: the same run anywhere gets the same id (paths, times, loggers excluded).
    A simulated run also hashes its hardware profile's contents, so a recalibrated profile reruns."""
    semantic = {k: v for k, v in sorted(config.items())
                if k not in NOT_SEMANTIC and not (k in OMITTED_AT_DEFAULT and v == OMITTED_AT_DEFAULT[k])}
    semantic["backend"] = backend
    if backend == "sim":
        semantic["hardware"] = hardware
    blob = json.dumps(semantic, sort_keys=True, default=str)
    return hashlib.sha1(blob.encode()).hexdigest()[:12]


def now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def git_commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5,
                              cwd=Path(__file__).parent).stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def make_record(config: dict, metrics: dict | None, env: dict, status: str = "ok", error: str | None = None,
                experiment: str | None = None, backend: str = "real", hardware: dict | None = None) -> dict:
    assert status in STATUSES, status
    return {"run_id": run_id(config, backend, hardware), "experiment": experiment, "status": status,
            "error": error, "backend": backend, "config": config, "metrics": metrics or {}, "env": env}


def write_atomic(path: Path, record: dict) -> Path:
    """Write a record as JSON whole or not at all (vp.files), so no reader sees half a record."""
    return write_json_atomic(path, record, indent=1, sort_keys=True)
