"""Schedules against the official generators (V-Half, vocabulary-pass placement, interlaced, redis) and the one
collective order across groups that NCCL needs."""
from dataclasses import replace

import pytest

from vp.config import RunConfig, redis_layers
from vp.schedule import Schedule, ScheduleError, build, simulate, unit_costs, validate
from vp.schedule.__main__ import parse_costs
from vp.schedule.validate import check_collective_order, collective_entries, crossed

# zero-bubble-pipeline-parallelism, branch v-half-vocab (the code of the paper's V-Half runs), zbv_greedy.py:
# PipelineGraph(p, m, "half", 1, 1, 1, 0).create_schedule(...) (do_reorder=False), with --enable-vocab-parallel for
# Algorithm 2 and also --disable-backward-fusion for Algorithm 1, at F = B = W = 1 (a rank's share; one chunk's pass
# costs 1/2): makespan and peak activations (in a rank's share). Each rank's order was also compared pass by pass
# with the official one (pp 2-16): identical.
OFFICIAL_VHALF_BRANCH = {
    "vhalf": {(4, 8): (30.0, 3), (4, 16): (54.0, 3), (8, 8): (37.0, 5), (8, 16): (61.0, 5), (5, 10): (37.0, 3)},
    "vhalf-vocab-2": {(4, 8): (31.5, 4), (4, 16): (55.5, 4), (8, 8): (38.5, 6), (8, 16): (62.5, 6), (5, 10): (38.5, 4)},
    "vhalf-vocab-1": {(4, 8): (33.0, 5), (4, 16): (57.0, 5), (8, 8): (40.0, 7), (8, 16): (64.0, 7), (5, 10): (40.0, 5)},
}
# The same on the main branch (do_reorder=True: both ends squeezed), vhalf only.
OFFICIAL_VHALF_MAIN = {(4, 8): (26.5, 3), (4, 16): (50.5, 3), (8, 8): (32.5, 5), (8, 16): (56.5, 5)}


@pytest.mark.parametrize("method,pp,m", [(meth, pp, m) for meth, runs in OFFICIAL_VHALF_BRANCH.items() for pp, m in runs])
def test_vhalf_is_the_official_generator_of_the_paper_runs(method, pp, m):
    """The vocabulary passes (free here) sit in the 6 (Algorithm 2) or 12 (Algorithm 1) slots by which the official
    pattern delays the backward slots: its makespan and peak exactly."""
    makespan, peak = OFFICIAL_VHALF_BRANCH[method][(pp, m)]
    r = simulate(build(method, pp, m))
    assert r.makespan == makespan
    assert max(r.peak_activations) == peak


def _squeezed(pp, m):
    from vp.schedule.actions import Action
    from vp.schedule.build import lower
    from vp.schedule.vhalf import vhalf
    s = build("vhalf", pp, m)
    order = vhalf(pp, m, squeeze=True)
    return simulate(validate(lower(replace(s, ranks=[[Action(r, *a) for a in acts] for r, acts in enumerate(order)]))))


@pytest.mark.parametrize("pp,m", list(OFFICIAL_VHALF_MAIN))
def test_vhalf_squeezed_at_most_the_main_branch_bubble_at_the_same_memory(pp, m):
    """Bubble 0.0943, 0.0495, 0.2615, 0.1504 at the main branch's makespans; the same peak as the plain block."""
    makespan, peak = OFFICIAL_VHALF_MAIN[(pp, m)]
    r = _squeezed(pp, m)
    assert r.makespan <= makespan
    assert r.bubble_rate <= 1 - 3 * m / makespan + 1e-12
    assert max(r.peak_activations) == peak == max(simulate(build("vhalf", pp, m)).peak_activations)


def test_the_plain_block_holds_fewer_last_stage_forwards_on_rank_0():
    """What the squeeze costs in memory: rank 0 holds up to p/4 + 1 forwards of the last stage (its output layer)
    at once where the plain block holds 1, so a weighted peak with a heavy last stage is higher."""
    from vp.schedule.vhalf import vhalf

    def most_last_stage(order):
        held = most = 0
        for kind, _, chunk in order[0]:
            if chunk == 1 and kind in ("F", "W"):
                held += 1 if kind == "F" else -1
                most = max(most, held)
        return most
    for pp in (8, 16):
        assert most_last_stage(vhalf(pp, 4 * pp)) == 1
        assert most_last_stage(vhalf(pp, 4 * pp, squeeze=True)) == pp // 4 + 1


