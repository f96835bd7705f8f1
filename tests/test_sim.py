"""backend=sim and calibration: one simulator behind both, the paper's trend, OOM, and a fit that reproduces
the pass times it was fitted on."""
import json
import os
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


def _sim_sweep(tmp_path, name, *extra, env=None):
    return subprocess.run([sys.executable, "-m", "harness.sweep", "backend=sim", f"hardware={name}", "logger=off",
                           "report=false", f"results_dir={tmp_path}/out-{name}", "grid.product.vocab=[8k]",
                           "grid.product.method=[vocab-2]", *extra], capture_output=True, text=True, cwd=ROOT, env=env)


def test_calibrate_cli_writes_a_profile_the_sweep_can_use(tmp_path):
    """By default to the user's profile folder, which the sweep's config search path reads; or to an explicit
    --out, found through hydra.searchpath. Whole files only: no temporary file is left beside them."""
    truth = cpu_profile("truth", 1e11, mem_bandwidth=8e9)
    results = tmp_path / "results" / "calib"
    results.mkdir(parents=True)
    for rec in synthetic_records(truth, CALIB[:4]):
        (results / f"{rec['run_id']}.json").write_text(json.dumps(rec))
    env = {**os.environ, "VP_HARNESS_CONFIG": str(tmp_path / "user")}
    conf = tmp_path / "conf" / "hardware"
    conf.mkdir(parents=True)
    for args, written in ((["--name", "mybox"], tmp_path / "user" / "hardware" / "mybox.yaml"),
                          (["--out", str(conf / "otherbox.yaml")], conf / "otherbox.yaml")):
        out = subprocess.run([sys.executable, "-m", "harness.calibrate", "--results-dir", str(results), *args],
                             capture_output=True, text=True, cwd=ROOT, env=env)
        assert out.returncode == 0 and f"wrote {written}:" in out.stdout, out.stderr
        assert [p.name for p in written.parent.iterdir()] == [written.name]
    assert "hydra.searchpath=[file://" in out.stdout  # --out: how the sweep finds it
    for name, extra in (("mybox", []), ("otherbox", [f"hydra.searchpath=[file://{tmp_path}/conf]"])):
        sweep = _sim_sweep(tmp_path, name, *extra, env=env)
        assert sweep.returncode == 0, sweep.stderr
        rec = json.loads(next((tmp_path / f"out-{name}" / "smoke").glob("*.json")).read_text())
        assert rec["labels"]["hardware"] == name and rec["env"]["hardware"]["peak_flops"] == pytest.approx(1e11)
    gone = _sim_sweep(tmp_path, "mybox", env={**env, "VP_HARNESS_CONFIG": str(tmp_path / "elsewhere")})
    assert gone.returncode == 2 and f"calibrated profiles are read from {tmp_path}/elsewhere/hardware" in gone.stderr
    bad = subprocess.run([sys.executable, "-m", "harness.calibrate", "--results-dir", str(tmp_path / "none")],
                         capture_output=True, text=True, cwd=ROOT)
    assert bad.returncode == 2 and "is not a folder of records" in bad.stderr


