"""SLURM without a cluster: the partition's facts parsed from captured output, a run's request planned and checked
against them, pending reasons that cannot clear, and the follow loop cancelling a stuck job (squeue faked).

The fixtures are real output of SLURM 22.05 (scripts/slurm-up.sh's two emulated nodes of 2 CPUs; the `gpu`
partition captured with `Gres=gpu:h100:4` on the nodes and DefaultTime/MaxTime/MaxNodes set)."""
import json
from pathlib import Path
from types import SimpleNamespace

import pytest
from omegaconf import OmegaConf

from harness import dispatch, slurm
from harness.jobs import Job
from harness.slurm import JobState, Node, Partition, check_request, plan_request
from vp.config import RunConfig

FIX = Path(__file__).parent / "fixtures" / "slurm"


def captured(name: str) -> Partition:
    return slurm.partition_from((FIX / f"scontrol_partition_{name}.txt").read_text(),
                                (FIX / f"sinfo_nodes_{name}.txt").read_text())


def cluster(**given):
    base = dict(partition="p", gpus_per_node=None, tasks_per_node=None, cpus_per_task=None, mem_gb=None,
                time_min=None, pending_grace_s=5)
    return OmegaConf.create({**base, **given})


def gpu_partition(nodes=2, gpus=8, cpus=64, mem_gb=1000, **limits) -> Partition:
    return Partition("gpu", "UP", tuple(Node(f"g{i}", cpus, mem_gb * 1024, gpus, "idle") for i in range(nodes)),
                     **limits)


def test_captured_partitions_parse():
    debug, gpu = captured("debug"), captured("gpu")
    assert debug.state == "UP" and [n.name for n in debug.nodes] == ["n1", "n2"]
    assert {(n.cpus, n.mem_mb, n.gpus) for n in debug.nodes} == {(2, 10847, 0)}
    assert debug.max_time_min is None and debug.default_time_min is None and debug.max_nodes is None
    assert debug.time_limit_min is None and debug.max_cpus_per_node is None and debug.max_mem_per_node_mb is None
    assert [n.gpus for n in gpu.nodes] == [4, 4] and gpu.nodes[0].state == "inval"
    assert gpu.max_time_min == 2 * 24 * 60 and gpu.default_time_min == 4 * 60 and gpu.max_nodes == 2
    assert gpu.time_limit_min == 240


@pytest.mark.parametrize("text,minutes", [("UNLIMITED", None), ("INFINITE", None), ("NONE", None), ("30", 30),
                                          ("10:30", 11), ("04:00:00", 240), ("2-00:00:00", 2880), ("1-12", 2160),
                                          ("1-00:01", 1441)])
def test_slurm_times(text, minutes):
    assert slurm.parse_time(text) == minutes


@pytest.mark.parametrize("gres,gpus", [("(null)", 0), ("gpu:8", 8), ("gpu:h100:4", 4), ("gpu:a100:8(S:0-1)", 8),
                                       ("gpu:a100:4(S:0,1),gpu:v100:2(S:1)", 6), ("gpu", 1), ("nvme:1,gpu:2", 2),
                                       ("shard:8", 0)])
def test_gpus_of_a_gres(gres, gpus):
    assert slurm.parse_gpus(gres) == gpus


def test_a_run_smaller_than_a_node_takes_part_of_one_and_a_larger_one_spans_nodes():
    part = gpu_partition()
    two = plan_request(2, 1, True, cluster(), part)  # the case: 2 ranks on 8-GPU nodes
    assert (two.nodes, two.tasks_per_node, two.gpus_per_node, two.cpus_per_task) == (1, 2, 2, 8)
    assert two.time_min is None and two.mem_gb is None  # the partition's limit and default
    sixteen = plan_request(16, 1, True, cluster(), part)
    assert (sixteen.nodes, sixteen.tasks_per_node, sixteen.gpus_per_node) == (2, 8, 8)
    assert plan_request(12, 1, True, cluster(), part).tasks_per_node == 6     # the fewest nodes that split evenly
    assert plan_request(12, 4, True, cluster(), part).tasks_per_node == 4     # a tp group stays on one node
    for req in (two, sixteen):
        check_request(req, part)
    cpu = plan_request(2, 1, False, cluster(), captured("debug"))  # CPU nodes: one CPU per task
    assert (cpu.nodes, cpu.tasks_per_node, cpu.gpus_per_node, cpu.cpus_per_task) == (1, 2, 0, 1)
    assert plan_request(1, 1, False, cluster(), captured("debug")).tasks_per_node == 1
    given = plan_request(4, 1, True, cluster(tasks_per_node=2, gpus_per_node=2, cpus_per_task=3, time_min=30), None)
    assert (given.nodes, given.tasks_per_node, given.gpus_per_node, given.cpus_per_task, given.time_min) == \
        (2, 2, 2, 3, 30)
    unknown = plan_request(8, 1, True, cluster(), None)  # a dry run without SLURM: 8-GPU nodes assumed
    assert (unknown.nodes, unknown.tasks_per_node, unknown.cpus_per_task) == (1, 8, None)
    assert "CPUs/task from the partition" in unknown.describe()


