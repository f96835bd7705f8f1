"""SLURM as its users meet it: Ctrl-C cancels what the command submitted (unless cluster.detach=true), a rerun
attaches to the jobs still in flight instead of submitting them again, one live status line while waiting, the
shared file system probed at submission, and refusals that name the setting given and a fix that works. Unit tests
fake squeue and sbatch; those marked `slurm` run on the emulated nodes (make slurm-up) and skip where SLURM is
absent. Tests carry `cluster2` in their names."""
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from omegaconf import OmegaConf

from harness import dispatch, inflight, sharedfs, slurm
from harness.jobs import Job
from harness.slurm import JobState, Node, Partition, check_request, plan_request
from harness_util import ROOT, TINY, records, sweep
from vp.config import RunConfig

RUN = RunConfig(method="baseline", pp=2, layers=2, hidden=16, heads=2, seq_len=8, vocab_size=101, microbatches=2)


def _cluster(**given):
    base = dict(partition="cpu", gpus_per_node=None, tasks_per_node=None, cpus_per_task=None, mem_gb=None,
                time_min=None, pending_grace_s=5)
    return OmegaConf.create({**base, **given})


def _cpu_partition(nodes=2, cpus=2) -> Partition:
    return Partition("cpu", "UP", tuple(Node(f"n{i}", cpus, 8000, 0, "idle") for i in range(nodes)))


# -- refusals that name the setting given and a fix that works ------------------------------------------------------
def test_cluster2_gpus_per_node_on_a_cpu_partition_names_it_and_no_zero_advice():
    with pytest.raises(ValueError, match="cluster.gpus_per_node=8 but the nodes of partition cpu have no GPUs") as err:
        plan_request(2, 1, True, _cluster(gpus_per_node=8), _cpu_partition())
    assert "at most 0" not in str(err.value)
    assert "run.device=cpu run.dtype=fp32 without cluster.gpus_per_node for runs of at most 4 ranks" in str(err.value)


def test_cluster2_gpus_per_node_on_a_cpu_run_is_refused_not_ignored():
    with pytest.raises(ValueError, match="cluster.gpus_per_node=4 but run.device=cpu: a CPU run takes no GPUs"):
        plan_request(2, 1, False, _cluster(gpus_per_node=4), _cpu_partition())
    assert plan_request(2, 1, False, _cluster(gpus_per_node=0), _cpu_partition()).gpus_per_node == 0


def test_cluster2_cpu_hint_only_where_the_cpus_fit():
    """The GPU experiment's hint to use run.device=cpu is given only for a run the partition's CPUs can hold; a
    pp 8 run on 2 nodes of 2 CPUs is told where CPU runs go instead, and the hint it gives is not refused."""
    with pytest.raises(ValueError) as small:
        plan_request(4, 1, True, _cluster(), _cpu_partition())
    assert "or use run.device=cpu run.dtype=fp32" in str(small.value)
    check_request(plan_request(4, 1, False, _cluster(), _cpu_partition()), _cpu_partition())  # the hint works
    with pytest.raises(ValueError) as big:
        plan_request(8, 1, True, _cluster(), _cpu_partition())
    assert "run.device=cpu" not in str(big.value) and "do not fit partition cpu either" in str(big.value)


def test_cluster2_a_request_for_gpus_on_gpu_less_nodes_says_so():
    req = slurm.Request(1, 2, 2, 1, None, None)
    with pytest.raises(ValueError, match="its nodes have no GPUs; pick a GPU partition") as err:
        check_request(req, _cpu_partition())
    assert "at most 0" not in str(err.value)


def test_cluster2_make_sweep_echoes_one_line():
    out = subprocess.run(["make", "-n", "-o", "venv", "sweep", "CLUSTER=slurm", "PARTITION=debug"], cwd=ROOT,
                         capture_output=True, text=True, timeout=60)
    lines = [line for line in out.stdout.splitlines() if "harness.sweep" in line or line.strip().startswith(
        "cluster.partition")]
    assert len(lines) == 1 and "cluster.partition=debug" in lines[0] and not lines[0].rstrip().endswith("\\"), out


