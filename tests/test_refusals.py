"""vp's command lines refuse what cannot work before any process starts (exit code 2, the field and the fix,
nothing written), and a local run stops with all its processes on Ctrl-C."""
import subprocess
import sys
import time
from pathlib import Path

import pytest

from inproc import run_main
from procs import ctrl_c, session_processes

ROOT = Path(__file__).parents[1]
TINY = ["--method", "vocab-2", "--pp", "2", "--layers", "2", "--hidden", "32", "--heads", "2", "--seq-len", "16",
        "--vocab-size", "500", "--microbatches", "4", "--iterations", "3", "--warmup", "1"]


def vp(module: str, *args, cwd=ROOT):
    """`python -m module args` with no GPU visible, in this process (tests/inproc.py): refusals start nothing."""
    return run_main(module, *args, cwd=cwd)


@pytest.mark.parametrize("args,message", [
    (["--device", "cuda", "--dtype", "bf16"], "device=cuda needs 2 GPU(s) on this machine but 0 are visible; use "
                                              "--device cpu"),
    (["--seq-len", "1000000"], "tokens per microbatch is above the sanity limit of 131072; use a smaller seq_len, "
                               "or raise --max-tokens"),
    (["--seq-len", "100000", "--max-tokens", "1000000", "--max-memory-gb", "1"],
     "GiB are available; use a smaller seq_len, micro_batch_size, microbatches, hidden or vocabulary, or raise "
     "--max-memory-gb"),
    (["--inject-fault", "5:F2"], "fault rank 5 does not exist: dp=1 x pp=2 has ranks 0..1"),
    (["--inject-fault", "1:F9"], "fault action 'F9' is not executed by rank 1 of method=vocab-2"),
    (["--inject-fault", "1:F2:boom"], "use RANK:ACTION[:exit|raise|hang|oom]"),
    (["--trace", "/missing/dir/t.json"], "--trace /missing/dir/t.json: the folder /missing/dir does not exist"),
    (["--trace", "t.txt"], "--trace t.txt: the suffix must be one of .json"),
])
def test_vp_train_refuses_before_any_process_starts(tmp_path, args, message):
    out = vp("vp.train", *TINY, *args, cwd=tmp_path)
    assert out.returncode == 2 and out.stdout == "", out.stderr
    assert message in out.stderr and "Traceback" not in out.stderr
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("args,message", [
    (["--pp", "100000", "--microbatches", "100000"], "is above the schedule size limit of 262144 (building, "
                                                     "validating and simulating grow with it"),
    (["--pp", "2", "--microbatches", "4", "--png", "/missing/dir/a.png"], "the folder /missing/dir does not exist"),
    (["--pp", "2", "--microbatches", "4", "--png", "a.txt"], "the suffix must be one of .png, .pdf, .svg"),
    (["--pp", "2", "--microbatches", "4", "--png", "/proc/a.png"], "cannot write in /proc"),
])
def test_vp_schedule_refuses_sizes_and_paths_up_front(tmp_path, args, message):
    began = time.monotonic()
    out = vp("vp.schedule", "simulate", "--method", "vocab-2", *args, cwd=tmp_path)
    assert out.returncode == 2 and message in out.stderr and "Traceback" not in out.stderr, out.stderr
    assert time.monotonic() - began < 60 and not list(tmp_path.iterdir())


def test_vp_schedule_size_limit_can_be_raised(tmp_path):
    out = vp("vp.schedule", "simulate", "--method", "baseline", "--pp", "4", "--microbatches", "8", "--max-size",
             "16", cwd=tmp_path)
    assert out.returncode == 2 and "raise --max-size" in out.stderr
    out = vp("vp.schedule", "simulate", "--method", "baseline", "--pp", "4", "--microbatches", "8", "--max-size",
             "32", "--png", "t.svg", cwd=tmp_path)
    assert out.returncode == 0 and (tmp_path / "t.svg").is_file()


def test_ctrl_c_stops_a_local_run_and_all_its_processes_within_10_s(tmp_path):
    proc = subprocess.Popen([sys.executable, "-m", "vp.train", *TINY[:-4], "--iterations", "100000", "--warmup", "1"],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    deadline = time.monotonic() + 120
    while len(session_processes(proc.pid)) < 3 and time.monotonic() < deadline:  # the launcher and its 2 ranks
        time.sleep(0.2)
    time.sleep(3)  # into training
    assert proc.poll() is None and len(session_processes(proc.pid)) >= 3
    code, left = ctrl_c(proc)  # a terminal's Ctrl-C reaches the whole foreground group
    assert not left, f"processes left 10 s after Ctrl-C: {left}"
    assert code == 130 and "interrupted: every rank of this run was stopped" in proc.stderr.read()
