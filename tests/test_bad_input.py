"""Bad input on the newer surfaces (profiles, planner, simulator bench, vp.train's run settings, reports, Make
variables) refused at the boundary, by mechanism: each class of bad input, not each case, and a valid input that
crashed (calibrate over records of every method). Tests carry `bad_input` in their names."""
import json
import math
import re
import subprocess
from pathlib import Path

import pytest
from harness import profiles
from harness.calibrate import calibrate, cpu_profile
from harness.records import read, read_records
from harness.plan import run as plan
from harness_util import sweep
from inproc import run_main
from vp.config import RunConfig, check_config
from vp.cost.profiles import Hardware, check_profile
from vp.schedule.methods import METHODS

ROOT = Path(__file__).parents[1]
NUMBERS = [f.name for f in Hardware.__dataclass_fields__.values() if f.type in ("float", "int", float, int)]


@pytest.mark.parametrize("field", NUMBERS)
@pytest.mark.parametrize("value", [float("nan"), float("inf"), -1.0, "12"])
def test_bad_input_profile_every_number_checked(field, value):
    """Every number of a profile is refused when not finite, out of range or not a number, naming the field."""
    with pytest.raises(ValueError, match=f"hardware profile p: {field}="):
        check_profile({"name": "p", "peak_flops": 1e12, field: value})


@pytest.mark.parametrize("measured,word", [
    ({"gemm": [[64, 64, 64, float("nan")]]}, "measured.gemm row 0"),
    ({"gemm": [[64, 64, 64]]}, "measured tables do not read"),
    ({"gemm": 5}, "measured.gemm must be rows"),
    ({"layers": [["x", None]]}, "measured.layers row 0"),
    ([1, 2], "measured must be a mapping"),
])
def test_bad_input_profile_tables_are_rows_of_numbers(measured, word):
    with pytest.raises(ValueError, match=word):
        check_profile({"name": "p", "peak_flops": 1e12, "measured": measured})
    with pytest.raises(ValueError, match="efficiency"):
        check_profile({"name": "p", "peak_flops": 1e12, "efficiency": {"F": float("nan")}})


def test_bad_input_builtin_profiles_pass_the_check():
    for path in (ROOT / "conf" / "hardware").glob("*.yaml"):
        profiles.read_profile(path)  # a100_paper holds a profile; the others are names of vp.cost.PROFILES


def test_bad_input_profile_file_yaml_named_with_its_path(tmp_path):
    broken = tmp_path / "hardware" / "broken.yaml"
    broken.parent.mkdir()
    broken.write_text("# @package hardware\nname: broken\nprofile: {name: broken, peak_flops: 1e12\n")
    with pytest.raises(ValueError, match=f"{broken}: not valid YAML"):
        profiles.read_profile(broken)
    nan = tmp_path / "hardware" / "nan.yaml"
    nan.write_text("# @package hardware\nname: nan\nprofile: {name: nan, peak_flops: .nan}\n")
    with pytest.raises(ValueError, match=f"{nan}: hardware profile nan: peak_flops=nan must be a finite number"):
        profiles.read_profile(nan)


@pytest.mark.parametrize("text,message", [
    ("profile: {name: broken, peak_flops: 1e12\n", "a config file is not valid YAML: .*broken.yaml"),
    ("profile: {name: broken, peak_flops: 1e12, link_latency: -1.0}\n", "link_latency=-1.0 must be >= 0"),
    ("profile: {name: broken, peak_flops: .inf}\n", "peak_flops=inf must be a finite number"),
])
def test_bad_input_profile_refused_before_a_sweep_or_plan(user_conf, capsys, text, message):
    """A user profile that does not parse, or with a bad number, is refused by the sweep and the planner (exit 2)."""
    folder = user_conf / "conf" / "hardware"  # the user's profile folder
    folder.mkdir(parents=True)
    (folder / "broken.yaml").write_text("# @package hardware\nname: broken\n" + text)
    code, _ = sweep(user_conf, "experiment=smoke", "backend=sim", "hardware=broken", "dry_run=true")
    assert code == 2 and re.search(message, capsys.readouterr().err)
    assert plan(["model=tiny", "vocab=8k", "hardware=broken", "plan.gpus=4", "plan.global_batch=8"]) == 2
    assert re.search(message, capsys.readouterr().err)


@pytest.mark.parametrize("override,message", [
    ("plan.gpus=1000000000", "plan.gpus=1000000000 is out of range; use 1..65536"),
    ("plan.global_batch=100000000000", "plan.global_batch=100000000000 is out of range; use 1..1048576"),
    ("run.lr=inf", "run.lr=inf must be a finite number"),
    ("limits.memory_gb=nan", "limits.memory_gb=nan must be a finite number"),
])
def test_bad_input_plan_sizes_and_settings_bounded(user_conf, capsys, override, message):
    defaults = {"plan.gpus": "plan.gpus=8", "plan.global_batch": "plan.global_batch=16"}
    defaults.pop(override.split("=")[0], None)
    assert plan(["model=tiny", "vocab=8k", "hardware=a100_80g", *defaults.values(), override]) == 2
    assert message in capsys.readouterr().err


def test_bad_input_sweep_refuses_non_finite_run_settings(tmp_path):
    for override in ("run.lr=inf", "run.timeout_s=nan", "limits.memory_gb=inf"):
        code, _ = sweep(tmp_path, "experiment=smoke", "backend=sim", override, "dry_run=true")
        assert code == 2, override


