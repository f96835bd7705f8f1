"""A measured profile's communication: the collectives and point-to-point rows as the cost model reads them (per
operation, group size, payload and world at work), the benchmarks that measure them and the wake-up wait
(vp.cost.measure_comm), and what a measured CPU profile leaves out (NCCL's buffers)."""
from dataclasses import replace

import pytest
import torch

from harness import measure as HM
from vp.config import RunConfig
from vp.cost import Hardware, pass_times
from vp.cost import measure_comm as C
from vp.cost.network import ALL_REDUCE, BROADCAST, Network
from vp.cost.tables import Tables
from vp.schedule import build

CPU = Hardware("cpu", 1e11, sms=0, tile_k_overhead=0, align_penalty=0.0, gemm_efficiency=0.5, act_bytes=4,
               gpus_per_node=64, link_latency=1e-4, link_bandwidth=1e9, collective_latency=0.0)


def with_tables(hw: Hardware, **measured) -> Hardware:
    return replace(hw, measured=measured)


def test_collectives_are_read_per_operation_and_group_size_within_the_measured_payloads():
    rows = [["all_reduce", 2, 1024, 1e-4], ["all_reduce", 2, 4096, 4e-4], ["p2p", 2, 1024, 5e-5]]
    net = Network.of(with_tables(CPU, collectives=rows))
    assert net.collective(ALL_REDUCE, (0, 1), 1024) == pytest.approx(1e-4)
    assert net.collective(ALL_REDUCE, (0, 1), 2048) == pytest.approx(2e-4)  # log-log between the two
    assert net.collective(ALL_REDUCE, (0, 1), 10) == pytest.approx(1e-4)  # the latency floor below
    analytic = Network.of(CPU)
    # beyond the largest payload: latency + bytes / bandwidth through the two largest (1e-4 s per 3072 bytes)
    assert net.collective(ALL_REDUCE, (0, 1), 10240) == pytest.approx(4e-4 + 6144 * 3e-4 / 3072)
    assert net.collective(ALL_REDUCE, (0, 1), 10240) != analytic.collective(ALL_REDUCE, (0, 1), 10240)
    assert net.collective(ALL_REDUCE, (0, 1, 2), 1024) == analytic.collective(ALL_REDUCE, (0, 1, 2), 1024)
    assert net.collective(BROADCAST, (0, 1), 1024) == analytic.collective(BROADCAST, (0, 1), 1024)
    assert net.p2p(0, 1, 1024) == pytest.approx(5e-5)


def test_a_collective_is_read_from_the_world_at_work_as_the_run_has_it():
    """Rows carry the world they were measured in (groups side by side); a run with `busy` ranks on the node reads
    the smallest world at or above max(busy, n), else the largest; a row without a world counts as its group alone."""
    rows = [["all_reduce", 2, 1024, 1e-4, 2], ["all_reduce", 2, 1024, 3e-4, 4], ["all_reduce", 2, 1024, 9e-4, 8],
            ["p2p", 2, 1024, 5e-5, 2], ["p2p", 2, 1024, 2e-4, 8], ["broadcast", 4, 1024, 7e-4]]
    hw = with_tables(CPU, collectives=rows)
    t = Tables.of(hw.measured)
    assert t.collective_s("all_reduce", 2, 1024) == pytest.approx(1e-4)  # alone
    assert t.collective_s("all_reduce", 2, 1024, busy=3) == pytest.approx(3e-4)  # next world up
    assert t.collective_s("all_reduce", 2, 1024, busy=8) == pytest.approx(9e-4)
    assert t.collective_s("all_reduce", 2, 1024, busy=16) == pytest.approx(9e-4)  # the largest measured
    assert t.collective_s("broadcast", 4, 1024, busy=2) == pytest.approx(7e-4)  # an old row: world = n
    assert Network.of(hw, world=4).collective(ALL_REDUCE, (0, 1), 1024) == pytest.approx(3e-4)
    assert Network.of(hw, world=8).p2p(0, 1, 1024) == pytest.approx(2e-4)
    assert Network.of(hw).p2p(0, 1, 1024) == pytest.approx(5e-5)
    # a 2-D grid's runs pay the world they have: the row groups of tp 4 [2,2,1] read the 4-process rows
    cfg2d = RunConfig(method="baseline", pp=1, tp=4, tp_mode="2d", layers=2, hidden=64, heads=4, seq_len=32,
                      micro_batch_size=4, microbatches=2, vocab_size=2048)
    sched = build("baseline", 1, 2, 1)
    alone = replace(hw, measured={"collectives": [r[:4] for r in rows if (r[4:] or [0])[0] <= 2] + [rows[-1]]})
    assert pass_times(cfg2d, hw, sched)[("F", 0)] > pass_times(cfg2d, alone, sched)[("F", 0)]


def test_a_woken_ranks_wait_for_a_core_is_half_the_round_trip_it_adds(monkeypatch):
    """vp.cost.measure_comm.wake: (round trip with 4 processes on 2 cores - with 2) / 2, from one world of each; 0 on
    one core, where no pair has a core each."""
    worlds = []

    def in_world(world, target, args, timeout_s, what):
        worlds.append((world, target, args[0]))
        return {2: 0.0004, 4: 0.0084}[world]

    monkeypatch.setattr(C, "in_world", in_world)
    assert C.wake(8) == pytest.approx(0.004)
    assert worlds == [(2, C._wake_rank, 2), (4, C._wake_rank, 2)]  # held to 2 cores whatever the machine has
    assert C.wake(1) == 0.0 and len(worlds) == 2


def test_a_measured_cpu_profile_counts_no_nccl_buffers(monkeypatch):
    here = {"cores": 2, "device_name": "cpu"}
    measured = {"gemm": [[64, 64, 64, 1e-4]], "attention": [], "elementwise": [[3e6, 1e-3, 1e-3], [3e8, 0.1, 0.3]],
                "optimizer": [[1000, 16, 1.6e-4]], "collectives": [["p2p", 2, 256, 1e-4], ["p2p", 2, 2**20, 1e-3]]}
    hw = HM.fitted("box", torch.device("cpu"), "fp32", 1e10, measured, here)
    assert hw.comm_bytes == 0 and hw.link_comm_bytes == 0  # gloo: the measured peak holds its buffers
    from vp.cost.memory import Communicators, comm_buffer_bytes
    assert comm_buffer_bytes(Communicators(3, 2), hw) == 0


def test_a_collective_benchmark_without_a_result_in_time_is_stopped_not_waited_for():
    """Ranks that are alive but never answer (a hung collective) end the benchmark at its deadline, killed."""
    with pytest.raises(RuntimeError, match="gave no result within 0.3 s"):
        C.collectives("cpu", [2], [2], [1 << 20], reps=1000, timeout_s=0.3)


def test_collectives_are_measured_with_the_worlds_groups_side_by_side():
    """World 4 in groups of 2: both pairs at once (the second pair's ranks 2 and 3 address each other by group
    rank), every op and the point-to-point message, each row tagged with its world."""
    got = C.collectives("cpu", [4], [2, 4], [256], reps=2)
    assert {(r[0], r[1], r[4]) for r in got} == {(op, n, 4) for op in C.OPS for n in (2, 4)} | {("p2p", 2, 4)}
    assert all(r[2] == 256 and r[3] > 0 for r in got)
