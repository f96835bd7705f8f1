"""Sweeps through a real SLURM cluster (make slurm-up: two emulated nodes of 2 CPUs): requests planned from the
partition's facts (a run smaller than a node takes part of one), a request the partition cannot give refused
before submission, a job SLURM leaves pending for good cancelled and recorded, and a mesh spanning two nodes."""
import json
import os
import subprocess
from dataclasses import replace

import pytest
from hydra import initialize_config_dir

from harness import dispatch, slurm
from harness.sweep import plan
from harness_util import CONF, TINY, records, sweep
from vp.config import RunConfig
from vp.reference import train_reference


@pytest.mark.slurm
def test_partition_facts_are_slurms(partition):
    """harness.slurm's facts of the partition are those `scontrol show node` reports for each of its nodes."""
    part = slurm.query_partition(partition)
    assert part.state == "UP" and part.nodes
    for node in part.nodes:
        fields = slurm.parse_fields(subprocess.run(["scontrol", "show", "node", node.name, "-o"], capture_output=True,
                                                   text=True).stdout)
        assert (node.cpus, node.mem_mb, node.gpus) == (int(fields["CPUTot"]), int(fields["RealMemory"]),
                                                       slurm.parse_gpus(fields["Gres"]))


@pytest.mark.slurm
def test_sweep_through_slurm_sizes_jobs_from_the_partition(tmp_path, partition):
    """Two runs through sbatch with no cluster sizes given: pp 1 takes one task (1 CPU) of a 2-CPU node, pp 2 two
    tasks of one node; gloo across the tasks; both train like one process."""
    code, lines = sweep(tmp_path, "cluster=slurm", f"cluster.partition={partition}", *TINY,
                        "grid.setups=[{run.pp: 1}, {run.pp: 2}]", "grid.product.vocab=[2k]",
                        "grid.product.method=[baseline]", "run.iterations=2")
    assert code == 0, lines
    submitted = [line for line in lines if line.startswith("submitted")]
    assert "run.pp=1" in submitted[0] and "1 node x 1 task, no GPUs/node, 1 CPU/task" in submitted[0], submitted
    assert "run.pp=2" in submitted[1] and "1 node x 2 tasks, no GPUs/node, 1 CPU/task" in submitted[1], submitted
    recs = records(tmp_path)
    assert len(recs) == 2 and all(r["status"] == "ok" for r in recs), [r["error"] for r in recs]
    assert sorted(r["env"]["world_size"] for r in recs) == [1, 2] and all(len(r["env"]["nodes"]) == 1 for r in recs)
    assert recs[0]["metrics"]["loss"] == pytest.approx(recs[1]["metrics"]["loss"], rel=1e-5)


def _jobs_in_slurm() -> set[str]:
    return set(subprocess.run(["squeue", "-h", "-t", "all", "-o", "%i"], capture_output=True, text=True).stdout.split())


@pytest.mark.slurm
def test_a_request_the_partition_cannot_give_is_refused_before_submission(tmp_path, capsys, partition):
    """The issue's case: 8 CPUs per task on nodes of 2. Refused with the field and the fix; nothing submitted."""
    before = _jobs_in_slurm()
    code, _ = sweep(tmp_path, "cluster=slurm", f"cluster.partition={partition}", "cluster.cpus_per_task=8", *TINY,
                    "method=vocab-2", "vocab=2k")
    err = capsys.readouterr().err
    assert code == 2 and "sweep refused, nothing was submitted" in err, err
    assert "cluster.cpus_per_task=8 = 8 CPUs per node are more than its nodes have" in err, err
    assert _jobs_in_slurm() == before and not list(tmp_path.rglob("*.json"))


@pytest.mark.slurm
def test_a_job_slurm_leaves_pending_for_good_is_cancelled_and_recorded(tmp_path, partition):
    """A request past what the nodes have (as a partition whose nodes changed after the check would leave it):
    SLURM keeps it PENDING (PartitionConfig); the sweep shows the reason, cancels it after the grace and records it
    failed with the reason."""
    with initialize_config_dir(CONF, version_base="1.3"):
        cfg, jobs = plan(["cluster=slurm", f"cluster.partition={partition}", "cluster.pending_grace_s=2", *TINY,
                          "method=vocab-2", "vocab=2k", "logger=off", f"results_dir={tmp_path}/results",
                          f"cluster.folder={tmp_path}/submitit"])
    (job,) = jobs
    job.request = replace(job.request, cpus_per_task=8)
    log = []
    counts = dispatch.run_slurm(jobs, cfg, log.append)
    assert counts == {"failed": 1}, log
    rec = json.loads(job.path.read_text())
    assert rec["status"] == "failed" and "never started: it pended with reason PartitionConfig" in rec["error"]
    assert any("pending: PartitionConfig (the partition cannot give what the job asks" in line for line in log), log
    state = subprocess.run(["squeue", "-h", "-t", "all", "-j", log[0].split("SLURM job ")[1].split(":")[0], "-o",
                            "%T"], capture_output=True, text=True).stdout.strip()
    assert state == "CANCELLED"


@pytest.mark.slurm
def test_mesh_job_spans_two_slurm_nodes(tmp_path, partition):
    """A dp 2 x pp 2 run through sbatch: larger than a node of 2 CPUs, so it spans both (2 tasks each, from the
    partition's facts); the ranks meet at the first node's address from SLURM's node record (emulated node names do
    not resolve) and train like one process."""
    nodes = subprocess.run(["sinfo", "-h", "-N", "-o", "%N"], capture_output=True, text=True).stdout.split()
    if len(set(nodes)) < 2:
        if os.environ.get("VP_REQUIRE_SLURM") == "1":
            pytest.fail(f"VP_REQUIRE_SLURM=1 but SLURM has one node ({nodes}); scripts/slurm-up.sh starts two")
        pytest.skip("SLURM has a single node here")
    code, lines = sweep(tmp_path, "cluster=slurm", f"cluster.partition={partition}",
                        "cluster.time_min=10", *TINY, "run.dp=2", "run.microbatches=4", "grid.product.vocab=[2k]",
                        "grid.product.method=[vocab-2]", "run.iterations=2")
    assert code == 0, lines
    assert any("2 nodes x 2 tasks, no GPUs/node, 1 CPU/task, 10 min" in line for line in lines), lines
    (rec,) = records(tmp_path)
    assert rec["status"] == "ok", rec["error"]
    assert rec["env"]["world_size"] == 4 and len(rec["env"]["nodes"]) == 2
    cfg = RunConfig.from_dict(rec["config"])
    ref, _ = train_reference(cfg)
    assert rec["metrics"]["loss"] == pytest.approx(ref, rel=1e-5)
