"""python -m vp.train end to end: a result record, refusals before any process starts, failing ranks."""
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from inproc import run_main

ROOT = Path(__file__).parents[1]
TINY = ["--pp", "2", "--layers", "2", "--hidden", "32", "--heads", "2", "--seq-len", "16", "--vocab-size", "500",
        "--microbatches", "4", "--iterations", "3", "--warmup", "1"]


def train(*args, env=None, timeout=120):
    return subprocess.run([sys.executable, "-m", "vp.train", *args], capture_output=True, text=True, cwd=ROOT,
                          env={**os.environ, **(env or {})}, timeout=timeout)


def test_json_record_has_the_design_fields():
    out = train("--method", "vocab-2", *TINY, "--json")
    assert out.returncode == 0, out.stderr
    rec = json.loads(out.stdout)
    assert {"run_id", "experiment", "status", "error", "backend", "config", "metrics", "env"} <= set(rec)
    assert rec["status"] == "ok" and rec["backend"] == "real" and rec["error"] is None
    cfg, m = rec["config"], rec["metrics"]
    assert cfg["method"] == "vocab-2" and cfg["padded_vocab_size"] == 500 and cfg["device"] == "cpu"
    assert len(m["loss"]) == 3 and all(isinstance(x, float) for x in m["loss"])
    assert m["iteration_time_s"] > 0 and m["tokens_per_s"] > 0 and 0 < m["mfu"] < 1
    assert len(m["peak_memory_bytes"]) == 2 and len(m["bubble_fraction"]) == 2
    assert set(m["pass_time_s"]) == set(m["pass_cpu_time_s"]) == {"F", "B", "S", "T", "IF", "IB"}
    for kind, wall in m["pass_time_s"].items():  # the CPU time a rank's thread computed, within the pass's span
        assert all(0 < cpu <= w + 1e-3 for cpu, w in zip(m["pass_cpu_time_s"][kind], wall)), kind
    assert m["barriers_per_microbatch"] == [1.0, 1.0]  # Algorithm 2: one barrier
    assert len(m["tail_s"]) == 2 and all(0 < t < m["iteration_time_s"] for t in m["tail_s"])  # optimizer step
    assert {"torch", "device", "hosts", "git_commit", "start", "end"} <= set(rec["env"])


@pytest.mark.parametrize("args,message", [
    (["--method", "nope"], "method='nope' is unknown"),
    (["--method", "vhalf", "--layers", "6"], "layers=6 cannot be split evenly over the 4 stages"),
    (["--method", "interleaved", "--layers", "4", "--microbatches", "1"], "microbatches=1 is fewer than pp=2"),
    (["--method", "interleaved", "--layers", "4", "--microbatches", "5"], "microbatches=5: interleaved"),
    (["--method", "vocab-1", "--device", "tpu"], "device='tpu' is unknown"),
    (["--method", "vocab-2", "--pad-multiple", "3"], "pad_multiple=3 is not divisible by the 2 vocabulary shards"),
    (["--method", "baseline", "--dtype", "bf16"], "dtype=bf16 needs device=cuda"),
    (["--method", "redis", "--redis-last-layers", "4"], "redis_last_layers=4 leaves fewer than one layer"),
])
def test_bad_input_is_refused_before_any_process_starts(args, message):
    base = [a for a in TINY]
    for flag, value in zip(args[::2], args[1::2]):
        if flag in base:
            base[base.index(flag) + 1] = value
        else:
            base += [flag, value]
    out = run_main("vp.train", *base)  # in this process: a refusal starts nothing (tests/inproc.py)
    assert out.returncode == 2 and out.stdout == ""
    assert message in out.stderr
    assert "rendezvous" not in out.stderr and "Traceback" not in out.stderr


def test_launcher_world_size_must_match_pp():
    out = run_main("vp.train", "--method", "baseline", *TINY, env={"RANK": "0", "WORLD_SIZE": "3"})
    assert out.returncode == 2
    assert "started 3 processes but dp x pp x tp = 2" in out.stderr


def test_a_killed_rank_fails_the_run_naming_rank_and_action():
    out = train("--method", "vocab-2", *TINY, "--json", "--inject-fault", "1:F2:exit", "--timeout-s", "20")
    assert out.returncode == 1 and out.stdout == ""
    assert "run failed (failed)" in out.stderr
    # the culprit first, with the action it died in (its progress note), then what the others saw
    assert re.search(r"run failed \(failed\): rank 1: exited with code 17 in iteration 0, step \d+ \(F2\); rank 0",
                     out.stderr), out.stderr
    assert "rank 0 failed at iteration 0, step" in out.stderr


def test_a_python_error_fails_the_run_at_once_naming_its_rank():
    """The failing rank exits without waiting on communication a peer blocks; the run is not a timeout."""
    out = train("--method", "vocab-2", *TINY, "--inject-fault", "0:F3:raise", "--timeout-s", "600", timeout=100)
    assert out.returncode == 1 and "run failed (failed)" in out.stderr
    assert "rank 0 failed at iteration 0" in out.stderr and "RuntimeError: injected fault" in out.stderr


def test_a_hung_rank_makes_the_others_time_out():
    out = train("--method", "baseline", *TINY, "--inject-fault", "1:B1:hang", "--timeout-s", "4")
    assert out.returncode == 1 and out.stdout == ""
    assert "run failed (timeout)" in out.stderr
    assert "rank 0 failed at iteration 0" in out.stderr
    assert re.search(r"rank 1: stopped after the others failed in iteration 0, step \d+ \(B1\)", out.stderr)
