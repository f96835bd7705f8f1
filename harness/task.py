"""What each submitit task runs: one rank of one run, through the same vp entry as `python -m vp.train`.

Rank, world size and the first node's address come from submitit's job environment (local processes or
SLURM tasks); ranks meet there over TCP, or through a fresh file in the job's folder (cluster.rendezvous).
Rank 0 writes the measured timeline (`<run_id>.trace.json`, Chrome/Perfetto) and the record beside it; it logs
the record to W&B only when no sweep driver follows the run (SLURM with cluster.wait=false: harness.dispatch), or,
for a live run (harness.live: SLURM runs, logger.live=true), hands it to its live W&B writer once it is written. A
rank that fails leaves its traceback in the job folder, from which the sweep driver writes the failure record
(harness.dispatch).
"""
import faulthandler
import os
import re
import socket
import subprocess
import traceback
from pathlib import Path

from harness.live import start as start_live
from harness.records import finish_run


def rendezvous(spec: dict, env, environ=os.environ) -> str:
    """tcp://first-node-address:port (SLURM's reserved port, else one from the job id below the ephemeral range)
    or a fresh file in the job folder."""
    from vp.hostenv import rendezvous_port

    if spec.get("rendezvous") == "tcp":
        return f"tcp://{node_address(env.hostnames[0])}:{rendezvous_port(env.job_id, environ)}"
    return f"file://{Path(spec['folder']).resolve()}/rendezvous-{env.job_id}"


def node_address(node: str) -> str:
    """The address of a SLURM node: its name when that resolves, else the NodeAddr of SLURM's node record
    (emulated nodes, or clusters whose node names are not in DNS)."""
    try:
        socket.getaddrinfo(node, None)
        return node
    except socket.gaierror:
        pass
    out = subprocess.run(["scontrol", "show", "node", node, "-o"], capture_output=True, text=True, timeout=30)
    match = re.search(r"\bNodeAddr=(\S+)", out.stdout)
    if out.returncode != 0 or not match:
        raise RuntimeError(f"node {node} does not resolve and `scontrol show node {node}` gives no NodeAddr "
                           f"({out.stderr.strip() or out.stdout.strip()}); use cluster.rendezvous=file")
    return match.group(1)


def run_task(spec: dict) -> dict | None:
    from vp.hostenv import die_with_parent

    die_with_parent()  # the job's controller (submitit's, or slurmstepd) ended: so does this task
    import submitit
    import torch

    from vp.config import RunConfig
    from vp.failure import PROGRESS_ENV, write_error
    from vp.hostenv import cpu_threads
    from vp.run import run_rank

    env = submitit.JobEnvironment()
    rank, world, local_rank = env.global_rank, env.num_tasks, env.local_rank
    faulthandler.enable()  # a fatal signal (NCCL's watchdog aborts the process) leaves the Python stacks in the log
    torch.set_num_threads(cpu_threads(-(-world // max(1, env.num_nodes))))
    cfg = RunConfig.from_dict(spec["config"])
    path = Path(spec["path"])
    init = rendezvous(spec, env)
    os.environ[PROGRESS_ENV] = str(Path(spec["folder"]) / f"progress-{env.job_id}-{rank}.txt")
    live = start_live(spec, cfg, rank, local_rank, socket.gethostname()) if spec.get("live") else None
    try:
        record = run_rank(cfg, rank, world, init, local_rank, fault=spec.get("fault"), experiment=spec["experiment"],
                          trace_path=spec.get("trace"), observer=live)
    except BaseException as err:
        # every failing rank leaves its traceback, stamped with the time it failed; the sweep driver names the
        # culprit (the first to fail on its own) in the run's record
        write_error(Path(spec["folder"]) / f"error-{env.job_id}-{rank}.txt", traceback.format_exc(),
                    getattr(err, "failed_at", None))
        if live is not None:  # the driver writes the failure record onto the same W&B run id
            live.finish(timeout_s=10, failed=True)
        raise
    if rank != 0:
        if live is not None:
            live.finish()
        return None
    record["labels"] = spec["labels"]
    record["env"]["nodes"] = list(env.hostnames)
    finish_run(record, path, None if live else spec["logger"], Path(spec["wandb_root"]))
    if live is not None:
        live.finish(record, path)  # marks the record logged once W&B holds it; else the driver or `make report` logs it
    return {"run_id": record["run_id"], "status": record["status"],
            "iteration_time_s": record["metrics"]["iteration_time_s"]}
