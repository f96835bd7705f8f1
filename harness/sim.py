"""backend=sim: a job's record from the schedule simulator and the cost model, without processes.

The schedule is the one the runtime would execute; pass times, communication and memory come from
vp.cost with the job's hardware profile, and the metrics from the same producer as measured runs
(vp.metrics.Metrics). A run whose peak memory exceeds the device is recorded as oom.

A record carries the fingerprint of the code that predicted it (simulator_version); a sweep takes a record of other
code for stale and simulates it again, so a changed cost model or schedule never hides behind "done".
"""
import hashlib
from functools import lru_cache
from pathlib import Path

from vp.channels import rank_communicators
from vp.cost import pass_costs, static_bytes, tail_s, traffic
from vp.cost.memory import static_breakdown
from vp.metrics import Metrics
from vp.record import make_record, now
from vp.schedule import build, simulate


# what a simulated record depends on besides its config and hardware profile: the schedules, the simulator, the
# cost model, the metrics and this module
_VP = Path(__file__).parents[1] / "vp"
_SOURCES = (_VP / "schedule", _VP / "cost", _VP / "metrics.py", _VP / "flops.py", _VP / "config.py",
            _VP / "channels.py", Path(__file__))


@lru_cache(maxsize=1)
def simulator_version() -> str:
    """A hash of the source of everything that makes a simulated record (12 hex digits)."""
    h = hashlib.sha1()
    for src in _SOURCES:
        for path in sorted(src.glob("*.py")) if src.is_dir() else [src]:
            h.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()[:12]


@lru_cache(maxsize=64)
def _schedule(method: str, pp: int, microbatches: int, chunks: int):
    return build(method, pp, microbatches, chunks)


def simulate_job(run, hw, experiment: str, labels: dict) -> dict:
    started = now()
    sched = _schedule(run.method, run.pp, run.microbatches, run.n_chunks)
    result = simulate(sched, pass_costs(run, hw, sched))
    sent = [sum(channels.values()) for channels in traffic(run, sched)]
    held = rank_communicators(run, sched)  # per global rank; replica 0's device 0 of each stage stands for all
    metrics = Metrics.from_simulation(run, result, hw.peak_flops, static_bytes(run, hw, sched), sent,
                                      hw.memory_bytes, tail_s(run, hw, sched, result),
                                      [held[run.mesh.rank(0, p, 0)] for p in range(run.pp)], hw,
                                      static_breakdown(run, hw, sched))
    peak = metrics.peak_memory_bytes
    over = [r for r, b in enumerate(peak) if b > hw.memory_bytes]
    status, error = "ok", None
    if over:
        status = "oom"
        error = (f"simulated peak memory {max(peak) / 2**30:.1f} GiB on rank(s) {over} exceeds the "
                 f"{hw.memory_bytes / 2**30:.0f} GiB of {hw.name}")
    env = {"simulator": "vp.schedule.simulate", "simulator_version": simulator_version(), "hardware": hw.to_dict(),
           "start": started, "end": now()}
    rec = make_record(run.to_dict(), metrics.to_dict(), env, status=status, error=error, experiment=experiment,
                      backend="sim", hardware=hw.to_dict())
    rec["labels"] = labels
    return rec
