"""Self-check of the local SLURM cluster (see scripts/slurm-up.sh) through submitit.

Submits one job with 2 tasks (nodes=1, ntasks_per_node=2, cpus_per_task=1) to
partition "debug" with submitit.SlurmExecutor, waits for it and prints what each
task saw in submitit.JobEnvironment(). Exits 0 only if ranks 0 and 1 of 2 answered.

Usage:  .venv/bin/python scripts/slurm-check.py [--partition debug] [--timeout-s 120]

Note: with accounting off, submitit warns that `sacct` fails ("Bypassing sacct
error"); that is expected: results are still collected from the job folder.
"""

import argparse
import sys
import tempfile
import time

import submitit

from vp.renamed import refuse_renamed_flags


def task_info():
    env = submitit.JobEnvironment()
    return {"global_rank": env.global_rank, "num_tasks": env.num_tasks, "hostname": env.hostname}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--partition", default="debug")
    parser.add_argument("--timeout-s", type=float, default=120, help="seconds to wait for the job")
    args = refuse_renamed_flags(parser).parse_args()

    with tempfile.TemporaryDirectory(prefix="slurm-check-") as folder:
        executor = submitit.SlurmExecutor(folder=folder, python=sys.executable)
        executor.update_parameters(
            nodes=1, ntasks_per_node=2, cpus_per_task=1, partition=args.partition, time=5
        )
        job = executor.submit(task_info)
        print(f"submitted job {job.job_id} (folder {folder})", flush=True)
        deadline = time.time() + args.timeout_s
        while not job.done():
            if time.time() > deadline:
                job.cancel(check=False)
                print(f"FAIL: job {job.job_id} not done after {args.timeout_s:.0f} s", file=sys.stderr)
                return 1
            time.sleep(1)
        try:
            results = job.results()
        except Exception as exc:  # job failed: show submitit's error (includes the job's stderr)
            print(f"FAIL: job {job.job_id} raised: {exc}", file=sys.stderr)
            return 1

    for res in results:
        print(res)
    ranks = sorted(r["global_rank"] for r in results)
    if ranks == [0, 1] and all(r["num_tasks"] == 2 for r in results):
        print("OK: 2 tasks answered with ranks 0 and 1 of 2")
        return 0
    print(f"FAIL: unexpected results {results}", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
