"""Schedules as data: every generator validates, closed forms hold, the validator catches what it should."""
import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from vp.schedule.__main__ import main as schedule_main
from vp.schedule.methods import METHODS, VOCAB
from vp.schedule import Action, Schedule, ScheduleError, build, simulate, unit_costs, validate
from vp.schedule.rules import waits_on

GOLDEN = Path(__file__).parent / "golden"
ROOT = Path(__file__).parents[1]


def grid():
    for method, spec in METHODS.items():
        for pp in range(2, 9):
            for m in sorted({pp, pp + 1, 2 * pp + 1, 4 * pp}):
                if spec.family.microbatches_multiple_of_pp and m % pp:
                    continue
                yield method, pp, m


@pytest.mark.parametrize("method", list(METHODS))
def test_every_generator_validates_over_the_grid(method):
    """validate(): counts, dependencies, p2p order, each group's order, the cross-group collective order, and no
    deadlock in the default nor the strict simulation (one ordered queue and lazy creation per rank)."""
    cases = [c for c in grid() if c[0] == method]
    assert cases
    for _, pp, m in cases:
        chunks = 3 if METHODS[method].family.chunks == 0 and pp % 2 else None
        validate(build(method, pp, m, chunks))


@pytest.mark.parametrize("method", [m for m, spec in METHODS.items() if spec.vocab.parallel])
def test_every_rank_enters_c0_after_its_own_forward(method):
    """C0(k)'s root needs every stage's F(k); a tensor-parallel F communicates, so on one queue (NCCL with
    serialised kernels) a rank that entered C0(k) before its own F(k) would deadlock."""
    for _, pp, m in (c for c in grid() if c[0] == method):
        chunks = 3 if METHODS[method].family.chunks == 0 and pp % 2 else None
        s = build(method, pp, m, chunks)
        for r, acts in enumerate(s.ranks):
            seen = set()
            for a in acts:
                if a.kind == "F" and s.stage(r, a.chunk) < s.n_stages - 1:
                    seen.add((a.mb, a.chunk))
                if a.kind == "C0":
                    need = {(a.mb, c) for c in range(s.chunks) if s.stage(r, c) < s.n_stages - 1}
                    assert need <= seen, f"{method} pp={pp} m={m}: rank {r} enters C0:{a.mb} before its F{a.mb}"


@pytest.mark.parametrize("pp,m", [(2, 4), (4, 8), (4, 16), (8, 32), (5, 7)])
def test_1f1b_bubble_and_memory_closed_forms(pp, m):
    r = simulate(build("baseline", pp, m))
    assert r.bubble_rate == pytest.approx((pp - 1) / (m + pp - 1))
    assert r.peak_activations == [float(pp - i) for i in range(pp)]


@pytest.mark.parametrize("pp,m,v", [(2, 4, 2), (4, 8, 2), (4, 16, 3), (8, 32, 2)])
def test_interleaved_bubble_closed_form(pp, m, v):
    r = simulate(build("interleaved", pp, m, v))
    assert r.bubble_rate == pytest.approx((pp - 1) / (v * m + pp - 1))


@pytest.mark.parametrize("pp,m,v", [(2, 4, 2), (4, 8, 2), (4, 16, 3), (8, 16, 2), (3, 6, 2), (4, 8, 4)])
def test_interleaved_vocab_closed_forms(pp, m, v):
    """Interleaved 1F1B with vocabulary passes: rank r holds interleaved's (2(p-r-1) + (v-1)p + 1)/v microbatches
    of activations plus the algorithm's extra warm-up forwards (1 for Algorithm 2, 2 for Algorithm 1) of one
    chunk each; Algorithm 2's passes add exactly their own work to interleaved's makespan 3(vm+p-1)/v, so its
    bubble falls below interleaved's; Algorithm 1's end waits for one more T and C2 (a tail of at most two
    chunk backwards)."""
    passes = {"S": 0.4, "T": 0.2, "IF": 0.05, "IB": 0.05}
    base = 3 * (v * m + pp - 1) / v
    inter = simulate(build("interleaved", pp, m, v))
    for method, extra in (("interleaved-vocab-2", 1), ("interleaved-vocab-1", 2)):
        s = build(method, pp, m, v)
        r = simulate(s, unit_costs(s, passes))
        interleaved_peak = [(2 * (pp - rank - 1) + (v - 1) * pp + 1) / v for rank in range(pp)]
        assert inter.peak_activations == pytest.approx(interleaved_peak)
        assert r.peak_activations == pytest.approx([x + extra / v for x in interleaved_peak])
        with_passes = base + m * sum(passes.values())
        if extra == 1:
            assert r.makespan == pytest.approx(with_passes)
            assert r.bubble_rate < inter.bubble_rate
        else:
            assert with_passes - 1e-9 <= r.makespan <= with_passes + 2 * 2 / v


