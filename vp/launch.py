"""Starting a run's dp x pp x tp processes on this machine and turning their failures into one clear error."""
import faulthandler
import json
import multiprocessing as mp
import os
import signal
import sys
import tempfile
import time
import traceback
from pathlib import Path

import torch

from vp import failure
from vp.config import RunConfig
from vp.failure import RankEnd, classify  # noqa: F401 - classify: part of this module's interface (harness)
from vp.hostenv import cpu_threads, die_with_parent
from vp.record import write_atomic

KILL_GRACE_S = 10.0  # after one rank failed, how long the others get to fail on their own before a kill


class RunFailed(RuntimeError):
    def __init__(self, status: str, message: str):
        super().__init__(message)
        self.status = status


def explain(errors: dict[int, str | None], order: list[int], notes: dict[int, str],
            times: dict[int, float] | None = None) -> tuple[str, str]:
    """(status, message) of a failed run (vp.failure.explain). errors: each failed rank's traceback, or None when it
    ended without a Python error (notes[rank] says how); order: ranks in the order they were seen failing;
    times: when each failed (error stamps, else when seen ending); without times, the order stands for them."""
    times = times or {r: float(i) for i, r in enumerate(order)}
    return failure.explain([RankEnd(r, errors.get(r), notes.get(r, "raised an error"), times.get(r)) for r in order])


def _local_worker(cfg_dict, rank, world, init_method, workdir, fault, trace_path, rank_fn):
    extra = {}
    if rank_fn is None:  # every rank of the run is here and sees the same GPUs
        from vp.run import run_rank as rank_fn

        extra = {"local_world": world}

    # the parent stops the ranks (on Ctrl-C it kills them); a rank never handles SIGINT itself, and dies
    # with its parent
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    die_with_parent()
    # this rank's stderr (Python's, and NCCL's from C++) goes to its log; a fatal signal (NCCL's watchdog aborts
    # the process) leaves every thread's Python stack there
    log = open(Path(workdir) / f"log-{rank}.txt", "w")
    os.dup2(log.fileno(), 2)
    faulthandler.enable()
    os.environ[failure.PROGRESS_ENV] = str(Path(workdir) / f"progress-{rank}.txt")
    torch.set_num_threads(cpu_threads(world, env={}))  # the ranks share this machine's (or task's) CPUs
    try:
        record = rank_fn(RunConfig.from_dict(cfg_dict), rank, world, init_method, local_rank=rank, fault=fault,
                         trace_path=trace_path, **extra)
        if record is not None:
            write_atomic(Path(workdir) / "record.json", record)
    except BaseException as err:  # noqa: BLE001 - reported through a file, then the process exits non-zero
        text = traceback.format_exc()
        failure.write_error(Path(workdir) / f"error-{rank}.txt", text, getattr(err, "failed_at", None))
        print(text, file=sys.stderr, flush=True)
        os._exit(1)  # now: do not wait for communication threads that a dead peer keeps blocked


