"""Why a run failed: each failed rank's evidence with the time it failed, and the culprit, the rank whose own
failure came first in time (not the one that printed last, nor one its peers' watchdogs took down).

Evidence of a rank, best first: the traceback it wrote (error file, stamped with the time of the failure), else
what NCCL or Python's fault handler left in its log (a watchdog timeout, a CUDA out-of-memory, a fatal signal),
else only how it ended (exit code or signal) and when the launcher saw it end, with the action it was in (the
progress note every rank keeps, so that a rank killed or exited without a word is still named with its action).
"""
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path

STAMP = "# failed at "  # first line of an error file: "# failed at <unix seconds>"

# what a rank reports when a *peer* failed: not the cause of a run's failure
PEER_SYMPTOMS = ("connection closed by peer", "connection reset by peer", "broken pipe", "gave no result within",
                 "timed out", "timeout", "nccl communicator was aborted", "watchdog caught",
                 "remote process exited", "ncclremoteerror")

# lines of a rank's log that tell how it failed when it left no traceback (NCCL writes them from C++)
LOG_EVIDENCE = ("Watchdog caught collective operation timeout", "Cuda failure", "CUDA out of memory",
                "OutOfMemoryError", "NCCL error", "ncclRemoteError", "ncclSystemError", "ncclInternalError",
                "Fatal Python error")

_EXCEPTION_LINE = re.compile(r"^\s*[A-Za-z_][\w.]*(Error|Exception|Failure|Timeout|Interrupt|Exit)\b.*:")


PROGRESS_ENV = "VP_PROGRESS_FILE"  # set by a launcher: the file a rank keeps its progress note in
PROGRESS_BYTES = 160


class Progress:
    """What a rank is doing (iteration, step, action), overwritten in place at each action (one pwrite of a fixed
    size), for the launcher to read when the rank died without a traceback."""

    def __init__(self, path: str):
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)

    @classmethod
    def from_env(cls) -> "Progress | None":
        path = os.environ.get(PROGRESS_ENV)
        return cls(path) if path else None

    def note(self, where: str) -> None:
        os.pwrite(self.fd, where.encode()[:PROGRESS_BYTES].ljust(PROGRESS_BYTES), 0)


def with_progress(how: str, path: Path) -> str:
    """How a rank ended, with the action its progress note names ("exited with code 17 in iteration 0, step 18
    (F2)"); unchanged when it left no note."""
    try:
        where = path.read_bytes().decode(errors="replace").strip()
    except OSError:
        return how
    return f"{how} in {where}" if where else how


def write_error(path: Path, text: str, at: float | None = None) -> None:
    path.write_text(f"{STAMP}{time.time() if at is None else at:.6f}\n{text}")


def read_error(path: Path) -> tuple[float | None, str]:
    """(time of the failure, traceback) of an error file; time None when the file has no stamp."""
    text = path.read_text()
    first, _, rest = text.partition("\n")
    if first.startswith(STAMP):
        try:
            return float(first[len(STAMP):]), rest
        except ValueError:
            pass
    return None, text


def log_evidence(log: str) -> str | None:
    """The lines of a rank's log that say how it failed, or None."""
    lines = [line.strip() for line in log.splitlines() if any(k in line for k in LOG_EVIDENCE)]
    return "\n".join(lines) if lines else None


def exception_lines(text: str) -> list[str]:
    """The 'SomeError: message' lines of a traceback (or every line of other evidence)."""
    found = [line.strip() for line in text.splitlines() if _EXCEPTION_LINE.match(line)]
    return found or [line.strip() for line in text.splitlines() if line.strip()]


def classify(error: str) -> str:
    """The record status of a failure, from its error text."""
    if "OutOfMemoryError" in error or "out of memory" in error.lower():
        return "oom"
    said = " ".join(exception_lines(error)).lower()
    return "timeout" if "timed out" in said or "timeout" in said else "failed"


@dataclass(frozen=True)
class RankEnd:
    """How one failed rank ended: `error` is its traceback or log evidence (None: it left neither), `how` says how
    it ended, `time` when it failed (its stamp, else when it was seen ending; None: unknown)."""
    rank: int
    error: str | None
    how: str
    time: float | None = None

    @property
    def stopped(self) -> bool:
        """Killed by the launcher after the others failed: it neither finished nor failed on its own."""
        return self.how.startswith("stopped")

    @property
    def symptom(self) -> bool:
        """Its error is a peer's failure seen from here (a closed connection, a timeout, a watchdog)."""
        return self.error is not None and any(s in line.lower() for line in exception_lines(self.error)
                                              for s in PEER_SYMPTOMS)

    def text(self) -> str:
        return self.error or f"rank {self.rank}: {self.how}"

    def line(self) -> str:
        """One line: its RankFailure (rank, iteration, step, action) or its last words."""
        for line in (self.error or "").splitlines():
            if "RankFailure: " in line:
                return line.split("RankFailure: ", 1)[1]
        last = exception_lines(self.error)[-1] if self.error else self.how
        return f"rank {self.rank}: {last}"


def explain(ends: list[RankEnd]) -> tuple[str, str]:
    """(status, message) of a failed run. The culprit is the first in time of the ranks that failed on their own
    (an error that is not a peer's symptom, or death without one); else a rank stopped while the others timed
    out waiting (it hung); else every rank failed waiting for another: a deadlock (or a lost message)."""
    def when(e: RankEnd) -> float:
        return e.time if e.time is not None else float("inf")

    ends = sorted(ends, key=lambda e: (when(e), e.rank))
    causes = [e for e in ends if not e.stopped and not e.symptom]
    hung = [e for e in ends if e.stopped]
    culprit = (causes or hung or ends)[0]
    summary = "; ".join(e.line() for e in [culprit] + [e for e in ends if e is not culprit])  # culprit first
    if causes:
        return classify(culprit.text()), f"{summary}\n\n{culprit.text()}"
    if hung:
        ranks = ", ".join(str(e.rank) for e in hung)
        return "timeout", (f"rank {ranks} hung: neither finished nor failed while the others timed out waiting; "
                           f"{summary}\n\n{ends[0].text()}")
    return classify(culprit.text()), (f"every rank failed waiting for another (a deadlock, or a lost message): "
                                      f"{summary}\n\n{culprit.text()}")
