"""python -m harness.sweep [experiment=NAME] [cluster=local|slurm] [backend=real|sim] [dry_run=true] [force=true]

Composes every job of the experiment's grid, checks all of them before anything starts (one bad job stops
the sweep, naming the job, the field and the fix), skips jobs whose record says ok (force=true reruns them),
runs the rest (processes through submitit, or the simulator for backend=sim) and builds the report.
"""
import sys
from pathlib import Path

import hydra
from hydra import compose
from hydra.core.hydra_config import HydraConfig
from hydra.errors import HydraException
from omegaconf import DictConfig

from harness import dispatch, jobs as J
from harness.records import finish_run


def _gpus_here(cfg) -> int:
    if cfg.backend != "real" or cfg.cluster.name != "local" or cfg.run.device != "cuda":
        return 0
    import torch

    return torch.cuda.device_count()


def plan(cfg: DictConfig, cli_overrides: list[str]) -> list[J.Job]:
    """Every job of the sweep, composed and checked; ValueError on the first bad one."""
    overrides = J.grid_overrides(cfg.grid)
    results = Path(cfg.results_dir)
    gpus = _gpus_here(cfg)
    out, seen = [], {}
    for i, extra in enumerate(overrides):
        name = " ".join(extra) or "(base config)"
        try:
            job_cfg = compose(config_name="config", overrides=cli_overrides + extra)
        except HydraException as err:
            first = str(err).strip().splitlines()[0]
            options = [line.strip() for line in str(err).splitlines()[1:] if line.strip()]
            raise ValueError(f"job {i} ({name}): {first}" + (f"; {' '.join(options)}" if options else "")) from None
        job = J.Job(i, extra, job_cfg)
        try:
            J.check(job, gpus)
        except ValueError as err:
            raise ValueError(f"job {i} ({name}): {err}") from None
        J.finish(job, results)
        if job.run_id in seen:  # the same run reached twice (e.g. run.chunks on a method without chunks)
            continue
        seen[job.run_id] = job
        out.append(job)
    return out


def run(cfg: DictConfig, cli_overrides: list[str], log=print) -> int:
    try:
        jobs = plan(cfg, cli_overrides)
    except ValueError as err:
        print(f"sweep refused, nothing was submitted: {err}", file=sys.stderr)
        return 2
    done = {j.run_id for j in jobs if j.status() == "done"}
    todo = [j for j in jobs if cfg.force or j.run_id not in done]
    log(f"experiment {cfg.experiment}: {len(jobs)} jobs, {len(done)} done, {len(todo)} to run "
        f"(backend={cfg.backend}" + (f", cluster={cfg.cluster.name})" if cfg.backend == "real" else
                                     f", hardware={cfg.hardware.name})"))
    if cfg.dry_run:
        width = max((len(j.name) for j in jobs), default=0)
        for j in jobs:
            log(f"  {j.index:>4}  {j.run_id}  {j.status():<4}  {j.name:<{width}}")
        return 0
    if cfg.backend == "sim":
        from harness.sim import simulate_job

        for job in todo:
            record = simulate_job(job.run, J.hardware_of(job.cfg), cfg.experiment, job.labels)
            finish_run(record, job.path, dict(cfg.logger), Path.cwd())
        log(f"simulated {len(todo)} jobs into {Path(cfg.results_dir) / cfg.experiment}")
    elif todo:
        runner = dispatch.run_local if cfg.cluster.name == "local" else dispatch.run_slurm
        runner(todo, cfg, log)
    if cfg.report:
        from harness.report import build_reports

        for path in build_reports(Path(cfg.results_dir), Path(cfg.reports_dir), [cfg.experiment]):
            log(f"report: {path}")
    return 0


@hydra.main(config_path="../conf", config_name="config", version_base="1.3")
def main(cfg: DictConfig) -> None:
    hc = HydraConfig.get()
    # every job is composed again with the command line's overrides (and its extra config search path)
    overrides = list(hc.overrides.task) + [o for o in hc.overrides.hydra if o.startswith("hydra.searchpath")]
    code = run(cfg, overrides)
    if code:
        sys.exit(code)


if __name__ == "__main__":
    main()
