"""The planner's bounds (vp.plan.bounds, docs/planner.md) hold against the one simulator for random costs and sizes:
the makespan's lower bound and the tail's with overlap_grad_reduce (what no iteration can hide of the reduction);
where a bound is exact by its proof, it is equal."""
import random
from dataclasses import replace

import pytest

from vp.config import RunConfig
from vp.cost import PROFILES, tail_s
from vp.cost.data_parallel import exposed_reduce_per_rank
from vp.plan.bounds import TailBound, activation_bounds, makespan_lower_bound
from vp.schedule import Costs, build, simulate
from vp.schedule.methods import METHODS

SMALL = RunConfig(layers=72, hidden=256, heads=8, seq_len=128, vocab_size=8000, device="cuda", dtype="bf16")


def _costs(s, rng: random.Random, scale: float = 1.0) -> Costs:
    """Random pass, collective and transfer times (some zero, stages unequal), `scale` seconds at most per stage pass;
    the output layer's passes, the collectives and the transfers each at a random scale of their own (from nothing to
    ten stage passes), so that each part of a bound is sometimes the one that decides it."""
    def t(hi, group):
        return 0.0 if rng.random() < 0.1 else scale * group * rng.uniform(0.01, hi)
    vocab, coll, hop = (rng.choice((0.0, 0.01, 1.0, 10.0)) for _ in range(3))
    comp = {(k, st): t(2, 1.0) for k in "FBW" for st in range(s.n_stages)}
    if not s.split_w:
        comp.update({("W", st): 0.0 for st in range(s.n_stages)})
    comp.update({(k, None): t(1, vocab) for k in ("S", "T", "IF", "IB")})
    comp.update({(k, None): t(0.1, coll) for k in ("C0", "C1", "C2")})
    comm = {k: t(0.5, coll) for k in ("C0", "C1", "C2", "IF", "IB", "S", "T")}
    comm.update({("P2P", a, b): t(0.3, hop) for a in range(s.pp) for b in range(s.pp) if a != b})
    return Costs(comp, comm, {("F", st): 1.0 for st in range(s.n_stages)})


def _shapes(method: str, rng: random.Random, n: int):
    """n random (pp, microbatches, chunks) the method accepts, small enough to simulate at once."""
    spec = METHODS[method]
    for _ in range(n):
        pp = rng.choice((2, 3, 4, 6))
        chunks = rng.choice((2, 3)) if spec.family.chunks == 0 else spec.family.chunks
        if spec.family.placement == "v" and pp % 2:
            pp += 1
        m = pp * rng.randint(1, 4) if spec.family.microbatches_multiple_of_pp else rng.randint(pp, 4 * pp)
        yield pp, m, chunks


@pytest.mark.parametrize("method", list(METHODS))
def test_planner_bound_tail_never_above_the_simulated_tail(method):
    """overlap_grad_reduce: the tail's lower bound (TailBound with the simulation's costs, and without any) is at
    most tail_s of the simulated iteration, for random pass times at the scale of one bucket's reduction (so
    that both ends of unhidden_reduce's maximum are met) and random bucket sizes."""
    rng, hw = random.Random(f"tail {method}"), PROFILES["h100"]
    chunks_of = {}
    for pp, m, chunks in _shapes(method, rng, 6):
        sched = chunks_of.setdefault((pp, m, chunks), build(method, pp, m, chunks))
        sk = replace(sched, ranks=[])
        run = SMALL.with_(method=method, pp=pp, dp=rng.choice((2, 4)), microbatches=m,
                          chunks=chunks if METHODS[method].family.chunks == 0 else None,
                          overlap_grad_reduce=True, bucket_mb=rng.choice((0.05, 0.2, 1.0, 25.0)))
        bound = TailBound(run, hw, sk)
        for scale in (1e-6, 1e-5, 1e-4):
            costs = _costs(sched, rng, scale)
            result = simulate(sched, costs)
            exact = tail_s(run, hw, sched, result)
            assert bound.at_least(sk) <= bound.at_least(sk, costs) <= exact * (1 + 1e-12), (pp, m, scale)
            assert bound.at_least(sk) >= tail_s(run, hw, sched, hidden=True)


