"""Processor sharing (vp.schedule.sharing): devices of a CPU node that compute at once share its cores, found as a
fixed point of the one simulator; where the devices hold every core, a message waits for one (comm_wake_s); profiles
without `cores` are untouched."""
from dataclasses import replace

import pytest

from vp.config import RunConfig
from vp.cost import PROFILES, Hardware, pass_costs
from vp.schedule import Action, Costs, SimResult, build, simulate, unit_costs
from vp.schedule.methods import METHODS
from vp.schedule.sharing import MAX_ROUNDS, Sharing, processor_sharing

CPU = Hardware("cpu_test", 1e11, sms=0, mem_bandwidth=1e10, gpus_per_node=64, cores=2)


def independent(durations_alone: list[float]):
    """Ranks that each run one F from time 0 and never wait for each other: a stand-in for simulate whose exact
    processor-sharing answer can be worked out by hand."""
    s = build("baseline", len(durations_alone), len(durations_alone))
    costs = Costs({("F", r): d for r, d in enumerate(durations_alone)})

    def simulate_with(durations):
        ends = [durations[r][0] if durations else d for r, d in enumerate(durations_alone)]
        timeline = [[(Action(r, "F", 0, 0), 0.0, e)] for r, e in enumerate(ends)]
        return SimResult(max(ends), list(ends), [0.0] * len(ends), timeline)

    return s, costs, simulate_with


def test_four_ranks_on_two_cores_share_them_as_worked_out_by_hand():
    # alone 1, 2, 3, 4 s from t = 0 on 2 cores: 4 busy at rate 1/2 until rank 0 ends at 2 (1 s of work done by
    # each), 3 busy at 2/3 until rank 1 ends at 3.5, then 2 busy at full speed: rank 2 ends at 4.5, rank 3 alone
    # at 5.5
    s, costs, sim = independent([1.0, 2.0, 3.0, 4.0])
    result, rounds = processor_sharing(s, replace(costs, sharing=Sharing(2.0)), sim, tolerance=1e-12,
                                       max_rounds=500)
    ends = [tl[0][2] for tl in result.timeline]
    assert ends == pytest.approx([2.0, 3.5, 4.5, 5.5], rel=1e-6)
    assert rounds < 500
    # each simulated rank standing for 2 devices: 8 devices on 2 cores, never fewer than 2 per core until rank 2
    # is alone (2 devices, full speed): 4 busy x 2 at 1/4 until 4; 3 x 2 at 1/3 until 7; 2 x 2 at 1/2 until 9;
    # then rank 3's last second alone
    result, _ = processor_sharing(s, replace(costs, sharing=Sharing(2.0, devices=2.0)), sim, tolerance=1e-12,
                                  max_rounds=500)
    assert [tl[0][2] for tl in result.timeline] == pytest.approx([4.0, 7.0, 9.0, 10.0], rel=1e-6)


def test_only_the_cpu_part_of_a_pass_is_shared():
    s, costs, sim = independent([2.0, 2.0, 2.0, 2.0])
    # each pass: 1 s of compute, 1 s of tensor-parallel collectives; 4 compute at half speed
    sharing = Sharing(2.0, cpu={("F", r): 1.0 for r in range(4)})
    result, _ = processor_sharing(s, replace(costs, sharing=sharing), sim, tolerance=1e-12, max_rounds=500)
    assert [tl[0][2] for tl in result.timeline] == pytest.approx([3.0] * 4, rel=1e-6)


