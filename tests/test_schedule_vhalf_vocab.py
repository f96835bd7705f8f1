"""V-Half's vocabulary passes where the official implementation of the paper's V-Half runs puts them
(zero-bubble-pipeline-parallelism, branch v-half-vocab, scheduler/passes.py add_embedding_passes and
scheduler/communication.py; vp/schedule/vhalf_vocab.py)."""
import pytest

from vp.schedule import Action, Schedule, build, simulate, unit_costs, validate
from vp.schedule.__main__ import parse_costs
from vp.schedule.build import stage_timeline
from vp.schedule.methods import get_method
from vp.schedule.vhalf_vocab import UNIT, official_costs, vocab_times


def unit_times(s: Schedule, costs) -> dict:
    """(rank, kind, mb, chunk) -> (start, end) of each of s's stage passes on the timeline the placer reads."""
    return {a: (t0, t1) for acts, starts, ends in stage_timeline(s, costs)
            for a, t0, t1 in zip(acts, starts.tolist(), ends.tolist())}  # an Action is its tuple


def _stage_passes(method: str, pp: int, m: int) -> Schedule:
    """The method's V-Half order of F, B and W alone, before the vocabulary passes are placed."""
    spec = get_method(method)
    order = spec.family.generate(pp, m, 2, spec.vocab)
    return Schedule(method, pp, m, 2, spec.placement, spec.vocab, spec.split_w,
                    [[Action(r, *a) for a in acts] for r, acts in enumerate(order)])


def _texts(acts, n):
    return " ".join(a.text() for a in acts[:n])


def test_official_times_pp4_by_hand():
    """pp 4, 8 microbatches, Algorithm 1, on the official unit timeline (F = B = W = 1000, a transfer 1).

    F(0) runs down the V: stages 0-7 on ranks 0 1 2 3 3 2 1 0, six transfers between ranks, so the last stage's F(0)
    ends at 8 * 1000 + 6 = 8006 and S(0) sits one backward later, at 9006. T(k) goes with S(k+1), the last T two
    backwards and two forwards after S(7). w = p/2 + 1 = 3: IF 0-2 before everything, IF(k) at S(k - 3); IB(k) at
    S(k + 5) for k < 3, the rest after every stage pass. C1 and C2 one time unit after S and T."""
    s = _stage_passes("vhalf-vocab-1", 4, 8)
    times = unit_times(s, official_costs(s))
    assert times[(0, "F", 0, 1)] == (7006.0, 8006.0)
    at = vocab_times(s, times)
    st = [at[("S", k)] for k in range(8)]
    assert st[0] == 9006.0
    assert st == [times[(0, "F", k, 1)][1] + UNIT for k in range(8)]
    assert [at[("T", k)] for k in range(8)] == st[1:] + [st[7] + 4 * UNIT]
    assert [at[("C1", k)] for k in range(8)] == [t + 1 for t in st]
    assert [at[("C2", k)] for k in range(8)] == [at[("T", k)] + 1 for k in range(8)]
    assert [at[("IF", k)] for k in range(3)] == [-8, -7, -6] and [at[("IF", k)] for k in range(3, 8)] == st[:5]
    assert [at[("IB", k)] for k in range(3)] == st[5:]
    last = max(t1 for _, t1 in times.values())
    assert all(at[("IB", k)] > last for k in range(3, 8))


def test_rank_0_order_pp4_by_hand():
    """Rank 0 (first and last stage) of pp 4, 8 microbatches, Algorithm 1. At 9006 its F2.0 (8006-9006) is done
    and its next stage pass, F1.1, starts at 11009: C0(0) then IF3 and S0 (collectives before computation at one
    time; IF, T, S, IB in that order), C1(0) at 9007. At 13009, between F3.0 and F2.1: C0(1), IF4, T0 before S1,
    then C1(1) and C2(0) at 13010 (every C2 after the other collectives)."""
    acts = build("vhalf-vocab-1", 4, 8).ranks[0]
    assert _texts(acts, 30) == (
        "IF0 IF1 IF2 F0 SF0 F1 SF1 RF0.1 F0.1 F2 SF2 C0:0 IF3 S0 C1:0 RF1.1 F1.1 F3 SF3 C0:1 IF4 T0 S1 C1:1 C2:0 "
        "RF2.1 F2.1 F4 SF4 C0:2")
    assert _texts([a for a in acts if a.kind == "IB"], 8) == "IB0 IB1 IB2 IB3 IB4 IB5 IB6 IB7"
    assert acts[-5:] == [Action(0, "IB", k) for k in range(3, 8)]


@pytest.mark.parametrize("method", ["vhalf-vocab-1", "vhalf-vocab-2"])
@pytest.mark.parametrize("pp,m", [(4, 8), (8, 16), (8, 64), (16, 32)])
def test_even_pipelines_keep_the_official_times(method, pp, m):
    """Where the official order runs (even pp, at least pp microbatches: the paper's setups), no pass is moved:
    every vocabulary pass at its official time, every rank in one order of them."""
    s = _stage_passes(method, pp, m)
    times = unit_times(s, official_costs(s))
    at = vocab_times(s, times)
    w = pp // 2 + 1
    st = [times[(0, "F", k, 1)][1] + UNIT for k in range(m)]
    last = max(t1 for _, t1 in times.values())
    for k in range(m):
        assert at[("S", k)] == at[("C0", k)] == st[k]
        assert at[("T", k)] == (st[k + 1] if k + 1 < m else st[k] + 4 * UNIT)
        assert at[("IF", k)] == (st[k - w] if k >= w else k - m)
        assert at[("IB", k)] == (st[k + w + 2] if k + w + 2 < m else last + k)
    vocab = [[a for a in acts if a.kind not in ("F", "B", "W", "SF", "RF", "SB", "RB")]
             for acts in build(method, pp, m).ranks]
    assert all(v == [Action(0, *a[1:]) for a in vocab[0]] for v in ([Action(0, *a[1:]) for a in r] for r in vocab))


@pytest.mark.parametrize("method", ["vhalf-vocab-1", "vhalf-vocab-2"])
def test_where_the_official_order_would_deadlock_passes_move(method):
    """Odd pipelines and few microbatches (the official runs had neither): the first stage's F(k) would come before
    the reduction of IF(k) it waits for, or the last stage's B(k) before its grad X; those passes move, and every
    schedule validates (both simulation modes)."""
    s = _stage_passes(method, 5, 10)
    times = unit_times(s, official_costs(s))
    at = vocab_times(s, times)
    assert at[("IF", 3)] < times[(0, "F", 3, 0)][0] < times[(0, "F", 0, 1)][1] + UNIT
    for pp in range(2, 10):
        for m in sorted({1, 2, 3, pp - 1, pp, pp + 1, 2 * pp + 1} - {0}):
            validate(build(method, pp, m))


def test_the_broadcast_waits_where_the_official_s_does():
    """The official runtime enters C0(k) and runs S(k) at one time on every rank (S waits for the broadcast), so a
    C0 of half a stage pass shows: less than a fifth of what it would if nothing overlapped, but some."""
    s = build("vhalf-vocab-2", 4, 16)
    passes, _ = parse_costs("F=1,B=1,W=1,S=0.2,T=0.2,IF=0.05,IB=0.05")
    free, slow = (simulate(s, unit_costs(s, passes, None, c)).makespan for c in ({}, {"C0": 0.25}))
    assert 0 < slow - free < 0.2 * 16 * 0.25
