"""The passes and steps a measured profile times as the runtime runs them (vp.cost.measure_passes,
vp.cost.measure.optimizer_set): a stage's layers and the output layer, whose rows become factors on the composed
model (vp.cost.passes.pass_factors), and the optimizer step over a rank's parameters (vp.cost.costs.optimizer_s)."""
from dataclasses import replace

import pytest
import torch

from test_measured_profile import CPU, with_tables
from vp.config import RunConfig
from vp.cost import pass_work, work_seconds
from vp.cost import measure as M
from vp.cost import measure_passes as P
from vp.cost.passes import compute_times
from vp.cost.tables import as_text
from vp.schedule import build


def test_a_ranks_measured_parameter_set_prices_its_optimizer_step_exactly_and_only_that_set():
    from vp.cost import tail_s
    from vp.cost.costs import optimizer_s, vocab_tensors
    from vp.cost.memory import rank_params

    cfg = RunConfig(method="vocab-2", pp=2, layers=4, hidden=64, heads=4, seq_len=32, micro_batch_size=1,
                    vocab_size=64000, microbatches=4, device="cpu", dtype="fp32")
    sched = build("vocab-2", 2, 4, 1)
    (n, large), _ = zip(rank_params(cfg, sched), vocab_tensors(cfg, sched))
    assert n > 10**6 and as_text([[n, 0.25, *large]]) == f"{n} 0.25 {large[0]} {large[1]}"  # counts kept exact
    hw = replace(with_tables(CPU, optimizer=[[2**10, 16, 2**14 * 1e-9]], optimizer_sets=as_text([[n, 0.25, *large]])),
                 optimizer_s_per_param=1e-9)
    assert optimizer_s(hw, n, list(reversed(large))) == 0.25  # the set measured: its time, in any order
    assert optimizer_s(hw, n + 1, large) == pytest.approx((n + 1) * 1e-9)  # another set: the per-tensor rates
    assert tail_s(cfg, hw, sched) == pytest.approx(0.25)  # pp 2, dp 1, tp 1: the tail is the step


