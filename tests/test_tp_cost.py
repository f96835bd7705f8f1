"""The cost model with tensor-parallel stages: one device's share of the work per mode, its memory, where its
groups sit on the network, and simulated records that equal a direct simulator call. (That its bytes per
channel are what the runtime counts is pinned in real runs by tests/test_mesh_train.py.)"""
import pytest

from harness.sim import simulate_job
from vp.config import RunConfig, check_config
from vp.cost import PROFILES, layer_activation_bytes, layer_params, pass_costs, rank_params, tail_s
from vp.cost.memory import device_layer_params
from vp.cost.network import Network
from vp.cost.passes import pass_work
from vp.cost.tensor import Split, _group, pass_comm_s, rank_tp_collectives
from vp.schedule import build, simulate
from vp.tp.traffic import ITERATION, LOGGED

A100 = PROFILES["a100_80g"]


def gpt(tp=1, mode="1d", depth=1, method="baseline", pp=1, **kw) -> RunConfig:
    base = dict(method=method, pp=pp, tp=tp, tp_mode=mode, tp_depth=depth, layers=4 * pp, hidden=4096, heads=32,
                seq_len=2048, vocab_size=32768, microbatches=4, micro_batch_size=16, dtype="bf16", device="cuda")
    return check_config(RunConfig(**{**base, **kw}))


def layer_gemm_flops(cfg: RunConfig, kind: str) -> float:
    sched = build(cfg.method, cfg.pp, cfg.microbatches, cfg.n_chunks)
    return sum(g.flops for g in pass_work(cfg, A100, sched)[(kind, 0)][kind].gemms) / cfg.stage_layers[0]


@pytest.mark.parametrize("tp, mode, depth", [(4, "1d", 1), (4, "2d", 1), (16, "2d", 1), (8, "2.5d", 2),
                                             (64, "2.5d", 4)])
@pytest.mark.parametrize("kind", ["F", "W"])
def test_each_device_does_one_tp_th_of_the_gemm_flops(tp, mode, depth, kind):
    method = "vhalf" if kind == "W" else "baseline"  # W is its own pass only where the schedule splits it
    one, many = gpt(method=method, pp=2), gpt(tp, mode, depth, method=method, pp=2)
    assert layer_gemm_flops(many, kind) == pytest.approx(layer_gemm_flops(one, kind) / tp, rel=1e-12)


