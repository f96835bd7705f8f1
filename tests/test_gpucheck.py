"""make gpu-check cannot run here (no GPU); every part of it that runs on CPU runs here: argument handling, the plan
per GPU count, the vocabulary math, pass timing and profile fitting, and the torchrun pipeline check."""
import json

import pytest

from harness import gpucheck
from vp.cost import Hardware


def test_plan_per_gpu_count():
    assert gpucheck.plan(1, [2, 4, 8]) == ["math", "passes"]  # a one-GPU host: no pipeline
    assert gpucheck.plan(4, [2, 4, 8]) == ["math", "passes", "pipeline", "fault"]


def test_refusals(capsys, tmp_path):
    with pytest.raises(SystemExit):
        gpucheck.main(["--methods", "nope", "--out", str(tmp_path)])
    assert "--methods: unknown ['nope']" in capsys.readouterr().err
    import torch

    if not torch.cuda.is_available():
        assert gpucheck.main(["--out", str(tmp_path)]) == 2
        assert "no CUDA device here" in capsys.readouterr().err


def test_fitted_profile_reproduces_the_measured_pass_times():
    shape = gpucheck.TINY
    seconds = {"F": 0.5, "B": 1.0, "W": 0.5, "S": 0.2, "T": 0.1, "IF": 0.01, "IB": 0.02}
    hw = gpucheck.fit_profile(seconds, shape, 1e12, "x")
    flops = gpucheck.pass_flops(shape)
    for kind, s in seconds.items():
        assert flops[kind] / (hw.peak_flops * hw.eff(kind)) == pytest.approx(s)
    assert isinstance(hw, Hardware)


def test_the_cpu_run_of_the_check_passes(tmp_path, capsys):
    code = gpucheck.main(["--device", "cpu", "--out", str(tmp_path), "--pp", "2", "--methods", "vocab-2"])
    printed = capsys.readouterr().out
    assert code == 0, printed
    report = json.loads((tmp_path / "gpucheck.json").read_text())
    assert report["plan"] == ["math", "passes", "pipeline", "fault"]
    assert all(r["ok"] for r in report["math"].values())
    assert report["passes"]["ok"] and set(report["passes"]["seconds"]) == {"F", "B", "W", "S", "T", "IF", "IB"}
    assert (tmp_path / "gpucheck.yaml").read_text().startswith("# @package hardware")
    assert report["pipeline"]["pp2/vocab-2"]["ok"]  # torchrun, 2 processes, loss against the reference
    assert "fault: skipped" in printed  # the fault check needs NCCL
