"""Fitting a profile's pass speeds to measured pass times: the one fit that harness.calibrate (from run records)
and the GPU check (vp.gpucheck.passes, from timed passes) use."""
from dataclasses import replace

import numpy as np

from vp.cost.passes import work_seconds
from vp.cost.profiles import Hardware
from vp.schedule.actions import COMPUTE as EFF_KINDS  # vp.cost.EFF_KINDS


def fit_speeds(rows: list[dict], times: list[float]) -> tuple[dict, float, float]:
    """seconds = overhead x passes + sum_k modelled_k / multiplier_k + bytes / bandwidth (passes: 1, 0 for a W pass),
    least squares on relative error;
    returns (multiplier per kind, elementwise bandwidth bytes/s, overhead s); all must come out positive."""
    kinds = [k for k in EFF_KINDS if any(r.get(k, 0) > 0 for r in rows)]
    has_bytes = any(r.get("bytes", 0) > 0 for r in rows)
    t = np.array(times)
    for with_overhead in (True, False):
        a = np.array([[r.get(k, 0.0) for k in kinds] + ([r.get("bytes", 0.0)] if has_bytes else [])
                      + ([r.get("passes", 1.0)] if with_overhead else []) for r in rows])
        a = a / t[:, None]
        scale = np.linalg.norm(a, axis=0)  # columns of seconds, bytes and ones: equilibrated, or bytes dominate
        scale[scale == 0] = 1.0
        x, *_ = np.linalg.lstsq(a / scale, np.ones_like(t), rcond=None)
        x = x / scale
        inv = x[: len(kinds) + has_bytes]
        if (inv > 0).all() and (not with_overhead or x[-1] >= 0):
            speeds = {k: float(1.0 / v) for k, v in zip(kinds, inv)}
            bandwidth = float(1.0 / inv[-1]) if has_bytes else float("inf")
            return speeds, bandwidth, float(x[-1]) if with_overhead else 0.0
    raise ValueError("the pass times do not fit positive speeds; calibrate on more runs (several methods and "
                     "vocabulary sizes) or longer ones (more iterations)")


def observation(skeleton: Hardware, parts: dict) -> dict:
    """One pass's row for fit_speeds: the GEMM and attention seconds the skeleton models per efficiency kind at
    multiplier 1, its elementwise bytes under 'bytes', and under 'passes' whether it pays the per-pass overhead (a W
    pass does not: vp.cost.passes.UNSYNCHRONISED; only a W pass's parts hold a W part)."""
    seconds = work_seconds(skeleton, parts)
    row = dict(seconds.compute)
    row["bytes"] = sum(w.mem_bytes for w in parts.values())
    row["passes"] = seconds.passes
    return row


def fitted(skeleton: Hardware, name: str, speeds: dict, bandwidth: float, overhead: float) -> Hardware:
    """A device's profile: the skeleton's shape model and network with the fitted multipliers, overhead and
    elementwise speed (as a fraction of its memory bandwidth)."""
    return replace(skeleton, name=name, efficiency=speeds, pass_overhead_s=overhead,
                   mem_efficiency=min(1.0, bandwidth / skeleton.mem_bandwidth))