@pytest.mark.parametrize("world,device,given,limits,message", [
    (2, "cpu", dict(cpus_per_task=8), {}, "1 task x cluster.cpus_per_task=8 = 8 CPUs per node are more than its "
                                          "nodes have (2); set cluster.cpus_per_task to at most 2"),
    (2, "cpu", dict(cpus_per_task=2, tasks_per_node=2), {}, "2 tasks x cluster.cpus_per_task=2 = 4 CPUs per node are "
                                                            "more than its nodes have (2); set cluster.cpus_per_task "
                                                            "to at most 1 (or null) or lower cluster.tasks_per_node"),
    (8, "cpu", {}, {}, "4 nodes are needed and 2 of its 2 nodes fit"),
    (2, "cuda", {}, {}, "run.device=cuda but the nodes of partition p have no GPUs"),
    (2, "cuda", dict(gpus_per_node=0), {}, "run.device=cuda but cluster.gpus_per_node=0"),
    (2, "cpu", dict(mem_gb=64), {}, "cluster.mem_gb=64 is more than its nodes have (10 GB)"),
    (2, "cpu", dict(time_min=3000), dict(max_time_min=2880), "cluster.time_min=3000 but partition debug allows 2880 "
                                                            "min (MaxTime)"),
    (4, "cpu", {}, dict(max_nodes=1), "the job needs 2 nodes but partition debug allows 1 per job (MaxNodes)"),
    (2, "cpu", {}, dict(state="DOWN"), "cluster.partition=debug is DOWN"),
])
def test_requests_the_partition_cannot_give_are_refused_with_the_field_and_fix(world, device, given, limits, message):
    part = captured("debug")
    part = Partition(**{**part.__dict__, **limits})
    with pytest.raises(ValueError) as err:
        check_request(plan_request(world, 1, device == "cuda", cluster(**given), part), part)
    assert message in str(err.value)


def test_gpu_requests_past_the_nodes_are_refused():
    with pytest.raises(ValueError, match="12 GPUs per node are more than its nodes have \\(8\\); set "
                                         "cluster.tasks_per_node to at most 8"):
        part = gpu_partition()
        check_request(plan_request(12, 1, True, cluster(tasks_per_node=12, gpus_per_node=12), part), part)


@pytest.mark.parametrize("reason,running,up,stuck", [
    ("PartitionConfig", 1, 1, True), ("PartitionNodeLimit", 1, 1, True), ("PartitionTimeLimit", 1, 1, True),
    ("QOSMaxGRESPerJob", 1, 1, True), ("AssocMaxWallDurationPerJobLimit", 1, 1, True),
    ("QOSMinCpuNotSatisfied", 1, 1, True), ("InvalidAccount", 1, 1, True),
    ("Resources", 0, 0, False), ("Priority", 0, 0, False), ("None", 0, 0, False), ("Dependency", 0, 0, False),
    ("AssocGrpGRES", 0, 0, False), ("QOSGrpCpuLimit", 0, 0, False), ("BeginTime", 0, 0, False),
    ("AssocMaxJobsLimit", 2, 1, False), ("AssocMaxJobsLimit", 0, 1, True), ("QOSMaxJobsPerUserLimit", 0, 1, True),
    ("Nodes required for job are DOWN, DRAINED or reserved for jobs in higher priority partitions", 0, 1, False),
    ("Nodes required for job are DOWN, DRAINED or reserved for jobs in higher priority partitions", 0, 0, True),
    ("ReqNodeNotAvail, UnavailableNodes:n[1-2]", 1, 0, True), ("ReqNodeNotAvail, UnavailableNodes:n1", 1, 1, False),
])
def test_which_pending_reasons_cannot_clear(reason, running, up, stuck):
    assert (slurm.stuck(reason, running, up) is not None) == stuck


def test_nodes_up_reads_node_states():
    done = lambda text: lambda args: SimpleNamespace(returncode=0, stdout=text, stderr="")  # noqa: E731
    assert slurm.nodes_up("gpu", done((FIX / "sinfo_nodes_gpu.txt").read_text())) == 0  # both inval
    assert slurm.nodes_up("debug", done((FIX / "sinfo_nodes_debug.txt").read_text())) == 2


def test_job_states_from_one_squeue_call():
    calls = []

    def squeue(args):
        calls.append(args)
        return SimpleNamespace(returncode=0, stdout="1|CANCELLED|PartitionConfig\n2|PENDING|Resources\n", stderr="")

    states = slurm.job_states(["1", "2", "9"], squeue)
    assert states == {"1": JobState("CANCELLED", "PartitionConfig"), "2": JobState("PENDING", "Resources"),
                      "9": JobState("GONE", "")}
    assert len(calls) == 1 and "1,2,9" in calls[0]
    gone = SimpleNamespace(returncode=1, stdout="", stderr="slurm_load_jobs error: Invalid job id specified")
    assert slurm.job_states(["7"], lambda a: gone) == {"7": JobState("GONE", "")}
    assert slurm.job_states(["7"], lambda a: SimpleNamespace(returncode=1, stdout="", stderr="timeout")) is None


