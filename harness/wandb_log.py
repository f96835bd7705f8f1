"""One W&B run per result record, under the record's run id: a rerun replaces the local offline run of that id
(online, it resumes the run and replaces its summary), so W&B never holds two runs of one record.

A run has a readable name (method, pipeline size, model, vocabulary), a config under the names a user types on the
sweep's command line (`method`, `vocab`, `model`, `hardware`, `run.pp`, `run.tp`, ...), the sweep's id as a tag,
the per-iteration loss and time as history (x axis `iteration`), the record's metrics as its summary (the same
numbers: iteration_time_s is the record's median), a per-rank table (peak memory, idle fraction, pass times) and
the timeline picture. Offline by default (no network, no account; `wandb sync` uploads later); the API key is
never read or written here. A record that was logged gets a marker beside it (`<run_id>.logged`, the hash of the
record it logged), so `make report` logs exactly the records that never were (harness.report.wandb_report)."""
import hashlib
import os
import re
import shutil
from pathlib import Path

SUMMARY = ("iteration_time_s", "tokens_per_s", "mfu", "model_flops", "peak_flops")
# the keys a run's history holds: the record's per-iteration numbers, and (live runs) what the ranks saw as they ran
HISTORY = ("iteration/loss", "iteration/time_s")
LIVE = ("live/loss", "live/time_s")
SUMMARY_KEYS = ("status", "error", "backend", *SUMMARY, "max_peak_memory_bytes", "bubble_fraction_max",
                "bubble_fraction_mean")
LABELS = ("model", "vocab", "hardware")  # the config groups a job's labels name (harness.jobs.finish)
INIT_TIMEOUT_S = 60  # wandb.init gives up after this (an unreachable server, a service that does not start)


def run_name(record: dict) -> str:
    """'vocab-2 pp2 small V64k seq256' (+ ' sim a100_80g' for a prediction); a mesh other than a pure pipeline
    names its dp and tp: 'vocab-2 dp2 pp4 tp4 2d ...'."""
    cfg, labels = record["config"], record.get("labels") or {}
    vocab = labels.get("vocab") or cfg["vocab_size"]
    dp, tp = cfg.get("dp", 1), cfg.get("tp", 1)
    mesh = (f"dp{dp} " if dp > 1 else "") + f"pp{cfg['pp']}" + (f" tp{tp} {cfg.get('tp_mode', '1d')}" if tp > 1 else "")
    name = f"{cfg['method']} {mesh} {labels.get('model', '')} V{vocab} seq{cfg['seq_len']}".replace("  ", " ")
    return name + (f" sim {labels['hardware']}" if record.get("backend") == "sim" and labels.get("hardware") else "")


def config_of(record: dict) -> dict:
    """The W&B config under the names of the sweep's command line: `method`, the groups `model`, `vocab` and
    `hardware` by the option chosen, every other RunConfig field as `run.<field>`, and backend, experiment, sweep."""
    cfg, labels = record["config"], record.get("labels") or {}
    out = {"method": cfg["method"], "vocab": labels.get("vocab") or str(cfg["vocab_size"])}
    out.update({k: labels[k] for k in LABELS if labels.get(k) is not None and k != "vocab"})
    out.update({f"run.{k}": v for k, v in cfg.items() if k != "method"})
    for axis in ("run.dp", "run.tp"):  # records from before data and tensor parallelism: a mesh of one
        out.setdefault(axis, 1)
    out.update({"backend": record["backend"], "experiment": record.get("experiment")})
    if labels.get("sweep"):
        out["sweep"] = labels["sweep"]
    return out


def tags_of(record: dict) -> list[str]:
    """The record's status and the id of the sweep that ran it (two sweeps of one experiment told apart)."""
    sweep = (record.get("labels") or {}).get("sweep")
    return [record["status"]] + ([sweep] if sweep else [])


def summary_of(record: dict) -> dict:
    """The W&B summary of a record: its status and error, and its scalar metrics as they are in the record."""
    m = record.get("metrics") or {}
    out = {"status": record["status"], "error": record.get("error") or "", "backend": record["backend"]}
    out.update({k: m[k] for k in SUMMARY if m.get(k) is not None})
    memory = [b for b in m.get("peak_memory_bytes") or [] if b is not None]
    if memory:
        out["max_peak_memory_bytes"] = max(memory)
    bubble = [b for b in m.get("bubble_fraction") or [] if b is not None]
    if bubble:  # the ranks' idle fraction: the largest (the rank that waits most) and the mean
        out["bubble_fraction_max"], out["bubble_fraction_mean"] = max(bubble), sum(bubble) / len(bubble)
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


