"""Ctrl-C as a terminal sends it, for the tests that interrupt a real run: the processes of a session, and an
interrupt that cleans up after itself when the run does not stop (so a failing test leaves nothing spinning)."""
import os
import signal
import subprocess
import time
from pathlib import Path


def session_processes(sid: int) -> list[int]:
    """Live processes of the session led by sid (a command started with start_new_session and all it started)."""
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[3]) == sid and fields[0] != "Z":
                out.append(int(entry))
    return out


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()[:300]
    except OSError:
        return "(gone)"


def ctrl_c(proc: subprocess.Popen, exit_s: float = 30, gone_s: float = 10) -> tuple[int | None, list[int]]:
    """SIGINT to the whole process group of proc (started with start_new_session), as a terminal's Ctrl-C.
    -> (proc's exit code, or None when it did not exit within exit_s; the processes of its session still alive
    gone_s after the signal, as "pid: command line"). Whatever is left is then killed."""
    os.killpg(proc.pid, signal.SIGINT)
    sent = time.monotonic()
    try:
        code = proc.wait(timeout=exit_s)
    except subprocess.TimeoutExpired:
        code = None
    while session_processes(proc.pid) and time.monotonic() - sent < gone_s:
        time.sleep(0.1)
    left = [f"{pid}: {_cmdline(pid)}" for pid in session_processes(proc.pid)]
    for pid in session_processes(proc.pid):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    if code is None:
        proc.wait()
    return code, left