def test_a_rank_that_waited_waits_for_a_core_where_the_cores_are_oversubscribed():
    """Hardware.wake_s: a compute action after its rank waited for a peer, starting while more devices compute than
    there are cores, takes wake_s longer; an action right after the rank's own last one does not, nor any where
    the cores suffice."""
    s = build("baseline", 4, 1)  # one microbatch: one rank computes at a time, every other one waits for it
    costs = unit_costs(s, comm={"P2P": 0.1})
    alone = simulate(s, costs).makespan
    assert simulate(s, replace(costs, sharing=Sharing(2.0, wake_s=0.05))).makespan == pytest.approx(alone)
    # each rank standing for 4 devices: 4 on 2 cores, every pass at half speed (2 x (4 F + 4 B of 2) + 6 x 0.1)
    crowded = simulate(s, replace(costs, sharing=Sharing(2.0, devices=4.0))).makespan
    assert crowded == pytest.approx(24.6)
    # woken: F on ranks 1-3 (after their receives) and B on ranks 0-2; the last rank's B follows its own F
    result = simulate(s, replace(costs, sharing=Sharing(2.0, devices=4.0, wake_s=0.05)))
    assert result.makespan == pytest.approx(24.6 + 6 * 0.05)
    last = [(a.kind, t1 - t0) for a, t0, t1 in result.timeline[3] if a.kind in ("F", "B")]
    assert last == [("F", pytest.approx(2.05)), ("B", pytest.approx(4.0))]


def test_passes_that_never_overlap_are_not_slowed():
    s = build("baseline", 4, 1)  # one microbatch: the ranks compute one after another
    costs = unit_costs(s, comm={"P2P": 0.1})
    alone = simulate(s, costs)
    assert simulate(s, replace(costs, sharing=Sharing(2.0))).makespan == pytest.approx(alone.makespan, rel=1e-12)
    # two devices per rank on one core each: every pass alone already waits for a core
    slow = simulate(s, replace(costs, sharing=Sharing(1.0, devices=2.0)))
    assert slow.makespan == pytest.approx(2 * alone.makespan - 6 * 0.1, rel=1e-9)  # 6 transfers unchanged


def test_a_pipeline_slows_between_alone_and_every_pass_shared():
    # baseline at pp 4 with a heavy last stage (the whole output layer): the last rank computes mostly alone
    s = build("baseline", 4, 8)
    costs = unit_costs(s, passes={"F": 1.0, "B": 2.0}, stage_weights=[1.0, 1.0, 1.0, 6.0], comm={"P2P": 0.01})
    alone = simulate(s, costs).makespan
    shared = simulate(s, replace(costs, sharing=Sharing(2.0))).makespan
    world_over_cores = simulate(s, replace(costs, compute={k: 2 * v for k, v in costs.compute.items()})).makespan
    assert alone < shared < 0.8 * world_over_cores


@pytest.mark.parametrize("method", sorted(METHODS))
@pytest.mark.parametrize("wake_s", [0.0, 0.03])
def test_the_fixed_point_converges_for_every_method(method, wake_s):
    s = build(method, 4, 8)
    costs = unit_costs(s, passes={"S": 0.5, "T": 0.5, "IF": 0.1, "IB": 0.1},
                       comm={"P2P": 0.05, "C0": 0.02, "C1": 0.02, "C2": 0.02, "IF": 0.02, "IB": 0.02})
    costs = replace(costs, sharing=Sharing(2.0, wake_s=wake_s))
    alone = replace(costs, sharing=None)
    result, rounds = processor_sharing(s, costs, lambda d: simulate(s, alone, False, d))
    assert rounds < MAX_ROUNDS
    assert simulate(s, alone).makespan <= result.makespan <= 2 * simulate(s, alone).makespan
    assert simulate(s, costs).makespan == result.makespan  # simulate() is that fixed point


def test_sharing_only_where_a_node_has_more_devices_than_cores():
    cfg = RunConfig(method="baseline", pp=4, layers=4, hidden=64, heads=4, seq_len=32, vocab_size=2000,
                    microbatches=4, device="cpu", dtype="fp32")
    s = build("baseline", 4, 4)
    got = pass_costs(cfg, CPU, s).sharing
    assert got == Sharing(2.0, 1.0, got.cpu) and got.cpu[("F", 0)] > 0
    assert pass_costs(replace(cfg, dp=2), CPU, s).sharing.devices == 2.0
    assert pass_costs(cfg, replace(CPU, wake_s=0.002), s).sharing.wake_s == 0.002  # the profile's measured wait
    assert pass_costs(cfg, replace(CPU, cores=4), s).sharing is None  # 4 ranks on 4 cores
    assert pass_costs(cfg, replace(CPU, cores=0), s).sharing is None
    gpu = replace(cfg, device="cuda", dtype="bf16")
    for name in ("a100_80g", "h100", "h200"):
        assert pass_costs(gpu, PROFILES[name], s).sharing is None


