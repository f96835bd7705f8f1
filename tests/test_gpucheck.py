"""The GPU check (scripts/gpu-check.sh, vp/gpucheck/) cannot run its CUDA form here; what runs on CPU runs here: the
script with Hydra, omegaconf, submitit, W&B and numba blocked from import, the report kept part by part when a later part
does not finish, the refusals, every part's CPU form at tiny shapes, and the pure pieces (the torch.distributed
scan, the race probe's verdict, the profile fit)."""
import json
import os
import subprocess
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

import pytest
import torch
import yaml

from vp.cost import PROFILES, Hardware, work_seconds
from vp.cost.fit import fit_speeds, fitted, observation
from vp.gpucheck import PARTS, __main__ as gpucheck
from vp.gpucheck import memory, passes, pipeline, precision, preflight, race, runtime, trust

ROOT = Path(__file__).resolve().parents[1]
BLOCKED = ("hydra", "omegaconf", "submitit", "wandb", "numba")
BLOCKER = f'''import importlib.abc, sys
class _Blocked(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] in {BLOCKED!r}:
            raise ImportError(f"{{name}} is blocked: the GPU machine has no such package")
sys.meta_path.insert(0, _Blocked())
'''


@pytest.mark.needs("bash")
def test_the_script_runs_with_hydra_omegaconf_submitit_and_wandb_blocked(tmp_path):
    """A sitecustomize on PYTHONPATH blocks the five in the script's process and in every part's process (without
    numba the simulator's loops run as Python, vp/schedule/kernel.py)."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(BLOCKER)
    env = {**os.environ, "PYTHONPATH": f"{site}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
           "PYTHON": sys.executable}
    code = ("import importlib, pkgutil, vp.gpucheck as g\n"
            "for m in pkgutil.iter_modules(g.__path__): importlib.import_module('vp.gpucheck.' + m.name)\n"
            "print('imported')\n"
            "try:\n    import omegaconf\nexcept ImportError as e:\n    print(e)\n")
    probe = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    # every module of the check imported; then the blocker stopped omegaconf (so it was in force)
    assert probe.stdout.splitlines() == ["imported", "omegaconf is blocked: the GPU machine has no such package"], \
        probe.stdout + probe.stderr
    out = tmp_path / "report"
    run = subprocess.run(["bash", str(ROOT / "scripts/gpu-check.sh"), "--device", "cpu", "--out", str(out), "--parts",
                          "preflight"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout + run.stderr
    report = json.loads((out / "gpu-check.json").read_text())
    assert [(p["part"], p["status"]) for p in report["parts"]] == [("preflight", "passed")]
    assert "## preflight: passed" in (out / "gpu-check.md").read_text()


def test_a_part_that_does_not_finish_keeps_the_parts_before_it(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(PARTS, "runtime", 0.5)  # far too short: the part is killed at its timeout
    code = gpucheck.main(["--device", "cpu", "--out", str(tmp_path), "--parts", "race", "runtime"])
    assert code == 1
    report = json.loads((tmp_path / "gpu-check.json").read_text())
    assert [(p["part"], p["status"]) for p in report["parts"]] == [("race", "skipped"), ("runtime", "timeout")]
    page = (tmp_path / "gpu-check.md").read_text()
    assert "## race: skipped" in page and "## runtime: timeout" in page and page.endswith("FAILED: runtime\n")
    assert "FAILED: runtime" in capsys.readouterr().out


def test_refusals(tmp_path, capsys):
    with pytest.raises(SystemExit):
        gpucheck.main(["--parts", "nope"])
    assert "--parts: unknown ['nope']" in capsys.readouterr().err
    (tmp_path / "gpu-check.json").write_text("{}")
    assert gpucheck.main(["--device", "cpu", "--out", str(tmp_path), "--parts", "preflight"]) == 2
    assert "already holds a check's report" in capsys.readouterr().err
    assert (tmp_path / "gpu-check.json").read_text() == "{}"  # nothing overwritten
    if not torch.cuda.is_available():
        assert gpucheck.main(["--out", str(tmp_path / "new")]) == 2
        assert "sees no CUDA device" in capsys.readouterr().err


def test_the_distributed_scan_finds_calls_and_flags_what_torch_lacks(tmp_path):
    (tmp_path / "a.py").write_text("import torch.distributed as dist\n"
                                   "from torch.distributed.distributed_c10d import _abort_process_group\n"
                                   "dist.reduce(t, group=g, group_dst=0, async_op=True)\n"
                                   "dist.reduce_scatter_nonexistent(t)\ndist.broadcast(t, not_a_keyword=1)\n")
    calls = preflight.distributed_calls(tmp_path)
    assert calls[("torch.distributed", "reduce")] == {"group", "group_dst", "async_op"}
    assert ("torch.distributed.distributed_c10d", "_abort_process_group") in calls
    assert preflight.missing_api(calls) == ["torch.distributed.broadcast(not_a_keyword=)",
                                            "torch.distributed.reduce_scatter_nonexistent"]
    assert ("torch.distributed", "isend") in preflight.distributed_calls()  # vp/'s own calls


def test_race_verdict():
    safe, kept = {"reused": False, "pending": True}, {"intact": True}
    ok, lines = race.verdict({"overwritten": True, "reused": True, "pending": True}, kept,
                             {"reused": True, "pending": True}, cuda=True)
    assert ok is False and "race CONFIRMED" in lines[0] and "RACE" in lines[1]
    ok, lines = race.verdict({"overwritten": False, "reused": False, "pending": True}, kept, safe, cuda=True)
    assert ok is True and "refuted" in lines[0] and "safe" in lines[1]
    ok, lines = race.verdict({"overwritten": False}, {"intact": False}, safe, cuda=True)
    assert ok is False and "INVALID" in lines[0]  # the control did not deliver its input: no conclusion
    ok, _ = race.verdict({"overwritten": False, "reused": False}, kept, {"reused": False, "pending": False}, cuda=True)
    assert ok is False  # the reduce had finished before the allocation: the delay failed, nothing was tested
    assert race.verdict(None, None, safe, cuda=False)[0] is None


def test_the_fit_recovers_a_profile_from_pass_times_it_implies():
    skeleton = PROFILES["h200"]
    truth = replace(skeleton, efficiency={"F": 0.7, "B": 0.6, "W": 0.8, "S": 0.5, "T": 0.9}, pass_overhead_s=2e-5,
                    mem_efficiency=0.6)
    rows, times = [], []
    for shape in passes.SHAPES.values():
        _, parts = passes.predicted(passes.shape_config(shape, "cuda"), skeleton)
        for kind in passes.KINDS:
            rows.append(observation(skeleton, parts[kind]))
            times.append(work_seconds(truth, parts[kind]).total(truth))
    hw = fitted(skeleton, "x", *fit_speeds(rows, times))
    assert hw.efficiency == pytest.approx(truth.efficiency, rel=1e-3)
    assert hw.pass_overhead_s == pytest.approx(2e-5, rel=1e-3) and hw.mem_efficiency == pytest.approx(0.6, rel=1e-3)


def test_every_part_passes_in_its_cpu_form(tmp_path, monkeypatch):
    """(preflight ran in the script above)"""
    cpu = torch.device("cpu")
    modules = (precision, race, trust, runtime, passes, memory, pipeline)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))  # the rendezvous folders go here
    (tmp_path / "tmp").mkdir()
    results = {m.__name__.rsplit(".", 1)[1]: m.run(cpu, tmp_path) for m in modules}
    assert not list((tmp_path / "tmp").glob("gpucheck-rendezvous-*"))  # and are gone
    assert list(results) == list(PARTS)[1:]
    # race and pipeline need CUDA streams and two GPUs: skipped
    assert {k: r["ok"] for k, r in results.items()} == {**dict.fromkeys(results, True), "race": None, "pipeline": None}
    assert set(results["runtime"]["runs"]) == {f"{m}/fp32" for m in runtime.CPU_METHODS}
    timed = results["passes"]["shapes"]["tiny-a"]["seconds"]
    assert set(timed) == set(passes.KINDS) and all(s > 0 for s in timed.values())
    if "profile" in results["passes"]:  # CPU times under load may fit no positive speeds; a GPU's must
        profile = yaml.safe_load(Path(results["passes"]["profile"]).read_text())
        assert Hardware.from_dict(profile["profile"]).name == profile["name"] == "cpu_measured"


def test_gpu_trust_a_check_in_which_no_part_ran_says_so_and_fails(tmp_path, capsys):
    """race cannot run on CPU (skipped): a check of race alone checked nothing, and exits 1 saying so."""
    assert gpucheck.main(["--device", "cpu", "--out", str(tmp_path), "--parts", "race"]) == 1
    assert "no part ran" in capsys.readouterr().out
    assert json.loads((tmp_path / "gpu-check.json").read_text())["verdict"].startswith("FAILED: no part ran")


def test_gpu_trust_the_node_form_refuses_one_gpu(capsys):
    with pytest.raises(SystemExit):
        gpucheck.main(["--gpus", "1"])
    assert "needs 2 or more GPUs" in capsys.readouterr().err
    args = gpucheck.parse(["--gpus", "8", "--device", "cpu"])
    assert args.parts == ["preflight", "trust", "pipeline"] and args.budget_s == 900.0