def _vocab_makespan(method, extra, **kw):
    s = build(method, 4, 16)
    passes, comm = parse_costs("F=1,B=2,S=0.4,T=0.4,IF=0.1,IB=0.1" + (f",{extra}" if extra else ""))
    return simulate(s, unit_costs(s, passes, None, comm), **kw)


@pytest.mark.parametrize("extra,official", [("", 72.5), ("C0=0.5", 73.6), ("IB=0.5", 78.9),
                                            ("C0=0.3,C1=0.3,C2=0.3", 76.8)])
def test_vocab_placement_has_slack_for_the_broadcast(extra, official):
    """vocab-2, pp 4, 16 microbatches: at most the official 1F1B order's makespan (receivers run S one pass after
    the last stage broadcasts X); with free communication no worse than before (72.5); p+1 activations."""
    r = _vocab_makespan("vocab-2", extra)
    assert r.makespan <= official + 1e-9
    assert max(r.peak_activations) == 5
    assert max(_vocab_makespan("vocab-1", extra).peak_activations) == 6


def test_the_broadcast_hides_under_a_pass():
    """A C0 of half a forward adds less than a tenth of what it would if every rank waited for each broadcast."""
    free, slow = _vocab_makespan("vocab-2", "").makespan, _vocab_makespan("vocab-2", "C0=0.5").makespan
    assert slow - free < 0.1 * 16 * 0.5  # V-Half enters C0 where the official code does: test_schedule_vhalf_vocab


