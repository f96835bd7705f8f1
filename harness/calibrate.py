"""python -m harness.calibrate --results results/smoke [--name NAME] [--out conf/hardware/NAME.yaml]

Fits a hardware profile from real records of one machine, so that backend=sim predicts a sweep from a short
calibration run. The cost model says what each pass computes (vp.cost.pass_flops); the measured pass times
give one speed per efficiency kind and one fixed per-pass overhead (least squares on relative error), and the
link probe every real run records (env.link_probe: bytes, seconds) gives the link latency and bandwidth.
The profile is written as a config of the `hardware` group: backend=sim hardware=NAME uses it.
"""
import argparse
import statistics
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
from omegaconf import OmegaConf

from harness.records import load
from vp.config import RunConfig
from vp.cost import EFF_KINDS, Hardware, fit_link
from vp.schedule import build


def observations(records: list[dict]) -> tuple[list[dict], list[float]]:
    """(FLOPs by efficiency kind, measured seconds) of each (record, pass kind, rank) with a time."""
    from vp.cost import pass_flops

    rows, times = [], []
    for rec in records:
        cfg = RunConfig.from_dict(rec["config"])
        sched = build(cfg.method, cfg.pp, cfg.microbatches, cfg.n_chunks)
        flops = pass_flops(cfg, sched)
        for kind, per_rank in (rec["metrics"].get("pass_time_s") or {}).items():
            for rank, seconds in enumerate(per_rank):
                if seconds is None or seconds <= 0:
                    continue
                if kind in ("F", "B", "W"):  # a rank's mean pass: the mean over the stages it holds
                    stages = [sched.stage(rank, c) for c in range(sched.chunks)]
                    parts = [flops[(kind, st)] for st in stages]
                    row = {k: statistics.mean(p.get(k, 0.0) for p in parts) for k in EFF_KINDS}
                else:
                    row = dict(flops.get((kind, None), {}))
                if sum(row.values()) > 0:
                    rows.append(row)
                    times.append(seconds)
    return rows, times


def fit_speeds(rows: list[dict], times: list[float]) -> tuple[dict, float]:
    """seconds = overhead + sum_k flops_k / speed_k, least squares on relative error; speeds must be positive."""
    kinds = [k for k in EFF_KINDS if any(r.get(k, 0) > 0 for r in rows)]
    t = np.array(times)
    for with_overhead in (True, False):
        a = np.array([[r.get(k, 0.0) for k in kinds] + ([1.0] if with_overhead else []) for r in rows])
        x, *_ = np.linalg.lstsq(a / t[:, None], np.ones_like(t), rcond=None)
        inv = x[: len(kinds)]
        if (inv > 0).all() and (not with_overhead or x[-1] >= 0):
            return {k: float(1.0 / v) for k, v in zip(kinds, inv)}, float(x[-1]) if with_overhead else 0.0
    raise ValueError("the pass times do not fit positive speeds; calibrate on more runs (several methods and "
                     "vocabulary sizes) or longer ones (more iterations)")


def calibrate(records: list[dict], name: str) -> Hardware:
    real = [r for r in records if r.get("backend") == "real" and r.get("status") == "ok" and r.get("metrics")]
    if not real:
        raise ValueError("no ok real records to calibrate on; run a sweep first (make sweep)")
    if len({r["config"]["device"] for r in real}) > 1 or len({tuple(r["env"].get("hosts", [])) for r in real}) > 1:
        raise ValueError("records come from several devices or hosts; calibrate one machine at a time "
                         "(--results results/<experiment>)")
    peak = float(statistics.median(r["metrics"]["peak_flops"] for r in real))
    speeds, overhead = fit_speeds(*observations(real))
    probes = [p for r in real for p in r["env"].get("link_probe") or []]
    latency, bandwidth = fit_link(probes) if len(probes) >= 2 else (10e-6, 25e9)
    cpu = real[0]["config"]["device"] == "cpu"
    base = Hardware(name, peak)
    return replace(base, efficiency={k: float(s / peak) for k, s in speeds.items()}, link_latency=latency,
                   link_bandwidth=bandwidth, pass_overhead_s=overhead,
                   **({"act_bytes": 4, "bytes_per_param": 16.0, "overhead_bytes": 0.0,
                       "memory_bytes": _machine_memory()} if cpu else {}))


def _machine_memory() -> float:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            return float(line.split()[1]) * 1024
    return 16 * 1024**3


def write_profile(hw: Hardware, path: Path, source: str) -> Path:
    body = OmegaConf.to_yaml({"name": hw.name, "profile": hw.to_dict()})
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"# @package hardware\n# Calibrated by `python -m harness.calibrate` from {source}.\n"
                    f"# Use it with: python -m harness.sweep backend=sim hardware={hw.name} ...\n{body}")
    return path


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m harness.calibrate", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--results", required=True, help="a folder of records of one machine, e.g. results/smoke")
    ap.add_argument("--name", default="calibrated")
    ap.add_argument("--out", default=None, help="default conf/hardware/NAME.yaml")
    args = ap.parse_args(argv)
    if not Path(args.results).is_dir():
        print(f"error: --results {args.results} is not a folder of records", file=sys.stderr)
        return 2
    try:
        hw = calibrate(load(Path(args.results)), args.name)
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    out = write_profile(hw, Path(args.out or f"conf/hardware/{args.name}.yaml"), args.results)
    print(f"wrote {out}: peak {hw.peak_flops:.3g} FLOP/s, efficiency "
          + ", ".join(f"{k} {v:.3f}" for k, v in hw.efficiency.items())
          + f", pass overhead {hw.pass_overhead_s * 1e3:.3f} ms, link {hw.link_latency * 1e6:.0f} us + "
          f"{hw.link_bandwidth / 1e9:.2f} GB/s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