@pytest.mark.parametrize("args,message", [
    (["--name", "a100_80g"], "--name a100_80g is a built-in profile (conf/hardware/a100_80g.yaml) and calibrating "
                             "would replace it; pick another --name, or pass --overwrite-builtin"),
    (["--name", "h100", "--out", "h100.yaml"], "--name h100 is a built-in profile"),
    (["--out", "a100_paper.yaml"], "--name a100_paper is a built-in profile"),
    (["--name", "../../x"], "--name '../../x': a profile name is a letter then letters, digits, _ or -"),
    (["--name", "mybox", "--overwrite-builtin"], "--overwrite-builtin: mybox is not a built-in profile"),
    (["--out", str(ROOT / "conf" / "hardware" / "mybox.yaml")], "conf/hardware/ holds the built-in profiles"),
    (["--name", "mybox", "--out", "other.yaml"], "the file must be named mybox.yaml"),
    (["--out", "mybox.yml"], "the suffix must be one of .yaml"),
    (["--out", "missing/mybox.yaml"], "the folder"),
])
def test_calibrate_refuses_built_in_names_and_bad_destinations_before_any_work(tmp_path, monkeypatch, capsys,
                                                                                args, message):
    from harness.calibrate import main

    builtins = {p: p.read_bytes() for p in (ROOT / "conf" / "hardware").glob("*.yaml")}
    monkeypatch.setenv("VP_HARNESS_CONFIG", str(tmp_path / "user"))
    monkeypatch.chdir(tmp_path)
    for what in (["--results-dir", str(ROOT / "tests" / "fixtures")], ["--published", "paper_artifact"]):
        assert main([*what, *args]) == 2
        err = capsys.readouterr().err
        assert message in err and "Traceback" not in err, err
    assert not list(tmp_path.iterdir())
    assert {p: p.read_bytes() for p in (ROOT / "conf" / "hardware").glob("*.yaml")} == builtins


def test_a_failed_write_leaves_the_old_profile_whole(tmp_path, monkeypatch):
    from vp import files
    from vp.cost import PROFILES
    from vp.cost.profiles import write_profile

    path = tmp_path / "hardware" / "mybox.yaml"
    files.write_text_atomic(path, "old\n")

    def crash(src, dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(files.os, "replace", crash)
    with pytest.raises(OSError):
        write_profile(PROFILES["h100"], path, "a test")
    with pytest.raises(UnicodeEncodeError):  # fails while writing, not at the rename
        files.write_text_atomic(path, "new \ud800\n")
    assert path.read_text() == "old\n" and [p.name for p in path.parent.iterdir()] == ["mybox.yaml"]


def test_a_written_profile_reads_back_as_the_same_hardware(tmp_path):
    import yaml

    from vp.cost import PROFILES, Hardware
    from vp.cost.profiles import write_profile

    hw = PROFILES["h100"]
    text = write_profile(hw, tmp_path / "h.yaml", "line one\nline two").read_text()
    assert text.startswith("# @package hardware\n# hardware=h100: a calibrated profile of the cost model "
                           "(backend=sim)\n# line one\n# line two\n")
    doc = yaml.safe_load(text)
    assert doc["name"] == "h100" and Hardware.from_dict(doc["profile"]) == hw


def test_only_the_flag_lets_a_calibration_refit_a_built_in():
    from harness.profiles import destination

    assert destination("a100_paper", None, overwrite_builtin=True) == ROOT / "conf" / "hardware" / "a100_paper.yaml"
    assert "--overwrite-builtin" in (ROOT / "Makefile").read_text().split("calibrate-paper:")[1].splitlines()[1]


def test_a_simulated_sweep_never_imports_torch(tmp_path):
    """backend=sim runs no process of the model: its sweep imports neither torch nor anything that needs it (the
    channels it counts live in vp.channels, the device probes of vp.metrics import torch when called), which saved
    about 2.4 CPU seconds per sweep of make paper-tables."""
    run = ("import runpy, sys\n"
           f"sys.argv = ['harness.sweep', 'backend=sim', 'hardware=a100_80g', 'logger=off', 'report=false',"
           f" 'results_dir={tmp_path}', 'grid.product.vocab=[8k]', 'grid.product.method=[vocab-2]']\n"
           "try:\n    runpy.run_module('harness.sweep', run_name='__main__')\nexcept SystemExit as e:\n"
           "    assert not e.code, e.code\n"
           "print(sorted(m for m in sys.modules if m.split('.')[0] == 'torch')[:5])\n")
    out = subprocess.run([sys.executable, "-c", run], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert list((tmp_path / "smoke").glob("*.json")), out.stdout  # it simulated
    assert out.stdout.strip().splitlines()[-1] == "[]"
