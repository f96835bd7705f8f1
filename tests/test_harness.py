"""The harness through its real entry points: config groups, presets, refusals, sweeps that run, resume,
fail, log to W&B offline, and run on SLURM."""
import json
import os
import shutil
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from harness.sweep import run
from vp.config import RunConfig
from vp.reference import train_reference

ROOT = Path(__file__).parents[1]
CONF = str(ROOT / "conf")


def sweep(tmp_path, *overrides, report=False, logger="off"):
    """harness.sweep in this process (compose + run, as @hydra.main does); returns (exit code, log lines)."""
    overrides = [f"results_dir={tmp_path}/results", f"reports_dir={tmp_path}/reports", f"report={report}",
                 f"logger={logger}", f"cluster.folder={tmp_path}/submitit", *overrides]
    lines = []
    with initialize_config_dir(CONF, version_base="1.3"):
        cfg = compose("config", overrides=overrides)
        code = run(cfg, overrides, log=lines.append)
    return code, lines


def records(tmp_path, experiment="smoke"):
    return [json.loads(p.read_text()) for p in sorted((tmp_path / "results" / experiment).glob("*.json"))]


@pytest.mark.parametrize("group", ["model", "vocab", "method", "cluster", "logger", "hardware", "experiment"])
def test_every_config_group_option_composes(group):
    options = sorted(p.stem for p in (ROOT / "conf" / group).glob("*.yaml"))
    assert options
    with initialize_config_dir(CONF, version_base="1.3"):
        for option in options:
            extra = ["cluster.partition=x"] if (group, option) == ("cluster", "slurm") else []
            cfg = compose("config", overrides=[f"{group}={option}", *extra])
            assert cfg[group if group != "experiment" else "experiment"] is not None


@pytest.mark.parametrize("overrides,jobs", [
    ([], 18),
    (["experiment=paper_1f1b", "backend=sim"], 192),
    (["experiment=paper_1f1b", "cluster=slurm", "cluster.partition=gpu"], 192),
    (["experiment=paper_vhalf", "backend=sim"], 72),
    (["experiment=vocab_padding", "backend=sim"], 4),
])
def test_presets_dry_run(tmp_path, overrides, jobs):
    code, lines = sweep(tmp_path, "dry_run=true", *overrides)
    assert code == 0
    assert f": {jobs} jobs, 0 done, {jobs} to run" in lines[0]
    assert len(lines) == jobs + 1
    assert not (tmp_path / "results").exists()


SMALL = ["grid.product.vocab=[2k]", "grid.product.method=[baseline,vocab-2]"]


@pytest.mark.parametrize("overrides,message", [
    (["grid.product.method=[baseline,nope]"], "job 1 (vocab=2k method=nope): In 'config': Could not find 'method/nope'"),
    (["run.pp=3"], "layers=4 cannot be split evenly over the 3 stages"),
    (["vocab.pad_multiple=3"], "pad_multiple=3 is not divisible by the 2 vocabulary shards"),
    (["cluster.max_local_ranks=1"], "run.dp x run.pp = 2 local processes but cluster.max_local_ranks=1"),
    (["cluster=slurm"], "cluster.partition is not set; run with cluster=slurm cluster.partition=NAME"),
    (["cluster=slurm", "cluster.partition=debug", "cluster.tasks_per_node=3", "cluster.gpus_per_node=0"],
     "the world of 2 tasks (run.dp x run.pp) does not split over nodes of cluster.tasks_per_node=3"),
    (["run.microbatches=0"], "microbatches=0 must be a positive integer"),
    (["run.seq_len=-1"], "seq_len=-1 must be a positive integer"),
    (["model.hidden=0"], "hidden=0 must be a positive integer"),
    (["model.heads=3"], "hidden=64 is not divisible by heads=3"),
    (["model.layers=0"], "layers=0 must be a positive integer"),
    (["run.iterations=0"], "iterations=0 must be a positive integer"),
    (["run.warmup=9"], "warmup=9 must be 0..iterations-1"),
    (["run.device=tpu"], "device='tpu' is unknown"),
    (["run.dtype=fp8"], "dtype='fp8' is unknown"),
    (["run.dtype=bf16"], "dtype=bf16 needs device=cuda"),
    (["run.device=cuda"], "run.device=cuda needs 2 GPUs here but 0 are visible"),
    (["backend=quantum"], "backend=quantum is unknown; use backend=real or backend=sim"),
    (["logger.mode=loud"], "logger.mode=loud is unknown"),
    (["backend=sim", "hardware.name=tpu9"], "hardware=tpu9 has no built-in profile"),
    (["grid.product.method=[interleaved]", "run.microbatches=3"], "needs a multiple of pp=2; use 4"),
    (["grid.product.method=[redis]", "run.redis_last_layers=9"], "redis_last_layers=9 leaves fewer than one layer"),
    (["vocab.size=1"], "vocab_size=1 is smaller than the 2 vocabulary shards"),
    (["run.lr=0"], "lr=0 must be positive"),
    (["run.timeout_s=0"], "timeout_s=0 must be a positive number of seconds"),
    (["grid.product.method=[vhalf]", "run.pp=4"], "layers=4 cannot be split evenly over the 8 stages of method=vhalf"),
    (["+grid.shuffle=true"], "grid has unknown key(s) ['shuffle']"),
    (["grid.product.vocab=2k"], "grid.product.vocab must be a non-empty list"),
])
def test_invalid_sweeps_are_refused_before_submission(tmp_path, capsys, overrides, message):
    code, _ = sweep(tmp_path, *SMALL, *overrides)
    err = capsys.readouterr().err
    assert code == 2, err
    assert "sweep refused, nothing was submitted" in err and message in err
    assert not (tmp_path / "results").exists() and not (tmp_path / "submitit").exists()


