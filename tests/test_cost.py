"""The cost model at the paper's sizes, through the one simulator."""
import pytest

from vp.config import RunConfig
from vp.cost import PROFILES, Hardware, pass_costs, rank_params, static_bytes
from vp.flops import layer_flops, model_flops, output_flops
from vp.schedule import build, simulate


def paper_8gpu(method, vocab=256000, seq=2048):
    cfg = RunConfig(method=method, pp=8, layers=32, hidden=3072, heads=24, seq_len=seq, vocab_size=vocab,
                    microbatches=128)
    sched = build(method, 8, 128, cfg.n_chunks)
    return cfg, sched, simulate(sched, pass_costs(cfg, PROFILES["a100_80g"], sched))


def test_paper_formulas():
    b, s, h, v = 1, 2048, 3072, 256000
    assert layer_flops(b * s, s, h, 4 * h) == pytest.approx(b * s * h * (72 * h + 12 * s))
    assert output_flops(b * s, h, v) == 6 * b * s * h * v
    assert model_flops(1, s, h, 4 * h, 32, v) == pytest.approx(
        3 * (2 * s * h * v + 32 * (8 * s * h * h + 4 * s * s * h + 4 * s * h * 4 * h)))


def test_vocab2_beats_baseline_and_redis_at_256k_with_balanced_ranks():
    _, _, base = paper_8gpu("baseline")
    cfg, _, redis = paper_8gpu("redis")
    _, _, vocab2 = paper_8gpu("vocab-2")
    assert cfg.stage_layers[-1] < 4  # redis moved layers off the last stage
    assert vocab2.makespan < redis.makespan < base.makespan
    assert max(vocab2.busy) / min(vocab2.busy) < 1.03
    assert max(base.busy) / min(base.busy) > 1.5


def test_vocab_parallel_balances_parameters():
    cfg, sched, _ = paper_8gpu("vocab-2")
    params = rank_params(cfg, sched)
    assert max(params) / min(params) < 1.01  # only the position embedding and final norm differ
    cfg, sched, _ = paper_8gpu("baseline")
    params = rank_params(cfg, sched)
    assert params[0] > params[1] and params[-1] > params[1]
    mem = static_bytes(cfg, PROFILES["a100_80g"], sched)
    assert mem[0] == pytest.approx(params[0] * 18 + PROFILES["a100_80g"].overhead_bytes)


def test_hardware_profile_refuses_unknown_fields():
    with pytest.raises(ValueError, match="unknown field"):
        Hardware.from_dict({"name": "x", "peak_flops": 1.0, "bogus": 2})
    with pytest.raises(ValueError, match="peak_flops"):
        Hardware.from_dict({"name": "x", "peak_flops": 0})


@pytest.mark.parametrize("method,rank0", [("vhalf", "4A + L"), ("vhalf-vocab-2", "5A + S"), ("vhalf-vocab-1", "6A + S")])
def test_vhalf_peak_memory_by_hand(method, rank0):
    """pp 2, 3 microbatches, one layer per stage. Rank 0 runs stages 0 and 3 (the last). Per microbatch a layer
    holds A = 34 s h act/2 bytes; vhalf's last stage also L = its fp32 softmax (4 n V) and input (act n h); a
    vocabulary shard's S holds S = 4 n V/2 + act n h. The official order of rank 0 (zbv_greedy, v-half-vocab):
    vhalf       F0.0 F0.1 F1.0 B0.1 W0.1 F1.1 F2.0 ...: at F2.0 it holds F1.0 F1.1 F2.0 and F0.0 (whose W comes
                last): 4A + L (B0.1 frees the softmax less the logits' gradient, W0.1 the rest);
    vocab-2     the backward slots 6 later: F0.0 .. F2.0 (5 forwards) before W0.1, with S1 held: 5A + S;
    vocab-1     12 later: all 6 forwards before the first W, S1 held: 6A + S."""
    hw = PROFILES["a100_80g"]
    cfg = RunConfig(method=method, pp=2, layers=4, hidden=64, heads=4, seq_len=16, vocab_size=1000, microbatches=3)
    sched = build(method, 2, 3, cfg.n_chunks)
    n, h, v, act = 16, 64, 1000, hw.act_bytes
    by_hand = {"4A + L": 4 * 34 * n * h * act / 2 + 4 * n * v + act * n * h,
               "5A + S": 5 * 34 * n * h * act / 2 + 4 * n * v // 2 + act * n * h,
               "6A + S": 6 * 34 * n * h * act / 2 + 4 * n * v // 2 + act * n * h}
    assert simulate(sched, pass_costs(cfg, hw, sched)).peak_activations[0] == by_hand[rank0]


def test_split_w_frees_the_softmax_at_b_and_the_rest_at_w():
    """vhalf's last stage: B frees the fp32 softmax but the logits' gradient (act bytes, the output linear's output
    gradient, which W needs with its input); where B computes the weight gradient too (1F1B) it frees all."""
    hw = PROFILES["a100_80g"]
    cfg = RunConfig(method="vhalf", pp=2, layers=4, hidden=64, heads=4, seq_len=16, vocab_size=1000, microbatches=3)
    costs = pass_costs(cfg, hw, build("vhalf", 2, 3, cfg.n_chunks))
    last = 3
    assert costs.mem("B", last) == 16 * 1000 * (4 - hw.act_bytes)
    assert costs.mem("W", last) == costs.mem("F", last) - costs.mem("B", last)
    assert costs.mem("B", 0) == 0 and costs.mem("W", 0) == costs.mem("F", 0)
    cfg = RunConfig(method="baseline", pp=2, layers=4, hidden=64, heads=4, seq_len=16, vocab_size=1000,
                    microbatches=3)
    assert ("B", 1) not in pass_costs(cfg, hw, build("baseline", 2, 3)).memory
