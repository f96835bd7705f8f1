"""Sweeps through a real SLURM cluster (make slurm-up): multi-task jobs, and a mesh spanning two nodes."""
import os
import shutil
import subprocess

import pytest

from harness_util import TINY, records, sweep
from vp.config import RunConfig
from vp.reference import train_reference


def _slurm_up() -> bool:
    if not shutil.which("sinfo"):
        return False
    out = subprocess.run(["sinfo", "-h", "-o", "%P %a"], capture_output=True, text=True, timeout=20)
    return out.returncode == 0 and "up" in out.stdout


@pytest.mark.slurm
def test_sweep_through_slurm(tmp_path):
    """Two runs through sbatch: multi-task jobs (2 tasks each), gloo across the tasks, records checked."""
    if not _slurm_up():
        if os.environ.get("VP_REQUIRE_SLURM") == "1":
            pytest.fail("VP_REQUIRE_SLURM=1 but no SLURM answers here; run `make slurm-up` first")
        pytest.skip("no SLURM cluster here (make slurm-up starts one)")
    partition = subprocess.run(["sinfo", "-h", "-o", "%P"], capture_output=True, text=True).stdout.split()[0]
    code, lines = sweep(tmp_path, "cluster=slurm", f"cluster.partition={partition.rstrip('*')}",
                        "cluster.gpus_per_node=0", "cluster.cpus_per_task=1", "cluster.time_min=10", *TINY,
                        "grid.product.vocab=[2k]", "grid.product.method=[baseline,vocab-2]", "run.iterations=2")
    assert code == 0, lines
    recs = records(tmp_path)
    assert len(recs) == 2 and all(r["status"] == "ok" for r in recs), [r["error"] for r in recs]
    assert all(r["env"]["world_size"] == 2 for r in recs)
    assert recs[0]["metrics"]["loss"] == pytest.approx(recs[1]["metrics"]["loss"], rel=1e-5)


@pytest.mark.slurm
def test_mesh_job_spans_two_slurm_nodes(tmp_path):
    """A dp 2 x pp 2 run through sbatch on two nodes (2 tasks each): the ranks meet at the first node's
    address from SLURM's node record (emulated node names do not resolve) and train like one process."""
    if not _slurm_up():
        if os.environ.get("VP_REQUIRE_SLURM") == "1":
            pytest.fail("VP_REQUIRE_SLURM=1 but no SLURM answers here; run `make slurm-up` first")
        pytest.skip("no SLURM cluster here (make slurm-up starts one)")
    nodes = subprocess.run(["sinfo", "-h", "-N", "-o", "%N"], capture_output=True, text=True).stdout.split()
    if len(set(nodes)) < 2:
        if os.environ.get("VP_REQUIRE_SLURM") == "1":
            pytest.fail(f"VP_REQUIRE_SLURM=1 but SLURM has one node ({nodes}); scripts/slurm-up.sh starts two")
        pytest.skip("SLURM has a single node here")
    partition = subprocess.run(["sinfo", "-h", "-o", "%P"], capture_output=True, text=True).stdout.split()[0]
    code, lines = sweep(tmp_path, "cluster=slurm", f"cluster.partition={partition.rstrip('*')}",
                        "cluster.gpus_per_node=0", "cluster.cpus_per_task=1", "cluster.tasks_per_node=2",
                        "cluster.time_min=10", *TINY, "run.dp=2", "run.microbatches=4", "grid.product.vocab=[2k]",
                        "grid.product.method=[vocab-2]", "run.iterations=2")
    assert code == 0, lines
    (rec,) = records(tmp_path)
    assert rec["status"] == "ok", rec["error"]
    assert rec["env"]["world_size"] == 4 and len(rec["env"]["nodes"]) == 2
    cfg = RunConfig.from_dict(rec["config"])
    ref, _ = train_reference(cfg)
    assert rec["metrics"]["loss"] == pytest.approx(ref, rel=1e-5)