@pytest.mark.parametrize("pp,m", [(2, 8), (3, 9), (4, 8), (4, 16), (5, 20), (8, 32), (4, 5)])
def test_interlaced_warms_up_like_the_official_code(pp, m):
    """Rank r runs min(1.5p - r, m) forwards before its first backward, and holds that many microbatches."""
    s = build("interlaced", pp, m)
    warm = [min(3 * pp // 2 - r, m) for r in range(pp)]
    for r, acts in enumerate(s.ranks):
        stage = [a.kind for a in acts if a.kind in ("F", "B")]
        assert stage.index("B") == warm[r]
    assert simulate(s).peak_activations == [float(w) for w in warm]


def test_redis_places_layers_as_the_official_code():
    """Official artifact (8 GPUs, 32 layers): N = 4, 3, 2, 0 for 32k..256k; remainders go to the later stages."""
    assert redis_layers(32, 8, 4) == [4] * 8
    assert redis_layers(32, 8, 3) == [4] * 6 + [5, 3]
    assert redis_layers(32, 8, 2) == [4] * 5 + [5, 5, 2]
    assert redis_layers(32, 8, 0) == [4] * 3 + [5] * 4 + [0]
    for layers in range(4, 40):
        for pp in range(2, 9):
            for last in range(0, layers - pp + 2):
                split = redis_layers(layers, pp, last)
                assert sum(split) == layers and split[-1] == last
                assert split[0] == min(split[:-1]), "rank 0 holds the input layer: it never gains a layer"
                assert split[:-1] == sorted(split[:-1])
    cfg = RunConfig(method="redis", pp=4, layers=8)
    assert cfg.stage_layers == [2, 3, 3, 0]  # no N: the official default --final-stage-num-layers 0
    with pytest.raises(ValueError, match="redis_last_layers=7 leaves fewer than one layer"):
        RunConfig(method="redis", pp=4, layers=8, redis_last_layers=7).stage_layers
    with pytest.raises(ValueError, match=r"other 127 stages of layers=64; use pp <= 65, or a model with at least 127"):
        redis_layers(64, 128, 0)  # more stages than layers: no value of N helps


def _swap(s: Schedule, rank: int, a: str, b: str) -> Schedule:
    acts = list(s.ranks[rank])
    i, j = (next(n for n, x in enumerate(acts) if x.text() == t) for t in (a, b))
    acts[i], acts[j] = acts[j], acts[i]
    return replace(s, ranks=[acts if r == rank else s.ranks[r] for r in range(s.pp)])


def test_cross_group_check_rejects_crossed_collectives():
    """Rank 0 enters the broadcast C0:0 before the reduce IF:4; every other rank the other way round. Each group
    alone is in order, and the default simulator runs it (groups progress independently), but under one ordered
    queue per rank it deadlocks: the check names both ranks, the instances and their steps."""
    s = build("vocab-2", 4, 8)
    crossed_s = _swap(s, 0, "IF4", "C0:0")
    i, j = (next(n for n, a in enumerate(crossed_s.ranks[0]) if a.text() == t) for t in ("C0:0", "IF4"))
    k, l = (next(n for n, a in enumerate(crossed_s.ranks[1]) if a.text() == t) for t in ("IF4", "C0:0"))
    with pytest.raises(ScheduleError) as err:
        check_collective_order(crossed_s)
    assert (f"rank 0 enters C0:0 (step {i}) before IF:4 (step {j}); but rank 1 enters IF:4 (step {k}) before "
            f"C0:0 (step {l})") in str(err.value)
    assert "rank 0" in str(err.value).splitlines()[2]  # the grid follows
    simulate(crossed_s)
    with pytest.raises(ScheduleError, match=r"deadlock \(one ordered queue of collectives per rank\)"):
        simulate(crossed_s, strict=True)
    with pytest.raises(ScheduleError, match="crossed orders across groups"):
        validate(crossed_s)


def test_cross_group_cycle_through_three_ranks():
    """Groups over subsets of ranks (as tensor-parallel vocabulary groups will be): no two ranks disagree, yet
    X (ranks 0, 2) -> Y (0, 1) -> Z (1, 2) -> X is a cycle of waits."""
    x, y, z = "X", "Y", "Z"
    entries = [[(3, x), (7, y)], [(1, y), (4, z)], [(2, z), (9, x)]]
    cycle = crossed(entries)
    assert cycle is not None and len(cycle) == 3
    assert {(r, a[1], b[1]) for r, a, b in cycle} == {(0, x, y), (1, y, z), (2, z, x)}
    assert crossed([[(0, x), (1, y)], [(0, y), (1, z)], [(0, x), (1, z)]]) is None


def test_every_method_enters_collectives_in_one_order():
    """Every rank of every method enters the same collective instances in the same order (all groups span all
    ranks today), and none deadlocks with one ordered queue of collectives per rank."""
    from vp.schedule.methods import METHODS
    for method, spec in METHODS.items():
        for pp, m in [(2, 4), (3, 6), (4, 8), (4, 12), (8, 16)]:
            if spec.family.microbatches_multiple_of_pp and m % pp:
                continue
            s = build(method, pp, m, 3 if spec.family.chunks == 0 and pp % 2 else None)
            seqs = [[inst for _, inst in seq] for seq in collective_entries(s)]
            assert all(seq == seqs[0] for seq in seqs), (method, pp, m)
            simulate(s, strict=True)


def test_strict_mode_blocks_at_a_lazily_created_communicator():
    """Rank 0 opens the C0 group before its F0, which the last rank needs before it can get there. The order is
    the same on both ranks and one queue per rank would do, but creating the communicator on its first
    collective blocks rank 0 until the last rank arrives: a deadlock only the strict mode sees."""
    s = build("vocab-2", 2, 4)

    def move(acts, token, after):
        acts = [a for a in acts if a.text() != token]
        i = next(n for n, a in enumerate(acts) if a.text() == after)
        moved = next(a for a in s.ranks[0] + s.ranks[1] if a.text() == token and a.rank == acts[0].rank)
        return acts[:i + 1] + [moved] + acts[i + 1:]
    lazy = replace(s, ranks=[move(s.ranks[0], "C0:0", "IF1"), move(s.ranks[1], "IF2", "C0:0")])
    check_collective_order(lazy)
    simulate(lazy)
    with pytest.raises(ScheduleError, match=r"rank 0 blocked at step 2 \(C0:0\)"):
        simulate(lazy, strict=True)


def test_the_former_vocab_1_order_is_rejected():
    """The order vocab-1 had before this check (pp 4, tests/fixtures/vocab-1-crossed-order.txt): rank 0 enters
    C0:0 first, the last rank the lookups IF0..IF4 first; each group alone was in order. Rejected statically, and
    deadlocked with one ordered queue per rank, as NCCL-semantics runs found."""
    from pathlib import Path
    s = Schedule.from_text((Path(__file__).parent / "fixtures" / "vocab-1-crossed-order.txt").read_text())
    simulate(s)
    with pytest.raises(ScheduleError, match=r"rank 0 enters C0:0 \(step 0\) before IF:4 \(step 11\); but rank 3 "
                                            r"enters IF:4 \(step 4\) before C0:0 \(step 7\)"):
        check_collective_order(s)
    with pytest.raises(ScheduleError, match="deadlock"):
        simulate(s, strict=True)
