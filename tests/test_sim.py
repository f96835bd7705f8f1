"""backend=sim and calibration: one simulator behind both, the paper's trend, OOM, and a fit that reproduces
the pass times it was fitted on."""
import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from omegaconf import OmegaConf

from harness.calibrate import calibrate, cpu_profile
from harness.sim import simulate_job
from vp.config import RunConfig
from vp.cost import PROFILES, Hardware, pass_costs
from vp.schedule import build, simulate

ROOT = Path(__file__).parents[1]
HW = PROFILES["a100_80g"]
# the profile fitted to the official artifact's published MFU (harness.calibrate --published paper_artifact)
PAPER = Hardware.from_dict(OmegaConf.to_container(OmegaConf.load(ROOT / "conf/hardware/a100_paper.yaml"))["profile"])


def paper(method, vocab, **kw):
    base = dict(method=method, pp=8, layers=32, hidden=3072, heads=24, seq_len=2048, vocab_size=vocab,
                microbatches=128, device="cuda", dtype="bf16")
    base.update(kw)
    return RunConfig(**base)


def test_sim_record_is_the_simulator_result():
    """The record's figures equal a direct simulator call, and its MFU, tokens/s, per-rank pass times and bubble
    fractions equal the DESIGN formulas worked out here from that call's timeline (not by vp.metrics)."""
    cfg = paper("vocab-2", 256000)
    rec = simulate_job(cfg, HW, "x", {"hardware": "a100_80g"})
    sched = build(cfg.method, cfg.pp, cfg.microbatches, cfg.n_chunks)
    result = simulate(sched, pass_costs(cfg, HW, sched))
    m = rec["metrics"]
    assert rec["backend"] == "sim" and rec["status"] == "ok"
    t = result.makespan
    assert m["iteration_time_s"] == t
    B, s, h, L, V = 128, 2048, 3072, 32, 256000
    flops = 3 * (2 * B * s * h * V + L * (8 * B * s * h**2 + 4 * B * s**2 * h + 4 * B * s * h * 4 * h))
    assert m["mfu"] == pytest.approx(flops / (t * 8 * 312e12), rel=1e-9)
    assert m["tokens_per_s"] == pytest.approx(B * s / t, rel=1e-12)
    for r, timeline in enumerate(result.timeline):
        spans = [t1 - t0 for a, t0, t1 in timeline if a.kind in ("F", "B", "W", "S", "T", "IF", "IB")]
        assert m["bubble_fraction"][r] == pytest.approx(1 - sum(spans) / t, rel=1e-9)
        t_spans = [t1 - t0 for a, t0, t1 in timeline if a.kind == "T"]
        assert m["pass_time_s"]["T"][r] == pytest.approx(sum(t_spans) / len(t_spans), rel=1e-9)
    assert m["bubble_rate"] == pytest.approx(sum(m["bubble_fraction"]) / 8, rel=1e-9)
    assert m["tail_s"] == [0.0] * 8  # nothing after the flush without data parallelism


def test_vocab2_wins_widely_at_256k_and_narrowly_at_32k():
    """The paper's trend (the artifact publishes 51.20 / 17.29 at 256k and 52.56 / 47.52 at 32k, sequence 2048)."""
    mfu = {(m, v): simulate_job(paper(m, v), PAPER, "x", {})["metrics"]["mfu"]
           for m in ("baseline", "vocab-2") for v in (32000, 256000)}
    assert mfu[("vocab-2", 256000)] > 1.5 * mfu[("baseline", 256000)]
    assert 1.0 < mfu[("vocab-2", 32000)] / mfu[("baseline", 32000)] < 1.15


def test_a_run_that_does_not_fit_is_recorded_oom():
    small = replace(HW, memory_bytes=20 * 2**30)
    rec = simulate_job(paper("baseline", 256000), small, "x", {})
    assert rec["status"] == "oom" and "exceeds the 20 GiB" in rec["error"]
    assert max(rec["metrics"]["peak_memory_bytes"]) > small.memory_bytes


