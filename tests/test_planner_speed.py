"""What makes the planner fast changes none of its figures: the search's memo (vp.plan.memo) against the cost model
called afresh, on every candidate of small spaces and on the knobs a space may search; a search with the memo
against one that computes every figure; the GEMM memo of a profile; vp.bench plan through its command line."""
import json
import random
from dataclasses import replace

import pytest

from vp.config import RunConfig
from vp.cost import PROFILES, pass_costs
from vp.cost.gemm import Gemm, _gemm_time, gemm_time
from vp.plan import Problem, Rejection, candidates, search
from vp.plan import memo as memo_module
from vp.plan.memo import Memo, Phases
from vp.plan.search import StageCommunicators, _bound, _span, full_costs, price

SMALL = RunConfig(layers=8, hidden=512, heads=8, seq_len=256, vocab_size=32000, device="cuda", dtype="bf16")
# the knobs a space may search (RunConfig fields): every memoised value is checked over them too
KNOBS = {"zero": (0, 1), "recompute": ("none", "selective", "full"), "overlap_grad_reduce": (False, True),
         "bucket_mb": (25.0, 4.0)}


def _runs(problem: Problem, rng: random.Random, n: int) -> list[RunConfig]:
    """n candidates of the space (all where there are fewer), each with random knobs, and each again with other
    knobs (so that the memo meets keys that differ in a knob alone)."""
    runs = [c for c in candidates(problem) if not isinstance(c, Rejection)]
    runs = rng.sample(runs, min(n, len(runs)))
    out = []
    for run in runs:
        for _ in range(2):
            out.append(replace(run, **{k: rng.choice(v) for k, v in KNOBS.items()}))
    rng.shuffle(out)
    return out


def _figures(p) -> tuple:
    if isinstance(p, Rejection):
        return (p.reason, p.message, p.excess)
    return (p.static, p.costs.compute, p.costs.memory, p.tail, p.bound, p.act_lo, p.act_hi)


@pytest.mark.parametrize("hw_name,gpus,batch", [("h100", 64, 32), ("a100_80g", 32, 64)])
def test_planner_memo_equals_the_cost_model_on_random_candidates(hw_name, gpus, batch):
    """Priced through one memo shared by all candidates (as the search prices them), every figure (static bytes,
    pass times, held bytes, tail, bound, activation bracket) equals the same candidate priced afresh; the full
    costs from the memoised parts equal pass_costs called alone."""
    hw = PROFILES[hw_name]
    rng = random.Random(f"{hw_name}{gpus}")
    problem = Problem(SMALL, gpus, batch)
    memo, held = Memo(), StageCommunicators()
    runs = _runs(problem, rng, 60)
    for run in runs:
        shared = price(run, hw, held, memo=memo)
        alone = price(run, hw, StageCommunicators())
        if not isinstance(shared, Rejection):
            assert _figures(shared) == _figures(alone), run
            full, fresh = full_costs(shared, hw, memo), pass_costs(run, hw, alone.skeleton)
            assert full == fresh, run
            span = memo("full span", _span, run, shared.skeleton, full)
            assert span == _span(run, alone.skeleton, fresh), run
            assert _bound(run, hw, span, shared.tail) == _bound(run, hw, _span(run, alone.skeleton, fresh), alone.tail)
        assert _figures(shared) == _figures(alone), run
    assert sum(memo.computed.values()) < sum(memo.calls.values())  # and it saved work


def test_planner_memo_keys_every_field_it_is_not_told_to_ignore():
    """A field the memo is not told a value ignores is part of that value's key: two runs that differ only there
    are computed apart (a new knob of RunConfig can make the memo too fine, never wrong)."""
    memo, seen = Memo(), []
    run = SMALL.with_(pp=2, microbatches=4)
    for name, ignore in memo_module.IGNORES.items():
        for field in ("hidden", "seed", "recompute", "zero", "dp", "microbatches"):
            other = replace(run, **{field: {"hidden": 256, "seed": 7, "recompute": "full", "zero": 1, "dp": 2,
                                            "microbatches": 8}[field]})
            a = memo(name, lambda r: (r, seen.append(r)), run)
            b = memo(name, lambda r: (r, seen.append(r)), other)
            assert (a is b) == (field in ignore), (name, field)


