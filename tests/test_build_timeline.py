"""The stage passes' timeline the vocabulary placers read (vp/schedule/timeline.py, build.stage_timeline): the
simulator's spans of the lowered schedule, to the bit, without the simulator's program; the simulator's error where
the passes cannot run."""
import random
from dataclasses import replace

import numpy as np
import pytest

from collections import Counter

from vp.schedule import Action, Schedule, ScheduleError, build, kernel, simulate, unit_costs
from vp.schedule.actions import P2P
from vp.schedule.build import build_unplaced, lower, stage_timeline
from vp.schedule.costs import Costs
from vp.schedule.methods import METHODS, VOCAB, chunks_for, get_method
from vp.schedule.timeline import stage_spans
from vp.schedule.vhalf_vocab import official_costs

COMPILED, PYTHON = 0, 10**12  # kernel.COMPILE_FROM: every timeline compiled, none


def _stage_passes(method: str, pp: int, m: int, chunks: int | None) -> Schedule | None:
    """The method's generated order of stage passes, before any vocabulary pass is placed (None: a family that
    places its own, or a shape it refuses)."""
    spec = get_method(method)
    try:
        c = chunks_for(spec, chunks)
        order = spec.family.generate(pp, m, c, spec.vocab)
    except (AssertionError, ValueError):
        return None
    ranks = [[Action(r, *a) for a in acts] for r, acts in enumerate(order)]
    if any(a.kind not in ("F", "B", "W") for acts in ranks for a in acts):
        return None
    return Schedule(method, pp, m, c, spec.placement, spec.vocab, spec.split_w, ranks)


def _simulated(s: Schedule, costs) -> list:
    """Per rank, (its stage passes, their starts, their ends) in the simulation of s lowered, vocabulary local."""
    low = lower(replace(s, vocab=VOCAB["local"]))
    out = []
    for lowered, (_, starts, ends) in zip(low.ranks, simulate(low, costs).rank_spans()):
        at = [i for i, a in enumerate(lowered) if a[1] not in P2P]
        out.append(([lowered[i] for i in at], starts[at], ends[at]))
    return out


def _costs(s: Schedule, which: int, rng: random.Random):
    if which == 0:
        return None  # unit_costs: what build() places by
    if which == 1:
        return official_costs(s)  # what the V-Half placer times by: a transfer takes time
    u = unit_costs(s)
    comm = {("P2P", a, b): rng.random() for a in range(s.pp) for b in range(s.pp)}
    return Costs({k: rng.random() for k in u.compute}, comm, u.memory)


@pytest.mark.parametrize("mode", [COMPILED, PYTHON], ids=["compiled", "python"])
def test_planner_stage_timeline_is_the_simulators_to_the_bit(mode, monkeypatch):
    monkeypatch.setattr(kernel, "COMPILE_FROM", mode)
    monkeypatch.setattr(kernel, "_jitted", {})
    rng, checked = random.Random(7), 0
    for method in METHODS:
        chunk_choices = (None,) if get_method(method).family.chunks else (2, 3)
        for pp in (2, 3, 4):
            for m in (1, pp, 2 * pp + 1, 3 * pp):
                for chunks in chunk_choices:
                    s = _stage_passes(method, pp, m, chunks)
                    if s is None:
                        continue
                    for which in range(3):
                        costs = _costs(s, which, rng)
                        got = stage_timeline(s, costs)
                        assert stage_spans(s, costs) is not None  # not the simulator's fallback
                        for (acts, starts, ends), (want, w_starts, w_ends) in zip(got, _simulated(s, costs)):
                            assert list(acts) == want
                            assert np.array_equal(starts, w_starts) and np.array_equal(ends, w_ends), \
                                (method, pp, m, chunks, which)
                        checked += 1
    assert checked > 300


def test_planner_stage_timeline_leaves_a_schedule_that_cannot_run_to_the_simulator():
    s = _stage_passes("vocab-1", 3, 4, None)
    swapped = [list(acts) for acts in s.ranks]  # the last rank runs B(0) before its F(0): an input later on its rank
    i, j = swapped[2].index(Action(2, "F", 0, 0)), swapped[2].index(Action(2, "B", 0, 0))
    swapped[2][i], swapped[2][j] = swapped[2][j], swapped[2][i]
    early = replace(s, ranks=swapped)
    assert stage_spans(early) is None
    with pytest.raises(ScheduleError, match="needs F0 earlier on rank 2"):
        stage_timeline(early)
    outside = replace(s, ranks=[acts + [Action(r, "W", 0, 5)] for r, acts in enumerate(s.ranks)])  # no chunk 5
    assert stage_spans(outside) is None
    missing = replace(s, ranks=[acts if r else [a for a in acts if a != Action(0, "F", 1, 0)]
                                for r, acts in enumerate(s.ranks)])  # F(1) of stage 0 never runs
    assert stage_spans(missing) is None
    with pytest.raises(ScheduleError, match="deadlock"):
        stage_timeline(missing)


def test_planner_unplaced_build_has_the_builds_passes_on_every_rank():
    """What the planner counts communicators from (vp.plan.memo.StageCommunicators): every rank's actions as build()
    gives them, whatever their order."""
    checked = 0
    for method in METHODS:
        chunk_choices = (None,) if get_method(method).family.chunks else (2, 3)
        for pp in (2, 3, 4, 8):
            for m in (1, pp, 2 * pp + 1):
                for chunks in chunk_choices:
                    try:
                        s = build(method, pp, m, chunks)
                    except (AssertionError, ValueError):
                        continue
                    got = build_unplaced(method, pp, m, chunks)
                    assert [Counter(acts) for acts in got.ranks] == [Counter(acts) for acts in s.ranks], \
                        (method, pp, m, chunks)
                    checked += 1
    assert checked > 100