def launch_local(cfg: RunConfig, fault=None, trace_path: str | None = None, rank_fn=None) -> dict:
    """Start dp x pp x tp processes here, wait for them, return rank 0's record; RunFailed if any rank fails.
    rank_fn(cfg, rank, world, init_method, local_rank=, fault=, trace_path=) -> dict on rank 0 is what each
    process runs: vp.run.run_rank unless given (a picklable module-level function: vp.bench.peer's torch runner)."""
    ctx = mp.get_context("spawn")
    grace = min(KILL_GRACE_S, cfg.timeout_s)
    with tempfile.TemporaryDirectory(prefix="vp-run-") as workdir:
        init = f"file://{workdir}/rendezvous"
        procs = [ctx.Process(target=_local_worker, args=(cfg.to_dict(), r, cfg.world, init, workdir, fault,
                                                         trace_path, rank_fn))
                 for r in range(cfg.world)]
        seen, killed = {}, set()  # rank -> when it was seen failing
        try:
            for p in procs:
                p.start()
            while any(p.exitcode is None for p in procs):
                time.sleep(0.05)
                seen.update({r: time.time() for r, p in enumerate(procs) if p.exitcode not in (None, 0) and r not in seen})
                if seen and time.time() - min(seen.values()) > grace:
                    for r, p in enumerate(procs):  # the others did not give up on their own: stop them
                        if p.exitcode is None:
                            p.kill()
                            killed.add(r)
        except BaseException:  # Ctrl-C (or any error here): ranks may sit in a blocking collective, kill them
            for p in procs:
                if p.pid is not None and p.exitcode is None:
                    p.kill()
            for p in procs:
                if p.pid is not None:
                    p.join()
            raise
        for p in procs:
            p.join()
        _replay_logs(workdir, cfg.world)
        failures = [r for r, p in enumerate(procs) if p.exitcode != 0]
        if failures:
            raise RunFailed(*failure.explain([rank_end(workdir, r, procs[r].exitcode, r in killed, seen.get(r))
                                              for r in failures]))
        return json.loads((Path(workdir) / "record.json").read_text())


def exit_interrupted(code: int = 130) -> None:
    """End this process at once after a Ctrl-C that launch_local has handled (every rank killed and reaped): the
    interpreter's own shutdown with torch loaded (module teardown, a last garbage collection) costs about 1 s of CPU,
    several seconds on a loaded machine, during which the interrupted command and the multiprocessing resource
    tracker it started are still there. Nothing is left to do: records are written whole or not at all. The tracker
    (it ignores SIGINT and leaves when its pipe closes) is told to leave first and waited for, at most `grace_s`,
    then killed: on a loaded machine it outlived this process by more than 10 s."""
    sys.stdout.flush()
    sys.stderr.flush()
    stop_resource_tracker()
    os._exit(code)


def stop_resource_tracker(grace_s: float = 3.0) -> None:
    """Close this process's end of multiprocessing's resource tracker pipe, so that the tracker cleans up what is
    registered and exits, and reap it; kill it if it is still there after grace_s (a rank's resources are gone with
    the rank: the ranks register none)."""
    from multiprocessing import resource_tracker

    tracker = resource_tracker._resource_tracker
    fd, pid = getattr(tracker, "_fd", None), getattr(tracker, "_pid", None)
    if fd is None or pid is None:
        return
    try:
        os.close(fd)
    except OSError:
        pass
    deadline = time.monotonic() + grace_s
    try:
        while os.waitpid(pid, os.WNOHANG) == (0, 0):
            if time.monotonic() > deadline:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                return
            time.sleep(0.02)
    except (ChildProcessError, ProcessLookupError):
        pass


def rank_end(workdir: str, rank: int, exitcode: int, killed: bool, seen: float | None) -> RankEnd:
    """A failed rank's evidence: its stamped traceback, else NCCL's or the fault handler's words in its log."""
    how = ("stopped after the others failed" if killed else
           f"killed by signal {-exitcode}" if exitcode < 0 else f"exited with code {exitcode}")
    how = failure.with_progress(how, Path(workdir) / f"progress-{rank}.txt")
    error_file, log = Path(workdir) / f"error-{rank}.txt", Path(workdir) / f"log-{rank}.txt"
    if error_file.exists():
        at, text = failure.read_error(error_file)
        return RankEnd(rank, text, "raised an error", at or seen)
    evidence = failure.log_evidence(log.read_text(errors="replace")) if log.exists() and not killed else None
    return RankEnd(rank, evidence, how, seen)


def _replay_logs(workdir: str, world: int):
    """Each rank's stderr, after the run (its log), on this process's stderr."""
    for r in range(world):
        log = Path(workdir) / f"log-{r}.txt"
        text = log.read_text(errors="replace").strip() if log.exists() else ""
        if text:
            print(f"--- rank {r} (stderr) ---\n{text}", file=sys.stderr, flush=True)