def test_planner_search_with_the_memo_equals_the_search_without(monkeypatch):
    """The whole answer (counts, rejections, top, best per method, Pareto front, every simulated row) is the same
    when the memo computes every figure afresh (no field ignored)."""
    problem = Problem(SMALL, 8, 16, methods=("baseline", "vocab-2", "interleaved-vocab-1", "vhalf-vocab-1", "redis"))
    hw = PROFILES["h100"]
    fast = search(problem, hw, top=5)
    monkeypatch.setattr(memo_module, "IGNORES", {name: () for name in memo_module.IGNORES})
    slow = search(problem, hw, top=5)
    assert slow.memo["tail"][0] == slow.memo["tail"][1] or slow.memo["tail"][1] > fast.memo["tail"][1]
    for field in ("candidates", "feasible", "simulated", "pruned", "undecided", "rejected", "examples"):
        assert getattr(fast, field) == getattr(slow, field), field
    key = lambda row: (row.run, row.tokens_per_s, row.mfu, row.iteration_s, row.peak_memory_bytes, row.peak_rank,
                       row.bubble)  # noqa: E731
    for field in ("rows", "top", "pareto"):
        assert list(map(key, getattr(fast, field))) == list(map(key, getattr(slow, field))), field
    assert {m: key(r) for m, r in fast.best_per_method.items()} == {m: key(r) for m, r in slow.best_per_method.items()}
    assert set(fast.phases) >= {"space", "price", "simulate"}
    assert all(v >= 0 for v in fast.phases.values())


def test_planner_gemm_memo_is_the_model_and_follows_the_profile():
    """gemm_time through a profile's memo equals the model computed afresh, shape by shape; a profile derived with
    other parameters (dataclasses.replace) starts with its own memo and answers with its own figures."""
    rng = random.Random(3)
    hw = PROFILES["h100"]
    shapes = [Gemm(rng.choice([64, 128, 1000, 4096]), rng.choice([8, 512, 5120]), rng.choice([7, 256, 8192]),
                   rng.choice([1, 4]), accumulate=rng.random() < 0.5) for _ in range(50)]
    for g in shapes * 2:
        assert gemm_time(hw, g) == _gemm_time(hw, g, 1.0)
        assert gemm_time(hw, g, 1.3) == _gemm_time(hw, g, 1.3)
    slower = replace(hw, gemm_efficiency=hw.gemm_efficiency / 2)
    assert slower.gemm_memo is not hw.gemm_memo
    big = Gemm(8192, 8192, 8192)
    assert gemm_time(slower, big) > gemm_time(hw, big)


def test_planner_config_caches_hand_out_copies():
    """RunConfig computes stage_layers and the padded vocabulary once; a caller changing the list it got changes
    nothing for the next caller."""
    cfg = SMALL.with_(pp=4, method="redis", redis_last_layers=1)
    layers = cfg.stage_layers
    layers[0] += 5
    assert cfg.stage_layers != layers and sum(cfg.stage_layers) == cfg.layers
    assert cfg.padded_vocab_size == cfg.padded_vocab_size >= cfg.vocab_size


def test_planner_phases_count_the_innermost_block():
    phases = Phases()
    with phases("outer"):
        sum(range(10000))
        with phases("inner"):
            sum(range(10000))
    assert set(phases.seconds) == {"outer", "inner"} and not phases._stack


