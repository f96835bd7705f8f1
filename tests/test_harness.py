"""The harness through its real entry points: config groups, presets, Hydra's idioms (-m sweeps, axis
overrides, --help, launchers), refusals, sweeps that run, resume, fail, stop on Ctrl-C, log to W&B offline,
write traces, and run on SLURM."""
import json
import os
import shutil
import signal
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from harness.sweep import run
from vp.config import RunConfig
from vp.reference import train_reference
from vp.schedule import build

ROOT = Path(__file__).parents[1]
CONF = str(ROOT / "conf")
TINY = ["model=tiny", "run.seq_len=64"]  # the smoke experiment's model is too large for tests


def sweep(tmp_path, *overrides, report=False, logger="off"):
    """harness.sweep in this process (compose + run, as @hydra.main does); returns (exit code, log lines)."""
    overrides = [f"results_dir={tmp_path}/results", f"reports_dir={tmp_path}/reports", f"report={report}",
                 f"logger={logger}", f"cluster.folder={tmp_path}/submitit", *overrides]
    lines = []
    with initialize_config_dir(CONF, version_base="1.3"):
        code = run(overrides, log=lines.append)
    return code, lines


def cli(*args, cwd=ROOT, timeout=120):
    return subprocess.run([sys.executable, "-m", "harness.sweep", *args], capture_output=True, text=True, cwd=cwd,
                          timeout=timeout)


def records(tmp_path, experiment="smoke"):
    return [json.loads(p.read_text()) for p in sorted((tmp_path / "results" / experiment).glob("????????????.json"))]


def files_under(path: Path) -> list[Path]:
    return [p for p in path.rglob("*") if p.is_file()] if path.exists() else []


@pytest.mark.parametrize("group", ["model", "vocab", "method", "cluster", "logger", "hardware", "experiment"])
def test_every_config_group_option_composes_to_its_file(group):
    options = sorted(p.stem for p in (ROOT / "conf" / group).glob("*.yaml"))
    assert options
    with initialize_config_dir(CONF, version_base="1.3"):
        for option in options:
            extra = ["cluster.partition=x"] if (group, option) == ("cluster", "slurm") else []
            cfg = compose("config", overrides=[f"{group}={option}", *extra])
            values = OmegaConf.load(ROOT / "conf" / group / f"{option}.yaml")
            values = {k: v for k, v in OmegaConf.to_container(values).items() if k != "defaults"}
            node = cfg if group == "experiment" else cfg[group]
            for key, value in values.items():  # every value of the file is in the composed config, typed
                if key == "partition" and extra:
                    continue
                got = OmegaConf.to_container(node[key]) if OmegaConf.is_config(node[key]) else node[key]
                if isinstance(got, dict):
                    assert {k: got[k] for k in value} == value, (option, key)
                else:
                    assert got == value, (option, key)


@pytest.mark.parametrize("overrides,jobs", [
    ([], 10),
    (["experiment=paper_1f1b", "cluster=slurm", "cluster.partition=gpu"], 192),  # backend=sim plans the same jobs
    (["experiment=paper_vhalf", "backend=sim"], 72),
    (["experiment=vocab_padding", "backend=sim"], 4),
])
def test_presets_dry_run(tmp_path, overrides, jobs):
    code, lines = sweep(tmp_path, "dry_run=true", *overrides)
    assert code == 0
    assert f": {jobs} jobs, 0 done, {jobs} to run" in lines[0]
    assert len(lines) == jobs + 1
    assert not (tmp_path / "results").exists()


def test_a_value_for_a_grid_axis_replaces_the_axis(tmp_path):
    code, lines = sweep(tmp_path, "dry_run=true", "method=vocab-1", "vocab=8k")
    assert code == 0 and ": 1 jobs, 0 done, 1 to run" in lines[0]
    assert lines[1].split()[-2:] == ["method=vocab-1", "vocab=8k"]
    code, lines = sweep(tmp_path, "dry_run=true", "experiment=paper_1f1b", "backend=sim", "model=10b")
    assert code == 0 and ": 64 jobs" in lines[0]  # one of the three setups: model=10b (with its 16 ranks)
    assert all("model=10b run.pp=16" in line for line in lines[1:])
    code, lines = sweep(tmp_path, "dry_run=true", "~grid")  # no grid: the base config is the one job
    assert code == 0 and ": 1 jobs" in lines[0] and "(base config)" in lines[1]
    # end to end through the command line: the one job runs and is the only record
    out = cli("backend=sim", "logger=off", "report=false", f"results_dir={tmp_path}/e2e", "method=vocab-1", "vocab=8k")
    assert out.returncode == 0 and "1 jobs, 0 done, 1 to run" in out.stdout, out.stderr
    [rec] = [json.loads(p.read_text()) for p in (tmp_path / "e2e" / "smoke").glob("*.json")]
    assert rec["config"]["method"] == "vocab-1" and rec["config"]["vocab_size"] == 8000


