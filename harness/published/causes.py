"""python -m harness.published.causes: how much of V-Half's under-prediction each cause explains.

Every published V-Half run (harness/published/paper_vhalf.csv, held out: never fitted) is simulated as backend=sim
would, under a cumulative list of model changes, and the median of simulated over published MFU is printed per
method: the model before the pass overhead had a structure (one fitted per-pass constant on every pass, W too),
the overhead in two parts fitted on the 1F1B artifact, W without the per-pass part (the model as it stands), and
then what the model cannot know from the artifact: the order (the squeezed generator, which the published runs did
not use: docs/cost-model.md; V-Half without vocabulary parallelism only), and, instead of it, the whole overhead
removed (an upper bound of what it can explain).
"""
import argparse
import statistics
from contextlib import contextmanager
from dataclasses import replace
from unittest import mock

from harness import published
from harness.published.calibrate import experiment_runs
from harness.published.fit import simulate_mfu
from harness.profiles import CONF, read_profile
from vp.cost import Hardware, passes

NAME = "paper_vhalf"
SQUEEZED = {"vhalf": "vhalf-squeezed"}  # the squeezed order has no vocabulary-parallel method (vp.schedule.methods)
# a100_paper as fitted before the overhead had two parts (gemm_efficiency, pass_overhead_s; commit 47f52ca)
ONE_CONSTANT = {"gemm_efficiency": 0.7490040511416456, "pass_overhead_s": 0.0008310220884742899, "kernel_s": 0.0}


@contextmanager
def w_charged(on: bool):
    """W passes charged the per-pass part as every other pass (the model before W went without it)."""
    with mock.patch.object(passes, "UNSYNCHRONISED", () if on else passes.UNSYNCHRONISED):
        yield


def steps(hw) -> list[tuple[str, object, bool, bool]]:
    """(what, profile, W charged the per-pass part, squeezed order), each step on top of the ones before."""
    return [("one per-pass constant on every pass (before)", replace(hw, **ONE_CONSTANT), True, False),
            ("per operation + per pass, fitted on the 1F1B artifact", hw, True, False),
            ("W without the per-pass part (the model now)", hw, False, False),
            ("the squeezed order (not what the runs used; vhalf only)", hw, False, True),
            ("no overhead at all, the paper's order (upper bound)", replace(hw, kernel_s=0.0, pass_overhead_s=0.0),
             False, False)]


def causes(hardware: str = "a100_paper", methods=("vhalf", "vhalf-vocab-1")) -> list[dict]:
    """One row per step: median and range of simulated / published MFU per method over the published runs."""
    rows = {r.key: r for r in published.load(NAME)}
    runs = [r for r in experiment_runs(NAME) if published.key_of(r.to_dict()) in rows and r.method in methods]
    out = []
    path = CONF / "hardware" / f"{hardware}.yaml"
    if not path.is_file():
        raise ValueError(f"--hardware {hardware}: no built-in profile {path}")
    for what, hw, charged, squeezed in steps(Hardware.from_dict(read_profile(path))):
        step = [r for r in runs if r.method in SQUEEZED] if squeezed else runs
        with w_charged(charged):
            mfu = simulate_mfu(hw, [replace(r, method=SQUEEZED[r.method]) if squeezed else r for r in step])
        ratios = {}
        for run, m in zip(step, mfu):
            ratios.setdefault(run.method, []).append(m / rows[published.key_of(run.to_dict())].mfu)
        out.append({"what": what, **{m: (statistics.median(v), min(v), max(v)) for m, v in ratios.items()}})
    return out


def table(rows: list[dict], methods) -> str:
    lines = ["| cumulative change | " + " | ".join(methods) + " |", "|---|" + "--:|" * len(methods)]
    for row in rows:
        lines.append(f"| {row['what']} | " + " | ".join(
            "{:.3f} [{:.3f}, {:.3f}]".format(*row[m]) if m in row else "–" for m in methods) + " |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hardware", default="a100_paper", help="the profile (fitted on the 1F1B artifact only)")
    ap.add_argument("--methods", nargs="+", default=["vhalf", "vhalf-vocab-1"], help="of the published table")
    args = ap.parse_args(argv)
    print(f"simulated / published MFU over {NAME}'s published runs, median [range], {args.hardware}:\n")
    print(table(causes(args.hardware, tuple(args.methods)), args.methods))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
