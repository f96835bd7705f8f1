"""The rank order and every group of the mesh, as pure index maps (no processes)."""
import itertools

import pytest

from vp.mesh import AXES, Mesh


@pytest.mark.parametrize("dp,pp,tp,mode,depth", [(1, 1, 1, "1d", 1), (2, 3, 4, "1d", 1), (1, 2, 4, "2d", 1),
                                                 (2, 2, 8, "2.5d", 2), (1, 1, 2, "2.5d", 2), (1, 2, 18, "2.5d", 2)])
def test_every_axis_partitions_the_world(dp, pp, tp, mode, depth):
    mesh = Mesh(dp, pp, tp, mode, depth)
    for axis in AXES:
        groups = mesh.groups(axis)
        flat = sorted(r for g in groups for r in g)
        assert flat == list(range(mesh.world)), axis
        assert len({len(g) for g in groups}) == 1, axis


@pytest.mark.parametrize("q,depth", [(1, 1), (2, 1), (2, 2), (3, 2), (1, 4), (4, 4)])
def test_grid_groups_vary_exactly_their_index(q, depth):
    mode = "2.5d" if depth > 1 else "2d"
    mesh = Mesh(2, 2, q * q * depth, mode, depth)
    assert (mesh.q, mesh.depth, mesh.batch_blocks) == (q, depth, q * depth)
    varying = {"row": "c", "col": "r", "dep": "k", "batch": "kr", "tp": "rck", "pp": "p", "dp": "d"}
    for axis, idx in varying.items():
        for g in mesh.groups(axis):
            co = [mesh.coords(r) for r in g]
            fixed = set("dprck") - set(idx) - ({"r", "c", "k"} if axis in ("pp", "dp") else set())
            for name in fixed:
                assert len({getattr(x, name) for x in co}) == 1, (axis, name)
    for g in mesh.groups("row"):  # ordered by column; a row of one depth layer is consecutive
        assert [mesh.coords(r).c for r in g] == list(range(q)) and g == list(range(g[0], g[0] + q))
    for g in mesh.groups("batch"):  # ordered by token block k * q + r
        assert [mesh.token_block(r) for r in g] == list(range(q * depth))


def test_rank_order_is_dp_pp_tp_with_tp_innermost():
    mesh = Mesh(dp=2, pp=3, tp=4)
    for rank, (d, p, t) in enumerate(itertools.product(range(2), range(3), range(4))):
        co = mesh.coords(rank)
        assert (co.d, co.p, co.t) == (d, p, t) and mesh.rank(d, p, t) == rank
    assert mesh.group_of("tp", 5) == [4, 5, 6, 7]
    assert mesh.group_of("pp", 5) == [1, 5, 9]
    assert mesh.group_of("dp", 5) == [5, 17]


def test_vocab_shards_span_pipeline_and_columns():
    one_d = Mesh(dp=1, pp=2, tp=2)
    assert one_d.groups("vocab") == [[0, 1, 2, 3]]
    assert [one_d.vocab_shard(r) for r in range(4)] == [0, 1, 2, 3]  # p * tp + t, as the official code
    grid = Mesh(dp=1, pp=2, tp=8, tp_mode="2.5d", tp_depth=2)  # [2, 2, 2]
    for g in grid.groups("vocab"):
        assert [grid.vocab_shard(r) for r in g] == [0, 1, 2, 3]
        assert len({grid.token_block(r) for r in g}) == 1  # batch rows stay local
    assert grid.vocab_shards == 4


@pytest.mark.parametrize("kw,message", [
    (dict(tp=8, tp_mode="2d"), "tp=8 is not q\\*q\\*1 for tp_mode=2d.*e.g. 4 or 9"),
    (dict(tp=4, tp_mode="2.5d", tp_depth=2), "tp=4 is not q\\*q\\*2 .*tp_depth=2.*e.g. 2 or 8"),
    (dict(tp=4, tp_mode="3d"), "tp_mode='3d' is unknown"),
    (dict(tp=4, tp_depth=2), "tp_depth=2 needs tp_mode=2.5d"),
    (dict(dp=0), "dp=0 must be a positive integer"),
])
def test_bad_meshes_name_the_field_and_the_fix(kw, message):
    with pytest.raises(ValueError, match=message):
        Mesh(**kw)


def test_simulated_metrics_give_every_device_its_own_entries_in_rank_order():
    """Metrics.from_simulation spreads one device per pipeline rank over the mesh, rank = (d pp + p) tp + t; each
    device's memory_detail is its own dict (a change to one device's entry must not change another's)."""
    from vp.config import RunConfig
    from vp.metrics import Metrics
    from vp.schedule import build, simulate

    cfg = RunConfig(method="baseline", pp=2, dp=2, tp=2, layers=2, hidden=8, heads=2, seq_len=4, vocab_size=64,
                    microbatches=2)
    result = simulate(build(cfg.method, cfg.pp, cfg.microbatches, cfg.n_chunks))
    m = Metrics.from_simulation(cfg, result, 1.0, static_bytes=[10.0, 20.0], bytes_sent=[1.0, 2.0],
                                device_memory_bytes=1e9)
    assert [d["static"] for d in m.memory_detail] == [10.0, 10.0, 20.0, 20.0] * 2
    assert len({id(d) for d in m.memory_detail}) == cfg.world
    m.memory_detail[0]["static"] = -1.0
    assert [d["static"] for d in m.memory_detail[1:]] == [10.0, 20.0, 20.0, 10.0, 10.0, 20.0, 20.0]
