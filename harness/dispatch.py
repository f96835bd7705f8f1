"""Dispatch jobs with submitit: one multi-task job per run (one task per rank of the world), on local
processes or on SLURM.

cluster=local runs one job at a time (timings are not disturbed) and prints progress with an ETA;
cluster=slurm submits every job with sbatch and, with cluster.wait=true, follows them to the end. A job
that dies without writing its record (a killed rank, a time limit) gets a failure record here.

W&B: the driver logs each run it follows once the run's record is written (every local run; SLURM runs with
cluster.wait=true), so a run's processes, and a SLURM job's GPUs, are released as soon as the record is on disk,
and wandb and matplotlib are imported once per sweep instead of once per run. Runs nobody follows
(cluster.wait=false) log from their rank 0 as they end.
"""
import json
import signal
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path

from omegaconf import OmegaConf

from harness import inflight, slurm
from harness.live import live_logger
from harness.records import failure_record, finish_run, log_run, status_of, trace_path
from harness.task import run_task


def job_folder(job, cfg) -> Path:
    """The run's submitit folder: its logs, the tracebacks of its ranks, harness.inflight's marker."""
    return Path(cfg.cluster.folder).resolve() / cfg.experiment / job.run_id


def in_flight(jobs, cfg, states=slurm.job_states) -> dict[str, tuple[str, str]]:
    """run_id -> (SLURM job id, state) of the jobs' runs an earlier command submitted that are queued or running."""
    if cfg.backend != "real" or cfg.cluster.name != "slurm" or not jobs or not slurm.slurm_here():
        return {}
    return inflight.in_flight({j.run_id: (job_folder(j, cfg), j.path) for j in jobs}, states)


def _spec(job, cfg) -> dict:
    folder = job_folder(job, cfg)
    return {"config": job.run.to_dict(), "path": str(job.path.resolve()), "experiment": cfg.experiment,
            "labels": job.labels, "folder": str(folder), "rendezvous": cfg.cluster.rendezvous,
            "logger": None if _driver_logs(cfg) else OmegaConf.to_container(cfg.logger, resolve=True),
            "trace": str(trace_path(job.path).resolve()), "live": live_logger(cfg),
            "wandb_root": str(Path.cwd()), "fault": job.fault}


def _driver_logs(cfg) -> bool:
    """Whether this process logs the runs' records to W&B (it follows them to the end), not their rank 0."""
    return cfg.cluster.get("name") == "local" or bool(cfg.cluster.get("wait", True))


@contextmanager
def _wandb_logger(cfg, log):
    """Yields log_finished(job): logs the record a run's rank 0 wrote to W&B from this process. A failure to log is
    reported and the sweep goes on (the record is kept). The W&B service this starts ends with the sweep."""
    logger = OmegaConf.to_container(cfg.logger, resolve=True)
    on = logger.get("mode", "disabled") != "disabled"

    def log_finished(job) -> None:
        if not on:
            return
        try:
            log_run(json.loads(job.path.read_text()), job.path, logger, Path.cwd())
        except Exception as err:  # noqa: BLE001 - W&B trouble never costs a run its record
            log(f"    W&B logging of run {job.run_id} failed ({type(err).__name__}: {err}); its record {job.path} "
                f"is kept")

    try:
        yield log_finished
    finally:
        if on and "wandb" in sys.modules:
            sys.modules["wandb"].teardown()


def _wrote_own_record(job, before: tuple | None) -> bool:
    """Whether the run's rank 0 wrote a new record (not the one there before, not a failure record yet)."""
    return status_of(job.path) is not None and _signature(job.path) != before


def executor_for(job, cfg, folder: Path):
    import submitit

    cl = cfg.cluster
    if cl.name == "local":
        ex = submitit.LocalExecutor(folder=str(folder))
        ex.update_parameters(timeout_min=int(cl.timeout_min), nodes=1, tasks_per_node=job.run.world,
                             gpus_per_node=job.run.world if job.run.device == "cuda" else 0)
        return ex
    req = job.request  # harness.slurm.Request, checked against the partition by harness.jobs.check
    assert req is not None and req.cpus_per_task is not None, "a SLURM job is planned with the partition's facts"
    ex = submitit.SlurmExecutor(folder=str(folder))
    params = dict(partition=cl.partition, nodes=req.nodes, ntasks_per_node=req.tasks_per_node,
                  cpus_per_task=req.cpus_per_task, time=req.time_min, setup=list(cl.setup),
                  job_name=f"vp-{cfg.experiment}-{job.run_id}")
    if req.gpus_per_node:
        params["gpus_per_node"] = req.gpus_per_node
    for key in ("account", "qos"):
        if cl.get(key):
            params[key] = cl[key]
    if req.mem_gb:
        params["mem"] = f"{req.mem_gb}GB"
    ex.update_parameters(**params)  # time=None: no --time, so SLURM applies the partition's limit
    return ex


