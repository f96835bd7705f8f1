"""The launch environment, faked: torchrun and SLURM variables, per-task GPU binding, allocated CPUs, rendezvous
ports, NCCL settings, device peaks by exact name (the torch floor: tests/test_cuda_path.py)."""
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from vp.hostenv import NCCL_ENV, cpu_threads, device_index, nccl_environment, rendezvous_port
from vp.metrics import table_peak
from vp.train import launcher_env

ROOT = Path(__file__).parents[1]


def test_torchrun_variables_make_a_launched_rank():
    assert launcher_env({"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1"}) == (3, 4, 1, "env://")
    assert launcher_env({"SLURM_PROCID": "0"}) is None  # no launcher: vp.train starts its own processes


def test_device_from_the_visible_devices():
    assert device_index(local_rank=3, visible=1) == 0  # --gpus-per-task=1: each task sees its own GPU as cuda:0
    assert device_index(local_rank=3, visible=8) == 3
    with pytest.raises(ValueError, match="local rank 5 sees 4 CUDA devices.*--gpus-per-task=1"):
        device_index(local_rank=5, visible=4)
    with pytest.raises(ValueError, match="no CUDA device is visible.*CUDA_VISIBLE_DEVICES"):
        device_index(local_rank=0, visible=0)


def test_threads_from_the_cpus_allocated():
    assert cpu_threads(4, env={"SLURM_CPUS_PER_TASK": "6"}, affinity=set(range(64))) == 6
    assert cpu_threads(4, env={}, affinity=set(range(8))) == 2  # the cpuset, not the machine's cores
    assert cpu_threads(4, env={}, affinity={0}) == 1


def test_rendezvous_ports_stay_out_of_the_ephemeral_range():
    assert rendezvous_port("77", {"SLURM_STEP_RESV_PORTS": "12000-12003"}) == 12000
    ports = {rendezvous_port(str(job), {}, ephemeral=(32768, 60999)) for job in range(0, 200000, 97)}
    assert min(ports) >= 10000 and max(ports) < 32768 and len(ports) > 100
    assert rendezvous_port("123456_7", {}, ephemeral=(32768, 60999)) == 10000 + 123456 % 22768
    with pytest.raises(ValueError, match="ephemeral port range starts at 1024.*cluster.rendezvous=file"):
        rendezvous_port("5", {}, ephemeral=(1024, 65535))


def test_a_slurm_task_meets_at_the_first_node_on_a_safe_port(tmp_path):
    from harness.task import rendezvous

    env = SimpleNamespace(job_id="4242", hostnames=["localhost", "node08"])
    assert rendezvous({"rendezvous": "tcp"}, env, {}) == f"tcp://localhost:{rendezvous_port('4242', {})}"
    assert rendezvous({"rendezvous": "tcp"}, env, {"SLURM_STEP_RESV_PORTS": "15000-15007"}) == "tcp://localhost:15000"
    assert rendezvous({"folder": str(tmp_path)}, env).startswith("file://")


def test_nccl_settings_are_made_unless_already_set():
    env = {"TORCH_NCCL_ASYNC_ERROR_HANDLING": "1"}
    added = nccl_environment(env)
    assert env["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "1" and "TORCH_NCCL_ASYNC_ERROR_HANDLING" not in added
    assert {k: env[k] for k in NCCL_ENV if k != "TORCH_NCCL_ASYNC_ERROR_HANDLING"} == added


def test_peaks_by_exact_device_name():
    assert table_peak("NVIDIA H100 80GB HBM3") == (989e12, "table:H100")
    assert table_peak("NVIDIA H100 PCIe") == (756e12, "table:H100 PCIe")
    assert table_peak("NVIDIA A100 80GB PCIe")[0] == 312e12
    assert table_peak("NVIDIA H100 NVL") is None and table_peak("NVIDIA GH200 480GB") is None  # measured instead


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_a_process_that_dies_with_its_parent_is_gone_when_the_parent_ends(tmp_path):
    """A middle process starts a child that calls die_with_parent and sleeps; when the middle one exits, the
    child is killed (a submitit task whose controller died does not run on)."""
    pid_file = tmp_path / "child.pid"
    child = (f"import os, time; from vp.hostenv import die_with_parent; die_with_parent(); "
             f"open({str(pid_file)!r}, 'w').write(str(os.getpid())); time.sleep(60)")
    middle = (f"import subprocess, sys, time, pathlib; subprocess.Popen([sys.executable, '-c', {child!r}]); "
              f"p = pathlib.Path({str(pid_file)!r})\nwhile not p.exists(): time.sleep(0.05)")
    subprocess.run([sys.executable, "-c", middle], cwd=ROOT, timeout=60, check=True)
    pid = int(pid_file.read_text())
    deadline = time.monotonic() + 10
    while Path(f"/proc/{pid}").exists() and "Z" not in _state(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not Path(f"/proc/{pid}").exists() or "Z" in _state(pid), "the child outlived its parent"


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "gone"
