"""Starting a run's pp processes on this machine and turning their failures into one clear error."""
import json
import multiprocessing as mp
import os
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


def classify(error: str) -> str:
    """The record status of a failure, from its error text."""
    if "OutOfMemoryError" in error or "CUDA out of memory" in error:
        return "oom"
    if "Timeout" in error or "timed out" in error.lower() or "Timed out" in error:
        return "timeout"
    return "failed"


def _local_worker(cfg_dict, rank, world, init_method, workdir, fault):
    from vp.train import run_rank

    torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))
    try:
        record = run_rank(RunConfig.from_dict(cfg_dict), rank, world, init_method, local_rank=rank, fault=fault)
        if record is not None:
            write_atomic(Path(workdir) / "record.json", record)
    except BaseException:  # noqa: BLE001 - reported through a file, then the process exits non-zero
        text = traceback.format_exc()
        (Path(workdir) / f"error-{rank}.txt").write_text(text)
        print(text, file=sys.stderr, flush=True)
        sys.exit(1)


def run_local(cfg: RunConfig, fault=None) -> dict:
    """Start pp processes here, wait for them, return rank 0's record; RunFailed if any rank fails."""
    ctx = mp.get_context("spawn")
    with tempfile.TemporaryDirectory(prefix="vp-run-") as workdir:
        init = f"file://{workdir}/rendezvous"
        procs = [ctx.Process(target=_local_worker, args=(cfg.to_dict(), r, cfg.pp, init, workdir, fault))
                 for r in range(cfg.pp)]
        for p in procs:
            p.start()
        failed_at, order, killed = None, [], set()  # order: ranks in the order they were seen failing
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
        for p in procs:
            p.join()
        errors = {r: (Path(workdir) / f"error-{r}.txt") for r in range(cfg.pp)}
        failures = [r for r, p in enumerate(procs) if p.exitcode != 0]
        if failures:
            order += [r for r in failures if r not in order]
            died = [r for r in order if not errors[r].exists() and r not in killed]  # crashed without a Python error
            first = died[0] if died else order[0]
            texts = {r: errors[r].read_text() if errors[r].exists() else
                     ("stopped after the others failed" if r in killed else f"exited with code {procs[r].exitcode}")
                     for r in failures}
            summary = "; ".join(_summary_line(r, texts[r]) for r in failures)
            raise RunFailed(classify("\n".join(texts.values())), f"{summary}\n\n{texts[first]}")
        return json.loads((Path(workdir) / "record.json").read_text())


def _summary_line(rank: int, text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    for line in lines:  # the RankFailure line names rank, iteration, step and action
        if "RankFailure: " in line:
            return line.split("RankFailure: ", 1)[1]
    return f"rank {rank}: {lines[-1] if lines else text}"