def _record_failure_if_missing(job, cfg, handle, error: str, started: str, before: tuple | None,
                               timed_out: bool = False) -> tuple[str, str]:
    """After a job ended: keep the record its rank 0 wrote, or write one naming the culprit rank from the
    tracebacks the ranks left in the job folder, stamped with the time they failed, or NCCL's words in their logs
    (vp.failure.explain), or from what submitit or SLURM said. `before`: the record file's _signature when the job
    was submitted (a forced rerun starts with the earlier record in place)."""
    from vp.failure import RankEnd, classify, explain, log_evidence, read_error, with_progress

    found = status_of(job.path)
    if found is not None and _signature(job.path) != before:
        return found, ""
    kept = found == "ok"  # a forced rerun that failed: the ok record of the earlier run stays
    folder = Path(_spec(job, cfg)["folder"])
    ends = []
    for r in range(job.run.world):
        err, log = folder / f"error-{handle.job_id}-{r}.txt", folder / f"{handle.job_id}_{r}_log.err"
        if err.exists():
            at, text = read_error(err)
            ends.append(RankEnd(r, text, "raised an error", at))
        elif log.exists() and (evidence := log_evidence(log.read_text(errors="replace"))):
            ends.append(RankEnd(r, evidence, with_progress("ended without a Python error",
                                                            folder / f"progress-{handle.job_id}-{r}.txt"),
                                log.stat().st_mtime))
    if ends:  # a rank without trace is a cause too, after every cause with a time (vp.failure.explain)
        silent = sorted(set(range(job.run.world)) - {e.rank for e in ends})
        status, message = explain(ends + [RankEnd(r, None, with_progress(
            "ended without a Python error (killed, crashed or hung)", folder / f"progress-{handle.job_id}-{r}.txt"))
            for r in silent])
    else:
        message = error or "the job ended without writing a record"
        status = classify(message)
    if timed_out:
        status = "timeout"
    if kept:
        return status, f" (the earlier ok record is kept; this attempt: {_first_line(message)})"
    finish_run(failure_record(job.run.to_dict(), cfg.experiment, "real", job.labels, status, message, started),
               job.path, OmegaConf.to_container(cfg.logger, resolve=True), Path.cwd())
    return status, f": see {job.path}"


def _first_line(text: str) -> str:
    return next((line.strip() for line in text.splitlines() if line.strip()), "")[:300]


ACTIVE = inflight.ACTIVE


def _tail(handle, lines: int = 30) -> str:
    try:
        return "\n".join((handle.stderr() or "").strip().splitlines()[-lines:])
    except OSError:
        return "(no log)"


def _signature(path: Path) -> tuple | None:
    """What tells a record file apart from the one there before: records are written by atomic rename, so a new
    one has a new inode (and, mostly, a new mtime to the nanosecond). None: no file. A time window cannot tell:
    a forced rerun that fails within a second of the earlier run's record would pass for having written it."""
    try:
        st = path.stat()
    except FileNotFoundError:
        return None
    return st.st_ino, st.st_mtime_ns, st.st_size


def _fmt(seconds: float) -> str:
    return f"{seconds / 60:.1f} min" if seconds >= 90 else f"{seconds:.0f} s"


def _stop(handle, grace_s: float = 8.0) -> None:
    """Ctrl-C: submitit's local controller forwards SIGINT to the ranks and kills what is left after a second."""
    process = getattr(handle, "_process", None)
    handle.cancel(check=False)
    if process is not None:
        try:
            process.wait(timeout=grace_s)
        except Exception:  # noqa: BLE001 - still there: end it
            process.kill()
            process.wait()


