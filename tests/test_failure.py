"""The failure path: the culprit is the first rank to fail on its own, in time; NCCL's evidence (watchdog timeouts,
CUDA out of memory in a NCCL call) is read as it would be on GPUs; injected faults under --emulate-nccl."""
import time

import pytest

from vp.failure import RankEnd, classify, explain, log_evidence, read_error, write_error
from vp.runtime.loop import NCCL_OOM

TINY = ["--pp", "2", "--layers", "2", "--hidden", "16", "--heads", "2", "--seq-len", "8", "--vocab-size", "101",
        "--microbatches", "4", "--iterations", "3", "--warmup", "1"]

# what ProcessGroupNCCL's watchdog writes (from C++, glog format) before it aborts a process
WATCHDOG_LOG = ("[rank0]:[E1024 10:01:02.345678 4321 ProcessGroupNCCL.cpp:616] [Rank 0] Watchdog caught collective "
                "operation timeout: WorkNCCL(SeqNum=12, OpType=BROADCAST, NumelIn=4128, NumelOut=4128, "
                "Timeout(ms)=300000) ran for 300011 milliseconds before timing out.\n"
                "Fatal Python error: Aborted\n\nThread 0x00007f (most recent call first):\n  File \"vp/runtime/loop.py\"")


def raised(rank: int, message: str) -> str:
    return (f"Traceback (most recent call last):\n  File \"vp/runtime/loop.py\", line 99, in iteration\n"
            f"    self.ex.wait(inst, self.cfg.timeout_s)\nvp.runtime.loop.RankFailure: rank {rank} failed at "
            f"iteration 0, step 4 (F1): {message}\nstep    0     1\nrank 0  F0    SF0\n")


def test_the_culprit_is_the_first_to_fail_on_its_own_not_a_rank_its_watchdog_took_down():
    """On NCCL a survivor dies silently (SIGABRT from its watchdog): its log says why, so it is not blamed."""
    ends = [RankEnd(0, log_evidence(WATCHDOG_LOG), "killed by signal 6", time=105.0),
            RankEnd(1, raised(1, "RuntimeError: injected fault"), "raised an error", time=100.0)]
    status, message = explain(ends)
    assert status == "failed" and message.startswith("rank 1 failed at iteration 0, step 4 (F1)")
    # a traceback that merely mentions `timeout_s` in its source lines is not a timeout
    assert classify(ends[1].error) == "failed" and not ends[1].symptom and ends[0].symptom


def test_first_in_time_wins_over_the_order_seen():
    late, early = RankEnd(0, None, "exited with code 17", time=50.0), RankEnd(1, None, "killed by signal 9", time=40.0)
    assert explain([late, early])[1].startswith("rank 1: killed by signal 9")


def test_nccl_out_of_memory_is_oom():
    assert classify(NCCL_OOM) == "oom"
    assert classify(log_evidence("x\n[E] NCCL WARN Cuda failure 'out of memory'\ny")) == "oom"
    status, message = explain([RankEnd(1, raised(1, "DistBackendError: " + NCCL_OOM), "raised an error", 3.0),
                               RankEnd(0, raised(0, "RuntimeError: Connection closed by peer"), "raised", 2.0)])
    assert status == "oom" and message.startswith("rank 1 failed")


def test_a_hang_is_named_and_a_deadlock_is_said():
    timed_out = raised(0, "WatchdogTimeout: [Rank 0] Watchdog caught collective operation timeout: C1:0 ran for "
                          "5000 milliseconds before timing out")
    status, message = explain([RankEnd(0, timed_out, "raised an error", 1.0),
                               RankEnd(1, None, "stopped after the others failed", 9.0)])
    assert status == "timeout" and message.startswith("rank 1 hung")
    status, message = explain([RankEnd(0, timed_out, "raised an error", 1.0),
                               RankEnd(1, timed_out.replace("rank 0", "rank 1"), "raised an error", 1.1)])
    assert status == "timeout" and message.startswith("every rank failed waiting for another (a deadlock")
    assert "rank 0 failed at iteration 0" in message and "rank 1 failed at iteration 0" in message


def test_error_files_carry_the_time_of_the_failure(tmp_path):
    write_error(tmp_path / "e.txt", "Traceback ...", at=123.5)
    assert read_error(tmp_path / "e.txt") == (123.5, "Traceback ...")
    (tmp_path / "old.txt").write_text("Traceback ...")  # an unstamped file still reads
    assert read_error(tmp_path / "old.txt") == (None, "Traceback ...")


@pytest.mark.parametrize("fault,method,form,status", [
    ("1:F2:exit", "vocab-2", "lazy", "failed"),
    ("1:B1:raise", "baseline", "both", "failed"),
    ("1:B0:oom", "vocab-2", "lazy", "oom"),
    ("1:B1:hang", "baseline", "both", "timeout"),
])
def test_an_injected_fault_under_emulated_nccl_names_its_rank_within_the_timeout(capsys, fault, method, form,
                                                                                 status):
    """vp.train's main in this process, its ranks real processes (python -m vp.train as a process: test_train_cli)."""
    from vp.train import main

    timeout = 5 if status == "timeout" else 120  # a fault other than a hang must not wait for the timeout
    t0 = time.monotonic()
    code = main(["--method", method, *TINY, "--emulate-nccl", form, "--timeout-s", str(timeout), "--inject-fault",
                 fault])
    elapsed = time.monotonic() - t0
    out = capsys.readouterr()
    assert code == 1 and out.out == ""
    line = next(line for line in out.err.splitlines() if line.startswith("run failed"))
    assert line.startswith(f"run failed ({status}): rank 1"), line
    # the failure comes before the timeout, or for a hang right after it (plus the others' grace, plus start-up)
    assert elapsed < (2 * timeout + 60 if status == "timeout" else timeout), elapsed
