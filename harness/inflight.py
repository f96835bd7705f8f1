"""SLURM jobs of a sweep that are still queued or running, so that a rerun attaches to them instead of submitting
each run a second time (two jobs writing one record), and the live status line a sweep shows while it follows
its jobs.

At submission, harness.dispatch writes `inflight.json` into the run's submitit folder (<cluster.folder>/<experiment>/
<run_id>/): the SLURM job id and the record the job writes. A later command reads the markers of its runs, asks
squeue once for all their states, and attaches (a submitit.SlurmJob of that id and folder) to every job squeue still
shows queued or running and that writes the same record (another results_dir's job of the same run is not this
one). A marker whose job ended or that squeue no longer knows is stale and ignored; the next submission replaces it.
"""
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from vp.files import write_text_atomic

MARKER = "inflight.json"
ACTIVE = ("PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED", "REQUEUED", "RESIZING")


def mark(folder: Path, job_id: str, record: Path) -> None:
    """Say that SLURM job `job_id`, submitted from `folder`, writes `record`."""
    folder.mkdir(parents=True, exist_ok=True)
    write_text_atomic(folder / MARKER, json.dumps({"job_id": str(job_id), "record": str(Path(record).resolve())}))


def marked(folder: Path, record: Path) -> str | None:
    """The job id of the marker in `folder` when it is for `record`; None without one (or an unreadable one)."""
    try:
        data = json.loads((folder / MARKER).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or data.get("record") != str(Path(record).resolve()):
        return None
    return str(data.get("job_id") or "") or None


def in_flight(folders: dict[str, tuple[Path, Path]], job_states) -> dict[str, tuple[str, str]]:
    """run_id -> (SLURM job id, state) of the runs whose marked job squeue shows queued or running. `folders`:
    run_id -> (submitit folder, record path); `job_states`: harness.slurm.job_states (one squeue call; None
    while squeue does not answer, then nothing is taken as in flight and the caller's refusal stands)."""
    ids = {run: job for run, (folder, record) in folders.items() if (job := marked(folder, record))}
    if not ids:
        return {}
    states = job_states(sorted(set(ids.values()))) or {}
    return {run: (job, states[job].state) for run, job in ids.items()
            if job in states and states[job].state in ACTIVE}


def interrupted(handles, submitted, cfg, log, cancel) -> None:
    """Ctrl-C while submitting or following: cancel what this command submitted (one scancel for all of them),
    unless cluster.detach=true; jobs of an earlier command this one attached to are left to run."""
    mine = " ".join(str(h.job_id) for h in submitted)
    theirs = " ".join(str(h.job_id) for _, h, _ in handles if h not in submitted)
    attached = f"; the {len(theirs.split())} job(s) of an earlier command it followed go on ({theirs}: scancel " \
               f"{theirs} stops them)" if theirs else ""
    if not submitted:
        log(f"stopped following; nothing was submitted by this command{attached}")
    elif cfg.cluster.get("detach", False):
        log(f"stopped following (cluster.detach=true); the SLURM jobs go on and write their records (scancel {mine} "
            f"stops them){attached}. Rerun the same command to follow them again: it attaches, never resubmits")
    else:
        cancel([str(h.job_id) for h in submitted])
        log(f"cancelled the {len(submitted)} SLURM job(s) this command submitted (scancel {mine}){attached}; "
            f"cluster.detach=true leaves them running instead")


def _duration(seconds: float) -> str:
    seconds = int(seconds)
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}" if seconds >= 3600 else \
        f"{seconds // 60}:{seconds % 60:02d}"


@dataclass
class StatusLine:
    """One live line while a sweep follows its SLURM jobs: queued / running / done / failed of the total, elapsed,
    and an ETA from the runs finished so far (elapsed / finished x left: the runs of one sweep are alike).

    On a terminal it is rewritten in place (carriage return) each poll; elsewhere (CI logs, a file) it is printed as
    a line of its own when the counts change and at least every `heartbeat_s` while they do not, so a log shows that
    the sweep waits, never thousands of lines."""
    log: object
    total: int
    tty: bool = False
    heartbeat_s: float = 60.0
    clock: object = time.monotonic

    def __post_init__(self):
        self.began, self.last, self.said_at, self.open = self.clock(), None, None, False

    def text(self, queued: int, running: int, done: int, failed: int) -> str:
        elapsed = self.clock() - self.began
        finished = done + failed
        left = self.total - finished
        eta = f", ETA {_duration(elapsed / finished * left)}" if finished and left else ""
        return (f"[{_duration(elapsed)}] {queued} queued, {running} running, {done} done, {failed} failed of "
                f"{self.total}{eta}")

    def show(self, queued: int, running: int, done: int, failed: int) -> None:
        counts = (queued, running, done, failed)
        line = self.text(*counts)
        if self.tty:
            sys.stdout.write("\r" + line + "\x1b[K")
            sys.stdout.flush()
            self.open = True
        elif counts != self.last or self.clock() - self.said_at >= self.heartbeat_s:
            self.log(line)
            self.said_at = self.clock()
        self.last = counts

    def say(self, line: str) -> None:
        """A line of its own (a failure, a pending reason): ends the live line first on a terminal."""
        self.end()
        self.log(line)

    def end(self) -> None:
        if self.open:
            sys.stdout.write("\n")
            sys.stdout.flush()
            self.open = False
