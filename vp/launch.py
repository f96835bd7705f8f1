"""Starting a run's dp x pp x tp processes on this machine and turning their failures into one clear error."""
import ctypes
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

from vp.config import RunConfig
from vp.record import write_atomic

KILL_GRACE_S = 10.0  # after one rank failed, how long the others get to fail on their own before a kill


class RunFailed(RuntimeError):
    def __init__(self, status: str, message: str):
        super().__init__(message)
        self.status = status


# what a rank reports when a *peer* failed: not the cause of a run's failure
PEER_SYMPTOMS = ("connection closed by peer", "connection reset by peer", "broken pipe", "gave no result within",
                 "timed out", "timeout", "nccl communicator was aborted")


def classify(error: str) -> str:
    """The record status of a failure, from its error text."""
    if "OutOfMemoryError" in error or "CUDA out of memory" in error:
        return "oom"
    return "timeout" if "timed out" in error.lower() or "timeout" in error.lower() else "failed"


def explain(errors: dict[int, str | None], order: list[int], notes: dict[int, str]) -> tuple[str, str]:
    """(status, message) of a failed run. errors: each failed rank's traceback, or None when it ended without
    a Python error (notes[rank] says how); order: ranks in the order they failed. The culprit is a rank that
    died without a Python error, else the first whose error is not a peer's symptom, else the first to fail."""
    died = [r for r in order if errors.get(r) is None and not notes.get(r, "").startswith("stopped")]
    own = [r for r in order if errors.get(r) and not any(s in errors[r].lower() for s in PEER_SYMPTOMS)]
    culprit = (died or own or order)[0]
    text = errors.get(culprit) or f"rank {culprit}: {notes.get(culprit, 'ended without a Python error')}"
    summary = "; ".join(_summary_line(r, errors.get(r) or notes.get(r, "ended without a Python error"))
                        for r in order)
    return classify(text), f"{summary}\n\n{text}"


def _local_worker(cfg_dict, rank, world, init_method, workdir, fault, trace_path, rank_fn):
    if rank_fn is None:
        from vp.run import run_rank as rank_fn

    # the parent stops the ranks (on Ctrl-C it kills them); a rank never handles SIGINT itself, and dies
    # with its parent
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _die_with_parent()
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))
    try:
        record = rank_fn(RunConfig.from_dict(cfg_dict), rank, world, init_method, local_rank=rank, fault=fault,
                         trace_path=trace_path)
        if record is not None:
            write_atomic(Path(workdir) / "record.json", record)
    except BaseException:  # noqa: BLE001 - reported through a file, then the process exits non-zero
        text = traceback.format_exc()
        (Path(workdir) / f"error-{rank}.txt").write_text(text)
        print(text, file=sys.stderr, flush=True)
        os._exit(1)  # now: do not wait for communication threads that a dead peer keeps blocked


def _die_with_parent() -> None:
    """Linux: this process gets SIGKILL when the process that started it ends (prctl PR_SET_PDEATHSIG)."""
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)
        except OSError:
            pass


def launch_local(cfg: RunConfig, fault=None, trace_path: str | None = None, rank_fn=None) -> dict:
    """Start dp x pp x tp processes here, wait for them, return rank 0's record; RunFailed if any rank fails.
    rank_fn(cfg, rank, world, init_method, local_rank=, fault=, trace_path=) -> dict on rank 0 is what each
    process runs: vp.run.run_rank unless given (a picklable module-level function: vp.bench.peer's torch runner)."""
    ctx = mp.get_context("spawn")
    with tempfile.TemporaryDirectory(prefix="vp-run-") as workdir:
        init = f"file://{workdir}/rendezvous"
        procs = [ctx.Process(target=_local_worker, args=(cfg.to_dict(), r, cfg.world, init, workdir, fault,
                                                         trace_path, rank_fn))
                 for r in range(cfg.world)]
        failed_at, order, killed = None, [], set()  # order: ranks in the order they were seen failing
        try:
            for p in procs:
                p.start()
            while any(p.exitcode is None for p in procs):
                time.sleep(0.05)
                order += [r for r, p in enumerate(procs) if p.exitcode not in (None, 0) and r not in order]
                if order and failed_at is None:
                    failed_at = time.monotonic()
                if failed_at is not None and time.monotonic() - failed_at > KILL_GRACE_S:
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
        failures = [r for r, p in enumerate(procs) if p.exitcode != 0]
        if failures:
            order += [r for r in failures if r not in order]
            files = {r: Path(workdir) / f"error-{r}.txt" for r in failures}
            errors = {r: files[r].read_text() if files[r].exists() else None for r in failures}
            notes = {r: "stopped after the others failed" if r in killed else f"exited with code {procs[r].exitcode}"
                     for r in failures}
            raise RunFailed(*explain(errors, order, notes))
        return json.loads((Path(workdir) / "record.json").read_text())


def _summary_line(rank: int, text: str) -> str:
    """One line per failed rank: its RankFailure (rank, iteration, step, action) or its last line."""
    lines = [line for line in text.strip().splitlines() if line.strip()]
    for line in lines:  # the RankFailure line names rank, iteration, step and action
        if "RankFailure: " in line:
            return line.split("RankFailure: ", 1)[1]
    return f"rank {rank}: {lines[-1] if lines else text}"


