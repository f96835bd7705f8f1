"""What each submitit task runs: one rank of one run, through the same vp entry as `python -m vp.train`.

Rank, world size and the first node's address come from submitit's job environment (local processes or
SLURM tasks); ranks meet there over TCP, or through a fresh file in the job's folder (cluster.rendezvous).
Rank 0 writes the measured timeline (`<run_id>.trace.json`, Chrome/Perfetto) and the record beside it (and
logs it to W&B). A rank that fails leaves its traceback in the job folder, from
which the sweep driver writes the failure record (harness.dispatch).
"""
import os
import socket
import subprocess
import traceback
from pathlib import Path

from harness.records import finish_run


def node_address(node: str) -> str:
    """The node's host name when it resolves, else its NodeAddr from SLURM (nodes named apart from their hosts,
    e.g. several slurmd on one machine)."""
    try:
        socket.gethostbyname(node)
        return node
    except OSError:
        pass
    out = subprocess.run(["scontrol", "show", "node", node], capture_output=True, text=True, timeout=30).stdout
    return next((w.split("=", 1)[1] for w in out.split() if w.startswith("NodeAddr=")), node)


def rendezvous(spec: dict, env) -> str:
    """tcp://first-node:port (port from the job id) or a fresh file in the job folder."""
    if spec.get("rendezvous") == "tcp":
        job = int(str(env.job_id).split("_")[0])
        return f"tcp://{node_address(env.hostnames[0])}:{20000 + job % 20000}"
    return f"file://{Path(spec['folder']).resolve()}/rendezvous-{env.job_id}"


def run_task(spec: dict) -> dict | None:
    import submitit
    import torch

    from vp.config import RunConfig
    from vp.run import run_rank

    env = submitit.JobEnvironment()
    rank, world, local_rank = env.global_rank, env.num_tasks, env.local_rank
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // max(1, world // max(1, env.num_nodes))))
    cfg = RunConfig.from_dict(spec["config"])
    path = Path(spec["path"])
    init = rendezvous(spec, env)
    try:
        record = run_rank(cfg, rank, world, init, local_rank, fault=spec.get("fault"), experiment=spec["experiment"],
                          trace_path=spec.get("trace"))
    except BaseException:
        # every failing rank leaves its traceback; the sweep driver names the culprit in the run's record
        (Path(spec["folder"]) / f"error-{env.job_id}-{rank}.txt").write_text(traceback.format_exc())
        raise
    if rank != 0:
        return None
    record["labels"] = spec["labels"]
    finish_run(record, path, spec["logger"], Path(spec["wandb_root"]))
    return {"run_id": record["run_id"], "status": record["status"],
            "iteration_time_s": record["metrics"]["iteration_time_s"]}