def test_interleaved_vocab_2_has_a_smaller_bubble_than_vocab_2():
    """At the paper's output-layer costs (4b model, 256k vocabulary, 8 ranks: S+T of a shard ~0.6 of a rank's
    forward), interleaving shrinks the bubble that 1F1B leaves, with the vocabulary passes balanced as in vocab-2."""
    costs = "F=1,B=2,S=0.4,T=0.2,IF=0.05,IB=0.05"
    got = {m: json.loads(run_cli("simulate", "--method", m, "--pp", "4", "--microbatches", "8", "--costs", costs,
                                 "--json", *(["--chunks", "2"] if m.startswith("interleaved") else [])).stdout)
           for m in ("interleaved", "interleaved-vocab-2", "vocab-2")}
    assert got["interleaved-vocab-2"]["bubble_rate"] <= got["interleaved"]["bubble_rate"]
    assert got["interleaved-vocab-2"]["bubble_rate"] < 0.7 * got["vocab-2"]["bubble_rate"]


@pytest.mark.parametrize("pp", [2, 3, 4, 6, 8])
def test_peak_activations_of_each_method(pp):
    m = 4 * pp
    peak = {name: max(simulate(build(name, pp, m)).peak_activations)
            for name in ("vocab-1", "vocab-2", "interlaced", "vhalf", "vhalf-vocab-2", "baseline")}
    assert peak["vocab-1"] == pp + 2
    assert peak["vocab-2"] == pp + 1
    assert peak["interlaced"] == 3 * pp // 2
    assert peak["vhalf"] <= pp / 2 + 1
    assert peak["vhalf-vocab-2"] <= pp / 2 + 2  # the official pattern delays B by one microbatch (6 slots)


@pytest.mark.parametrize("method", ["vocab-1", "vocab-2"])
def test_vocab_warmup_and_one_s_slot_per_step(method):
    pp, m = 4, 12
    s = build(method, pp, m)
    extra = 2 if method == "vocab-1" else 1
    for r, acts in enumerate(s.ranks):
        stage = [a for a in acts if a.kind in ("F", "B")]
        first_b = next(i for i, a in enumerate(stage) if a.kind == "B")
        assert first_b == pp - r + extra
        texts = [a.text() for a in acts if a.kind in ("S", "T")]
        for k in range(1, m - 1):  # steady state: T of k-1 right before S of k
            assert texts.index(f"S{k}") == texts.index(f"T{k - 1}") + 1


@pytest.mark.parametrize("method", ["vocab-1", "vocab-2", "vhalf-vocab-1", "vhalf-vocab-2", "interleaved-vocab-1",
                                    "interleaved-vocab-2"])
def test_barriers_have_a_pass_to_overlap_with(method):
    """Between entering C1 (or C2) and the first action that waits for it, each rank runs a compute pass, for
    the microbatches of the steady state (p <= k < m - p; in warm-up and cool-down ranks idle anyway, and V-Half
    squeezes those ends without the room)."""
    pp, m = 4, 16
    s = build(method, pp, m, 2 if METHODS[method].family.chunks == 0 else None)
    for r, acts in enumerate(s.ranks):
        entered = {}
        for i, a in enumerate(acts):
            if a.kind in ("C1", "C2"):
                entered[(a.kind, a.mb)] = i
            for inst in waits_on(s, a):
                if inst.group in ("C1", "C2") and pp <= inst.mb < m - pp:
                    between = acts[entered[(inst.group, inst.mb)] + 1:i]
                    assert any(b.kind in ("F", "B", "W", "S", "T") for b in between), (r, a)


def test_text_form_round_trips():
    for method in METHODS:
        s = build(method, 4, 8)
        again = Schedule.from_text(s.to_text())
        assert again == s
    assert Action.parse(0, "C1:3") == Action(0, "C1", 3, 0)
    assert Action.parse(2, "B3.1") == Action(2, "B", 3, 1)
    with pytest.raises(ValueError, match="cannot parse"):
        Action.parse(0, "X3")


@pytest.mark.parametrize("method", ["baseline", "interleaved", "interlaced", "vocab-1", "vocab-2", "vhalf",
                                    "vhalf-vocab-2", "interleaved-vocab-2"])
def test_golden_snapshots(method):
    """Small schedules in text, so that a review reads what changed. VP_UPDATE_GOLDEN=1 rewrites them."""
    text = build(method, 4 if method != "interlaced" else 3, 8 if method != "interlaced" else 6).to_text()
    path = GOLDEN / f"{method}.txt"
    if os.environ.get("VP_UPDATE_GOLDEN"):
        path.parent.mkdir(exist_ok=True)
        path.write_text(text)
    assert path.read_text() == text