def test_a_grid_device_runs_q_steps_of_block_gemms():
    """[4, 4, 1]: each linear is 4 SUMMA steps on m = n / 4 tokens x K/4 x N/4 blocks; smaller GEMMs run less
    efficiently, so the forward GEMM time shrinks by less than 16."""
    cfg, sched = gpt(16, "2d"), build("baseline", 1, 4, 1)
    gemms = pass_work(cfg, A100, sched)[("F", 0)]["F"].gemms
    qkv = [g for g in gemms if (g.n, g.k) == (3 * 4096 // 4, 4096 // 4)]
    assert len(qkv) == 4 * cfg.layers and {g.m for g in qkv} == {16 * 2048 // 4}
    one = pass_costs(gpt(), A100, sched).compute[("F", 0)]
    assert pass_costs(cfg, A100, sched).compute[("F", 0)] > one / 16


def test_1d_activations_keep_the_replicated_part_and_grids_shrink_by_tp():
    """Korthikanti et al.: without sequence parallelism 10 s b h of a layer's 34 s b h stay on every device."""
    one = layer_activation_bytes(gpt(), A100)
    assert layer_activation_bytes(gpt(8), A100) == pytest.approx(one * (10 + 24 / 8) / 34)
    assert layer_activation_bytes(gpt(8), A100) > one / 4
    assert layer_activation_bytes(gpt(16, "2d"), A100) == pytest.approx(one / 16)
    assert layer_activation_bytes(gpt(8, "2.5d", 2), A100) == pytest.approx(one / 8)


@pytest.mark.parametrize("tp, mode, depth", [(8, "1d", 1), (16, "2d", 1), (8, "2.5d", 2)])
def test_weights_per_device_are_about_one_tp_th(tp, mode, depth):
    """A layer's weights, gradients and optimizer state: 1-D replicates LayerNorms and row-parallel biases, a
    grid's depth layers replicate its q x q blocks (2.5-D [2, 2, 2]: 1/4, not 1/8); the vocabulary layers hold
    1/columns of the rows (1-D: 1/t, grid: 1/q)."""
    sched = build("baseline", 2, 4, 1)
    one, cfg = gpt(pp=2), gpt(tp, mode, depth, pp=2)
    split = Split.of(cfg)
    blocks = tp // split.depth
    layer_one, layer_many = device_layer_params(one, Split.of(one)), device_layer_params(cfg, split)
    assert layer_one == layer_params(one)
    assert layer_one / blocks < layer_many < 1.01 * layer_one / blocks
    vocab, pos = 32768 * 4096, [2048 * 4096, 0]  # each stage's vocabulary layer; the first's position embedding
    vector = 1 if mode == "1d" else split.q  # 1-D replicates the position embedding, a grid splits it q ways
    for a, b, p in zip(rank_params(one, sched), rank_params(cfg, sched), pos):
        assert b == pytest.approx((a - vocab - p) / blocks + vocab / split.q + p / vector, rel=0.01)


def test_grid_rows_share_a_node_and_columns_cross_nodes():
    """tp innermost (vp.mesh): on 8-GPU nodes a 1-D group of 8 is one node, a [8, 8, 1] grid's ROW is one node
    and its COL spans 8 nodes; so the same bytes take longer on COL."""
    net, grid = Network.of(A100), gpt(64, "2d")
    assert len({net.node(r) for r in _group(gpt(8), "tp", 0)}) == 1
    assert len({net.node(r) for r in _group(grid, "row", 0)}) == 1
    assert len({net.node(r) for r in _group(grid, "col", 0)}) == 8
    cols = rank_tp_collectives(grid, build("baseline", 1, 4, 1), 0)
    assert {c.channel for c in cols} >= {"row", "col", "batch"}


def test_tp_collectives_add_to_their_pass_and_grid_reductions_to_the_tail():
    cfg, sched = gpt(16, "2d", method="vhalf", pp=2, layers=8), build("vhalf", 2, 4, 2)
    comm = pass_comm_s(cfg, Network.of(A100), sched, 0)
    assert comm["F"] > 0 and comm["B"] > 0 and comm["W"] > 0  # SUMMA's ab in F, abt in B, atb in W
    assert pass_costs(cfg, A100, sched).compute[("F", 0)] > comm["F"]
    once = [c for c in rank_tp_collectives(cfg, sched, 0) if c.pass_kind == ITERATION]
    assert {c.channel for c in once} == {"batch"} and tail_s(cfg, A100, sched) > 0  # [4,4,1]: no depth
    assert len(once) == 1  # every stage's replicated gradients in one flat buffer, as vp.tp.grads sends them
    # the loss summed for the log, after the runtime's timed step: counted, never timed
    logged = [c for r in range(2) for c in rank_tp_collectives(cfg, sched, r) if c.pass_kind == LOGGED]
    assert [(c.channel, c.calls) for c in logged] == [("batch", 1)]
    deep = gpt(8, "2.5d", 2, method="vhalf", pp=2, layers=8)
    assert {c.channel for c in rank_tp_collectives(deep, sched, 0) if c.pass_kind == ITERATION} == {"dep", "batch"}
    assert tail_s(gpt(8), A100, build("baseline", 1, 4, 1)) == 0.0  # 1-D replicates nothing it must reduce


@pytest.mark.parametrize("tp, mode, depth, method", [(1, "1d", 1, "vocab-2"), (4, "1d", 1, "vocab-2"),
                                                     (16, "2d", 1, "baseline"), (8, "2.5d", 2, "vocab-1")])
def test_sim_record_time_is_a_direct_simulator_call(tp, mode, depth, method):
    """A simulated record's iteration time = the simulator's makespan with the same Costs + the tail after the
    flush; MFU counts every device of the dp x pp x tp mesh."""
    cfg = gpt(tp, mode, depth, method=method, pp=2, microbatches=8)
    sched = build(cfg.method, cfg.pp, cfg.microbatches, cfg.n_chunks)
    rec = simulate_job(cfg, A100, "x", {})
    t = simulate(sched, pass_costs(cfg, A100, sched)).makespan + tail_s(cfg, A100, sched)
    m = rec["metrics"]
    assert m["iteration_time_s"] == t
    assert m["devices"] == cfg.world and len(m["peak_memory_bytes"]) == cfg.world
    assert m["mfu"] == pytest.approx(m["model_flops"] / (t * cfg.world * A100.peak_flops), rel=1e-12)
    assert Split.of(cfg).tp == tp


def test_a_grid_hides_part_of_its_summa_steps_behind_its_gemms_and_1d_hides_nothing():
    """The runtime prefetches step t+1's blocks during step t's GEMM: of G GEMM and C step-collective seconds a
    pass takes max(G, C) + min(G, C)/q; 1-D's all-reduces block."""
    net, sched = Network.of(A100), build("baseline", 1, 4, 1)
    for cfg, hidden in ((gpt(16, "2d"), True), (gpt(8), False)):
        serial = pass_comm_s(cfg, net, sched, 0)
        gemm = {"F": 1e-3, "B": 1e9, "W": 0.0}  # F: GEMMs shorter than the steps; B: far longer
        overlapped = pass_comm_s(cfg, net, sched, 0, gemm)
        if not hidden:
            assert overlapped == serial
            continue
        q = 4
        assert overlapped["F"] == pytest.approx(serial["F"] - (1 - 1 / q) * 1e-3)
        summa_b = serial["B"] - overlapped["B"]  # with G >> C every step collective but the first's 1/q hides
        assert 0 < summa_b < serial["B"]
