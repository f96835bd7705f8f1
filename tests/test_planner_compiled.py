"""The simulator's and the program's loops (vp/schedule/kernel.py, vp/schedule/derive.py) run compiled by numba from
kernel.COMPILE_FROM steps on, and as Python below that or where numba is not installed: the same functions, so the
same figures to the bit, and the figures the simulator computed before it was compiled
(tests/fixtures/simulator_reference.json, build_reference.json)."""
import json
import sys
from dataclasses import replace

import numpy as np
import pytest

from tests.sim_reference import BUILDS, FIXTURE, build_digests, schedule_digests
from vp.schedule import ScheduleError, build, kernel, simulate, unit_costs, validate
from vp.schedule.methods import METHODS
from vp.schedule.program import _program
from vp.schedule.sharing import Sharing

COMPILED, PYTHON = 0, 10**12  # kernel.COMPILE_FROM: every program compiled, none


@pytest.mark.parametrize("mode", [COMPILED, PYTHON], ids=["compiled", "python"])
def test_planner_compiled_and_python_loops_give_the_reference_figures_to_the_bit(mode, monkeypatch):
    monkeypatch.setattr(kernel, "COMPILE_FROM", mode)
    monkeypatch.setattr(kernel, "_jitted", {})
    want = json.loads(FIXTURE.read_text())["schedules"]
    got = schedule_digests()
    assert [name for name in want if got[name] != want[name]] == []
    want = json.loads(BUILDS.read_text())
    got = build_digests()
    assert [name for name in want if got[name] != want[name]] == []


def _figures(method: str) -> tuple:
    """A fresh schedule's program and its simulations in the default mode, the strict mode and with processor
    sharing (durations of the caller's), or the error text where it cannot run."""
    s = build(method, 4, 12)
    validate(s)
    prog = _program(s)
    arrays = tuple(np.asarray(x).tolist() for x in prog[:9]) + (prog.in_order, prog.missing,
                                                                prog.entry_inst.tolist(), prog.counts)
    shared = replace(unit_costs(s), sharing=Sharing(cores=2.0, devices=1.0, crowding=1.2))
    out = [arrays]
    for costs, strict in ((None, False), (None, True), (shared, False)):
        r = simulate(s, costs, strict)
        out.append((r.makespan, r.busy, r.peak_activations, [(list(a), b, e) for a, b, e in r.spans]))
    crossed = replace(s, ranks=[list(reversed(acts)) for acts in s.ranks])  # inputs after their consumers
    try:
        simulate(crossed)
    except ScheduleError as e:
        out.append(str(e))
    return tuple(out)


@pytest.mark.parametrize("method", METHODS)
def test_planner_compiled_and_python_loops_agree_to_the_bit(method, monkeypatch):
    monkeypatch.setattr(kernel, "COMPILE_FROM", PYTHON)
    monkeypatch.setattr(kernel, "_jitted", {})
    python = _figures(method)
    monkeypatch.setattr(kernel, "COMPILE_FROM", COMPILED)
    compiled = _figures(method)
    assert isinstance(compiled[-1], str) and "needs" in compiled[-1]
    assert compiled == python
    # where numba is not installed, jit() hands back the Python functions
    monkeypatch.setitem(sys.modules, "numba", None)
    monkeypatch.setattr(kernel, "_jitted", {})
    assert kernel.jit(kernel.run, 10**9) is kernel.run
    assert _figures(method) == python



def test_planner_compiled_loops_compile_without_a_cache_where_numba_has_nowhere_to_write(monkeypatch):
    """numba refuses cache=True where neither the module's folder nor the user's cache folder is writable (a
    RuntimeError when the function is decorated); jit() then compiles without the cache. Here njit stands in for
    numba's (no compilation): it refuses the cache and hands back the function."""
    import numba

    asked = []

    def njit(cache=False, inline="never"):
        asked.append(cache)
        if cache:
            raise RuntimeError("cannot cache function: no locator available")
        return lambda fn: fn
    monkeypatch.setattr(numba, "njit", njit)
    monkeypatch.setattr(kernel, "_jitted", {})
    run = kernel.jit(kernel.run, kernel.COMPILE_FROM)
    assert run is not kernel.run and run.__code__ is kernel.run.__code__ and True in asked and False in asked
    assert run.__globals__["_enter"].__code__ is kernel._enter.__code__  # the helpers it calls: their clones


def test_planner_program_counts_each_ranks_passes_after_a_rank_with_a_missing_input():
    """The program counts each rank's distinct microbatches per (kind, chunk) (what validate's count check reads). A
    rank that needs a pass it never runs holds a shape of its own for it, and the next rank's counts still read the
    next rank's shapes."""
    s = build("baseline", 2, 4)
    broken = replace(s, ranks=[[a for a in s.ranks[0] if a.kind != "F"]] + s.ranks[1:])  # B needs an F never run
    want = [{(k, c): len({a.mb for a in acts if (a.kind, a.chunk) == (k, c)}) for _, k, _, c in acts}
            for acts in broken.ranks]
    assert _program(broken).counts == want
    assert _program(broken).missing


def _program_figures(s) -> tuple:
    prog = _program(s)
    arrays = tuple(np.asarray(x).tolist() for x in prog[:9]) + tuple(np.asarray(x).tolist() for x in prog[-3:])
    return arrays + (prog.time_keys, prog.mem_keys, prog.p2p_keys, prog.channels, prog.links, list(prog.instances),
                     prog.inst_kind.tolist(), prog.inst_kinds, list(prog.members), prog.counts, prog.p2p_actions,
                     prog.missing, prog.in_order)


@pytest.mark.parametrize("method", ["interleaved-vocab-1", "vhalf-vocab-2", "interlaced", "redis"])
def test_planner_program_shape_table_is_shared_by_schedules_of_one_kind_and_changes_nothing(method, monkeypatch):
    """The program's table of shapes is worked out once per kind of schedule and ranks' shapes (a planner builds one
    schedule per microbatch count): every figure of a program is the one worked out with no table kept, and
    schedules of one kind but their microbatches share one table; one whose ranks meet their shapes in another
    order (here reversed) has its own."""
    from vp.schedule import program

    def schedules():
        made = [build(method, 4, m) for m in (4, 8, 12)]
        return made + [replace(made[0], ranks=[list(reversed(acts)) for acts in made[0].ranks])]

    monkeypatch.setattr(program, "_TABLES", {})
    shared = [_program_figures(s) for s in schedules()]
    kept = len(program._TABLES)
    fresh = []
    for s in schedules():
        program._TABLES.clear()
        fresh.append(_program_figures(s))
    assert shared == fresh
    assert kept < len(fresh)  # the larger schedules ran the shapes of the smaller