@contextmanager
def _sigint_held():
    """Hold Ctrl-C while a job's controller is being started: a SIGINT then would leave the new controller (forked,
    but not yet a handle here, and maybe not in the signalled process group) running on its own. Yields a list
    that is non-empty when SIGINT came; the caller raises KeyboardInterrupt once it can stop the job."""
    got = []
    if threading.current_thread() is not threading.main_thread() or \
            signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        yield got  # not ours to hold (another thread, or SIGINT ignored or handled by the caller)
        return
    signal.signal(signal.SIGINT, lambda *_: got.append(True))
    try:
        yield got
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def run_local(jobs, cfg, log=print) -> dict:
    """One job at a time; progress lines: done / total, the current run, elapsed and an ETA."""
    from vp.record import now

    with _wandb_logger(cfg, log) as log_finished:
        return _run_local(jobs, cfg, log, log_finished, now)


def _run_local(jobs, cfg, log, log_finished, now) -> dict:
    counts, began, total = {}, time.monotonic(), len(jobs)
    for i, job in enumerate(jobs):
        spec = _spec(job, cfg)
        elapsed = time.monotonic() - began
        eta = f", ETA {_fmt(elapsed / i * (total - i))}" if i else ""
        log(f"[{i}/{total} done{eta}] running {job.name} (run {job.run_id})")
        started, before = now(), _signature(job.path)
        t0 = time.monotonic()
        with _sigint_held() as interrupted:
            handle = executor_for(job, cfg, Path(spec["folder"])).submit(run_task, spec)
        error = ""
        try:
            if interrupted:
                raise KeyboardInterrupt
            handle.results()
        except KeyboardInterrupt:
            _stop(handle)
            raise
        except Exception as err:  # noqa: BLE001 - the failure becomes the record's error text
            error = f"{type(err).__name__}: {err}"
        own = _wrote_own_record(job, before)
        status, note = _record_failure_if_missing(job, cfg, handle, error, started, before,
                                                  "TIMEOUT" in str(handle.state))
        counts[status] = counts.get(status, 0) + 1
        log(f"    {status} in {_fmt(time.monotonic() - t0)}{note}")
        if own:
            log_finished(job)
    log(f"[{total}/{total} done in {_fmt(time.monotonic() - began)}] " +
        ", ".join(f"{n} {s}" for s, n in sorted(counts.items())))
    return counts


def run_slurm(jobs, cfg, log=print, states=slurm.job_states, cancel=slurm.cancel_all) -> dict:
    """Submit every job, or attach to the job of an earlier command that is still queued or running for it
    (harness.inflight); with cluster.wait, follow them and record those that die without a record. Ctrl-C
    cancels the jobs this command submitted (scancel), unless cluster.detach=true leaves them running."""
    import submitit

    from vp.record import now

    started, handles, submitted = now(), [], []
    flying = inflight.in_flight({job.run_id: (job_folder(job, cfg), job.path) for job in jobs}, states)
    try:
        for job in jobs:
            spec, before = _spec(job, cfg), _signature(job.path)
            folder = Path(spec["folder"])
            if job.run_id in flying:
                job_id, state = flying[job.run_id]
                handles.append((job, submitit.SlurmJob(folder=folder, job_id=job_id), before))
                log(f"attached to SLURM job {job_id} of {job.name} (run {job.run_id}), {state.lower()} since an "
                    f"earlier command: not submitted again")
                continue
            with _sigint_held() as interrupted:  # a Ctrl-C here waits until the job is known, so it is cancelled
                handle = executor_for(job, cfg, folder).submit(run_task, spec)
                submitted.append(handle)
                handles.append((job, handle, before))
                inflight.mark(folder, handle.job_id, job.path)
            if interrupted:
                raise KeyboardInterrupt
            log(f"submitted {job.name} (run {job.run_id}) as SLURM job {handle.job_id}: {job.request.describe()}")
        if not cfg.cluster.wait:
            log(f"{len(submitted)} jobs submitted" + (f", {len(handles) - len(submitted)} attached" if
                                                      len(handles) > len(submitted) else "") +
                "; rerun the same command later to follow them and resume what did not finish")
            return {"submitted": len(submitted)}
        with _wandb_logger(cfg, log) as log_finished:
            return _follow(handles, cfg, started, log, log_finished=log_finished)
    except KeyboardInterrupt:
        inflight.interrupted(handles, submitted, cfg, log, cancel)
        raise


