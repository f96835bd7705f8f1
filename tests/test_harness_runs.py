"""Sweeps that run: simulated and real, resumed, concurrent, interrupted by Ctrl-C, with a killed rank, a failed
forced rerun, W&B offline logging and traces."""
import json
from hashlib import sha1
import os
import signal
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest

from harness_util import ROOT, TINY, records, sweep
from procs import ctrl_c
from vp.schedule import build


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
    sweep_id = recs[0]["labels"]["sweep"]  # the sweep's id (harness.sweep.new_sweep_id), one for all its records
    assert all(r["labels"] == {"model": "4b", "vocab": r["labels"]["vocab"], "hardware": "a100_80g", "sweep": sweep_id}
               for r in recs)
    code, lines = sweep(tmp_path, *grid, "force=no")  # a YAML boolean: false, not a truthy string
    assert "4 jobs, 4 done, 0 to run" in lines[0]
    code, lines = sweep(tmp_path, *grid, "force=true")
    assert "4 jobs, 4 done, 4 to run" in lines[0]


def test_simulated_records_of_other_code_are_stale_and_simulated_again(tmp_path, monkeypatch):
    """A record predicted by other code (its simulator_version differs) is listed stale and simulated again into
    the same file; the version is a hash of the sources, so any change to them changes it."""
    from harness import sim

    grid = ["experiment=paper_1f1b", "backend=sim", "grid.setups=[{model: 4b, run.pp: 8, vocab: 32k}]",
            "grid.product={run.seq_len: [2048], method: [baseline, vocab-2]}"]
    assert sweep(tmp_path, *grid)[0] == 0
    paths = sorted((tmp_path / "results" / "paper_1f1b").glob("????????????.json"))
    recs = [json.loads(p.read_text()) for p in paths]
    assert [r["env"]["simulator_version"] for r in recs] == [sim.simulator_version()] * 2
    recs[0]["env"]["simulator_version"] = "0123456789ab"
    recs[0]["metrics"]["mfu"] = -1.0
    paths[0].write_text(json.dumps(recs[0]))
    code, lines = sweep(tmp_path, *grid, "dry_run=true")
    assert "2 jobs, 1 done, 1 to run" in lines[0] and "1 simulated by other code" in lines[0]
    assert sorted(line.split()[2] for line in lines[1:]) == ["done", "stale"]
    assert sweep(tmp_path, *grid)[0] == 0
    again = json.loads(paths[0].read_text())
    assert again["env"]["simulator_version"] == sim.simulator_version() and again["metrics"]["mfu"] > 0
    assert sorted((tmp_path / "results" / "paper_1f1b").glob("????????????.json")) == paths
    source = tmp_path / "src"
    source.mkdir()
    (source / "a.py").write_text("x = 1\n")
    monkeypatch.setattr(sim, "_SOURCES", (source,))
    sim.simulator_version.cache_clear()
    try:
        first = sim.simulator_version()
        (source / "a.py").write_text("x = 2\n")
        sim.simulator_version.cache_clear()
        assert sim.simulator_version() != first
    finally:
        sim.simulator_version.cache_clear()


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
    grid = [*TINY, "grid.product.vocab=[2k]", "grid.product.method=[baseline,vocab-2]", "run.iterations=2"]
    args = [sys.executable, "-m", "harness.sweep", "logger=off", "report=false", f"results_dir={tmp_path}/results",
            f"cluster.folder={tmp_path}/submitit", *grid]
    proc = subprocess.Popen(args, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    out = tmp_path / "results" / "smoke"
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and not list(out.glob("????????????.json")):
        time.sleep(0.2)
    time.sleep(2)  # into the second run
    code, left = ctrl_c(proc)  # what a terminal's Ctrl-C does
    assert not left, f"processes left running 10 s after Ctrl-C: {left}"
    assert code == 130 and "rerun the same command to resume" in proc.stderr.read()
    first = list(out.glob("????????????.json"))
    assert len(first) == 1, "the sweep should have been stopped after its first run"
    stamp = first[0].stat().st_mtime
    assert not [p for p in out.iterdir() if p.name.endswith(".tmp") and not p.name.startswith(".")]
    code, lines = sweep(tmp_path, *grid)
    assert code == 0 and "2 jobs, 1 done, 1 to run" in lines[0]
    assert first[0].stat().st_mtime == stamp
    recs = records(tmp_path)
    assert len(recs) == 2 and all(r["status"] == "ok" for r in recs)
    ref = recs[0]["metrics"]["loss"]
    for r in recs:  # every method reproduces the same loss curve, and wrote its measured timeline
        assert r["metrics"]["loss"] == pytest.approx(ref, rel=1e-5)
        check_trace(r, out / f"{r['run_id']}.trace.json")


def test_ctrl_c_while_a_job_is_being_started_is_held_until_it_can_be_stopped():
    """A SIGINT during submit (the job's controller forked, its handle not yet returned) is held and reported, so
    the sweep stops that job instead of leaving it running; the handler is restored after."""
    from harness.dispatch import _sigint_held

    with _sigint_held() as interrupted:
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.1)  # Python runs the handler here: no KeyboardInterrupt inside the block
    assert interrupted == [True] and signal.getsignal(signal.SIGINT) is signal.default_int_handler
    with pytest.raises(KeyboardInterrupt):
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.1)