# -- live status line -------------------------------------------------------------------------------------------------
def test_cluster2_status_line_in_a_log_prints_changes_and_a_heartbeat():
    now, lines = [0.0], []
    status = inflight.StatusLine(lines.append, 4, tty=False, heartbeat_s=60, clock=lambda: now[0])
    status.show(4, 0, 0, 0)
    status.show(4, 0, 0, 0)  # nothing changed, within the heartbeat: silent
    now[0] = 61
    status.show(4, 0, 0, 0)  # a minute without change: said again
    now[0] = 90
    status.show(1, 2, 1, 0)
    now[0] = 120
    status.show(0, 0, 3, 1)
    assert lines == ["[0:00] 4 queued, 0 running, 0 done, 0 failed of 4",
                     "[1:01] 4 queued, 0 running, 0 done, 0 failed of 4",
                     "[1:30] 1 queued, 2 running, 1 done, 0 failed of 4, ETA 4:30",
                     "[2:00] 0 queued, 0 running, 3 done, 1 failed of 4"]


def test_cluster2_follow_shows_status_and_the_log_of_a_failure(tmp_path):
    jobs = [Job(i, [f"method=m{i}"], None, run=RUN, run_id=f"{i:012x}", path=tmp_path / "r" / f"{i:012x}.json")
            for i in (1, 2)]
    cfg = OmegaConf.create({"experiment": "x", "logger": {"mode": "disabled"},
                            "cluster": {**_cluster(partition="debug"), "folder": str(tmp_path / "sub"),
                                        "rendezvous": "tcp"}})
    log_file = tmp_path / "sub" / "x" / "2_0_log.err"
    handles = [(job, SimpleNamespace(job_id=str(job.index), stderr=lambda: "boom",
                                     paths=SimpleNamespace(stderr=log_file)), None) for job in jobs]
    now, log = [0.0], []
    script = {1: ["PENDING", "RUNNING", "COMPLETED"], 2: ["PENDING", "PENDING", "RUNNING", "FAILED"]}

    def poll(ids):
        t = int(now[0] // 2)
        return {i: JobState(script[int(i)][min(t, len(script[int(i)]) - 1)], "Resources") for i in ids}

    jobs[0].path.parent.mkdir(parents=True)
    jobs[0].path.write_text(json.dumps({"run_id": jobs[0].run_id, "status": "ok", "backend": "real",
                                        "config": RUN.to_dict(), "metrics": {"iteration_time_s": 1.0}}))
    counts = dispatch._follow(handles, cfg, "start", log.append, poll=poll, running=lambda: 1,
                              nodes_up=lambda p: 2, clock=lambda: now[0],
                              sleep=lambda s: now.__setitem__(0, now[0] + s))
    assert counts == {"ok": 1, "failed": 1}
    status = [line for line in log if line.startswith("[0:")]
    assert status[0] == "[0:00] 2 queued, 0 running, 0 done, 0 failed of 2", log
    assert "[0:04] 0 queued, 1 running, 1 done, 0 failed of 2, ETA 0:04" in status, log
    assert any(f"failed: method=m2 (SLURM job 2, ended FAILED); record {jobs[1].path}, log {log_file}" in line
               for line in log), log


# -- in flight: a rerun attaches ------------------------------------------------------------------------------------
def test_cluster2_in_flight_reads_markers_of_the_same_record_only(tmp_path):
    rec_a, rec_b = tmp_path / "r" / "a.json", tmp_path / "r" / "b.json"
    inflight.mark(tmp_path / "a", "7", rec_a)
    inflight.mark(tmp_path / "b", "8", tmp_path / "other-results" / "b.json")  # another results_dir's job
    inflight.mark(tmp_path / "c", "9", tmp_path / "r" / "c.json")
    asked = []

    def states(ids):
        asked.append(ids)
        return {"7": JobState("RUNNING", "None"), "9": JobState("COMPLETED", "None")}

    found = inflight.in_flight({"a": (tmp_path / "a", rec_a), "b": (tmp_path / "b", rec_b),
                                "c": (tmp_path / "c", tmp_path / "r" / "c.json"),
                                "d": (tmp_path / "d", tmp_path / "r" / "d.json")}, states)
    assert found == {"a": ("7", "RUNNING")} and asked == [["7", "9"]]  # one squeue call
    assert inflight.in_flight({"d": (tmp_path / "d", tmp_path / "r" / "d.json")}, states) == {}
    assert inflight.in_flight({"a": (tmp_path / "a", rec_a)}, lambda ids: None) == {}  # squeue silent


def test_cluster2_ctrl_c_cancels_what_this_command_submitted_unless_detached(tmp_path):
    mine = [SimpleNamespace(job_id="21"), SimpleNamespace(job_id="22")]
    theirs = SimpleNamespace(job_id="5")
    handles = [(None, h, None) for h in [*mine, theirs]]
    for detach, expect in ((False, [["21", "22"]]), (True, [])):
        cancelled, log = [], []
        cfg = OmegaConf.create({"cluster": {"detach": detach}})
        inflight.interrupted(handles, mine, cfg, log.append, cancelled.append)
        assert cancelled == expect
        assert ("cancelled the 2 SLURM job(s) this command submitted (scancel 21 22)" in log[0]) != detach, log
        assert "the 1 job(s) of an earlier command it followed go on (5: scancel 5 stops them)" in log[0]
        assert detach == ("cluster.detach=true); the SLURM jobs go on" in log[0])
    calls = []
    slurm.cancel_all(["21", "22"], call=lambda args: calls.append(args))
    assert calls == [["scancel", "21", "22"]]  # one scancel, one argument per job


def test_cluster2_interrupted_after_force_says_none_finished(tmp_path):
    from harness.sweep import interrupted_message

    jobs = [Job(i, [], None, run=RUN, run_id=f"{i:012x}", path=tmp_path / f"{i:012x}.json") for i in range(3)]
    for job in jobs:
        job.path.write_text(json.dumps({"run_id": job.run_id, "status": "ok", "backend": "real",
                                        "config": RUN.to_dict(), "metrics": {"iteration_time_s": 1.0}}))
    began = time.time() + 1  # every ok record is older than this command
    forced = interrupted_message(jobs, jobs, OmegaConf.create({"force": True}), began)
    assert forced.startswith("interrupted: 0 of the 3 forced runs finished again") and "rerun to resume" not in forced
    plain = interrupted_message(jobs, [], OmegaConf.create({"force": False}), began)
    assert plain.startswith("interrupted: 3 of 3 runs done (0 by this command)")


# -- shared file system probe ---------------------------------------------------------------------------------------
def _probe_cfg(tmp_path, **cluster):
    return OmegaConf.create({"results_dir": str(tmp_path / "results"), "cluster": {
        "partition": "debug", "folder": str(tmp_path / "sub"), "setup": [], "probe_s": 3, "account": None,
        "qos": None, **cluster}})


class FakeSlurm:
    """sbatch runs the --wrap script here (a node that shares everything) or not at all (a node that sees none of
    it: the job ends without an answer), or leaves it pending; squeue reports its state."""

    def __init__(self, runs: str):
        self.runs, self.state, self.calls = runs, "PENDING", []

    def __call__(self, args, timeout_s=30):
        self.calls.append(args[0])
        if args[0] == "sbatch":
            if self.runs == "here":
                subprocess.run(["bash", "-c", args[-1]], check=True)
            self.state = "PENDING" if self.runs == "never" else "COMPLETED"
            return subprocess.CompletedProcess(args, 0, "42\n", "")
        if args[0] == "squeue":
            return subprocess.CompletedProcess(args, 0, f"42|{self.state}|Priority\n", "")
        if args[0] == "scancel":
            self.state = "CANCELLED"
        return subprocess.CompletedProcess(args, 0, "", "")


def test_cluster2_shared_fs_probe_passes_and_is_remembered(tmp_path):
    fake = FakeSlurm("here")
    sharedfs.check_shared(_probe_cfg(tmp_path), print, call=fake, sleep=lambda s: None)
    assert fake.calls.count("sbatch") == 1 and (tmp_path / "sub" / "shared-fs.json").exists()
    sharedfs.check_shared(_probe_cfg(tmp_path), print, call=fake, sleep=lambda s: None)
    assert fake.calls.count("sbatch") == 1  # remembered: no second probe


def test_cluster2_shared_fs_probe_refuses_when_the_node_does_not_see_the_folder(tmp_path):
    with pytest.raises(ValueError, match="do not see the submitit folder cluster.folder=.*on a file system the "
                                         "nodes share"):
        sharedfs.check_shared(_probe_cfg(tmp_path), print, call=FakeSlurm("elsewhere"), sleep=lambda s: None)


def test_cluster2_shared_fs_probe_names_what_the_node_lacks(tmp_path):
    token, answer = tmp_path / "tok", tmp_path / "answer"
    token.write_text("tok")
    script = sharedfs.probe_script(token, answer, {"python": Path(sys.executable),
                                                   "results_dir": tmp_path / "nowhere"}, [])
    subprocess.run(["bash", "-c", script], check=True)
    assert answer.read_text().split() == [f"results_dir={tmp_path / 'nowhere'}"]


def test_cluster2_shared_fs_probe_that_does_not_start_is_cancelled_and_skipped(tmp_path):
    fake, log, now = FakeSlurm("never"), [], [0.0]
    sharedfs.check_shared(_probe_cfg(tmp_path), log.append, call=fake, sleep=lambda s: now.__setitem__(0, now[0] + s),
                          clock=lambda: now[0])
    assert "scancel" in fake.calls and "shared file system not checked: the probe job 42 did not run" in log[0]
    assert not (tmp_path / "sub" / "shared-fs.json").exists()


# -- on the emulated nodes ------------------------------------------------------------------------------------------
def _squeue_state(job_id: str) -> str:
    return subprocess.run(["squeue", "-h", "-t", "all", "-j", job_id, "-o", "%T"], capture_output=True,
                          text=True).stdout.strip()


@pytest.mark.slurm
def test_cluster2_slurm_rerun_attaches_to_the_job_in_flight(tmp_path, partition):
    """cluster.wait=false submits and leaves; the same command again, while the job is queued or running, follows
    that job (no second submission) to its record."""
    args = ["cluster=slurm", f"cluster.partition={partition}", *TINY, "grid.setups=[{run.pp: 2}]",
            "grid.product.vocab=[2k]", "grid.product.method=[baseline]", "run.iterations=2"]
    code, first = sweep(tmp_path, *args, "cluster.wait=false")
    assert code == 0 and sum(line.startswith("submitted") for line in first) == 1, first
    job_id = next(line for line in first if line.startswith("submitted")).split("SLURM job ")[1].split(":")[0]
    code, second = sweep(tmp_path, *args)
    assert code == 0, second
    if _squeue_state(job_id) and any("attached to SLURM job" in line for line in second):
        assert not any(line.startswith("submitted") for line in second), second
        assert any("1 of them queued or running from an earlier command" in line for line in second), second
    else:  # the first job ended before the rerun looked: it was done, nothing to attach to
        assert any("1 done, 0 to run" in line for line in second), second
    (rec,) = records(tmp_path)
    assert rec["status"] == "ok"


@pytest.mark.slurm
def test_cluster2_slurm_ctrl_c_cancels_the_submitted_jobs(tmp_path, partition):
    """SIGINT to a sweep following its two SLURM jobs: both are cancelled (one scancel), the message says which."""
    cmd = [sys.executable, "-m", "harness.sweep", "cluster=slurm", f"cluster.partition={partition}", *TINY,
           "grid.setups=[{run.pp: 2}]", "grid.product.vocab=[2k]", "grid.product.method=[baseline,vocab-2]",
           "run.iterations=200", f"results_dir={tmp_path}/results", f"cluster.folder={tmp_path}/sub", "logger=off",
           "report=false"]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    ids = []
    deadline = time.monotonic() + 120
    try:
        while time.monotonic() < deadline and len(ids) < 2:
            line = proc.stdout.readline()
            if line.startswith("submitted"):
                ids.append(line.split("SLURM job ")[1].split(":")[0])
            elif not line and proc.poll() is not None:
                break
        assert len(ids) == 2, ("jobs not submitted", proc.stderr.read() if proc.poll() is not None else "")
        time.sleep(1)
        os.killpg(proc.pid, signal.SIGINT)
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 130, (out, err)
        assert f"cancelled the 2 SLURM job(s) this command submitted (scancel {' '.join(ids)})" in out, (out, err)
        for _ in range(30):
            if all(_squeue_state(j) in ("CANCELLED", "") for j in ids):
                break
            time.sleep(1)
        assert all(_squeue_state(j) in ("CANCELLED", "") for j in ids), [_squeue_state(j) for j in ids]
    finally:
        proc.kill()
        proc.wait()
        subprocess.run(["scancel", *ids])


# -- teardown by PID ------------------------------------------------------------------------------------------------
def test_cluster2_teardown_stops_pids_it_started_never_by_name(tmp_path):
    """scripts/slurm-pids.sh: a PID file counts only while its process has the daemon's name (a reused PID is not
    ours), stop_pid ends just that process; the up/down scripts never kill by name."""
    mine = subprocess.Popen(["sleep", "60"])
    other = subprocess.Popen(["sleep", "60"])  # a process of the same name the scripts must leave alone
    try:
        pidfile = tmp_path / "d.pid"
        pidfile.write_text(str(mine.pid))
        lib = ROOT / "scripts" / "slurm-pids.sh"

        def sh(line):
            return subprocess.run(["bash", "-c", f". {lib}; {line}"], capture_output=True, text=True, timeout=30)

        assert sh(f"alive {pidfile} sleep").stdout.strip() == str(mine.pid)
        assert sh(f"alive {pidfile} slurmd").stdout.strip() == ""  # the PID is not a slurmd: not ours
        assert sh(f"stop_pid {mine.pid} sleep").returncode == 0
        assert mine.wait(timeout=15) is not None and other.poll() is None
    finally:
        for p in (mine, other):
            p.kill()
            p.wait()
    for script in ("slurm-up.sh", "slurm-down.sh", "slurm-pids.sh"):
        text = (ROOT / "scripts" / script).read_text()
        assert "pkill" not in text and "killall" not in text and "pgrep -x" not in text, script
    dry = subprocess.run(["bash", str(ROOT / "scripts" / "slurm-down.sh"), "--dry-run"], capture_output=True,
                         text=True, timeout=30, env={**os.environ, "CONF": str(tmp_path / "none.conf")})
    assert dry.returncode == 0 and "nothing of this project's to stop" in dry.stdout


# -- CPU reports that agree with themselves -------------------------------------------------------------------------
def _cpu_record(method: str, peak: float, seconds: list[float], kind: str = "Xeon x 2") -> dict:
    from harness.calibrate import cpu_profile
    from harness.sim import simulate_job
    from vp.config import check_config
    from vp.metrics import throughput

    cfg = check_config(RunConfig(method=method, pp=2, layers=2, hidden=16, heads=2, seq_len=8, vocab_size=101,
                                 microbatches=2, iterations=1 + len(seconds), warmup=1))
    rec = simulate_job(cfg, cpu_profile("c", 1e10), "smoke", {"model": "tiny", "vocab": "101"})
    t = statistics.mean(seconds)
    rec["metrics"].update(iteration_time_s=t, iteration_times_s=seconds, **throughput(cfg, t, 2, peak))
    rec.update(backend="real", env={"device": "cpu", "cpu_model": kind, "peak_flops_source": "probe:matmul"})
    return rec


def test_cluster2_report_uses_one_peak_per_node_kind_and_flags_noisy_runs(tmp_path):
    """Two runs of one node kind that probed different peaks: the report's MFU ratio is their throughput ratio; a
    run whose iterations spread 1.6x is listed as noisy; a run of another kind keeps its own peak."""
    from harness.report.build import build_experiment
    from harness.report.frame import records_frame

    base = _cpu_record("baseline", 4e10, [1.0, 1.02])
    vocab = _cpu_record("vocab-2", 2e10, [0.5, 0.8])  # a loaded node: half the probe, iterations spread 1.6x
    other = _cpu_record("vocab-1", 9e10, [0.9, 0.91], kind="EPYC x 64")
    df = records_frame([base, vocab, other]).set_index("method")
    mfu_ratio = df.loc["vocab-2", "mfu"] / df.loc["baseline", "mfu"]
    tps_ratio = df.loc["vocab-2", "tokens_per_s"] / df.loc["baseline", "tokens_per_s"]
    assert mfu_ratio == pytest.approx(tps_ratio) and vocab["metrics"]["mfu"] / base["metrics"]["mfu"] != \
        pytest.approx(tps_ratio)
    assert df.loc["vocab-1", "mfu"] == pytest.approx(other["metrics"]["mfu"])  # alone of its kind
    text = build_experiment("smoke", [base, vocab, other], tmp_path / "out", tmp_path).read_text()
    assert "MFU of the real runs on `cpu Xeon x 2` uses one peak, 30.0 GFLOP/s" in text
    assert f"**noisy**: `{vocab['run_id']}`" in text and "spread 1.60x" in text
    assert f"`{base['run_id']}`" not in text.split("## How the CPU runs were measured")[1]
    slow = _cpu_record("interlaced", 1e10, [2.0, 2.02])  # evenly slow: no spread, but half its kind's median peak
    text = build_experiment("smoke", [base, vocab, slow], tmp_path / "out2", tmp_path).read_text()
    assert f"**noisy**: `{slow['run_id']}`" in text and "its peak probe found 50% of its node kind's median" in text