def test_paper_grid_gives_redis_the_official_final_stage_layers(tmp_path):
    """paper_1f1b: redis leaves the official artifact's N = 4, 3, 2, 0 layers on the last of 8 stages for 32k..256k
    (remainders on the later stages, rank 0 never gains one); the other methods split layers evenly."""
    from harness.sweep import plan
    overrides = [f"results_dir={tmp_path}/results", "experiment=paper_1f1b", "backend=sim", "logger=off"]
    with initialize_config_dir(CONF, version_base="1.3"):
        jobs = plan(compose("config", overrides=overrides), overrides)
    layers = {(j.run.method, j.run.vocab_size): j.run.stage_layers for j in jobs if j.run.pp == 8}
    assert layers[("redis", 32000)] == [4] * 8
    assert layers[("redis", 64000)] == [4] * 6 + [5, 3]
    assert layers[("redis", 128000)] == [4] * 5 + [5, 5, 2]
    assert layers[("redis", 256000)] == [4] * 3 + [5] * 4 + [0]
    assert layers[("baseline", 256000)] == [4] * 8
    assert all(j.run.redis_last_layers is None for j in jobs if j.run.method != "redis")


def test_sim_sweep_writes_records_and_resumes(tmp_path):
    grid = ["experiment=paper_1f1b", "backend=sim",
            "grid.setups=[{model: 4b, run.pp: 8, vocab: 32k}, {model: 4b, run.pp: 8, vocab: 256k}]",
            "grid.product={run.seq_len: [2048], method: [baseline, vocab-2]}"]
    code, lines = sweep(tmp_path, *grid)
    assert code == 0 and "4 jobs, 0 done, 4 to run" in lines[0]
    recs = records(tmp_path, "paper_1f1b")
    assert len(recs) == 4 and all(r["status"] == "ok" and r["backend"] == "sim" for r in recs)
    assert all(r["labels"] == {"model": "4b", "vocab": r["labels"]["vocab"], "hardware": "a100_80g"} for r in recs)
    code, lines = sweep(tmp_path, *grid)
    assert "4 jobs, 4 done, 0 to run" in lines[0]
    code, lines = sweep(tmp_path, *grid, "force=true")
    assert "4 jobs, 4 done, 4 to run" in lines[0]


