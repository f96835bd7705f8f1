"""Pipelines on two or more GPUs (skipped on a machine with one): every method at pp 2, 4, 8 (up to the GPUs
present), one process per GPU over NCCL started by torchrun as a user would (`launch_torchrun`: each rank through
vp.gpucheck.node_rank, its actions strict about host syncs), bf16, the loss against the fp32 CPU reference, the syncs
of every rank, the step time and the communicators; then a rank made to raise at F2 under NCCL, which must fail the
run at once naming that rank. Runs are started while the part's budget lasts; the rest are reported as not run. On
CPU the part is skipped (the suite's loss-parity tests start the same runs over gloo, and launch_torchrun's own test
runs it on CPU).
"""
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from vp.config import RunConfig
from vp import failure
from vp.launch import RunFailed, rank_end
from vp.schedule.methods import METHODS

# the fields worker_config sets, as vp.train's flags (a test checks that vp.train parses them back to the config)
TRAIN_FIELDS = ("method", "pp", "layers", "hidden", "heads", "seq_len", "vocab_size", "microbatches", "iterations",
                "warmup", "device", "dtype", "timeout_s")

RTOL = 3e-2  # bf16 against the fp32 reference
RUN_S = 60.0  # a run is started only with this much of the budget left


def worker_config(method: str, pp: int) -> RunConfig:
    chunks = METHODS[method].family.chunks or 2
    return RunConfig(method=method, pp=pp, layers=pp * chunks, hidden=64, heads=4, seq_len=32, vocab_size=1000,
                     microbatches=2 * pp, iterations=3, warmup=1, device="cuda", dtype="bf16", timeout_s=120)


def train_flags(cfg: RunConfig) -> list[str]:
    """vp.train's command line for a worker_config."""
    return [x for name in TRAIN_FIELDS for x in (f"--{name.replace('_', '-')}", str(getattr(cfg, name)))]


def launch_torchrun(cfg: RunConfig, fault=None) -> tuple[dict, dict[int, list[str]]]:
    """cfg's run under torchrun on this node (`--standalone`: a free port on localhost), one process per rank, each
    through vp.gpucheck.node_rank: (rank 0's record, each rank's syncs inside actions). RunFailed naming the rank that
    caused a failure, from the ranks' stamped tracebacks (vp.failure.explain, as vp.launch explains its runs)."""
    with tempfile.TemporaryDirectory(prefix="gpucheck-node-") as folder:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={cfg.world}",
               "-m", "vp.gpucheck.node_rank", "--syncs-dir", folder, *train_flags(cfg), "--json"]
        if fault:
            cmd += ["--inject-fault", ":".join(map(str, fault))]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=cfg.timeout_s + 60)
        except subprocess.TimeoutExpired as err:
            raise RunFailed("timeout", f"torchrun did not end within {cfg.timeout_s + 60:.0f} s") from err
        syncs = {}
        for path in Path(folder).glob("syncs-*.json"):
            seen = json.loads(path.read_text())
            syncs[seen["rank"]] = seen["syncs"]
        if proc.returncode:  # the culprit from the ranks' own evidence (a rank without any was stopped by torchrun)
            ends = [rank_end(folder, r, proc.returncode, not (Path(folder) / f"error-{r}.txt").exists(), None)
                    for r in range(cfg.world)]
            status, message = failure.explain(ends)
            raise RunFailed(status, f"{message} (torchrun exit {proc.returncode}; its stderr: {proc.stderr[-800:]})")
    records = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if not records:
        raise RunFailed("failed", f"no record printed: {proc.stdout[-500:]} {proc.stderr[-1500:]}")
    return json.loads(records[-1]), syncs


def fault(deadline: float) -> dict:
    """A rank that raises under NCCL: the run fails at once (its communicators aborted), naming that rank."""
    if deadline - time.monotonic() < RUN_S:
        return {"ok": None, "skipped": "budget"}
    t0 = time.monotonic()
    try:
        launch_torchrun(worker_config("vocab-2", 2).with_(timeout_s=60), fault=(1, "F2", "raise"))
        return {"ok": False, "error": "the run did not fail"}
    except RunFailed as err:
        seconds = time.monotonic() - t0
        return {"ok": err.status == "failed" and str(err).startswith("rank 1") and seconds < 60,
                "status": err.status, "seconds": seconds, "message": str(err)[:500]}


def run(device: torch.device, out: Path, budget_s: float = 150.0, gpus: int | None = None) -> dict:
    from vp.reference import train_reference

    deadline = time.monotonic() + budget_s - 10
    present = torch.cuda.device_count() if device.type == "cuda" else 0
    gpus = min(gpus, present) if gpus else present
    if gpus < 2:
        return {"ok": None, "gpus": gpus, "summary": [f"{gpus} GPUs here: the pipeline's NCCL traffic and the fault "
                                                      "path need two or more (skipped)"]}
    plan = [(pp, m) for pp in (2, 4, 8) if pp <= gpus for m in METHODS]
    runs, summary = {}, ["| pp | method | loss | reference | syncs in actions | iteration s | communicators | ok |",
                         "|---|---|---|---|---|---|---|---|"]
    for pp, method in plan:
        key = f"pp{pp}/{method}"
        if deadline - time.monotonic() < RUN_S:
            runs[key] = {"ok": None, "skipped": "budget"}
            continue
        cfg = worker_config(method, pp)
        reference = train_reference(cfg.with_(device="cpu", dtype="fp32"))[0]
        try:
            record, syncs = launch_torchrun(cfg)
            metrics = record["metrics"]
            loss = metrics["loss"]
        except RunFailed as err:
            runs[key] = {"ok": False, "status": err.status, "error": str(err)[:2000]}
            summary.append(f"| {pp} | {method} | {err.status}: {str(err)[:150]} | | | | | FAILED |")
            continue
        seen = sum(len(s) for s in syncs.values())
        ok = all(abs(a - b) <= RTOL * abs(b) for a, b in zip(loss, reference)) and not seen
        step, held = metrics.get("iteration_time_s"), metrics.get("communicators")
        runs[key] = {"ok": ok, "loss": loss, "reference": reference, "syncs": syncs, "iteration_time_s": step,
                     "communicators": held, "comm_buffer_bytes": metrics.get("comm_buffer_bytes")}
        summary.append(f"| {pp} | {method} | {', '.join(f'{x:.4f}' for x in loss)} | "
                       f"{', '.join(f'{x:.4f}' for x in reference)} | {seen} | {step} | {held} | "
                       f"{'yes' if ok else 'FAILED'} |")
    left = [k for k, r in runs.items() if r.get("skipped")]
    if left:
        summary.append(f"not run (budget): {', '.join(left)}")
    result = {"gpus": gpus, "runs": runs, "fault": fault(deadline)}
    summary.append(f"fault (rank 1 raises at F2): {result['fault']}")
    checks = [r["ok"] for r in runs.values()] + [result["fault"]["ok"]]
    ok = False if False in checks else True if True in checks else None
    return {"ok": ok, "summary": summary, **result}