@pytest.mark.parametrize("method", ["baseline", "redis"])
def test_planner_bound_tail_is_exact_for_one_chunk_without_vocabulary_passes(method):
    """1F1B's ranks end with their only chunk's last B, which makes every bucket final: the bound is the exposed
    reduction itself, whatever the pass times (the stream waits for nothing before that pass)."""
    rng, hw = random.Random(method), PROFILES["h100"]
    sched = build(method, 4, 8)
    run = SMALL.with_(method=method, pp=4, dp=2, microbatches=8, overlap_grad_reduce=True, bucket_mb=0.2)
    bound = TailBound(run, hw, replace(sched, ranks=[]))
    for scale in (1e-6, 1e-5, 1e-4, 1e-2):
        costs = _costs(sched, rng, scale)
        result = simulate(sched, costs)
        assert max(exposed_reduce_per_rank(run, hw, sched, result)) > 0
        assert bound.at_least(sched, costs) == pytest.approx(tail_s(run, hw, sched, result), rel=1e-12)


def test_planner_bound_tail_without_overlap_is_the_tail():
    """Without overlap_grad_reduce the tail does not depend on the iteration: TailBound is tail_s, to the bit."""
    hw = PROFILES["h100"]
    for method in METHODS:
        chunks = 2 if METHODS[method].family.chunks == 0 else None
        sched = build(method, 2, 4, chunks)
        run = SMALL.with_(method=method, pp=2, dp=2, microbatches=4, chunks=chunks)
        assert TailBound(run, hw, replace(sched, ranks=[])).at_least(sched, _costs(sched, random.Random(1))) \
            == tail_s(run, hw, sched)


@pytest.mark.parametrize("method", list(METHODS))
def test_planner_bound_makespan_never_above_the_simulated_makespan(method):
    """Random shapes (pipelines of 2 to 6 ranks, 1 to 4 times as many microbatches, 2 or 3 chunks), random pass,
    collective and transfer times (some zero, stages unequal), in the default and the strict collective mode: the
    makespan's lower bound never exceeds the simulated makespan."""
    rng = random.Random(f"makespan {method}")
    for pp, m, chunks in _shapes(method, rng, 8):
        s = build(method, pp, m, chunks)
        sk = replace(s, ranks=[])
        for strict in (False, True, False, False):
            costs = _costs(s, rng, rng.choice((1.0, 1e-3)))
            whole = makespan_lower_bound(sk, costs)
            assert whole <= simulate(s, costs, strict=strict).makespan * (1 + 1e-12)
            assert makespan_lower_bound(sk, costs, order=False) <= whole  # bounds A, B and E: what the search orders by


@pytest.mark.parametrize("method,within", [("vhalf", 1.04), ("vhalf-squeezed", 1.01), ("vhalf-vocab-1", 1.11),
                                           ("interlaced", 1.07)])
def test_planner_bound_makespan_follows_the_rank_after_its_first_backward(method, within):
    """pp 8, 32 microbatches, every stage pass 1, S and T 0.3, collectives 0.1: with the bounds from each rank's first
    backward on (C and C') and, for interlaced, between its barriers (D) the simulated makespan is within `within` of
    the bound; bounds A and B alone left it 1.095 (vhalf), 1.05, 1.123 and 1.143 times the bound (C alone: interlaced
    1.105)."""
    s = build(method, 8, 32)
    comp = {(k, st): 1.0 for k in "FBW" for st in range(s.n_stages)}
    comp.update({(k, None): 0.3 for k in ("S", "T")})
    costs = Costs(comp, {k: 0.1 for k in ("C0", "C1", "C2", "IF", "IB")})
    assert simulate(s, costs).makespan <= within * makespan_lower_bound(replace(s, ranks=[]), costs)


