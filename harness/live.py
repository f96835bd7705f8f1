"""Live W&B runs: a run's W&B run opens when its job starts and shows each iteration's loss and step time while it
trains, with system metrics (the GPUs' utilisation, memory, power) on device runs; the record lands on the same run
id at the end.

On for SLURM runs (logger.live=null) and wherever logger.live=true; local CPU sweeps log each record after its run
(a run lasts seconds there, W&B's start-up per run would dominate). W&B runs in a writer process of its own beside
the rank: the training loop's observer (vp.run.train_rank) only puts (iteration, loss, seconds) on a queue, never
waits, and drops values when the queue is full. At the end the writer logs the record (history, per-rank table,
timeline pictures, summary) and finishes; it gets logger.live_timeout_s for that, then it is killed. A writer that
fails (no network, a full disk, a killed W&B service) costs its rank nothing: the record is written first and is
marked logged only when the writer finished, so the sweep driver or `make report` logs it later.

Who writes: global rank 0 opens the run (primary). Online, W&B's shared mode lets more processes write into the one
run: the rank that knows the loss (replica 0, last pipeline stage, first tensor-parallel rank) when it is not rank 0,
and local rank 0 of every other node of a device run, for that node's system metrics. Offline there is one writer,
rank 0 (shared mode merges writers on W&B's server), which logs the loss when it knows it (vocabulary-parallel
methods, one stage)."""
import multiprocessing
import queue
import sys
import traceback
from pathlib import Path

QUEUE_ROWS = 100_000  # iterations buffered while W&B starts up or stalls; more are dropped, never waited for


def live_logger(cfg) -> dict | None:
    """The logger of live runs for this sweep (a dict), or None: logs live unless disabled, simulated, or a local
    sweep without logger.live=true."""
    from omegaconf import OmegaConf

    logger = OmegaConf.to_container(cfg.logger, resolve=True)
    if logger.get("mode", "disabled") == "disabled" or cfg.backend != "real":
        return None
    live = logger.get("live")
    return logger if (cfg.cluster.name == "slurm" if live is None else bool(live)) else None


def writer_role(cfg, rank: int, local_rank: int, mode: str) -> str | None:
    """'primary' (global rank 0), 'loss' (the rank that knows the loss, online), 'node' (local rank 0 of another
    node of a device run, online), or None: this process does not write to W&B."""
    if rank == 0:
        return "primary"
    if mode != "online":
        return None
    mesh = cfg.mesh
    holder = next(r for r in range(cfg.world) if (c := mesh.coords(r)).d == 0 and c.p == cfg.pp - 1 and c.t == 0)
    if rank == holder:
        return "loss"
    return "node" if local_rank == 0 and cfg.device == "cuda" else None


class LiveRun:
    """The observer of one rank (called after each iteration) and the writer process behind it."""

    def __init__(self, opening: dict, logger: dict, root: Path, role: str, stats: bool, label: str):
        ctx = multiprocessing.get_context("spawn")  # a clean interpreter: nothing of torch or the process groups
        self.queue = ctx.Queue(QUEUE_ROWS)
        self.dropped = 0
        self.timeout_s = float(logger.get("live_timeout_s") or 120)
        self.process = ctx.Process(target=_write, args=(self.queue, opening, logger, str(root), role, stats, label),
                                   name=f"wandb-live-{label}", daemon=True)
        self.process.start()

    def __call__(self, iteration: int, loss, seconds: float) -> None:
        try:
            self.queue.put_nowait(("iteration", iteration, loss, seconds))
        except queue.Full:
            self.dropped += 1

    def finish(self, record: dict | None = None, path: Path | None = None, timeout_s: float | None = None,
               failed: bool = False) -> bool:
        """Hand the record (rank 0) to the writer and wait for it at most timeout_s (logger.live_timeout_s); True when
        W&B holds it, and the record is then marked logged. A writer still busy after that is killed. failed: the
        rank failed (no record): the W&B run ends as failed, and the driver's failure record follows on its id."""
        from harness.wandb_log import mark_logged

        try:
            self.queue.put(("end", record, str(path) if path else None, self.dropped, failed), timeout=5)
        except queue.Full:
            pass
        self.process.join(self.timeout_s if timeout_s is None else timeout_s)
        if self.process.is_alive():
            self.process.kill()
            self.process.join(5)
            print(f"live W&B writer did not finish within {self.timeout_s:.0f} s and was stopped; the record is kept "
                  f"and logged by the sweep or `make report`", file=sys.stderr)
            return False
        ok = self.process.exitcode == 0
        if ok and record is not None and path is not None:
            mark_logged(Path(path))
        return ok


def start(spec: dict, cfg, rank: int, local_rank: int, host: str) -> LiveRun | None:
    """The live observer of this rank, or None when this process does not write to W&B (harness.task)."""
    logger = spec.get("live")
    role = writer_role(cfg, rank, local_rank, logger["mode"]) if logger else None
    if role is None:
        return None
    opening = {"run_id": Path(spec["path"]).stem, "experiment": spec["experiment"], "status": "running",
               "backend": "real", "config": spec["config"], "labels": spec["labels"]}
    label = f"rank{rank}-{host}"
    shared = logger["mode"] == "online" and cfg.world > 1  # more writers may join: every one in shared mode
    stats = cfg.device == "cuda" and (role == "primary" or local_rank == 0)  # one system monitor per node
    return LiveRun(opening, {**logger, "shared": shared}, Path(spec["wandb_root"]), role, stats, label)


def _write(q, opening: dict, logger: dict, root: str, role: str, stats: bool, label: str) -> None:
    """The writer process: open the run, log each iteration as it comes, then the record, then finish. Exit code 0
    only when W&B took everything."""
    from vp.hostenv import die_with_parent

    die_with_parent()
    run = None
    try:
        from harness.wandb_log import drop_local_runs, open_run

        extra, mode = {}, logger["mode"]
        if logger.get("shared"):
            mode = "shared"
            extra = {"x_primary": role == "primary", "x_label": label}
            if role != "primary":
                extra["x_update_finish_state"] = False
        if mode == "offline":
            drop_local_runs(Path(root), opening["run_id"])
        run = open_run(opening, {**logger, "mode": mode}, Path(root), stats, **extra)
    except Exception:  # noqa: BLE001 - W&B trouble: keep draining, so the rank never waits on a full queue
        print(f"live W&B run could not be opened:\n{traceback.format_exc()}", file=sys.stderr)
    while True:
        item = q.get()
        if item[0] == "end":
            break
        if run is None:
            continue
        _, iteration, loss, seconds = item
        row = {"iteration": iteration, "live/time_s": seconds} if role == "primary" else {"iteration": iteration}
        if loss is not None and role in ("primary", "loss"):
            row["live/loss"] = loss
        if len(row) > 1:
            run.log(row)
    _, record, path, dropped, failed = item
    if run is None:
        sys.exit(3)
    if dropped:
        run.summary["live/dropped_iterations"] = dropped
    if record is not None:
        from harness.records import trace_path
        from harness.timeline import timeline_images
        from harness.wandb_log import fill_run

        images = timeline_images(record, Path(path), trace_path(Path(path))) if record.get("metrics") else {}
        try:
            fill_run(run, record, images)
        finally:
            for picture in images.values():
                picture.unlink(missing_ok=True)
    run.finish(exit_code=1 if failed else 0)