def test_passes_at_once_go_slower_by_the_crowding_measured():
    """Hardware.crowding: a pass goes 1 / crowding as fast while every core computes (the slowest of the ranks at
    once, measured), in proportion to the cores at work; and processor sharing on top where devices outnumber
    cores."""
    share = Sharing(4.0, crowding=1.3)
    assert share.rate(1) == 1.0  # alone
    assert share.rate(2) == pytest.approx(1 / 1.1) and share.rate(4) == pytest.approx(1 / 1.3)  # 1 and 3 cores more
    assert share.rate(8) == pytest.approx(0.5 / 1.3)  # 8 devices on 4 cores: half a core each, every core at work
    assert Sharing(2.0).rate(2) == 1.0 and Sharing(2.0, crowding=1.2).rate(3) == pytest.approx(2 / 3 / 1.2)
    with pytest.raises(AssertionError):
        Sharing(2.0, crowding=0.9)
    # two ranks from t = 0 on 2 cores, 1 s and 3 s alone, crowding 1.25: both at 1 / 1.25 until rank 0 ends at
    # 1.25 (1 s of work each); rank 1 alone does its last 2 s at full speed, ending at 3.25
    s, costs, sim = independent([1.0, 3.0])
    result, _ = processor_sharing(s, replace(costs, sharing=Sharing(2.0, crowding=1.25)), sim, tolerance=1e-12,
                                  max_rounds=500)
    assert [tl[0][2] for tl in result.timeline] == pytest.approx([1.25, 3.25], rel=1e-6)


def test_crowding_slows_a_run_whose_devices_have_a_core_each_but_not_a_tensor_parallel_one():
    """Two pipeline ranks on 2 cores share nothing, yet with a measured crowding the simulator slows the passes they
    run at once; a tensor-parallel stage's rows were timed with its group at work (crowding inside them), a single
    device has no one beside it: neither gets it."""
    cfg = RunConfig(method="vocab-1", pp=2, layers=4, hidden=64, heads=4, seq_len=32, vocab_size=2000,
                    microbatches=4, device="cpu", dtype="fp32")
    s = build("vocab-1", 2, 4)
    assert pass_costs(cfg, CPU, s).sharing is None  # crowding 1: as before
    crowded = replace(CPU, crowding=1.2)
    got = pass_costs(cfg, crowded, s).sharing
    assert got == Sharing(2.0, 1.0, got.cpu, 0.0, 1.2)
    assert simulate(s, pass_costs(cfg, crowded, s)).makespan > 1.1 * simulate(s, pass_costs(cfg, CPU, s)).makespan
    tp = replace(cfg, method="baseline", pp=1, tp=2, tp_mode="1d")
    assert pass_costs(tp, crowded, build("baseline", 1, 4)).sharing is None
    one = replace(cfg, method="baseline", pp=1)
    assert pass_costs(one, crowded, build("baseline", 1, 4)).sharing is None
    assert pass_costs(replace(cfg, dp=2), crowded, s).sharing.crowding == 1.2  # 4 devices on 2 cores: shared too