def _mutate(s: Schedule, rank: int, fn) -> Schedule:
    ranks = [list(acts) for acts in s.ranks]
    ranks[rank] = fn(ranks[rank])
    return replace(s, ranks=ranks)


def test_validator_names_rank_step_and_action():
    s = build("vocab-2", 4, 8)
    missing = _mutate(s, 2, lambda acts: [a for a in acts if a.text() != "F3"])
    with pytest.raises(ScheduleError, match=r"rank 2: F3 appears 0 time"):
        validate(missing)
    i = next(i for i, a in enumerate(s.ranks[1]) if a.text() == "B2")
    j = next(i for i, a in enumerate(s.ranks[1]) if a.text() == "F2")
    swapped = _mutate(s, 1, lambda acts: acts[:j] + [acts[i]] + acts[j:i] + acts[i + 1:])
    with pytest.raises(ScheduleError, match=r"rank 1, step \d+ \(B2\): needs F2 earlier on rank 1"):
        validate(swapped)


def test_validator_catches_unmatched_send_and_collective_order():
    s = build("baseline", 3, 6)
    no_recv = _mutate(s, 1, lambda acts: [a for a in acts if a.text() != "RF4"] )
    with pytest.raises(ScheduleError):
        validate(no_recv)
    v = build("vocab-2", 3, 6)

    def swap_if(acts):
        i = next(i for i, a in enumerate(acts) if a.text() == "IF4")
        j = next(i for i, a in enumerate(acts) if a.text() == "IF5")
        acts[i], acts[j] = acts[j], acts[i]
        return acts
    with pytest.raises(ScheduleError, match="collective group IF: rank 2 enters"):
        validate(_mutate(v, 2, swap_if))


def test_validator_catches_receives_out_of_send_order():
    """Each direction of traffic is one first-in-first-out channel: receiving F4 before F3 swaps their data."""
    s = build("baseline", 2, 6)

    def early_rf4(acts):
        rf4 = next(a for a in acts if a.text() == "RF4")
        acts.remove(rf4)
        acts.insert(next(i for i, a in enumerate(acts) if a.text() == "RF3"), rf4)
        return acts
    with pytest.raises(ScheduleError, match="activations rank 0 -> rank 1 are received in another order than sent"):
        validate(_mutate(s, 1, early_rf4))


def test_validator_catches_deadlock():
    """Rank 1 waits for F1 from rank 0 before it sends B0, while rank 0 waits for B0 before F1."""
    ranks = [[Action(0, k, mb) for k, mb in [("F", 0), ("SF", 0), ("RB", 0), ("B", 0), ("F", 1), ("SF", 1),
                                             ("RB", 1), ("B", 1)]],
             [Action(1, k, mb) for k, mb in [("RF", 0), ("F", 0), ("RF", 1), ("F", 1), ("B", 0), ("SB", 0),
                                             ("B", 1), ("SB", 1)]]]
    s = Schedule("baseline", 2, 2, 1, "loop", VOCAB["local"], False, ranks)
    with pytest.raises(ScheduleError, match="deadlock: rank 0 blocked at step 2 \\(RB0\\); rank 1 blocked"):
        validate(s)


def test_stage_costs_scale_chunk_passes():
    s = build("interleaved", 2, 4, 2)
    costs = unit_costs(s)
    assert costs.time("F", 0) == 0.5 and costs.time("B", 3) == 1.0


def run_cli(*args):
    return subprocess.run([sys.executable, "-m", "vp.schedule", *args], capture_output=True, text=True, cwd=ROOT)


def test_cli_simulate_json_and_show(tmp_path):
    out = run_cli("simulate", "--method", "baseline", "--pp", "4", "--microbatches", "8", "--json")
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert data["bubble_rate"] == pytest.approx(3 / 11)
    assert data["peak_activations"] == [4, 3, 2, 1] and len(data["busy"]) == 4
    out = run_cli("simulate", "--method", "vocab-2", "--pp", "4", "--microbatches", "8", "--strict", "--json",
                  "--costs", "C1=0.5")
    strict = json.loads(out.stdout)
    flat = json.loads(run_cli("simulate", "--method", "vocab-2", "--pp", "4", "--microbatches", "8", "--json",
                              "--costs", "C1=0.5").stdout)
    assert strict["strict"] and strict["makespan"] >= flat["makespan"]
    png = tmp_path / "s.png"
    out = run_cli("show", "--method", "vocab-2", "--pp", "2", "--microbatches", "4", "--png", str(png),
                  "--costs", "S=0.3,T=0.3")
    assert out.returncode == 0, out.stderr
    assert "rank 1" in out.stdout and "C1:0" in out.stdout
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_planner_compile_command_fills_the_cache_of_every_compiled_loop():
    """make venv runs it so that no plan pays numba's compilation: each loop compiled (or loaded) on one schedule."""
    out = run_cli("compile")
    assert out.returncode == 0, out.stderr
    assert "derive, pass_spans, run, walk" in out.stdout


