"""Whether the compute nodes see this checkout, its Python, the results folder and the submitit folder: a SLURM job
runs the venv's python by absolute path, imports the checkout, and its rank 0 writes the record and the tracebacks
on the compute node, so without a shared file system every run would fail (or its record would land on the node).

Checked once before a sweep submits its first job, by a probe job of one task and one CPU (sbatch --wrap, a
one-minute limit): it reads a token this process wrote into the submitit folder, checks that the python, the
checkout and the results folder exist there, and writes its answer beside the token, which this process reads back.
A probe that finds everything is remembered in the submitit folder (the same partition and paths are not probed
again for a day). A probe that the queue does not start within cluster.probe_s is cancelled and the sweep goes on,
saying the check was skipped: the check must never cost more than a few seconds of a submission.
"""
import json
import secrets
import shlex
import sys
import time
from pathlib import Path

from harness import slurm
from harness.inflight import ACTIVE

ROOT = Path(__file__).resolve().parents[1]
REMEMBER_S = 24 * 3600


def probe_script(token: Path, answer: Path, paths: dict[str, Path], setup: list[str]) -> str:
    """The probe job's shell lines: its answer lists what the node lacks, `ok` when nothing."""
    checks = [f"test -e {shlex.quote(str(p))} || missing=\"$missing {name}={shlex.quote(str(p))}\""
              for name, p in paths.items()]
    return "; ".join([*setup, "missing=''", *checks,
                      f"test \"$(cat {shlex.quote(str(token))} 2>/dev/null)\" = {token.name} || "
                      f"missing=\"$missing token\"",
                      f"echo \"${{missing:-ok}}\" > {shlex.quote(str(answer))}.tmp",
                      f"mv {shlex.quote(str(answer))}.tmp {shlex.quote(str(answer))}"])


def check_shared(cfg, log, call=slurm._call, sleep=time.sleep, clock=time.monotonic) -> None:
    """Refuse (ValueError naming what the node could not see and the fix) when a compute node of the partition does
    not see the checkout, the python, results_dir or cluster.folder; log a line and go on when the probe could not
    run in time."""
    cl = cfg.cluster
    folder = Path(cl.folder).resolve()
    results = Path(cfg.results_dir).resolve()
    results.mkdir(parents=True, exist_ok=True)  # checked writable (harness.sweep.check_outputs)
    paths = {"python": Path(sys.executable), "checkout": ROOT / "harness" / "task.py", "results_dir": results}
    key = {"partition": cl.partition, "paths": {k: str(v) for k, v in paths.items()}, "folder": str(folder)}
    remembered = folder / "shared-fs.json"
    try:
        seen = json.loads(remembered.read_text())
        if seen.get("key") == key and time.time() - seen.get("at", 0) < REMEMBER_S:
            return
    except (OSError, ValueError, AttributeError):
        pass
    name = secrets.token_hex(6)
    where = folder / "probe" / name
    where.mkdir(parents=True, exist_ok=True)
    token, answer = where / name, where / "answer"
    token.write_text(name)
    args = ["sbatch", "--parsable", "-p", cl.partition, "-N", "1", "-n", "1", "-c", "1", "--time", "1",
            "--job-name", "vp-shared-fs-probe", "--output", "/dev/null"]
    args += [f"--{k}={cl[k]}" for k in ("account", "qos") if cl.get(k)]
    out = call(args + ["--wrap", probe_script(token, answer, paths, list(cl.setup))])
    if out.returncode != 0:
        raise ValueError(f"cluster.partition={cl.partition}: the shared file system probe job was refused by sbatch "
                         f"({(out.stderr or out.stdout).strip()}); fix the request or set cluster.check_shared_fs="
                         f"false to skip the probe")
    job = out.stdout.strip().split(";")[0]
    began, limit = clock(), cl.get("probe_s", 30)
    while not answer.exists():
        states = slurm.job_states([job], call) or {}
        st = states.get(job)
        if st is not None and st.state not in ACTIVE:
            sleep(0.5)  # the answer may trail the job's end by a file system's attribute cache
            if answer.exists():
                break
            raise ValueError(f"the compute nodes of partition {cl.partition} do not see the submitit folder "
                             f"cluster.folder={folder} (a probe job ran, {st.state}, and its answer never "
                             f"appeared here): jobs run the python, the checkout and the results folder of this "
                             f"machine by absolute path, so all of them must be on a file system the nodes share; "
                             f"put the checkout (with .venv, results/ and .submitit/) on the shared file system, or "
                             f"point cluster.folder and results_dir there")
        if clock() - began > limit:
            slurm.cancel(job, call)
            log(f"shared file system not checked: the probe job {job} did not run within cluster.probe_s={limit} s "
                f"(reason: {st.reason if st else 'unknown'}); it was cancelled and the sweep goes on")
            return
        sleep(0.5)
    said = answer.read_text().strip()
    if said != "ok":
        missing = ", ".join(said.split())
        raise ValueError(f"the compute nodes of partition {cl.partition} do not see {missing} (a probe job looked "
                         f"for them): jobs run this machine's python, checkout and results folder by absolute path; "
                         f"put them on the file system the nodes share (or set cluster.check_shared_fs=false if "
                         f"cluster.setup makes them appear)")
    remembered.write_text(json.dumps({"key": key, "at": time.time()}))
    for p in (token, answer):
        p.unlink(missing_ok=True)
    where.rmdir()