def settings(stats: bool = False, **extra):
    """W&B settings of every run here: quiet, no code or git capture, wandb.init bounded by INIT_TIMEOUT_S; system
    metrics (the device's utilisation, memory, power) only where asked (live runs on a device)."""
    import wandb

    return wandb.Settings(silent=True, console="off", save_code=False, disable_git=True, x_disable_stats=not stats,
                          init_timeout=INIT_TIMEOUT_S, **extra)


def open_run(record: dict, logger, root: Path, stats: bool = False, **extra):
    """The W&B run of a record's id (resumed where it exists online), named, configured and tagged from the record
    (a live run opens with the record the job will write, status `running`)."""
    import wandb

    os.environ.setdefault("WANDB_SILENT", "true")
    root.mkdir(parents=True, exist_ok=True)
    run = wandb.init(project=logger.get("project"), entity=logger.get("entity"), mode=logger["mode"],
                     id=record["run_id"], resume="allow", name=run_name(record), group=record.get("experiment"),
                     dir=str(root), job_type=record["backend"], tags=tags_of(record), reinit="finish_previous",
                     config=config_of(record), settings=settings(stats, **extra))
    run.define_metric("iteration")
    run.define_metric("iteration/*", step_metric="iteration")
    run.define_metric("live/*", step_metric="iteration")
    return run


def fill_run(run, record: dict, images: dict[str, Path] | None = None) -> None:
    """The record's history, per-rank table, timeline pictures and summary, into an open run."""
    import wandb

    m = record.get("metrics") or {}
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
    if tuple(run.tags or ()) != tuple(tags_of(record)):  # a live run opened as `running`: its status now
        run.tags = tuple(tags_of(record))


def log_record(record: dict, logger, root: Path, images: dict[str, Path] | None = None):
    """Log one record as the W&B run of its id; its files go to root/wandb/."""
    if logger["mode"] == "offline":
        drop_local_runs(root, record["run_id"])
    run = open_run(record, logger, root)
    try:
        fill_run(run, record, images)
    finally:
        run.finish()


# -- which records were logged ----------------------------------------------------------------------------------------
def logged_marker(record_path: Path) -> Path:
    return Path(record_path).with_suffix(".logged")


def _digest(record_path: Path) -> str:
    return hashlib.sha1(Path(record_path).read_bytes()).hexdigest()


def mark_logged(record_path: Path) -> None:
    """Note beside the record that W&B holds it (the record's hash: a record rewritten since is not logged)."""
    from vp.record import write_atomic

    write_atomic(logged_marker(record_path), {"record_sha1": _digest(record_path)})


def is_logged(record_path: Path) -> bool:
    import json

    try:
        return json.loads(logged_marker(record_path).read_text())["record_sha1"] == _digest(record_path)
    except (OSError, ValueError, KeyError, TypeError):
        return False


# -- one run of tables and pictures (a report's comparison) -----------------------------------------------------------
def derived_id(kind: str, name: str) -> str:
    """A W&B run id derived from a name, stable across rebuilds: 'report-paper_1f1b-3f2a9c' (the hash keeps two
    names that differ only in characters W&B ids cannot hold apart)."""
    slug = re.sub(r"[^A-Za-z0-9_-]+", "-", name)[:40]
    return f"{kind}-{slug}-{hashlib.sha1(name.encode()).hexdigest()[:6]}"


def log_tables(run_id: str, name: str, group: str, job_type: str, tables: dict[str, tuple[list, list]],
               images: dict[str, Path], logger, root: Path, config: dict | None = None) -> None:
    """One run holding W&B Tables (name -> (columns, rows)) and pictures, replacing an earlier run of its id."""
    import wandb

    os.environ.setdefault("WANDB_SILENT", "true")
    root.mkdir(parents=True, exist_ok=True)
    if logger["mode"] == "offline":
        drop_local_runs(root, run_id)
    run = wandb.init(project=logger.get("project"), entity=logger.get("entity"), mode=logger["mode"], id=run_id,
                     resume="allow", name=name, group=group, dir=str(root), job_type=job_type,
                     reinit="finish_previous", config=config or {}, settings=settings())
    try:
        run.log({key: wandb.Table(columns=[str(c) for c in columns], data=rows)
                 for key, (columns, rows) in tables.items()})
        pictures = {key: wandb.Image(str(path)) for key, path in images.items() if Path(path).exists()}
        if pictures:
            run.log(pictures)
    finally:
        run.finish()