def synthetic_records(truth, configs):
    """Records whose pass times come from a known profile, as a real run on that machine would measure."""
    out = []
    for cfg in configs:
        rec = simulate_job(cfg, truth, "calib", {})
        rec["backend"], rec["metrics"]["peak_flops"] = "real", truth.peak_flops
        rec["env"]["hosts"] = ["node0"]
        rec["env"]["link_probe"] = [[b, truth.link_latency + b / truth.link_bandwidth] for b in (4096, 262144, 4194304)]
        out.append(rec)
    return out


CALIB = [RunConfig(method=m, pp=2, layers=4, hidden=256, heads=4, seq_len=256, vocab_size=v, microbatches=8)
         for m in ("baseline", "vocab-2", "vocab-1", "vhalf") for v in (8000, 32000)]


def test_calibrated_profile_reproduces_the_pass_times_it_was_fitted_on():
    truth = cpu_profile("truth", 1e11, pass_overhead_s=2e-4, mem_bandwidth=8e9,
                        efficiency={"F": 0.3, "B": 0.35, "W": 0.4, "S": 0.6, "T": 0.5},
                        link_latency=5e-5, link_bandwidth=3e9, ib_latency=5e-5, ib_bandwidth=3e9, gpus_per_node=2)
    fitted = calibrate(synthetic_records(truth, CALIB), "fitted")
    for kind, eff in truth.efficiency.items():
        assert fitted.efficiency[kind] == pytest.approx(eff, rel=1e-6)
    assert fitted.pass_overhead_s == pytest.approx(truth.pass_overhead_s, rel=1e-6)
    assert fitted.mem_bandwidth == pytest.approx(truth.mem_bandwidth, rel=1e-4)
    assert fitted.link_latency == pytest.approx(5e-5, rel=1e-6) and fitted.link_bandwidth == pytest.approx(3e9)
    for cfg in CALIB:
        sched = build(cfg.method, cfg.pp, cfg.microbatches, cfg.n_chunks)
        want, got = pass_costs(cfg, truth, sched).compute, pass_costs(cfg, fitted, sched).compute
        for key, seconds in want.items():
            assert got[key] == pytest.approx(seconds, rel=1e-6), key


def test_calibrate_cli_writes_a_profile_the_sweep_can_use(tmp_path):
    truth = cpu_profile("truth", 1e11, mem_bandwidth=8e9)
    results = tmp_path / "results" / "calib"
    results.mkdir(parents=True)
    for rec in synthetic_records(truth, CALIB[:4]):
        (results / f"{rec['run_id']}.json").write_text(json.dumps(rec))
    conf = tmp_path / "conf" / "hardware"
    out = subprocess.run([sys.executable, "-m", "harness.calibrate", "--results", str(results), "--name", "mybox",
                          "--out", str(conf / "mybox.yaml")], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    sweep = subprocess.run([sys.executable, "-m", "harness.sweep", "backend=sim", "hardware=mybox", "logger=off",
                            "report=false", f"results_dir={tmp_path}/out", f"hydra.searchpath=[file://{tmp_path}/conf]",
                            "grid.product.vocab=[8k]", "grid.product.method=[vocab-2]"],
                           capture_output=True, text=True, cwd=ROOT)
    assert sweep.returncode == 0, sweep.stderr
    rec = json.loads(next((tmp_path / "out" / "smoke").glob("*.json")).read_text())
    assert rec["labels"]["hardware"] == "mybox" and rec["env"]["hardware"]["peak_flops"] == pytest.approx(1e11)
    bad = subprocess.run([sys.executable, "-m", "harness.calibrate", "--results", str(tmp_path / "none")],
                         capture_output=True, text=True, cwd=ROOT)
    assert bad.returncode == 2 and "is not a folder of records" in bad.stderr