# one real local sweep for the next two tests (each of its runs starts fresh interpreters that import torch): vocab-2
# with a rank killed beside an ok baseline, logged to W&B offline with its report, then a forced rerun of baseline
# that succeeds and replaces its W&B run
LOGGED = [*TINY, "grid.product.vocab=[2k]", "grid.product.method=[vocab-2,baseline]", "run.iterations=3",
          "run.timeout_s=20"]
SECRET = "sk-test-0123456789abcdef"


@pytest.fixture(scope="module")
def killed_and_logged(tmp_path_factory):
    root = tmp_path_factory.mktemp("logged")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("WANDB_API_KEY", SECRET)
        patch.chdir(root)
        # logger.live=true: the runs' W&B runs open as they start (harness.live), as on a cluster
        first = sweep(root, *LOGGED, "fault={method: vocab-2, at: '1:F2:exit'}", "logger.live=true", logger="wandb",
                      report=True)
        rerun = sweep(root, *LOGGED, "grid.product.method=[baseline]", "force=true", "logger.live=true",
                      logger="wandb")
    return root, first, rerun


def test_killed_rank_is_recorded_failed_and_a_failed_forced_rerun_keeps_the_ok_record(killed_and_logged):
    tmp_path, (code, lines), _ = killed_and_logged
    assert code == 0
    recs = {r["config"]["method"]: r for r in records(tmp_path)}
    assert recs["vocab-2"]["status"] == "failed" and recs["vocab-2"]["metrics"] == {}
    err = recs["vocab-2"]["error"]  # the culprit first, then what every rank reported
    assert err.startswith("rank 1: ended without a Python error (killed, crashed or hung) in iteration 0, step ")
    assert err.split(";")[0].endswith("(F2)") and "rank 0 failed at iteration 0" in err
    assert recs["baseline"]["status"] == "ok"
    assert any("failed in" in line for line in lines)
    [summary] = [line for line in lines if line.startswith("[2/2 done")]
    assert "1 failed, 1 ok" in summary and lines[-2].startswith("report: ")  # the sweep's report follows it,
    assert lines[-1].startswith("W&B: report run report-smoke-")  # then its run on W&B
    # a forced rerun that fails keeps the earlier ok record; the record was just written (as when the rerun follows
    # within a second), so a check by modification time would take it for the rerun's own
    path = tmp_path / "results" / "smoke" / f"{recs['baseline']['run_id']}.json"
    ok = path.read_text()
    os.utime(path)
    code, lines = sweep(tmp_path, *LOGGED, "grid.product.method=[baseline]", "force=true",
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


def test_wandb_offline_one_run_per_record_with_the_records_numbers(killed_and_logged):
    tmp_path, first, rerun = killed_and_logged
    assert first[0] == 0 and rerun[0] == 0  # the rerun (force=true) replaces, never adds, a run
    recs = records(tmp_path)  # the failed vocab-2 run and the ok baseline, each one W&B run named by its run_id
    runs = {r.name.split("-", 3)[-1]: r for r in (tmp_path / "wandb").glob("offline-run-*")}
    assert len(runs) == len(list((tmp_path / "wandb").glob("offline-run-*"))) == 3  # and the report's run
    assert sorted(runs) == sorted([r["run_id"] for r in recs] + ["report-smoke-" + sha1(b"smoke").hexdigest()[:6]])
    assert all((tmp_path / "results" / "smoke" / f"{r['run_id']}.logged").is_file() for r in recs)
    rec = next(r for r in recs if r["config"]["method"] == "baseline")
    runs = [runs[rec["run_id"]]]
    summary = {}
    for update in _wandb_records(runs[0], "summary"):
        summary.update({item.key: json.loads(item.value_json) for item in update.update})
    m = rec["metrics"]
    assert summary["iteration_time_s"] == m["iteration_time_s"]  # the record's median, not the last iteration
    assert summary["mfu"] == m["mfu"] and summary["tokens_per_s"] == m["tokens_per_s"]
    assert summary["max_peak_memory_bytes"] == max(m["peak_memory_bytes"]) and summary["status"] == "ok"
    history = {item.key or "/".join(item.nested_key) for h in _wandb_records(runs[0], "history") for item in h.item}
    assert {"live/time_s", "iteration/loss", "iteration/time_s"} <= history  # live as it ran, then the record
    run_record = _wandb_records(runs[0], "run")[-1]  # a live run: opened tagged running, then tagged ok
    assert list(run_record.tags) == ["ok", rec["labels"]["sweep"]] and rec["labels"]["sweep"].startswith("sweep-")
    assert run_record.display_name == "baseline pp2 tiny V2k seq64" and run_record.run_id == rec["run_id"]
    [table] = runs[0].glob("files/media/table/per_rank_*.table.json")
    rows = json.loads(table.read_text())["data"]
    assert [row[1] for row in rows] == m["peak_memory_bytes"] and [row[2] for row in rows] == m["bubble_fraction"]
    assert list(runs[0].glob("files/media/images/timeline/measured_*.png"))
    assert list(runs[0].glob("files/media/images/timeline/replayed_*.png"))
    for path in tmp_path.rglob("*"):
        if path.is_file():
            assert SECRET.encode() not in path.read_bytes(), path