def test_a_message_waits_for_a_core_where_the_devices_hold_every_core():
    """vp.cost.costs.comm_wake_s: each pipeline transfer and each step of a vocabulary collective takes the
    profile's wake_s longer where the run's devices on a node are at least its cores (2 ranks on 2 cores, 4 on 2),
    never with fewer devices than cores, without cores (a GPU) or without a measured wait."""
    from vp.cost import comm_times
    from vp.cost.costs import comm_wake_s
    from vp.cost.traffic import payloads

    cfg = RunConfig(method="vocab-2", pp=2, layers=4, hidden=64, heads=4, seq_len=32, vocab_size=2000,
                    microbatches=4, device="cpu", dtype="fp32")
    s = build("vocab-2", 2, 4)
    waits = replace(CPU, wake_s=0.002)
    plain, woken = comm_times(cfg, CPU, s), comm_times(cfg, waits, s)
    steps = payloads(cfg, s)
    assert comm_wake_s(cfg, waits) == 0.002 and comm_wake_s(replace(cfg, dp=2), waits) == 0.002
    assert woken[("P2P", 0, 1)] == pytest.approx(plain[("P2P", 0, 1)] + 0.002) and woken["P2P"] > plain["P2P"]
    for kind in ("C0", "C1", "C2", "IF", "IB"):  # per step of the kind (an instance may take several)
        assert steps[kind] and woken[kind] == pytest.approx(plain[kind] + 0.002 * len(steps[kind]))
    assert comm_times(cfg, replace(waits, cores=4), s) == plain  # 2 ranks on 4 cores: a core is free
    assert comm_times(cfg, replace(waits, cores=0), s) == plain
    assert comm_wake_s(replace(cfg, device="cuda", dtype="bf16"), PROFILES["h100"]) == 0.0
    assert simulate(s, pass_costs(cfg, waits, s)).makespan > simulate(s, pass_costs(cfg, CPU, s)).makespan


def test_after_the_flush_every_device_shares_the_cores():
    # the data-parallel all-reduce (a gloo all-reduce copies and sums on the CPU) and the optimizer step run on
    # every device at once: dp 2 x pp 2 on 2 cores takes twice their time alone
    from vp.cost import dp_allreduce_s, tail_s

    cfg = RunConfig(method="baseline", pp=2, dp=2, layers=4, hidden=64, heads=4, seq_len=32, vocab_size=2000,
                    microbatches=4, device="cpu", dtype="fp32")
    s = build("baseline", 2, 4)
    alone = replace(CPU, cores=4, optimizer_s_per_param=1e-9)
    shared = replace(alone, cores=2)
    assert dp_allreduce_s(cfg, alone, s) > 0
    assert tail_s(cfg, shared, s) == pytest.approx(2 * tail_s(cfg, alone, s))


def test_a_collective_action_keeps_its_rank_busy_for_what_its_costs_say():
    """A collective action (C0, C1, C2) is done at once unless Costs.compute prices it: then its rank moves on
    that much later. Where ranks share cores it takes no core unless the sharing names its kind (the CPU time of a
    collective run off the compute path): then it competes for cores as a pass does, slowed by the passes beside
    it and slowing them."""
    s = build("vocab-1", 2, 4)
    base = unit_costs(s)
    charged = replace(base, compute={**base.compute, ("C1", None): 0.25})
    spans = [[e - t for a, t, e in tl if a.kind == "C1"] for tl in simulate(s, charged).timeline]
    assert all(spans) and all(d == pytest.approx(0.25) for row in spans for d in row)
    assert all(e == t for tl in simulate(s, base).timeline for a, t, e in tl if a.kind == "C1")
    assert simulate(s, charged).makespan > simulate(s, base).makespan
    aside = replace(charged, sharing=Sharing(1.0, 1.0))  # one core, C1 not named: it takes none
    assert all(e - t == pytest.approx(0.25) for tl in simulate(s, aside).timeline for a, t, e in tl
               if a.kind == "C1")
    competing = replace(charged, sharing=Sharing(1.0, 1.0, {("C1", None): 0.25}))
    spans = [e - t for tl in simulate(s, competing).timeline for a, t, e in tl if a.kind == "C1"]
    assert min(spans) >= 0.25 * (1 - 1e-9) and max(spans) > 0.3  # beside the other rank's passes on one core
    assert simulate(s, competing).makespan > simulate(s, aside).makespan


