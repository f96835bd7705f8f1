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