def test_planner_bench_prints_the_search_and_its_phases(capsys):
    """python -m vp.bench plan through the real harness.plan command (a small problem): the process's CPU seconds,
    the plan's counts and its phases, and which disk cache it ran with; a malformed problem is refused with how to
    write one."""
    from vp.bench.__main__ import main

    small = "tiny=model=small,vocab=32k,hardware=h100,plan.gpus=8,plan.global_batch=8,run.seq_len=256"
    assert main(["plan", "--json", "--problems", small]) == 0
    (row,) = json.loads(capsys.readouterr().out)
    assert row["problem"] == "tiny" and row["process_cpu_s"] > 0 and row["candidates"] >= row["feasible"] > 0
    assert row["search_cpu_s"] <= row["process_cpu_s"] and "price" in row["phases"] and "tail" in row["memo"]
    assert row["cache"] == "cold" and row["cold_cpu_s"] == row["process_cpu_s"]  # one round: with an empty cache
    assert main(["plan", "--problems", "tiny=model"]) == 2
    assert "NAME=KEY=VALUE" in capsys.readouterr().err


def test_planner_stage_parts_memo_is_the_traffic_model():
    """A stage's tensor-parallel collectives (vp.cost.tensor._stage_parts, memoised on everything it reads) equal
    vp.tp.traffic's called afresh, for every stage of random grids and methods; the lists handed out are fresh."""
    from vp.cost.tensor import _stage_parts, tp_shape
    from vp.plan.search import skeleton
    from vp.tp.traffic import layer_collectives, stage_collectives

    rng = random.Random(5)
    runs = [c for c in candidates(Problem(SMALL, 64, 32)) if not isinstance(c, Rejection) and c.tp > 1]
    for run in rng.sample(runs, 40):
        sk = skeleton(run)
        for st in range(sk.n_stages):
            layers, rest = _stage_parts(run, sk, st)
            shape = tp_shape(run)
            assert layers == [replace(c, calls=c.calls * run.stage_layers[st]) for c in layer_collectives(shape)]
            assert rest == stage_collectives(shape, first=st == 0, last=st == sk.n_stages - 1,
                                             vocab_layers=not sk.vocab_parallel, loss=False)
            layers.clear()
            assert _stage_parts(run, sk, st)[0], run  # the memo's own is untouched