def test_concurrent_sweeps_keep_every_record(tmp_path):
    """Two sweeps at once writing into one results folder: every record is there and whole."""
    base = [sys.executable, "-m", "harness.sweep", "experiment=vocab_padding", "backend=sim", "logger=off",
            "report=false", f"results_dir={tmp_path}/results"]
    procs = [subprocess.Popen(base + [f"grid.product={{vocab.pad_multiple: [{m}], method: [vocab-2, vhalf-vocab-2]}}"], cwd=ROOT,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE) for m in ("24,48", "96,192")]
    for p in procs:
        assert p.wait(timeout=300) == 0, p.stderr.read()
    recs = records(tmp_path, "vocab_padding")
    assert sorted(r["config"]["pad_multiple"] for r in recs) == [24, 24, 48, 48, 96, 96, 192, 192]


def test_local_sweep_interrupted_then_resumed(tmp_path):
    """Kill a real local sweep after its first record; a rerun runs only what is missing."""
    grid = ["grid.product.vocab=[2k]", "grid.product.method=[baseline,vocab-2,interlaced]", "run.iterations=2"]
    args = [sys.executable, "-m", "harness.sweep", "logger=off", "report=false", f"results_dir={tmp_path}/results",
            f"cluster.folder={tmp_path}/submitit", *grid]
    proc = subprocess.Popen(args, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    out = tmp_path / "results" / "smoke"
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and not list(out.glob("*.json")):
        time.sleep(0.2)
    os.killpg(proc.pid, 9)
    proc.wait()
    first = list(out.glob("*.json"))
    assert len(first) == 1, "the sweep should have been stopped after its first run"
    stamp = first[0].stat().st_mtime
    for path in out.iterdir():  # no half-written record: every file there is a whole record
        assert not path.name.endswith(".tmp") or path.name.startswith(".")
    code, lines = sweep(tmp_path, *grid)
    assert code == 0 and "3 jobs, 1 done, 2 to run" in lines[0]
    assert first[0].stat().st_mtime == stamp
    recs = records(tmp_path)
    assert len(recs) == 3 and all(r["status"] == "ok" for r in recs)
    ref = recs[0]["metrics"]["loss"]
    for r in recs:  # every method reproduces the same loss curve
        assert r["metrics"]["loss"] == pytest.approx(ref, rel=1e-5)


def test_killed_rank_is_recorded_failed_and_the_sweep_goes_on(tmp_path):
    code, lines = sweep(tmp_path, "grid.product.vocab=[2k]", "grid.product.method=[vocab-2,baseline]",
                        "run.iterations=2", "run.timeout_s=20", "+fault={method: vocab-2, at: '1:F2:exit'}")
    assert code == 0
    recs = {r["config"]["method"]: r for r in records(tmp_path)}
    assert recs["vocab-2"]["status"] == "failed" and recs["vocab-2"]["metrics"] == {}
    err = recs["vocab-2"]["error"]  # the culprit first, then what every rank reported
    assert err.startswith("rank 1: ended without a Python error") and "rank 0 failed at iteration 0" in err
    assert recs["baseline"]["status"] == "ok"
    assert any("failed in" in line for line in lines) and "1 failed, 1 ok" in lines[-1]


def _wandb_summary_keys(run_dir: Path) -> set[str]:
    """Keys of the summary records in an offline run's transaction log (LevelDB-log framing of protobufs)."""
    from wandb.proto import wandb_internal_pb2 as pb

    data = next(run_dir.glob("run-*.wandb")).read_bytes()
    pos, block, chunks, buf = 7, 32768, [], b""
    while pos + 7 <= len(data):
        left = block - pos % block
        if left < 7:
            pos += left
            continue
        _, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        pos += 7
        piece, pos = data[pos:pos + length], pos + length
        if kind == 1:
            chunks.append(piece)
        elif kind in (2, 3):
            buf += piece
        elif kind == 4:
            chunks.append(buf + piece)
            buf = b""
    keys = set()
    for chunk in chunks:
        rec = pb.Record()
        rec.ParseFromString(chunk)
        if rec.WhichOneof("record_type") == "summary":
            keys |= {item.key for item in rec.summary.update}
    return keys


def test_wandb_offline_run_is_written_and_no_secret_leaks(tmp_path, monkeypatch):
    secret = "sk-test-0123456789abcdef"
    monkeypatch.setenv("WANDB_API_KEY", secret)
    monkeypatch.chdir(tmp_path)
    code, _ = sweep(tmp_path, "grid.product.vocab=[2k]", "grid.product.method=[vocab-2]", "run.iterations=2",
                    logger="wandb", report=True)
    assert code == 0
    runs = list((tmp_path / "wandb").glob("offline-run-*"))
    assert len(runs) == 1
    assert {"status", "iteration_time_s", "tokens_per_s", "mfu", "max_peak_memory_bytes"} <= _wandb_summary_keys(runs[0])
    assert list(runs[0].glob("files/media/images/schedule_*.png"))
    for path in tmp_path.rglob("*"):
        if path.is_file():
            assert secret.encode() not in path.read_bytes(), path


def _slurm_up() -> bool:
    if not shutil.which("sinfo"):
        return False
    out = subprocess.run(["sinfo", "-h", "-o", "%P %a"], capture_output=True, text=True, timeout=20)
    return out.returncode == 0 and "up" in out.stdout


@pytest.mark.slurm
def test_sweep_through_slurm(tmp_path):
    """Two runs through sbatch: multi-task jobs (2 tasks each), gloo across the tasks, records checked."""
    if not _slurm_up():
        if os.environ.get("VP_REQUIRE_SLURM") == "1":
            pytest.fail("VP_REQUIRE_SLURM=1 but no SLURM answers here; run `make slurm-up` first")
        pytest.skip("no SLURM cluster here (make slurm-up starts one)")
    partition = subprocess.run(["sinfo", "-h", "-o", "%P"], capture_output=True, text=True).stdout.split()[0]
    code, lines = sweep(tmp_path, "cluster=slurm", f"cluster.partition={partition.rstrip('*')}",
                        "cluster.gpus_per_node=0", "cluster.cpus_per_task=1", "cluster.time_min=10",
                        "grid.product.vocab=[2k]", "grid.product.method=[baseline,vocab-2]", "run.iterations=2")
    assert code == 0, lines
    recs = records(tmp_path)
    assert len(recs) == 2 and all(r["status"] == "ok" for r in recs), [r["error"] for r in recs]
    assert all(r["env"]["world_size"] == 2 for r in recs)
    assert recs[0]["metrics"]["loss"] == pytest.approx(recs[1]["metrics"]["loss"], rel=1e-5)


@pytest.mark.slurm
def test_mesh_job_spans_two_slurm_nodes(tmp_path):
    """A dp 2 x pp 2 run through sbatch on two nodes (2 tasks each): the ranks meet at the first node's
    address from SLURM's node record (emulated node names do not resolve) and train like one process."""
    if not _slurm_up():
        if os.environ.get("VP_REQUIRE_SLURM") == "1":
            pytest.fail("VP_REQUIRE_SLURM=1 but no SLURM answers here; run `make slurm-up` first")
        pytest.skip("no SLURM cluster here (make slurm-up starts one)")
    nodes = subprocess.run(["sinfo", "-h", "-N", "-o", "%N"], capture_output=True, text=True).stdout.split()
    if len(set(nodes)) < 2:
        if os.environ.get("VP_REQUIRE_SLURM") == "1":
            pytest.fail(f"VP_REQUIRE_SLURM=1 but SLURM has one node ({nodes}); scripts/slurm-up.sh starts two")
        pytest.skip("SLURM has a single node here")
    partition = subprocess.run(["sinfo", "-h", "-o", "%P"], capture_output=True, text=True).stdout.split()[0]
    code, lines = sweep(tmp_path, "cluster=slurm", f"cluster.partition={partition.rstrip('*')}",
                        "cluster.gpus_per_node=0", "cluster.cpus_per_task=1", "cluster.tasks_per_node=2",
                        "cluster.time_min=10", "run.dp=2", "run.microbatches=4", "grid.product.vocab=[2k]",
                        "grid.product.method=[vocab-2]", "run.iterations=2")
    assert code == 0, lines
    (rec,) = records(tmp_path)
    assert rec["status"] == "ok", rec["error"]
    assert rec["env"]["world_size"] == 4 and len(rec["env"]["nodes"]) == 2
    cfg = RunConfig.from_dict(rec["config"])
    ref, _ = train_reference(cfg)
    assert rec["metrics"]["loss"] == pytest.approx(ref, rel=1e-5)
