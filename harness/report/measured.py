"""Making a report's real CPU measurements agree with themselves: one peak per node kind for MFU, and the runs whose
measured iterations disagree flagged.

A real run on CPU measures its own peak (vp.metrics.probe_peak: the best of a few 512 x 512 matmuls), so on SLURM,
or on a loaded machine, two runs of one node kind divide by different peaks, and their MFU and throughput against the
baseline disagree (one run 1.70x the baseline's MFU at 1.46x its throughput). A report therefore divides every such
run's model FLOP/s by one peak per node kind: the median of the probes of that kind's runs in the report (the kind:
env.device and env.cpu_model, the CPU's model name and logical CPUs; records without cpu_model count as one kind per
device). GPU runs whose peak is the datasheet's (peak_flops_source table:...) and simulated runs keep their MFU.

A run whose measured iterations spread more than SPREAD_LIMIT (slowest / fastest), or whose own probe found its node
more than SPREAD_LIMIT slower than its kind's median, was disturbed while it ran (other processes on the node): the
README lists it, so a ratio drawn from it is not taken for a property of the method.
"""
import statistics

import pandas as pd

SPREAD_LIMIT = 1.25  # slowest / fastest measured iteration of one run above this is flagged


def node_kind(rec: dict) -> str | None:
    """The node kind of a real run whose peak its own probe measured; None for any other run."""
    env = rec.get("env") or {}
    if rec.get("backend") != "real" or not str(env.get("peak_flops_source", "")).startswith("probe"):
        return None
    return f"{env.get('device', '?')} {env.get('cpu_model') or ''}".strip()


def spread(rec: dict) -> float | None:
    """Slowest / fastest of a real run's measured iterations (None with fewer than two)."""
    times = [t for t in (rec.get("metrics") or {}).get("iteration_times_s") or [] if t]
    return max(times) / min(times) if rec.get("backend") == "real" and len(times) > 1 else None


def _peaks(df: pd.DataFrame) -> tuple[list, list, dict[str, list[float]]]:
    kinds = [node_kind(r) for r in df["record"]]
    peaks = [(r.get("metrics") or {}).get("peak_flops") for r in df["record"]]
    by_kind: dict[str, list[float]] = {}
    for kind, peak, status in zip(kinds, peaks, df["status"]):
        if kind is not None and peak and status == "ok":
            by_kind.setdefault(kind, []).append(float(peak))
    return kinds, peaks, by_kind


def one_peak_mfu(df: pd.DataFrame) -> list:
    """The MFU column with each probed run's MFU put on its node kind's median peak."""
    kinds, peaks, by_kind = _peaks(df)
    common = {k: statistics.median(v) for k, v in by_kind.items()}
    return [m * peak / common[kind] if kind in common and peak and pd.notna(m) else m
            for m, peak, kind in zip(df["mfu"], peaks, kinds)]


def peak_notes(df: pd.DataFrame) -> list[str]:
    """One line per node kind: the peak its runs' MFU uses and how far their probes ranged."""
    _, _, by_kind = _peaks(df)
    return [f"MFU of the real runs on `{kind}` uses one peak, {statistics.median(v) / 1e9:.1f} GFLOP/s: the median "
            f"of their {len(v)} matmul probes (which ranged {min(v) / 1e9:.1f} to {max(v) / 1e9:.1f} GFLOP/s), so "
            f"MFU and throughput compare alike" for kind, v in by_kind.items()]


def noisy(df: pd.DataFrame, limit: float = SPREAD_LIMIT) -> list[str]:
    """One line per ok real run whose iterations spread more than `limit`, or whose own peak probe found its node
    slower than 1 / limit of its kind's median (busy while the run started: every iteration slow alike)."""
    kinds, peaks, by_kind = _peaks(df)
    common = {k: statistics.median(v) for k, v in by_kind.items()}
    out = []
    for r, kind, peak in zip(df.to_dict("records"), kinds, peaks):
        if r["status"] != "ok":
            continue
        where = f"`{r['run_id']}` {r['setup']}, {r['method']}, vocabulary {r['vocab']}"
        s = spread(r["record"])
        if s is not None and s > limit:
            n = len(r["record"]["metrics"]["iteration_times_s"])
            out.append(f"{where}: its {n} measured iterations spread {s:.2f}x (slowest / fastest, above {limit}x): "
                       f"the node was busy; rerun it (force=true) before drawing a ratio from it")
        elif kind in common and peak and peak * limit < common[kind]:
            out.append(f"{where}: its peak probe found {peak / common[kind]:.0%} of its node kind's median: the node "
                       f"was busy when it started; rerun it (force=true) before drawing a ratio from it")
    return out