def _stream_bucket_by_bucket(cfg, hw, sched, result):
    """The overlapped reduction's exposure as the docstring of exposed_reduce_per_rank states it, one bucket at a
    time: each pass's buckets final evenly over it, then the dp stream x = max(x, ready) + seconds in that order."""
    from vp.cost.data_parallel import reduce_s
    from vp.cost.memory import stage_params
    per_stage, shards = stage_params(cfg, sched)
    bucket = max(1, int(cfg.bucket_mb * 2**20 / 4))
    out = []
    for p, (actions, starts, ends) in enumerate(result.spans):
        last = {}
        for a, start, end in zip(actions, starts, ends):
            key = ("stage", a.chunk) if a.kind in ("B", "W") else "shards" if a.kind in ("T", "IB") else None
            if key is not None:
                last[key] = (start, end)
        ready = []
        for c in range(sched.chunks):
            start, end = last.get(("stage", c), (0.0, 0.0))
            n = per_stage[sched.stage(p, c)]
            k = -(-n // bucket)
            ready += [(start + (i + 1) / k * (end - start), min(bucket, n - i * bucket)) for i in range(k)]
        if shards[p]:
            ready.append((last.get("shards", (0.0, 0.0))[1], shards[p]))
        stream = 0.0
        for at, n in sorted(ready):
            stream = max(stream, at) + reduce_s(cfg, hw, p, n)
        out.append(max(0.0, stream - (ends[-1] if ends else 0.0)))
    return out


@pytest.mark.parametrize("method", ["baseline", "interleaved-vocab-2", "vhalf-vocab-1", "interlaced"])
def test_planner_overlapped_tail_in_closed_form_is_the_bucket_by_bucket_stream(method):
    """exposed_reduce_per_rank prices each pass's buckets in O(1) (the max-plus recurrence in closed form): the same
    exposure as the stream walked bucket by bucket, for buckets from one to hundreds per pass, zero 0 and 1, on
    random pass times (so that the stream sometimes keeps up with the passes and sometimes falls behind)."""
    from vp.cost.data_parallel import exposed_reduce_per_rank
    from vp.schedule import Costs, build, simulate
    rng = random.Random(method)
    hw = PROFILES["h100"]
    chunks = 2 if method.startswith("interleaved") else None
    cfg = SMALL.with_(method=method, pp=4, dp=4, microbatches=8, chunks=chunks, overlap_grad_reduce=True)
    sched = build(method, cfg.pp, cfg.microbatches, cfg.n_chunks)
    base = pass_costs(cfg, hw, sched)
    checked = 0
    for scale in (1e-3, 1.0, 1e3):
        costs = Costs({k: v * scale * rng.uniform(0.5, 2.0) for k, v in base.compute.items()}, base.comm,
                      base.memory)
        result = simulate(sched, costs)
        for bucket_mb in (0.05, 1.0, 100.0):
            for zero in (0, 1):
                run = cfg.with_(bucket_mb=bucket_mb, zero=zero)
                got, want = exposed_reduce_per_rank(run, hw, sched, result), _stream_bucket_by_bucket(
                    run, hw, sched, result)
                assert got == pytest.approx(want, rel=1e-9, abs=1e-15), (scale, bucket_mb, zero)
                checked += any(w > 0 for w in want)
    assert checked  # some exposure to compare, not only zeros


def _reference_times(run, hw, sched):
    """compute_times, pass_times and each rank's tensor-parallel tail as the cost model's parts give them, every
    stage and rank worked out alone (no cost table): pass_work's parts timed one by one, pass_comm_s per stage,
    vp.cost.tensor.tail_s per rank (a profile without measured pass factors)."""
    from vp.cost.network import Network
    from vp.cost.passes import Shapes, _timed, layer_gemm_s, pass_work
    from vp.cost.tensor import pass_comm_s, tail_s

    compute = {key: _timed(hw, parts, {}, key[1] is not None, sched.split_w, None, None)
               for key, parts in pass_work(run, hw, sched).items()}
    times, net = dict(compute), Network.of(hw, run.world)
    if run.tp > 1:
        sh = Shapes.of(run, hw)
        for st, layers in enumerate(run.stage_layers):
            gemm = layer_gemm_s(hw, sh, sched.split_w, layers)
            for kind, s in pass_comm_s(run, net, sched, st, gemm, {}, {}).items():
                if s:
                    times[(kind, st)] += s
    return compute, times, [tail_s(run, net, sched, rank) for rank in range(run.pp)]


@pytest.mark.parametrize("hw_name,gpus_per_node", [("h100", 8), ("a100_80g", 4)])
def test_planner_cost_tables_equal_the_cost_model_on_a_whole_space(hw_name, gpus_per_node):
    """compute_times, pass_times and the tensor-parallel tails, looked up in one profile's cost tables across every
    candidate of a space (as a search asks them: a stage's figures once per layer shape, role and placement), equal
    the same figures worked out stage by stage and rank by rank without the tables, to the bit; the tables hold far
    fewer figures than were asked. tp groups across nodes (4 devices a node, tp up to 16) make placement matter; zero
    and overlap_grad_reduce, which none of these figures read, are left off."""
    from vp.cost.passes import compute_times, pass_times
    from vp.cost.tensor import tails_s
    from vp.plan.search import skeleton

    hw = replace(PROFILES[hw_name], gpus_per_node=gpus_per_node)
    problem = Problem(SMALL, 16, 8, tp_in_node=False, fixed={"zero": 0, "overlap_grad_reduce": False},
                      methods=("baseline", "vocab-2", "interleaved-vocab-1", "vhalf-vocab-1", "redis"))
    runs = [c for c in candidates(problem) if not isinstance(c, Rejection)]
    runs += [replace(r, microbatches=2 * r.microbatches) for r in runs[::7]]  # pass_times: keyed per microbatch
    asked = 0
    for run in runs:
        sched = skeleton(run)
        want = _reference_times(run, hw, sched)
        assert (compute_times(run, hw, sched), pass_times(run, hw, sched), tails_s(run, hw, sched)) == want, run
        asked += sched.n_stages + run.pp
    assert {r.tp for r in runs} >= {2, 4, 8} and any(r.tp_mode != "1d" for r in runs)
    held = sum(len(table) for table in hw.cost_memo.values())
    assert held < asked, (held, asked)


def test_planner_cost_tables_are_bounded_and_start_afresh(monkeypatch):
    """A profile's cost tables start afresh past COST_TABLES (a long-lived process pricing many problems) and answer
    as before; a profile derived with dataclasses.replace has its own."""
    from vp.cost import profiles
    from vp.cost.passes import compute_times
    from vp.plan.search import skeleton

    monkeypatch.setattr(profiles, "COST_TABLES", 3)
    hw = replace(PROFILES["h100"])
    runs = [c for c in candidates(Problem(SMALL, 16, 8, methods=("baseline", "vocab-2"), fixed={"zero": 0}))
            if not isinstance(c, Rejection)]
    first = {run: compute_times(run, hw, skeleton(run)) for run in runs}
    assert 0 < len(hw.cost_memo) <= 3
    assert all(compute_times(run, hw, skeleton(run)) == want for run, want in first.items())
    assert replace(hw).cost_memo == {} and PROFILES["h100"].cost_memo is not hw.cost_memo


def test_planner_placement_names_every_tensor_parallel_axis():
    """The cost tables key a stage's collectives on its groups' placement (vp.cost.tensor.placement: ranks and
    nodes per axis of TP_AXES); a channel on an axis it does not describe is refused, not priced on a stale key."""
    from vp.cost.network import Network, span
    from vp.cost.tensor import TP_AXES, _group, placement

    run = SMALL.with_(dp=2, pp=2, tp=8, tp_mode="2.5d", tp_depth=2)
    assert placement(run.mesh, 1, 4) == tuple(span(_group(run, axis, 1), 4) for axis in TP_AXES)
    assert placement(run.mesh, 1, 4) != placement(run.mesh, 1, 8)  # groups of 8 across two nodes of 4, or in one
    assert Network.of(replace(PROFILES["h100"], gpus_per_node=4)).span(_group(run, "tp", 1)) == (8, 2)
    with pytest.raises(ValueError, match="TP_AXES"):
        _group(run, "pp", 1)


def test_planner_space_makes_the_runs_replace_makes():
    """The space's candidates, made from their fields' values without dataclasses.replace (vp.plan.space.make), are
    the RunConfigs replace makes: equal, with the same hash, every field and every derived property, and nothing
    else in them; a dict that misses or adds a field gets RunConfig's own error."""
    from dataclasses import asdict

    from vp.plan.space import RUN_FIELDS, make

    problem = Problem(SMALL, 16, 8, methods=("baseline", "vocab-2", "interleaved-vocab-1", "redis"))
    seen = 0
    for c in candidates(problem):
        run = c.run if isinstance(c, Rejection) else c
        if run is None:
            continue
        made = replace(SMALL, **{name: getattr(run, name) for name in RUN_FIELDS})
        assert type(run) is RunConfig and run == made and hash(run) == hash(made) and asdict(run) == asdict(made)
        if not isinstance(c, Rejection):
            assert (run.mesh, run.padded_vocab_size, run.stage_layers, run.to_dict()) == \
                (made.mesh, made.padded_vocab_size, made.stage_layers, made.to_dict())
        seen += 1
    assert seen > 100
    values = {name: getattr(SMALL, name) for name in RUN_FIELDS}
    with pytest.raises(TypeError):
        make({**values, "zer0": 1})
    with pytest.raises(TypeError):
        make({k: v for k, v in values.items() if k != "pp"} | {"zer0": 1})
