"""The planner's bounds (vp.plan.bounds, docs/planner.md) hold against the one simulator for random costs and sizes:
the makespan's lower bound and the tail's with overlap_grad_reduce (what no iteration can hide of the reduction);
where a bound is exact by its proof, it is equal."""
import random
from dataclasses import replace

import pytest

from vp.config import RunConfig
from vp.cost import PROFILES, tail_s
from vp.cost.data_parallel import exposed_reduce_per_rank
from vp.plan.bounds import TailBound, makespan_lower_bound
from vp.schedule import Costs, build, simulate
from vp.schedule.methods import METHODS

SMALL = RunConfig(layers=72, hidden=256, heads=8, seq_len=128, vocab_size=8000, device="cuda", dtype="bf16")


def _costs(s, rng: random.Random, scale: float = 1.0) -> Costs:
    """Random pass, collective and transfer times (some zero, stages unequal), `scale` seconds at most per pass."""
    def t(hi):
        return 0.0 if rng.random() < 0.1 else scale * rng.uniform(0.01, hi)
    comp = {(k, st): t(2) for k in "FBW" for st in range(s.n_stages)}
    if not s.split_w:
        comp.update({("W", st): 0.0 for st in range(s.n_stages)})
    comp.update({(k, None): t(1) for k in ("S", "T", "IF", "IB", "C0", "C1", "C2")})
    comm = {k: t(0.5) for k in ("C0", "C1", "C2", "IF", "IB", "S", "T")}
    comm.update({("P2P", a, b): t(0.3) for a in range(s.pp) for b in range(s.pp) if a != b})
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