def test_a_job_stuck_on_a_reason_that_cannot_clear_is_cancelled_after_the_grace_and_recorded(tmp_path):
    """Job 11 pends for PartitionConfig: cancelled once the grace has passed, recorded failed with the reason; job 12
    pends for Resources (shown) and then runs to the end: left alone."""
    run = RunConfig(method="baseline", pp=2, layers=2, hidden=16, heads=2, seq_len=8, vocab_size=101, microbatches=2)
    jobs = [Job(i, [f"method=m{i}"], None, run=run, run_id=f"{i:012x}", path=tmp_path / "results" / f"{i:012x}.json")
            for i in (11, 12)]
    cfg = OmegaConf.create({"experiment": "x", "logger": {"mode": "disabled"},
                            "cluster": {**cluster(partition="debug"), "folder": str(tmp_path / "sub"),
                                        "rendezvous": "tcp"}})
    handles = [(job, SimpleNamespace(job_id=str(job.index), stderr=lambda: ""), None) for job in jobs]
    now, log, cancelled = [0.0], [], []
    script = {11: ["PartitionConfig"] * 9, 12: ["None", "Resources", "Resources", "RUNNING", "RUNNING", "DONE"]}

    def poll(ids):
        t = int(now[0] // 2)
        out = {}
        for i in map(int, ids):
            step = script[i][min(t, len(script[i]) - 1)]
            out[str(i)] = JobState("CANCELLED", step) if str(i) in cancelled else \
                JobState("COMPLETED", "None") if step == "DONE" else \
                JobState("RUNNING", "None") if step == "RUNNING" else JobState("PENDING", step)
        return out

    def completed_with_record(job):  # what rank 0 of job 12 writes before SLURM says COMPLETED
        job.path.parent.mkdir(parents=True, exist_ok=True)
        job.path.write_text(json.dumps({"run_id": job.run_id, "status": "ok", "backend": "real", "config":
                                        run.to_dict(), "metrics": {"iteration_time_s": 1.0}}))

    completed_with_record(jobs[1])
    logged = []
    counts = dispatch._follow(handles, cfg, "start", log.append, poll=poll, cancel=cancelled.append,
                              running=lambda: 0, nodes_up=lambda p: 2, clock=lambda: now[0],
                              sleep=lambda s: now.__setitem__(0, now[0] + s), log_finished=logged.append)
    assert cancelled == ["11"] and counts == {"failed": 1, "ok": 1}
    assert logged == [jobs[1]]  # the driver logs the record rank 0 wrote (the failure record: finish_run, itself)
    rec = json.loads(jobs[0].path.read_text())
    assert rec["status"] == "failed" and "pended with reason PartitionConfig" in rec["error"]
    assert "the partition cannot give what the job asks" in rec["error"]
    assert any("SLURM job 11 (method=m11) pending: PartitionConfig (the partition cannot give" in line and
               "cancelled in 5 s unless it clears" in line for line in log)
    assert any("SLURM job 12 (method=m12) pending: Resources" in line for line in log)
    assert not any("pending: None" in line for line in log)
    assert now[0] >= 5  # not before the grace


def test_runs_the_driver_follows_leave_w_and_b_to_it_and_the_others_log_from_rank_0(tmp_path):
    """The task's spec carries the logger only when no driver follows the run (SLURM with cluster.wait=false)."""
    run = RunConfig(method="baseline", pp=2, layers=2, hidden=16, heads=2, seq_len=8, vocab_size=101, microbatches=2)
    job = Job(1, ["method=baseline"], None, run=run, run_id="0" * 12, path=tmp_path / "r" / ("0" * 12 + ".json"))
    logger = {"mode": "offline", "project": "p"}

    def spec(name, **extra):
        cfg = OmegaConf.create({"experiment": "x", "backend": "real", "logger": logger, "cluster": {
            "name": name, "folder": str(tmp_path), "rendezvous": "file", **extra}})
        return dispatch._spec(job, cfg)["logger"]

    assert spec("local") is None and spec("slurm", wait=True) is None
    assert spec("slurm", wait=False) == logger


def test_a_slurm_command_that_does_not_answer_is_a_failed_call_not_a_traceback(tmp_path):
    """A controller too busy to answer within the limit: the call fails (124) and its callers carry on as when
    SLURM does not answer (squeue: states unknown this poll; scontrol: the partition refused with the fix)."""
    hang = tmp_path / "hang"
    hang.write_text("#!/bin/sh\nsleep 5\n")
    hang.chmod(0o755)
    out = slurm._call([str(hang)], timeout_s=0.2)
    assert out.returncode == 124 and "did not answer within 0.2 s" in out.stderr
    late = lambda args: slurm._call([str(hang)], timeout_s=0.2)  # noqa: E731
    assert slurm.job_states(["1"], late) is None
    with pytest.raises(slurm.NoAnswer, match="cluster.partition=gpu: SLURM did not answer"):
        slurm.query_partition("gpu", late)