def test_costs_must_be_finite_and_not_negative(capsys):
    """nan and inf were accepted and printed as NaN/Infinity, which is not JSON."""
    for bad in ("F=nan", "B=inf", "S=-inf", "F=-1", "C1=NaN"):
        assert schedule_main(["simulate", "--method", "vocab-2", "--pp", "2", "--microbatches", "4", "--json",
                              "--costs", bad]) == 2
        err = capsys.readouterr()
        assert f"--costs: {bad} must be a finite number >= 0" in err.err and not err.out


@pytest.mark.parametrize("args,message", [
    (["--method", "nope", "--pp", "2", "--microbatches", "4"], "method='nope' is unknown"),
    (["--method", "interleaved", "--pp", "4", "--microbatches", "6"], "needs a multiple of pp=4; use 8"),
    (["--method", "vhalf", "--pp", "2", "--microbatches", "4", "--layers", "6"], "layers=6 cannot be split"),
    (["--method", "vocab-2", "--pp", "1", "--microbatches", "4"], "needs pp >= 2"),
    (["--method", "vocab-2", "--pp", "4", "--microbatches", "3"], "use microbatches >= 4"),
    (["--method", "baseline", "--pp", "2", "--microbatches", "4", "--costs", "F=x"], "is not a number"),
    (["--pp", "2"], "simulate needs --method, --microbatches"),
])
def test_cli_refuses_bad_input(args, message):
    out = run_cli("simulate", *args)
    assert out.returncode == 2
    assert message in out.stderr


def test_vhalf_incremental_peak_equals_a_full_recount():
    """V-Half's squeeze checks each trial move by recounting only the slots it changes: every decision and every
    count afterwards must equal a recount of the whole grid (_peak), over random moves of real grids."""
    import random

    from vp.schedule.vhalf import _Held, _grid, _peak, pattern

    rng = random.Random(3)
    for pp, m in ((4, 6), (5, 9), (8, 16)):
        block = pattern(pp, 1 if pp % 2 else 0) or pattern(pp, 2)
        for r in range(pp):
            grid = _grid({(i, mb): t + 6 * mb for i, t in enumerate(block[r]) for mb in range(m)})
            held, cap = _Held(list(grid)), _peak(grid)
            for _ in range(200):
                filled = [x for x, k in enumerate(held.grid) if k]
                t = rng.choice(filled)
                free = [x for x in range(t) if not held.grid[x]]
                if not free:
                    continue
                f = rng.choice(free)
                after = list(held.grid)
                after[f], after[t] = after[t], ""
                assert held.move(t, f, cap) == (_peak(after) <= cap)
                assert held.held == _Held(held.grid).held and held.pending == _Held(held.grid).pending


@pytest.mark.parametrize("method", ["vocab-2", "interlaced", "interleaved-vocab-2", "vhalf", "baseline"])
def test_validator_counts_without_counting_as_a_count_would(method):
    """validate() checks every pass and collective appears once per microbatch with per-(kind, chunk) sets, falling
    back to a count only to name what is off: over random duplicates, drops and swaps its answer is the count's."""
    import random
    from collections import Counter
    from importlib import import_module

    from vp.schedule.actions import P2P

    v = import_module("vp.schedule.validate")
    s = build(method, 3, 6)
    rng = random.Random(7)
    kinds = sorted({(a.kind, a.chunk) for acts in s.ranks for a in acts if a.kind not in P2P})
    foreign = next(k for k in ("W", "S", "C1") if k not in {kind for kind, _ in kinds})
    for trial in range(150):
        ranks = [list(acts) for acts in s.ranks]
        r = rng.randrange(s.pp)
        i = rng.randrange(len(ranks[r]))
        op = trial % 5
        if op == 0:  # an action twice, another dropped
            ranks[r][i] = rng.choice(ranks[r])
        elif op == 1:  # an action twice
            ranks[r].insert(i, rng.choice(ranks[r]))
        elif op == 2:  # one dropped
            del ranks[r][i]
        elif op == 3:  # another kind of pass or collective, microbatch in range
            kind, chunk = rng.choice(kinds)
            ranks[r][i] = Action(r, kind, rng.randrange(s.microbatches), chunk)
        else:  # one more of a kind the method never runs
            ranks[r].insert(i, Action(r, foreign, rng.randrange(s.microbatches)))
        t = replace(s, ranks=ranks)
        have = Counter(a for acts in t.ranks for a in acts if a.kind not in P2P)
        assert v._counts_match(t) == dict.__eq__(have, v.expected_counts(t)), (trial, r, i)
    assert v._counts_match(s)
    with pytest.raises(ScheduleError, match="appears 2 time"):
        validate(_mutate(s, 1, lambda acts: acts + [next(a for a in acts if a.kind == "B")]))