def test_the_optimizer_step_times_each_vocabulary_matrix_at_its_size():
    from vp.cost import tail_s
    from vp.cost.costs import optimizer_s, vocab_tensors

    cfg = RunConfig(method="baseline", pp=2, layers=4, hidden=64, heads=4, seq_len=32, micro_batch_size=1,
                    vocab_size=64000, microbatches=4, device="cpu", dtype="fp32")
    sched = build("baseline", 2, 4, 1)
    big = cfg.padded_vocab_size * 64
    assert vocab_tensors(cfg, sched) == [[big], [big]]
    assert vocab_tensors(cfg, build("vocab-2", 2, 4, 1)) == [[big // 2] * 2] * 2
    # 1 ns a parameter in small tensors, 10 ns in one tensor of the embedding's size
    hw = replace(with_tables(CPU, optimizer=[[2**10, 16, 2**14 * 1e-9], [big, 1, big * 1e-8]]),
                 optimizer_s_per_param=1e-9)
    assert optimizer_s(hw, big + 1000, [big]) == pytest.approx(big * 1e-8 + 1000 * 1e-9)
    assert optimizer_s(replace(hw, measured={}), big + 1000, [big]) == pytest.approx((big + 1000) * 1e-9)
    assert tail_s(cfg, hw, sched) > tail_s(cfg, replace(hw, measured={}), sched) + 8 * big * 1e-9


def test_layers_and_output_layer_timed_as_the_runtime_runs_them_scale_every_runs_composed_work():
    """vp.cost.measure_passes.layers and output_passes on tiny shapes (the real code paths); pass_factors: each row over
    the composed time of its shape; compute_times: the measured shape's parts come out as measured, and every other
    run (other shapes, tensor parallelism) is scaled by the same factors, so plans compare on one footing."""
    from vp.cost.factors import pass_factors
    from vp.cost.tables import layer_key

    timer = M.Timer(torch.device("cpu"))
    cfg = RunConfig(method="vocab-1", pp=2, layers=4, hidden=16, heads=2, seq_len=8, micro_batch_size=1,
                    vocab_size=64, microbatches=4, device="cpu", dtype="fp32")
    n, rows_vp = 8, cfg.padded_vocab_size // 2
    layer_rows = P.layers([layer_key(cfg)], torch.device("cpu"), torch.float32, timer, cycles=2)
    out_rows = P.output_passes([(n, rows_vp, 16, a) for a in ("naive", "alg1", "alg2")]
                               + [(n, cfg.padded_vocab_size, 16, "local")], torch.device("cpu"), torch.float32, timer,
                               cycles=2)
    assert [r[:5] for r in layer_rows] == [[1, 8, 16, 2, 64]] and all(t > 0 for t in layer_rows[0][5:])
    assert all(len(r) == 6 and r[4] > 0 and r[5] > 0 for r in out_rows)
    hw = with_tables(CPU, layers=as_text(layer_rows), output=as_text(out_rows))
    plain = replace(hw, measured={})
    assert pass_factors(plain) == {}
    factors = pass_factors(hw)
    assert {"F", "B", "W", "BW", "S", "T", ("S", "alg2"), ("T", "naive"), ("S", "local")} <= set(factors)
    F, B, W, BW = (float(f"{t:.6g}") for t in layer_rows[0][5:])  # as the profile stores them
    seconds = {r[3]: [float(f"{t:.6g}") for t in r[4:]] for r in out_rows}
    for method, algo in (("vocab-1", "alg1"), ("vocab-2", "alg2"), ("interlaced", "naive")):
        sched = build(method, 2, 4, 1)
        got = compute_times(replace(cfg, method=method), hw, sched)
        assert got[("F", 0)] == pytest.approx(2 * F, rel=1e-6)  # the measured shape: as measured
        assert got[("B", 0)] == pytest.approx(2 * (B if sched.split_w else BW), rel=1e-6)
        for i, kind in enumerate("ST"):  # the pooled factor on this algorithm's composed part
            assert got[(kind, None)] == pytest.approx(seconds[algo][i] * factors[kind] / factors[(kind, algo)],
                                                      rel=1e-6)
    base, sched = replace(cfg, method="baseline"), build("baseline", 2, 4, 1)
    got, composed = compute_times(base, hw, sched), compute_times(base, plain, sched)
    pooled = [seconds["local"][i] * factors[k] / factors[(k, "local")] for i, k in enumerate("ST")]
    assert got[("F", 1)] == pytest.approx(2 * F + pooled[0], rel=1e-6)  # layers and the whole output layer
    assert got[("B", 1)] == pytest.approx(2 * BW + pooled[1], rel=1e-6)
    # the first stage's input layer stays composed: its F is the layers as measured plus the composed input part
    first_input = work_seconds(hw, {"IF": pass_work(base, hw, sched)[("F", 0)]["IF"]}).total(hw)
    assert got[("F", 0)] == pytest.approx(2 * F + first_input, rel=1e-6) and composed[("F", 0)] != got[("F", 0)]
    # another shape and a tensor-parallel mesh: their composed work times the same factors
    for other in (replace(cfg, seq_len=16), replace(cfg, tp=2, pp=1)):
        sk = build("vocab-1", other.pp, 4, 1)
        scaled, alone = compute_times(other, hw, sk), compute_times(other, plain, sk)
        assert scaled[("F", 0)] == pytest.approx(alone[("F", 0)] * factors["F"], rel=1e-9)
        assert scaled[("S", None)] == pytest.approx(alone[("S", None)] * factors["S"], rel=1e-9)


def test_a_tensor_parallel_layer_timed_in_its_groups_world_prices_its_work_and_its_collectives():
    """vp.cost.measure_passes.tp_passes on tiny shapes in a world of 2 (1-D, and a [1, 1, 2] grid whose layers
    send nothing inside their passes); pass_factors: the CPU time over the composed work, and what the wall clock
    adds beyond the work (stretched where the group's processes share cores) over the modelled collectives; so a
    run at the measured shape pays per layer its measured CPU time as work and the rest as collectives."""
    from vp.cost.network import Network
    from vp.cost.factors import pass_factors
    from vp.cost.passes import Shapes, layer_gemm_s, pass_times
    from vp.cost.tables import tp_layer_key
    from vp.cost.tensor import pass_comm_s

    shapes = [("1d", 2, 1, 1, 8, 16, 2, 64), ("2.5d", 2, 2, 2, 8, 16, 2, 64)]
    vocab = [("1d", 2, 1, 1, 8, 16, 64), ("2.5d", 2, 2, 2, 8, 16, 64)]
    got, got_vocab = P.tp_passes(shapes, vocab, cycles=2)
    assert [tuple(r[:8]) for r in got] == shapes and all(len(r) == 16 and min(r[8:]) > 0 for r in got)
    assert [tuple(r[:7]) for r in got_vocab] == vocab and all(len(r) == 15 and min(r[7:]) > 0 for r in got_vocab)
    cfg = RunConfig(method="baseline", pp=1, tp=2, tp_mode="1d", layers=4, hidden=16, heads=2, seq_len=8,
                    micro_batch_size=1, vocab_size=64, microbatches=2, device="cpu", dtype="fp32")
    assert tp_layer_key(cfg) == shapes[0]
    # a row of known numbers, per layer: wall F 10 ms, B 12, W 1, BW 13; CPU F 2 ms, B 3, W 1, BW 4; one core
    wall, cpu = [0.010, 0.012, 0.001, 0.013], [0.002, 0.003, 0.001, 0.004]
    hw = replace(with_tables(CPU, tp_layers=as_text([list(shapes[0]) + wall + cpu, got[1]])), cores=1)
    plain = replace(hw, measured={})
    assert set(hw.tables.tp_layers) == set(shapes)  # modes read back as names
    factors = pass_factors(hw)
    assert {("tp", "1d", 2, 1, k) for k in ("F", "B", "W", "BW")} | {("tp", "2.5d", 2, 2, "F")} <= set(factors)
    # 1-D sends nothing in W, the [1, 1, 2] grid nothing inside a pass: no factor on what is not modelled
    assert {k for k in factors if k[0] == "tpcomm"} == {("tpcomm", "1d", 2, 1, k) for k in ("F", "B", "BW")}
    sched = build("baseline", 1, 2, 1)
    work, alone = compute_times(cfg, hw, sched), compute_times(cfg, plain, sched)
    layers_f = work_seconds(plain, {"F": pass_work(cfg, plain, sched)[("F", 0)]["F"]}).total(plain) - CPU.pass_overhead_s
    assert work[("F", 0)] == pytest.approx(alone[("F", 0)] - layers_f + 4 * cpu[0], rel=1e-9)  # work as measured
    net = Network.of(hw, cfg.world)
    gemm = layer_gemm_s(hw, Shapes.of(cfg, hw), False, 4)
    rest = pass_comm_s(cfg, net, sched, 0, gemm, {"F": 0.0, "B": 0.0, "W": 0.0})  # the vocabulary layers' alone
    timed = pass_times(cfg, hw, sched)
    slower = 2 / 1  # two processes on one core: the simulator stretches their work twice (vp.cost.costs.sharing)
    for kind, i in (("F", 0), ("B", 3)):  # B without a split W: the whole backward's row
        exposed = wall[i] - slower * cpu[i]
        assert timed[(kind, 0)] == pytest.approx(work[(kind, 0)] + 4 * exposed + rest[kind], rel=1e-9)
    # another mesh (4 devices) keeps the modelled collectives and the tp = 1 factors (none here)
    other = replace(cfg, tp=4)
    assert pass_times(other, hw, sched) == pytest.approx(pass_times(other, plain, sched), rel=1e-12)



@pytest.mark.parametrize("method, pp", [("vhalf", 2), ("baseline", 1)])
def test_a_grids_measured_layers_price_each_pass_and_stage_of_any_schedule(method, pp):
    """A [2,2,1] grid's row (made-up numbers): every stage's layer collectives become what the wall clock added
    beyond the stretched work, per layer, in F, B and W where the schedule splits W (vhalf), in B from the whole
    backward's row where it does not (baseline): the SUMMA loops' collectives, with their credit, scaled alike."""
    from vp.cost.network import Network
    from vp.cost.factors import pass_factors
    from vp.cost.passes import Shapes, layer_gemm_s, pass_times
    from vp.cost.tables import tp_layer_key
    from vp.cost.tensor import pass_comm_s

    cfg = RunConfig(method=method, pp=pp, tp=4, tp_mode="2d", layers=4, hidden=16, heads=2, seq_len=8,
                    micro_batch_size=2, vocab_size=64, microbatches=4, device="cpu", dtype="fp32")
    sched = build(method, pp, 4, 2 if method == "vhalf" else 1)
    wall, cpu = [0.010, 0.012, 0.008, 0.020], [0.001, 0.002, 0.001, 0.003]
    hw = replace(with_tables(CPU, tp_layers=as_text([list(tp_layer_key(cfg)) + wall + cpu])), cores=1)
    assert {k[-1] for k in pass_factors(hw) if k[0] == "tpcomm"} == {"F", "B", "W", "BW"}  # SUMMA in all three
    exposed = dict(zip(("F", "B", "W", "BW"), (w - 4 * c for w, c in zip(wall, cpu))))  # 4 processes, 1 core
    if not sched.split_w:
        exposed["B"], exposed["W"] = exposed["BW"], 0.0
    net, sh, work, timed = Network.of(hw, cfg.world), Shapes.of(cfg, hw), compute_times(cfg, hw, sched), \
        pass_times(cfg, hw, sched)
    for st, layers in enumerate(cfg.stage_layers):
        rest = pass_comm_s(cfg, net, sched, st, layer_gemm_s(hw, sh, sched.split_w, layers),
                           {"F": 0.0, "B": 0.0, "W": 0.0})
        for kind in ("F", "B", "W"):
            if (kind, st) in work:
                assert timed[(kind, st)] == pytest.approx(work[(kind, st)] + layers * exposed[kind] + rest[kind],
                                                          rel=1e-9, abs=1e-12), (kind, st)


def test_a_tensor_parallel_layer_that_fails_ends_its_benchmark_with_an_error():
    """A shape the layers refuse (3 heads over 2 devices) stops every rank at once (os._exit after the
    traceback, its peers killed), and calibrate's caller gets the error instead of waiting for a timeout."""
    with pytest.raises(RuntimeError, match="tensor-parallel layer benchmark process failed"):
        P.tp_passes([("1d", 2, 1, 1, 8, 16, 3, 64)], cycles=1, timeout_s=120)


@pytest.mark.parametrize("mode", ["1d", "2d"])
def test_a_tensor_parallel_stages_vocabulary_layers_timed_in_its_world_are_what_a_run_pays_for_them(mode):
    """tp_vocab rows (made-up numbers) beside a tp_layers row: a one-stage run at the measured shapes on one core
    pays, per microbatch, its layers' measured wall clock and its vocabulary layers' (IF and S in F, IB and T in
    B): their CPU time as work, what the wall clock added as the collectives of the rest of the stage, whatever
    the network model says of those; its simulated passes take exactly the measured wall clocks. A schedule that
    splits W pays the row's T over B and W together; another shape keeps the composed parts; a run with vocabulary
    parallelism keeps its S and T passes' own factors: its vocabulary layers run elsewhere."""
    from vp.cost import pass_costs
    from vp.cost.factors import pass_factors
    from vp.cost.passes import pass_times
    from vp.cost.tables import VOCAB_PARTS, tp_layer_key, tp_vocab_key
    from vp.schedule import simulate

    cfg = RunConfig(method="baseline", pp=1, tp=2 if mode == "1d" else 4, tp_mode=mode, layers=4, hidden=16,
                    heads=2, seq_len=8, micro_batch_size=2, vocab_size=64, microbatches=2, device="cpu",
                    dtype="fp32")
    wall, cpu = [0.020, 0.024, 0.006, 0.030], [0.002, 0.003, 0.001, 0.004]  # per layer: F, B, W, BW
    vwall, vcpu = [0.008, 0.004, 0.015, 0.010], [0.001, 0.0005, 0.002, 0.0015]  # IF, IB, S, T
    hw = replace(with_tables(CPU, tp_layers=as_text([list(tp_layer_key(cfg)) + wall + cpu]),
                             tp_vocab=as_text([list(tp_vocab_key(cfg)) + vwall + vcpu])), cores=1, wake_s=0.0)
    assert hw.tables.tp_vocab[tp_vocab_key(cfg)] == {"wall": dict(zip(VOCAB_PARTS, vwall)),
                                                     "cpu": dict(zip(VOCAB_PARTS, vcpu))}
    factors = pass_factors(hw)
    assert {k[-1] for k in factors if k[0] == "tpvocab"} == {"F", "B"}
    sched = build("baseline", 1, 2, 1)
    slower = cfg.tp  # tp processes on one core
    v = dict(zip(VOCAB_PARTS, zip(vwall, vcpu)))
    work, timed = compute_times(cfg, hw, sched), pass_times(cfg, hw, sched)
    for kind, layer, parts in (("F", 0, ("IF", "S")), ("B", 3, ("IB", "T"))):
        own = CPU.pass_overhead_s + 4 * cpu[layer] + sum(v[p][1] for p in parts)
        assert work[(kind, 0)] == pytest.approx(own, rel=1e-9)
        exposed = 4 * (wall[layer] - slower * cpu[layer]) + sum(v[p][0] - slower * v[p][1] for p in parts)
        assert timed[(kind, 0)] == pytest.approx(work[(kind, 0)] + exposed, rel=1e-9)
    result = simulate(sched, pass_costs(cfg, hw, sched))
    took = {a.kind: t1 - t0 for a, t0, t1 in result.timeline[0]}
    overhead = slower * CPU.pass_overhead_s
    assert took["F"] == pytest.approx(4 * wall[0] + vwall[0] + vwall[2] + overhead, rel=1e-9)
    assert took["B"] == pytest.approx(4 * wall[3] + vwall[1] + vwall[3] + overhead, rel=1e-9)
    # another shape (a larger vocabulary) keeps the composed vocabulary layers: the timed parts are mostly fixed
    # costs, which no factor carries to other sizes; the rest of its collectives still take the mesh's factor
    big = replace(cfg, vocab_size=128)
    no_vocab = replace(hw, measured={"tp_layers": hw.measured["tp_layers"]})
    assert pass_work(big, hw, sched)[("F", 0)].keys() >= {"IF", "S"}
    assert compute_times(big, hw, sched) == compute_times(big, no_vocab, sched)
    assert pass_times(big, hw, sched)[("F", 0)] != pass_times(big, no_vocab, sched)[("F", 0)]
    # vocabulary parallelism: S and T are pipeline passes over pp x columns, not the stage's layers timed here, and
    # its stages' collectives (a grid's final LayerNorm) keep the model's price
    vp_cfg = replace(cfg, method="vocab-1", pp=2)
    vp_sched = build("vocab-1", 2, 2, 1)
    assert compute_times(vp_cfg, hw, vp_sched) == compute_times(vp_cfg, no_vocab, vp_sched)
    assert pass_times(vp_cfg, hw, vp_sched) == pass_times(vp_cfg, no_vocab, vp_sched)
    # a schedule that splits W (vhalf): the output layer's weight gradient runs in W, and the row's T prices the
    # parts of B and W together, each at T's factor
    vh_cfg, vh_sched = replace(cfg, method="vhalf", pp=2), build("vhalf", 2, 2, 2)
    last, f_t = vh_sched.n_stages - 1, factors[("tp", *tp_vocab_key(cfg), "T")]
    parts = pass_work(vh_cfg, hw, vh_sched)
    composed = {k: work_seconds(hw, {"T": parts[(k, last)]["T"]}).total(hw) - CPU.pass_overhead_s for k in "BW"}
    assert f_t * sum(composed.values()) == pytest.approx(vcpu[3], rel=1e-9)
    measured, alone = compute_times(vh_cfg, hw, vh_sched), compute_times(vh_cfg, no_vocab, vh_sched)
    for kind in "BW":
        assert measured[(kind, last)] - alone[(kind, last)] == pytest.approx((f_t - 1) * composed[kind], rel=1e-9)