def _follow(handles, cfg, started: str, log, poll=slurm.job_states, cancel=slurm.cancel,
            running=slurm.running_jobs, nodes_up=slurm.nodes_up, clock=time.monotonic, sleep=time.sleep,
            log_finished=lambda job: None, status=None) -> dict:
    """Poll squeue until every job ended; record those that ended without a record. One live status line
    (harness.inflight.StatusLine) shows queued / running / done / failed, elapsed and an ETA; a pending job's
    reason is shown whenever it changes, a failed run with its log file. A reason that cannot clear by itself
    (harness.slurm.stuck) that still holds after cluster.pending_grace_s cancels the job, recorded failed with
    the reason."""
    status = status or inflight.StatusLine(log, len(handles), tty=_terminal(log), clock=clock)
    try:
        return _poll_until_ended(handles, cfg, started, log, poll, cancel, running, nodes_up, clock, sleep,
                                 log_finished, status)
    finally:
        status.end()  # a terminal's live line ends before anything else is printed (Ctrl-C's message)


def _poll_until_ended(handles, cfg, started, log, poll, cancel, running, nodes_up, clock, sleep, log_finished,
                      status) -> dict:
    counts, total = {}, len(handles)
    pending, shown, stuck_since = list(handles), {}, {}
    grace = cfg.cluster.get("pending_grace_s", 60)
    while pending:
        states = poll([h.job_id for _, h, _ in pending]) or {}
        why_stuck = _StuckReasons(cfg.cluster.partition, running, nodes_up)
        still, queued = [], 0
        for job, handle, before in pending:
            key, st = handle.job_id, states.get(str(handle.job_id))
            if st is None or st.state in ACTIVE:
                waiting = st is not None and st.state == "PENDING"
                queued += st is None or waiting
                why = why_stuck(st.reason) if waiting else None
                if waiting and shown.get(key) != st.reason and st.reason not in ("None", ""):
                    shown[key] = st.reason
                    note = f" ({why}; cancelled in {grace} s unless it clears)" if why else ""
                    status.say(f"    SLURM job {key} ({job.name}) pending: {st.reason}{note}")
                since = stuck_since.setdefault(key, clock()) if why else stuck_since.pop(key, None)
                if why is None or clock() - since < grace:
                    still.append((job, handle, before))
                    continue
                cancel(key)
                error = (f"SLURM job {key} never started: it pended with reason {st.reason} ({why}) for "
                         f"{clock() - since:.0f} s and was cancelled; fix the request or pick another partition "
                         f"(docs/harness.md, SLURM)")
                result, _ = _record_failure_if_missing(job, cfg, handle, error, started, before)
                status.say(f"    cancelled SLURM job {key} ({job.name}): recorded {result} with its reason, "
                           f"{job.path}")
            else:
                error = "" if st.state == "COMPLETED" else f"SLURM job {key} ended {st.state}: " + _tail(handle)
                own = _wrote_own_record(job, before)
                result, _ = _record_failure_if_missing(job, cfg, handle, error, started, before,
                                                       st.state == "TIMEOUT")
                if own:
                    log_finished(job)
                if result != "ok":
                    status.say(f"    {result}: {job.name} (SLURM job {key}, ended {st.state}); record {job.path}, "
                               f"log {_log_path(handle)}")
            counts[result] = counts.get(result, 0) + 1
        pending = still
        done = counts.get("ok", 0)
        status.show(queued, len(pending) - queued, done, sum(counts.values()) - done)
        if pending:
            sleep(2)
    status.end()
    log(f"[{total}/{total} done] " + ", ".join(f"{n} {s}" for s, n in sorted(counts.items())))
    return counts


def _log_path(handle) -> str:
    try:
        return str(handle.paths.stderr)
    except Exception:  # noqa: BLE001 - a handle without submitit's paths (a test's fake)
        return "(no log)"


def _terminal(log) -> bool:
    """Whether the status line may be rewritten in place: the log goes to stdout and stdout is a terminal."""
    return log in (print, getattr(sys.modules.get("harness.sweep"), "_print", None)) and sys.stdout.isatty()


class _StuckReasons:
    """harness.slurm.stuck for the reasons of one poll. The cluster state two reasons depend on (this user's running
    jobs, the partition's nodes that are up) is asked of squeue and sinfo once, when such a reason first shows."""

    def __init__(self, partition: str, running, nodes_up):
        self.asked = {}
        self.ask = {"running": running, "nodes_up": lambda: nodes_up(partition)}

    def __call__(self, reason: str) -> str | None:
        if slurm.stuck(reason) is not None or slurm.stuck(reason, running=0, nodes_up=0) is None:
            return slurm.stuck(reason)
        for key, ask in self.ask.items():
            if key not in self.asked:
                self.asked[key] = ask()
        return slurm.stuck(reason, **self.asked)