@pytest.mark.parametrize("args,message", [
    (["--lr", "inf"], "lr=inf must be a positive finite number"),
    (["--lr", "nan"], "lr=nan must be a positive finite number"),
    (["--timeout-s", "inf"], "timeout_s=inf must be a positive finite number"),
    (["--max-memory-gb", "0"], "--max-memory-gb 0.0 must be a positive finite number"),
    (["--max-memory-gb", "nan"], "--max-memory-gb nan must be a positive finite number"),
    (["--tp", "64", "--pp", "1", "--method", "baseline", "--hidden", "64", "--heads", "64"],
     "dp x pp x tp = 64 local processes but --max-local-ranks is 8"),
])
def test_bad_input_vp_train_run_settings(tmp_path, args, message):
    out = run_main("vp.train", *args, cwd=tmp_path)
    assert out.returncode == 2 and message in out.stderr, out.stderr


def test_bad_input_check_config_finite():
    for field in ("lr", "timeout_s"):
        for value in (math.inf, math.nan, -1.0, 0.0):
            with pytest.raises(ValueError, match=f"{field}="):
                check_config(RunConfig(**{field: value}))


@pytest.mark.parametrize("args,message", [
    (["sim", "--sizes", "100000x100000"], "above the schedule size limit"),
    (["vocab", "--tokens", "100000000"], "--tokens 100000000 is above the limit of 1048576"),
    (["vocab", "--tokens", "0"], "--tokens 0 must be a positive integer"),
    (["vocab", "--tokens", "1000000", "--vocab-size", "10000000"], "GiB are available"),
])
def test_bad_input_bench_sizes_bounded_before_work(tmp_path, args, message):
    out = run_main("vp.bench", *args, cwd=tmp_path)
    assert out.returncode == 2 and message in out.stderr, out.stderr


def _record(tmp_path, name: str, metrics) -> Path:
    path = tmp_path / "results" / "smoke" / name
    path.parent.mkdir(parents=True, exist_ok=True)
    rec = {"run_id": name[:12], "status": "ok", "backend": "real", "experiment": "smoke",
           "config": {"method": "baseline", "pp": 1, "seq_len": 8, "vocab_size": 10}, "metrics": metrics}
    path.write_text(json.dumps(rec))
    return path


def test_bad_input_report_nan_or_null_metrics_are_broken_records(tmp_path):
    """An ok record with NaN metrics or `metrics: null` is a broken record named with its file and field (json
    writes NaN as the bare word NaN, which Python reads back); one bad record does not stop the folder."""
    nan = _record(tmp_path, "aaaaaaaaaaaa.json", {"mfu": float("nan"), "iteration_time_s": 1.0})
    null = _record(tmp_path, "bbbbbbbbbbbb.json", None)
    deep = _record(tmp_path, "cccccccccccc.json", {"mfu": 0.1, "pass_time_s": {"F": [0.1, float("inf")]}})
    good = _record(tmp_path, "dddddddddddd.json", {"mfu": 0.1, "iteration_time_s": 1.0})
    with pytest.raises(ValueError, match=f"{nan}: .*`metrics.mfu` is not a finite number"):
        read(nan)
    with pytest.raises(ValueError, match=f"{null}: .*`metrics` is null"):
        read(null)
    with pytest.raises(ValueError, match=r"`metrics.pass_time_s.F\[1\]` is not a finite number"):
        read(deep)
    recs, broken = read_records(tmp_path / "results", "smoke")
    assert [r["run_id"] for r in recs] == [good.name[:12]] and len(broken) == 3


def test_bad_input_calibrate_reads_every_method(tmp_path):
    """calibrate from records holding every method (chunks, V placement, split W) and meshes with dp and tp:
    each device's pass is the work of the stages its pipeline rank holds (it stopped with KeyError ('B', 1))."""
    from harness.sim import simulate_job

    hw = cpu_profile("m", 5e10, mem_bandwidth=5e9, pass_overhead_s=1e-4)
    recs = []
    for i, method in enumerate(METHODS):
        for dp, tp in ((1, 1), (2, 1), (1, 2)):
            cfg = check_config(RunConfig(method=method, pp=2, dp=dp, tp=tp, layers=8, hidden=64, heads=4,
                                         seq_len=32, vocab_size=1000 + 500 * i, microbatches=4))
            rec = simulate_job(cfg, hw, "x", {})
            rec.update(backend="real", env={"hosts": ["h"], "link_probe": [[8, 1e-5], [8e6, 2e-3]]})
            recs.append(rec)
    one_stage = check_config(RunConfig(method="baseline", pp=1, tp=2, layers=2, hidden=64, heads=4, seq_len=32,
                                       vocab_size=999, microbatches=4))  # tp_smoke's kind: rank 1 holds stage 0
    rec = simulate_job(one_stage, hw, "x", {})
    rec.update(backend="real", env={"hosts": ["h"], "link_probe": [[8, 1e-5], [8e6, 2e-3]]})
    fit = calibrate(recs + [rec], "fit")
    assert set(fit.efficiency) == {"F", "B", "W", "S", "T"} and all(v > 0 for v in fit.efficiency.values())


@pytest.mark.parametrize("make_args,message", [
    (["CLUSTER=slrum"], "CLUSTER=slrum is not a cluster"),
    (["PARTITION=debug"], "PARTITION=debug applies to SLURM sweeps only"),
])
def test_bad_input_make_sweep_variables_refused_before_calibration(make_args, message):
    out = subprocess.run(["make", "-s", "-o", "venv", "sweep", *make_args], cwd=ROOT, capture_output=True,
                         text=True, timeout=60)
    assert out.returncode != 0 and message in out.stderr and "calibrate" not in out.stdout + out.stderr, out