def test_multirun_sweeps_exactly_the_given_values_end_to_end(tmp_path):
    """-m through Hydra's command line: two values give two jobs, checked, dispatched, then skipped as done."""
    args = ["-m", "experiment=paper_1f1b", "backend=sim", "logger=off", "report=false", f"results_dir={tmp_path}",
            "grid.setups=[{model: 4b, run.pp: 8}]", "run.seq_len=2048", "vocab=32k", "method=baseline,vocab-2"]
    out = cli(*args)
    assert out.returncode == 0, out.stderr
    assert "2 jobs, 0 done, 2 to run" in out.stdout
    recs = [json.loads(p.read_text()) for p in (tmp_path / "paper_1f1b").glob("*.json")]
    assert sorted(r["config"]["method"] for r in recs) == ["baseline", "vocab-2"]
    assert cli(*args).stdout.startswith("experiment paper_1f1b: 2 jobs, 2 done, 0 to run")
    bad = cli(*args[:-1], "method=vocab-2,nope")
    assert bad.returncode == 2 and "Could not find 'method/nope'" in bad.stderr
    assert len(list((tmp_path / "paper_1f1b").glob("*.json"))) == 2  # nothing more written


def test_help_shows_the_projects_usage_and_closed_pipes_are_quiet():
    out = cli("--help")
    assert out.returncode == 0 and out.stdout.startswith("python -m harness.sweep [-m]")
    assert "-m method=baseline,vocab-2" in out.stdout and "docs/harness.md" in out.stdout
    piped = subprocess.run(f"{sys.executable} -m harness.sweep dry_run=true | head -2",
                           shell=True, capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert len(piped.stdout.splitlines()) == 2 and "Traceback" not in piped.stderr and "Broken" not in piped.stderr


SMALL = [*TINY, "grid.product.vocab=[2k]", "grid.product.method=[baseline,vocab-2]"]


@pytest.mark.parametrize("overrides,message", [
    (["grid.product.method=[baseline,nope]"], "job 1 (vocab=2k method=nope): In 'config': Could not find 'method/nope'"),
    (["run.pp=3"], "layers=4 cannot be split evenly over the 3 stages"),
    (["vocab.pad_multiple=3"], "pad_multiple=3 is not divisible by the 2 vocabulary shards"),
    (["cluster.max_local_ranks=1"], "run.dp x run.pp x run.tp = 2 local processes but cluster.max_local_ranks=1"),
    (["cluster=slurm"], "cluster.partition is not set; run with cluster=slurm cluster.partition=NAME"),
    (["cluster=slurm", "cluster.partition=debug", "cluster.tasks_per_node=3", "cluster.gpus_per_node=0"],
     "the world of 2 tasks (run.dp x run.pp x run.tp) does not split over nodes of cluster.tasks_per_node=3"),
    (["run.microbatches=0"], "microbatches=0 must be a positive integer"),
    (["run.seq_len=-1"], "seq_len=-1 must be a positive integer"),
    (["model.hidden=0"], "hidden=0 must be a positive integer"),
    (["model.heads=3"], "hidden=64 is not divisible by heads=3"),
    (["model.layers=0"], "layers=0 must be a positive integer"),
    (["model.layers=???"], "model.layers is not set; give it on the command line"),
    (["run.iterations=0"], "iterations=0 must be a positive integer"),
    (["run.warmup=9"], "warmup=9 must be 0..iterations-1"),
    (["run.device=tpu"], "device='tpu' is unknown"),
    (["run.dtype=fp8"], "dtype='fp8' is unknown"),
    (["run.dtype=bf16"], "dtype=bf16 needs device=cuda"),
    (["run.device=cuda"], "run.device=cuda needs 2 GPUs here but 0 are visible"),
    (["backend=quantum"], "backend=quantum is unknown; use one of real, sim"),
    (["logger.mode=loud"], "logger.mode=loud is unknown; use one of offline, online, disabled"),
    (["backend=sim", "hardware.name=tpu9"], "hardware=tpu9 has no built-in profile"),
    (["grid.product.method=[interleaved]", "run.microbatches=3"], "needs a multiple of pp=2; use 4"),
    (["grid.product.method=[redis]", "run.redis_last_layers=9"], "redis_last_layers=9 leaves fewer than one layer"),
    (["vocab.size=1"], "vocab_size=1 is smaller than the 2 vocabulary shards"),
    (["run.lr=0"], "lr=0.0 must be positive"),
    (["run.timeout_s=0"], "timeout_s=0.0 must be a positive number of seconds"),
    (["grid.product.method=[vhalf]", "run.pp=4"], "layers=4 cannot be split evenly over the 8 stages of method=vhalf"),
    (["+grid.shuffle=true"], "grid.shuffle is not a field of grid; its fields are setups, product"),
    (["grid.product.vocab=2k"], "grid.product.vocab=2k: "),
    (["grid.product.seq=[64]"], "grid.product.seq does not exist in grid.product; add it with +grid.product.seq="),
    (["forse=true"], "forse is not a field of the sweep config; did you mean force?"),
    # strings where booleans, numbers and limits belong, and keys that do not exist
    (["force=no2"], "force=no2: Value 'no2' is not a valid bool (type str); force takes a value of type bool"),
    (["dry_run=maybe"], "dry_run=maybe: Value 'maybe' is not a valid bool"),
    (["run.pp=two"], "run.pp=two: Value 'two' of type 'str' could not be converted to Integer; run.pp takes a value "
                     "of type int"),
    (["cluster.timeout_min=0"], "cluster.timeout_min=0 is out of range; use 1..10080"),
    (["cluster=slurm", "cluster.partition=p", "cluster.cpus_per_task=0"], "cluster.cpus_per_task=0 is out of range"),
    (["limits.memory_gb=0"], "limits.memory_gb=0.0 is out of range"),
    (["+run.microbatch=8"], "run.microbatch is not a field of run; did you mean run.microbatches?"),
    (["run.microbatch=8"], "run.microbatch is not a field of run; did you mean run.microbatches?"),
    (["cluster.partition=x"], "cluster.partition is not a field of cluster; its fields are name, max_local_ranks"),
    # resources and sizes
    (["run.seq_len=10000000"], "= 10000000 tokens per microbatch is above the sanity limit of 131072; use a smaller "
                               "seq_len, or raise limits.tokens_per_microbatch"),
    (["limits.memory_gb=0.5"], "GiB are available; use a smaller seq_len, micro_batch_size, microbatches, hidden or "
                               "vocabulary, or set limits.memory_gb"),
    (["backend=sim", "run.pp=1024", "run.microbatches=1024", "model.layers=1024"],
     "is above the schedule size limit of 65536"),
    # the fault spec, checked against the schedule
    (["fault={method: vocab-2, at: '7:F2'}"], "fault rank 7 does not exist: dp=1 x pp=2 has ranks 0..1"),
    (["fault={method: vocab-2, at: '1:F99'}"], "fault action 'F99' is not executed by rank 1 of method=vocab-2"),
    (["fault={method: vocab-2, at: '1:F2:explode'}"], "fault '1:F2:explode': use RANK:ACTION[:exit|raise|hang|oom]"),
    (["fault={method: vocab-2}"], "fault.at is not set"),
    # outputs and launchers
    (["results_dir=/proc/nope"], "results_dir=/proc/nope/smoke: cannot write in /proc"),
    (["grid.setups=[{model: tiny}, {model: small}]", "model=7b"], "model=7b matches none of the experiment's "
                                                                   "setups (model: small, tiny)"),
])
def test_invalid_sweeps_are_refused_before_submission(tmp_path, capsys, overrides, message):
    code, _ = sweep(tmp_path, *SMALL, *overrides)
    err = capsys.readouterr().err
    assert code == 2, err
    assert "sweep refused, nothing was submitted" in err and message in err
    assert not files_under(tmp_path)


def test_refusals_at_the_real_entry_point(tmp_path):
    """Type errors are refused before Hydra's own composition error; Hydra's launchers and sweeper parameters
    are refused with a pointer; -m sweeps only a job's axes; cluster=slurm needs its commands."""
    cases = [(["force=maybe"], "force=maybe: Value 'maybe' is not a valid bool"),
             (["hydra/launcher=submitit_slurm"], "use cluster=slurm cluster.partition=NAME"),
             (["hydra/launcher=submitit_local"], "not by a Hydra launcher"),
             (["hydra.sweeper.params={method: 'a,b'}"], "experiments list their axes in grid.product"),
             (["-m", "experiment=smoke,paper_1f1b"], "experiment is a setting of the whole sweep")]
    for args, message in cases:
        out = cli(*args, f"results_dir={tmp_path}/r", cwd=tmp_path)
        assert out.returncode == 2, (args, out.stderr)
        assert message in out.stderr and "Traceback" not in out.stderr, (args, out.stderr)
    env = {**os.environ, "PATH": str(Path(sys.executable).parent)}  # no sbatch there
    out = subprocess.run([sys.executable, "-m", "harness.sweep", "cluster=slurm", "cluster.partition=debug",
                          "cluster.gpus_per_node=0", *SMALL, f"results_dir={tmp_path}/r"], capture_output=True,
                         text=True, cwd=ROOT, env=env, timeout=120)
    assert out.returncode == 2 and "cluster=slurm needs sbatch and squeue on PATH" in out.stderr
    assert "make slurm-up" in out.stderr and not files_under(tmp_path)


def test_a_report_folder_of_other_results_is_not_overwritten(tmp_path):
    grid = ["experiment=paper_1f1b", "backend=sim", "grid.setups=[{model: 4b, run.pp: 8}]", "run.seq_len=2048",
            "vocab=32k", "method=vocab-2"]
    assert sweep(tmp_path, *grid, report=True)[0] == 0
    readme = tmp_path / "reports" / "paper_1f1b" / "README.md"
    before = readme.read_text()
    other = tmp_path / "other"
    code, _ = sweep(other, *grid, report=True, )
    assert code == 0 and (other / "reports" / "paper_1f1b" / "README.md").exists()
    with initialize_config_dir(CONF, version_base="1.3"):
        code = run([f"results_dir={other}/results", f"reports_dir={tmp_path}/reports", "logger=off", *grid])
    assert code == 2 and readme.read_text() == before


def test_paper_grid_gives_redis_the_official_final_stage_layers(tmp_path):
    """paper_1f1b: redis leaves the official artifact's N = 4, 3, 2, 0 layers on the last of 8 stages for 32k..256k
    (remainders on the later stages, rank 0 never gains one); the other methods split layers evenly."""
    from harness.sweep import plan

    overrides = [f"results_dir={tmp_path}/results", "experiment=paper_1f1b", "backend=sim", "logger=off", "model=4b"]
    with initialize_config_dir(CONF, version_base="1.3"):
        _, jobs = plan(overrides)
    layers = {(j.run.method, j.run.vocab_size): j.run.stage_layers for j in jobs if j.run.pp == 8}
    assert layers[("redis", 32000)] == [4] * 8
    assert layers[("redis", 64000)] == [4] * 6 + [5, 3]
    assert layers[("redis", 128000)] == [4] * 5 + [5, 5, 2]
    assert layers[("redis", 256000)] == [4] * 3 + [5] * 4 + [0]
    assert layers[("baseline", 256000)] == [4] * 8
    assert all(j.run.redis_last_layers is None for j in jobs if j.run.method != "redis")


def test_sim_sweep_writes_records_and_resumes_and_is_not_logged_unless_asked(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    grid = ["experiment=paper_1f1b", "backend=sim",
            "grid.setups=[{model: 4b, run.pp: 8, vocab: 32k}, {model: 4b, run.pp: 8, vocab: 256k}]",
            "grid.product={run.seq_len: [2048], method: [baseline, vocab-2]}"]
    code, lines = sweep(tmp_path, *grid, logger="wandb")
    assert code == 0 and "4 jobs, 0 done, 4 to run" in lines[0]
    assert "not logged to W&B; logger.sim=true logs them" in lines[-1] and not (tmp_path / "wandb").exists()
    recs = records(tmp_path, "paper_1f1b")
    assert len(recs) == 4 and all(r["status"] == "ok" and r["backend"] == "sim" for r in recs)
    assert all(r["labels"] == {"model": "4b", "vocab": r["labels"]["vocab"], "hardware": "a100_80g"} for r in recs)
    code, lines = sweep(tmp_path, *grid, "force=no")  # a YAML boolean: false, not a truthy string
    assert "4 jobs, 4 done, 0 to run" in lines[0]
    code, lines = sweep(tmp_path, *grid, "force=true")
    assert "4 jobs, 4 done, 4 to run" in lines[0]


def test_concurrent_sweeps_keep_every_record(tmp_path):
    """Two sweeps at once writing into one results folder: every record is there and whole."""
    base = [sys.executable, "-m", "harness.sweep", "experiment=vocab_padding", "backend=sim", "logger=off",
            "report=false", f"results_dir={tmp_path}/results"]
    procs = [subprocess.Popen(base + [f"grid.product={{vocab.pad_multiple: [{m}], method: [vocab-2, vhalf-vocab-2]}}"],
                              cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE) for m in ("24,48", "96,192")]
    for p in procs:
        assert p.wait(timeout=300) == 0, p.stderr.read()
    recs = records(tmp_path, "vocab_padding")
    assert sorted(r["config"]["pad_multiple"] for r in recs) == [24, 24, 48, 48, 96, 96, 192, 192]


def _session(pid: int) -> list[int]:
    """Live processes of the session led by pid (the sweep and everything it started)."""
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[3]) == pid and fields[0] != "Z":
                out.append(int(entry))
    return out


def check_trace(record: dict, trace: Path) -> None:
    """One event per executed action of every measured iteration, in schedule order, times monotone per rank."""
    cfg = record["config"]
    sched = build(cfg["method"], cfg["pp"], cfg["microbatches"], cfg["chunks"])
    events = [e for e in json.loads(trace.read_text())["traceEvents"] if e.get("cat") == "action"]
    measured = cfg["iterations"] - cfg["warmup"]
    for rank in range(cfg["pp"]):
        mine = [e for e in events if e["pid"] == rank]
        assert [e["name"] for e in mine] == [a.text(sched.chunks > 1) for a in sched.ranks[rank]] * measured
        ends = [e["ts"] + e["dur"] for e in mine]
        assert all(a["ts"] <= b["ts"] and end <= b["ts"] + 1e-3 for a, b, end in zip(mine, mine[1:], ends))


def test_local_sweep_interrupted_then_resumed(tmp_path):
    """Ctrl-C a real local sweep after its first record: it stops with every process it started within 10 s and
    says how to resume; a rerun runs only what is missing. Every record has its trace."""
    grid = [*TINY, "grid.product.vocab=[2k]", "grid.product.method=[baseline,vocab-2,interlaced]",
            "run.iterations=2"]
    args = [sys.executable, "-m", "harness.sweep", "logger=off", "report=false", f"results_dir={tmp_path}/results",
            f"cluster.folder={tmp_path}/submitit", *grid]
    proc = subprocess.Popen(args, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    out = tmp_path / "results" / "smoke"
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and not list(out.glob("????????????.json")):
        time.sleep(0.2)
    time.sleep(2)  # into the second run
    os.killpg(proc.pid, signal.SIGINT)  # what a terminal's Ctrl-C does
    stopped = time.monotonic()
    code = proc.wait(timeout=30)
    while _session(proc.pid) and time.monotonic() - stopped < 10:
        time.sleep(0.1)
    assert not _session(proc.pid), "processes left running 10 s after Ctrl-C"
    assert code == 130 and "rerun the same command to resume" in proc.stderr.read()
    first = list(out.glob("????????????.json"))
    assert len(first) == 1, "the sweep should have been stopped after its first run"
    stamp = first[0].stat().st_mtime
    assert not [p for p in out.iterdir() if p.name.endswith(".tmp") and not p.name.startswith(".")]
    code, lines = sweep(tmp_path, *grid)
    assert code == 0 and "3 jobs, 1 done, 2 to run" in lines[0]
    assert first[0].stat().st_mtime == stamp
    recs = records(tmp_path)
    assert len(recs) == 3 and all(r["status"] == "ok" for r in recs)
    ref = recs[0]["metrics"]["loss"]
    for r in recs:  # every method reproduces the same loss curve, and wrote its measured timeline
        assert r["metrics"]["loss"] == pytest.approx(ref, rel=1e-5)
        check_trace(r, out / f"{r['run_id']}.trace.json")


def test_killed_rank_is_recorded_failed_and_a_failed_forced_rerun_keeps_the_ok_record(tmp_path):
    grid = [*TINY, "grid.product.vocab=[2k]", "grid.product.method=[vocab-2,baseline]", "run.iterations=2",
            "run.timeout_s=20"]
    code, lines = sweep(tmp_path, *grid, "fault={method: vocab-2, at: '1:F2:exit'}")
    assert code == 0
    recs = {r["config"]["method"]: r for r in records(tmp_path)}
    assert recs["vocab-2"]["status"] == "failed" and recs["vocab-2"]["metrics"] == {}
    err = recs["vocab-2"]["error"]  # the culprit first, then what every rank reported
    assert err.startswith("rank 1: ended without a Python error (killed, crashed or hung) in iteration 0, step ")
    assert err.split(";")[0].endswith("(F2)") and "rank 0 failed at iteration 0" in err
    assert recs["baseline"]["status"] == "ok"
    assert any("failed in" in line for line in lines) and "1 failed, 1 ok" in lines[-1]
    # a forced rerun that fails keeps the earlier ok record; the record was just written (as when the rerun follows
    # within a second), so a check by modification time would take it for the rerun's own
    path = tmp_path / "results" / "smoke" / f"{recs['baseline']['run_id']}.json"
    ok = path.read_text()
    os.utime(path)
    code, lines = sweep(tmp_path, *grid, "grid.product.method=[baseline]", "force=true",
                        "fault={method: baseline, at: '0:B1:exit'}")
    assert code == 0 and any("the earlier ok record is kept" in line for line in lines), lines
    assert path.read_text() == ok


def _wandb_records(run_dir: Path, kind: str) -> list:
    """The records of one kind in an offline run's transaction log (LevelDB-log framing of protobufs)."""
    from wandb.proto import wandb_internal_pb2 as pb

    data = next(run_dir.glob("run-*.wandb")).read_bytes()
    pos, block, chunks, buf = 7, 32768, [], b""
    while pos + 7 <= len(data):
        left = block - pos % block
        if left < 7:
            pos += left
            continue
        _, length, frame = struct.unpack("<IHB", data[pos:pos + 7])
        pos += 7
        piece, pos = data[pos:pos + length], pos + length
        if frame == 1:
            chunks.append(piece)
        elif frame in (2, 3):
            buf += piece
        elif frame == 4:
            chunks.append(buf + piece)
            buf = b""
    out = []
    for chunk in chunks:
        rec = pb.Record()
        rec.ParseFromString(chunk)
        if rec.WhichOneof("record_type") == kind:
            out.append(getattr(rec, kind))
    return out


def test_wandb_offline_one_run_per_record_with_the_records_numbers(tmp_path, monkeypatch):
    secret = "sk-test-0123456789abcdef"
    monkeypatch.setenv("WANDB_API_KEY", secret)
    monkeypatch.chdir(tmp_path)
    grid = [*TINY, "grid.product.vocab=[2k]", "grid.product.method=[vocab-2]", "run.iterations=3"]
    assert sweep(tmp_path, *grid, logger="wandb", report=True)[0] == 0
    assert sweep(tmp_path, *grid, "force=true", logger="wandb")[0] == 0  # a rerun replaces, never adds, a run
    [rec] = records(tmp_path)
    runs = list((tmp_path / "wandb").glob("offline-run-*"))
    assert [r.name.rsplit("-", 1)[1] for r in runs] == [rec["run_id"]]
    summary = {}
    for update in _wandb_records(runs[0], "summary"):
        summary.update({item.key: json.loads(item.value_json) for item in update.update})
    m = rec["metrics"]
    assert summary["iteration_time_s"] == m["iteration_time_s"]  # the record's median, not the last iteration
    assert summary["mfu"] == m["mfu"] and summary["tokens_per_s"] == m["tokens_per_s"]
    assert summary["max_peak_memory_bytes"] == max(m["peak_memory_bytes"]) and summary["status"] == "ok"
    [run_record] = _wandb_records(runs[0], "run")
    assert run_record.display_name == "vocab-2 pp2 tiny V2k seq64" and run_record.run_id == rec["run_id"]
    [table] = runs[0].glob("files/media/table/per_rank_*.table.json")
    rows = json.loads(table.read_text())["data"]
    assert [row[1] for row in rows] == m["peak_memory_bytes"] and [row[2] for row in rows] == m["bubble_fraction"]
    assert list(runs[0].glob("files/media/images/timeline/measured_*.png"))
    assert list(runs[0].glob("files/media/images/timeline/replayed_*.png"))
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
                        "cluster.gpus_per_node=0", "cluster.cpus_per_task=1", "cluster.time_min=10", *TINY,
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
                        "cluster.time_min=10", *TINY, "run.dp=2", "run.microbatches=4", "grid.product.vocab=[2k]",
                        "grid.product.method=[vocab-2]", "run.iterations=2")
    assert code == 0, lines
    (rec,) = records(tmp_path)
    assert rec["status"] == "ok", rec["error"]
    assert rec["env"]["world_size"] == 4 and len(rec["env"]["nodes"]) == 2
    cfg = RunConfig.from_dict(rec["config"])
    ref, _ = train_reference(cfg)
    assert rec["metrics"]["loss"] == pytest.approx(ref, rel=1e-5)


def test_make_declares_only_targets_that_have_rules():
    text = (ROOT / "Makefile").read_text()
    declared = text.split(".PHONY:", 1)[1].splitlines()[0].split()
    for target in declared:
        out = subprocess.run(["make", "-n", target], capture_output=True, text=True, cwd=ROOT, timeout=60)
        assert out.returncode == 0 and out.stdout.strip(), (target, out.stderr)
    helped = subprocess.run(["make", "help"], capture_output=True, text=True, cwd=ROOT, timeout=60).stdout
    assert all(target in helped for target in declared if target != "help")


def test_make_venv_reinstalls_torch_when_another_build_is_asked_for(tmp_path):
    """The stamp names the requested torch: another TORCH reinstalls it (--force-reinstall), the same one is a
    no-op. A stand-in python records what pip was asked to do."""
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    log = tmp_path / "pip.log"
    fake = venv / "bin" / "python"
    fake.write_text(f"#!/bin/sh\necho \"$*\" >> {log}\n")
    fake.chmod(0o755)
    make = ["make", "--no-print-directory", "venv", f"VENV={venv}"]
    assert subprocess.run([*make, "TORCH=torch==1.0"], cwd=ROOT, capture_output=True, timeout=60).returncode == 0
    first = log.read_text()
    assert "install" in first and "torch==1.0" in first and "--force-reinstall" not in first
    assert subprocess.run([*make, "TORCH=torch==1.0"], cwd=ROOT, capture_output=True, timeout=60).returncode == 0
    assert log.read_text() == first  # up to date
    assert subprocess.run([*make, "TORCH=torch==2.0"], cwd=ROOT, capture_output=True, timeout=60).returncode == 0
    assert "--force-reinstall torch==2.0" in log.read_text()[len(first):]
    assert len(list(venv.glob(".torch-*"))) == 1


def test_docs_and_code_cite_only_files_that_are_in_the_repository():
    """Every Markdown file a doc, a module or a test names exists (the repository's docs stand alone)."""
    import re

    named = re.compile(r"(?<![\w/.-])((?:[\w-]+/)*[\w-]+\.md)\b")
    # written by a run (reports/...), a placeholder (NAME.md) or in the paper's own artifact repository
    elsewhere = re.compile(r"reports/|tables\.md|NAME\.md|artifact/README\.md")
    sources = [ROOT / "README.md", ROOT / "Makefile", *ROOT.glob("docs/*.md"), *ROOT.glob("conf/**/*.yaml"),
               *[p for d in ("vp", "harness", "hydra_plugins", "scripts") for p in (ROOT / d).rglob("*.py")]]
    missing = []
    for src in sources:
        for ref in named.findall(src.read_text()):
            bases = (ROOT, src.parent, ROOT / "docs")
            if not elsewhere.search(ref) and not any((base / ref).exists() for base in bases):
                missing.append(f"{src.relative_to(ROOT)}: {ref}")
    assert not missing, missing