def test_on_a_cpu_a_collective_off_the_compute_path_costs_its_ranks_the_cpu_time_measured():
    """gloo and a CommStream's thread move and sum a collective's payload on the cores the passes use: a CPU
    profile whose collectives rows carry their CPU time (column 6) charges each instance run off the compute path
    (C0, C1, C2, IF, IB) to the action of its kind on every member; the naive algorithm's S and T communicate
    inside their compute (their wall time is the collective's) and a profile without the column charges nothing."""
    from vp.cost.costs import comm_cpu_times
    from vp.cost.traffic import payloads

    ops = ("all_reduce", "broadcast", "all_gather", "reduce")
    rows = [[op, 2, b, 1e-4, 2, cpu] for i, op in enumerate(ops) for b, cpu in ((256, 1e-3 * (i + 1)),
                                                                               (2**20, 2e-3 * (i + 1)))]
    hw = replace(CPU, measured={"collectives": rows})
    older = replace(CPU, measured={"collectives": [r[:5] for r in rows]})
    cfg = RunConfig(method="vocab-1", pp=2, layers=2, hidden=64, heads=4, seq_len=32, vocab_size=2048,
                    microbatches=4, device="cpu", dtype="fp32")
    s = build("vocab-1", 2, 4)
    assert hw.tables.collective_cpu_s("broadcast", 2, 16) == pytest.approx(2e-3)  # the smallest's below it
    assert hw.tables.collective_cpu_s("broadcast", 2, 2**14) == pytest.approx(2e-3 * 2 ** (6 / 12))  # log-log
    assert older.tables.collective_cpu_s("broadcast", 2, 256) is None
    assert older.tables.collective_s("broadcast", 2, 256) == hw.tables.collective_s("broadcast", 2, 256)
    cpu = comm_cpu_times(cfg, hw, s)
    sizes = payloads(cfg, s)
    assert set(cpu) == {"C0", "C1", "C2", "IF", "IB"}
    for kind, got in cpu.items():
        assert got == pytest.approx(sum(hw.tables.collective_cpu_s(op, 2, nbytes, 2) for op, nbytes in sizes[kind]))
    assert cpu["C1"] != cpu["C2"] and comm_cpu_times(cfg, older, s) == {}
    charged, plain = pass_costs(cfg, hw, s), pass_costs(cfg, older, s)
    assert charged.compute[("C0", None)] == pytest.approx(cpu["C0"]) and ("C0", None) not in plain.compute
    from vp.plan.search import skeleton  # the planner prices a schedule's shape, without its actions
    assert comm_cpu_times(cfg, hw, skeleton(cfg)) == cpu
    assert comm_cpu_times(replace(cfg, method="baseline"), hw, build("baseline", 2, 4)) == {}
    assert charged.compute[("IF", None)] == pytest.approx(plain.compute[("IF", None)] + cpu["IF"])
    assert charged.compute[("F", 0)] == plain.compute[("F", 0)]
    assert simulate(s, charged).makespan > simulate(s, plain).makespan
    crowded = replace(hw, cores=1)  # two devices on one core: the CPU time competes for it as the passes' work
    work = pass_costs(cfg, crowded, s).sharing.cpu
    assert work[("C1", None)] == pytest.approx(cpu["C1"]) and ("C1", None) not in pass_costs(cfg, replace(
        older, cores=1), s).sharing.cpu
    assert work[("IF", None)] == pytest.approx(pass_costs(cfg, replace(older, cores=1), s).sharing.cpu[("IF", None)]
                                               + cpu["IF"])
    naive = replace(cfg, method="interlaced")
    si = build("interlaced", 2, 4)
    assert payloads(naive, si)["S"] and set(comm_cpu_times(naive, hw, si)) == {"C0", "IF", "IB"}
    gpu = replace(cfg, device="cuda", dtype="bf16")
    assert comm_cpu_times(gpu, PROFILES["h100"], s) == {}