@pytest.mark.parametrize("method", [m for m, spec in METHODS.items() if spec.vocab_parallel])
def test_planner_bound_makespan_counts_the_output_layers_collectives(method):
    """Collectives of 1 s, passes of 0.01 s: a last stage's B(k) waits for X(k)'s broadcast (C0), S(k) and its
    collective C1 (Algorithm 1: then T(k) and C2; the naive algorithm: the S and T barriers), so the bound is at
    least that chain, 2 s (Algorithm 1: 4 s), and still at most the simulated makespan."""
    s = build(method, 2, 4, 2 if METHODS[method].family.chunks == 0 else None)
    costs = Costs({(k, st): 0.01 for k in "FBW" for st in range(s.n_stages)},
                  {k: 1.0 for k in ("C0", "C1", "C2", "IF", "IB", "S", "T")})
    chain = 4.0 if METHODS[method].vocab.name == "alg1" else 2.0
    assert chain < makespan_lower_bound(replace(s, ranks=[]), costs) <= simulate(s, costs).makespan


@pytest.mark.parametrize("method", [m for m, spec in METHODS.items()
                                    if spec.vocab_parallel and not spec.vocab.synchronous])
def test_planner_bound_e_reads_the_order_build_places(method):
    """What bound E's proof reads of a built schedule: on every rank, S(k), then the collectives after S(k) (C1),
    then T(k), then S(k+1)."""
    rng = random.Random(f"order {method}")
    for pp, m, chunks in _shapes(method, rng, 6):
        s = build(method, pp, m, chunks)
        after_s = s.vocab.after_s
        assert after_s
        for acts in s.ranks:
            seq = [(a.kind, a.mb) for a in acts if a.kind in ("S", "T") + after_s]
            want = [(kind, k) for k in range(m) for kind in ("S", *after_s, "T")]
            assert seq == want, (method, pp, m, chunks)


@pytest.mark.parametrize("method", [m for m, spec in METHODS.items()
                                    if spec.vocab_parallel and not spec.vocab.synchronous])
def test_planner_bound_makespan_counts_the_output_layers_period(method):
    """C1 of 1 s, everything else 0.01 s, 12 microbatches on 4 ranks: every rank's T(k) waits for C1(k), which waits
    for S(k) on every rank, and S(k+1) follows T(k), so microbatches pass the output layer no faster than one a
    second (bound E): the bound is at least 12 s and within 4 % of the simulated makespan; bounds A to D
    alone left it at 0.13 to 0.17 of it."""
    s = build(method, 4, 12, 2 if METHODS[method].family.chunks == 0 else None)
    comp = {(k, st): 0.01 for k in "FBW" for st in range(s.n_stages)}
    comp.update({(k, None): 0.01 for k in ("S", "T", "IF", "IB")})
    costs = Costs(comp, {**{k: 0.01 for k in ("C0", "C2", "IF", "IB")}, "C1": 1.0})
    bound, makespan = makespan_lower_bound(replace(s, ranks=[]), costs), simulate(s, costs).makespan
    assert 12 * 1.02 <= bound <= makespan <= 1.04 * bound


@pytest.mark.parametrize("method", [m for m, spec in METHODS.items() if spec.split_w])
def test_planner_bound_activations_hold_where_b_recomputes(method):
    """Where W is split and B recomputes what W needs (recompute: Costs.mem("B") negative, B holds more than it
    frees), the activation bracket from the generator's order and the walk of the built schedule still hold the
    simulated peak: the holding after B is one of the points read (it was not, and three 30b candidates were
    counted feasible whose simulated peak is above the budget)."""
    rng = random.Random(method)
    for pp in (2, 4):
        for m in (pp, 3 * pp):
            s = build(method, pp, m)
            skeleton = replace(s, ranks=[])
            compute = {(k, st): rng.uniform(0.5, 2) for k in "FBW" for st in range(s.n_stages)}
            compute.update({(k, None): rng.uniform(0, 1) for k in ("S", "T", "IF", "IB")})
            memory = {("F", st): rng.uniform(1, 3) for st in range(s.n_stages)}
            memory.update({("B", st): -rng.uniform(0.1, 2) for st in range(s.n_stages)})
            memory[("S", None)] = rng.uniform(0, 2)
            costs = Costs(compute, {}, memory)
            peak = simulate(s, costs).peak_activations
            lo, hi = activation_bounds(skeleton, costs)
            exact, _ = activation_bounds(s, costs)
            for r in range(pp):
                assert exact[r] == pytest.approx(peak[r], rel=1e-12), (pp, m, r)
                assert lo[r] <= peak[r] * (1 + 1e-12) and peak[r] <= hi[r] * (1 + 1e-12), (pp, m, r)
