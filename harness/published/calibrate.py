"""python -m harness.calibrate --published NAME: compose the experiment NAME's runs, pair them with the published
table NAME, fit the base profile's free parameters, write the profile and print the fit row by row."""
from dataclasses import replace
from pathlib import Path

from hydra import initialize_config_dir

from harness import published
from harness.profiles import write_profile
from harness.published.fit import FITTED, Fit, fit_profile
from vp.config import RunConfig
from vp.cost import PROFILES

CONF = Path(__file__).parents[2] / "conf"


def experiment_runs(name: str) -> list[RunConfig]:
    """The runs of conf/experiment/NAME.yaml as backend=sim composes them."""
    from harness.sweep import plan

    if not (CONF / "experiment" / f"{name}.yaml").is_file():
        raise ValueError(f"no experiment conf/experiment/{name}.yaml to pair with harness/published/{name}.csv")
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        _, jobs = plan([f"experiment={name}", "backend=sim", "logger=off"])
    return [job.run for job in jobs]


def fit_table(name: str, fit: Fit, rows) -> str:
    """The fit beside the published numbers, one Markdown row per run, and the median error."""
    lines = ["| seq | vocab | method | published MFU (%) | fitted MFU (%) | fitted / published |", "|---|---|---|---|---|---|"]
    for row, simulated, err in zip(rows, fit.simulated, fit.errors):
        lines.append(f"| {row.seq_len} | {row.vocab} | {row.method} | {row.mfu * 100:.2f} | {simulated * 100:.2f} | "
                     f"{1 + err:.3f} |")
    lines.append(f"\nMedian |fitted / published - 1| over {len(rows)} rows: {fit.median_abs_error * 100:.2f} %.")
    return "\n".join(lines)


def calibrate_published(name: str, profile: str, base: str, out: Path, log=print) -> int:
    if base not in PROFILES:
        raise ValueError(f"--base {base} is not a built-in profile; use one of {', '.join(PROFILES)}")
    published.path_of(name)
    published.check_fittable(name)
    runs = experiment_runs(name)
    pairs = published.pair(name, [run.to_dict() for run in runs])
    rows = [row for _, row in pairs]
    log(f"fitting {', '.join(p.name for p in FITTED)} of {base} to {len(rows)} published runs of {name}")
    fit = fit_profile(replace(PROFILES[base], fitted_to=name), profile, runs, [row.mfu for row in rows], log=log)
    fitted = ", ".join(p.name for p in FITTED)
    write_profile(fit.hardware, out, f"the published MFU of harness/published/{name}.csv (fitted: {fitted}; "
                                     f"every other field is {base}'s)")
    log(fit_table(name, fit, rows))
    log(f"wrote {out}: " + ", ".join(f"{p.name} {getattr(fit.hardware, p.name):.4g}" for p in FITTED)
        + f" ({fit.evaluations} evaluations of the {len(rows)} runs)")
    return 0
