"""python -m harness.sweep [-m] [experiment=NAME] [group=option ...] [key=value ...]   (--help: usage)

Composes every job of the experiment's grid with the command line, checks all of them before anything starts
(one bad job stops the sweep, naming the job, the field and the fix), skips jobs whose record says ok
(force=true reruns them), runs the rest (processes through submitit, or the simulator for backend=sim) and
builds the report. A command-line value for an axis of the grid replaces that axis; `-m key=a,b` sweeps those
values, through the same plan (harness.hydra_sweeper, selected as hydra/sweeper=vp).
"""
import itertools
import os
import shutil
import sys
import time
import warnings
from pathlib import Path

import hydra
from hydra.core.global_hydra import GlobalHydra
from hydra.core.hydra_config import HydraConfig
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import HydraException
from omegaconf import DictConfig, OmegaConf

from harness import dispatch, jobs as J, schema, slurm
from harness.compose import JobComposer, compose_checked
from harness.records import finish_run

schema.register()
# conf/config.yaml's search path names the user's profile folder (harness.profiles), which most users never create
warnings.filterwarnings("ignore", r"provider=hydra\.searchpath in main, path=.* is not available\.", UserWarning)

# keys that -m may sweep: a job's axes; everything else is a setting of the whole sweep
JOB_ROOTS = ("model", "vocab", "method", "hardware", "run")
BASIC_LAUNCHER = "hydra._internal.core_plugins.basic_launcher.BasicLauncher"


def _print(line: str) -> None:
    """print that survives a closed pipe (`... dry_run=true | head`): the rest is dropped, the work goes on."""
    try:
        print(line, flush=True)
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


def split_overrides(overrides: list[str]) -> tuple[list[str], dict[str, list[str]], dict[str, list[str]]]:
    """(overrides without sweeps, sweeps as key -> values, every given key -> its values)."""
    loader = GlobalHydra.instance().config_loader() if GlobalHydra.instance().is_initialized() else None
    try:
        parsed = OverridesParser.create(config_loader=loader).parse_overrides(overrides)
    except HydraException as err:
        raise ValueError(f"{str(err).strip().splitlines()[0]}") from None
    fixed, sweeps, given = [], {}, {}
    for o in parsed:
        key = o.key_or_group
        if o.is_sweep_override():
            if key.split(".")[0] not in JOB_ROOTS or key.startswith("hydra"):
                raise ValueError(f"{o.input_line}: only a job's axes can be swept (model, vocab, method, hardware, "
                                 f"run.* and their fields); {key} is a setting of the whole sweep, so run one sweep "
                                 f"per value")
            if o.value_type.name == "GLOB_CHOICE_SWEEP":
                values = list(o.sweep_string_iterator()) if loader is None else \
                    [str(v) for v in o.value().filter(loader.get_group_options(key))]
            else:
                values = list(o.sweep_string_iterator())
            sweeps[key] = given[key] = values
        else:
            fixed.append(o.input_line)
            if o.type.name != "DEL":
                given[key] = [o.get_value_element_as_str()]
    return fixed, sweeps, given




def plan(overrides: list[str], base: DictConfig | None = None) -> tuple[DictConfig, list[J.Job]]:
    """The sweep's settings and every job, composed and checked; ValueError on the first bad one. base: the
    command line's fixed overrides already composed (compose_checked), if the caller has them."""
    fixed, sweeps, given = split_overrides(overrides)
    base = compose_checked(fixed) if base is None else base
    grid = base.get("grid")
    fixed_keys = {k for k, v in given.items() if k not in sweeps}
    in_setups = J.setup_keys(grid)
    axes = [[f"{k}={v}" for v in values] for k, values in sweeps.items() if k not in in_setups]
    extras = [[o for o in g if o.split("=", 1)[0] not in fixed_keys] + list(s)
              for g in J.grid_overrides(grid, given) for s in itertools.product(*axes)]
    # a job is named by its own axes, including those the command line fixed (method=vocab-2 vocab=64k)
    named = [o for o in fixed if o.lstrip("+~").split("=", 1)[0] in J.axis_keys(grid)]
    results = Path(base.results_dir)
    gpus, partition = _gpus_here(base), partition_facts(base)
    out, seen, compose_job = [], set(), JobComposer(fixed)
    for i, extra in enumerate(extras):
        job = J.Job(i, named + extra, None)
        try:
            job.cfg = compose_job(extra)
            J.check(job, gpus, partition)
        except ValueError as err:
            raise ValueError(f"job {i} ({job.name}): {err}") from None
        J.finish(job, results)
        if job.run_id not in seen:  # the same run reached twice (e.g. run.chunks on a method without chunks)
            seen.add(job.run_id)
            out.append(job)
    return base, out


def partition_facts(cfg):
    """cluster=slurm's partition facts (harness.slurm.Partition), asked of SLURM once, when the first job needs
    them; None where SLURM is not here (no sinfo), or, in a dry run, where it does not answer."""
    got = []

    def facts():
        if not got:
            name = cfg.cluster.partition
            try:
                got.append(slurm.query_partition(name) if slurm.slurm_here() else None)
            except slurm.NoAnswer:
                if not cfg.dry_run:
                    raise
                got.append(None)
        return got[0]

    return facts


def _gpus_here(cfg) -> int:
    if cfg.backend != "real" or cfg.cluster.name != "local" or cfg.run.device != "cuda":
        return 0
    import torch

    return torch.cuda.device_count()


def check_outputs(cfg: DictConfig, jobs: list[J.Job]) -> None:
    """Output folders and the dispatch commands exist before the first job starts."""
    from vp.checks import writable_path

    writable_path(Path(cfg.results_dir) / cfg.experiment, "results_dir")
    if cfg.report:
        from harness.report.build import check_report_target, report_dir_for

        reports = report_dir_for(Path(cfg.results_dir), cfg.reports_dir)
        writable_path(reports, "reports_dir")
        check_report_target(reports / cfg.experiment, Path(cfg.results_dir) / cfg.experiment)
    if cfg.backend == "real" and cfg.cluster.name == "slurm" and jobs:
        missing = [c for c in slurm.COMMANDS if shutil.which(c) is None]
        if missing:
            raise ValueError(f"cluster=slurm needs {', '.join(missing)} on PATH; run on a SLURM login node, "
                             f"start a local single-node SLURM with `make slurm-up`, or list the jobs with "
                             f"dry_run=true")


def run(overrides: list[str], log=_print, sweep_id: str | None = None) -> int:
    """The whole sweep; returns the exit code (2: refused before anything ran, 130: interrupted). sweep_id: the id
    its records and W&B runs carry (new_sweep_id; backend=both gives its two halves one)."""
    try:
        base = compose_checked(split_overrides(overrides)[0])  # composed once: most of a sweep's start-up
        if base.backend == "both":
            return run_both(overrides, log, sweep_id or new_sweep_id())
        cfg, jobs = plan(overrides, base)
        states = [j.status() for j in jobs]  # each reads the job's record
        todo = [j for j, state in zip(jobs, states) if cfg.force or state != "done"]  # todo and stale
        flying = dispatch.in_flight(todo, cfg)  # SLURM jobs of an earlier command still queued or running
        states = [flying[j.run_id][1].lower()[:7] if j.run_id in flying else s for j, s in zip(jobs, states)]
        if not cfg.dry_run:
            check_outputs(cfg, todo)
            if cfg.backend == "real" and cfg.cluster.name == "slurm" and len(todo) > len(flying) and \
                    cfg.cluster.check_shared_fs:
                from harness.sharedfs import check_shared

                check_shared(cfg, log)
    except ValueError as err:
        print(f"sweep refused, nothing was submitted: {err}", file=sys.stderr)
        return 2
    done, stale = states.count("done"), states.count("stale")
    where = f"cluster={cfg.cluster.name}" if cfg.backend == "real" else f"hardware={cfg.hardware.name}"
    log(f"experiment {cfg.experiment}: {len(jobs)} jobs, {done} done, {len(todo)} to run "
        f"(backend={cfg.backend}, {where})" +
        (f"; {len(flying)} of them queued or running from an earlier command: followed, not submitted again"
         if flying else "") +
        (f"; {stale} simulated by other code (cost model or schedules changed since) run again" if stale else ""))
    if cfg.dry_run:
        requests = [j.request.describe() if j.request else "" for j in jobs]
        if any(requests):
            log("  " + _partition_line(jobs[0].request.partition))
        width = max((len(j.name) for j in jobs), default=0)
        for j, state, ask in zip(jobs, states, requests):
            log(f"  {j.index:>4}  {j.run_id}  {state:<7}  " + (f"{j.name:<{width}}  {ask}" if ask else j.name))
        return 0
    began = time.time()
    sweep_id = sweep_id or new_sweep_id()
    for job in todo:  # every record this sweep writes names it; W&B tags its runs with it (harness.wandb_log)
        job.labels["sweep"] = sweep_id
    try:
        if cfg.backend == "sim":
            simulate(todo, cfg, log)
        elif todo:
            runner = dispatch.run_local if cfg.cluster.name == "local" else dispatch.run_slurm
            runner(todo, cfg, log)
    except KeyboardInterrupt:
        print("\n" + interrupted_message(jobs, todo, cfg, began), file=sys.stderr)
        return 130
    if cfg.report:
        from harness.report import build_reports
        from harness.report.wandb_report import log_report

        for path in build_reports(Path(cfg.results_dir), cfg.reports_dir, [cfg.experiment], reuse=True, log=log):
            log(f"report: {path}")
        log_report(Path(cfg.results_dir), cfg.reports_dir, cfg.experiment, OmegaConf.to_container(cfg.logger),
                   Path.cwd(), log)
    return 0


def interrupted_message(jobs, todo, cfg, began: float) -> str:
    """What Ctrl-C left: how many of this command's runs finished (a record written since it began), and what a
    rerun does. A forced rerun skips nothing, so its earlier ok records do not count as done."""
    now_done = sum(1 for j in todo if j.status() == "done" and j.path.stat().st_mtime >= began)
    if cfg.force:
        return (f"interrupted: {now_done} of the {len(todo)} forced runs finished again; the same command "
                f"(force=true) starts all {len(todo)} again, without force=true every run with an ok record "
                f"(earlier or new) is skipped")
    left = len([j for j in jobs if j.status() != "done"])
    return (f"interrupted: {len(jobs) - left} of {len(jobs)} runs done ({now_done} by this command); rerun the same "
            f"command to resume (runs already done are skipped)")


def new_sweep_id() -> str:
    """'sweep-20261206-031502-7f3a': when it started (UTC) and four random hex digits."""
    import datetime
    import secrets

    return f"sweep-{datetime.datetime.now(datetime.timezone.utc):%Y%m%d-%H%M%S}-{secrets.token_hex(2)}"


def _partition_line(partition) -> str:
    if partition is not None:
        return partition.describe()
    return ("partition not queried (no SLURM answers here): GPU nodes taken to have 8 GPUs (cluster.gpus_per_node), "
            "CPUs per task and the time limit left to the partition; nothing checked against it")


def run_both(overrides: list[str], log, sweep_id: str) -> int:
    """backend=both: the sweep run for real, then the same jobs predicted with backend=sim and the hardware profile,
    into the same results folder; the report opens with predicted against measured. Both halves are planned and
    checked before either starts."""
    rest = [o for o in overrides if o.split("=", 1)[0].lstrip("+") != "backend"]
    sim = rest + ["backend=sim"]
    cfg, jobs = plan(sim)  # the real half is checked by its own run before it starts; the sim half here, first
    if not cfg.dry_run:
        check_outputs(cfg, jobs)
    real = [o for o in rest if o.split("=", 1)[0].lstrip("+") != "report"] + ["backend=real", "report=false"]
    code = run(real, log, sweep_id)
    return code if code else run(sim, log, sweep_id)


def simulate(todo: list[J.Job], cfg: DictConfig, log) -> None:
    from harness.sim import simulate_job

    logger = OmegaConf.to_container(cfg.logger) if cfg.logger.sim else None
    for job in todo:
        record = simulate_job(job.run, J.hardware_of(job.cfg), cfg.experiment, job.labels)
        finish_run(record, job.path, logger, Path.cwd())
    log(f"simulated {len(todo)} jobs into {Path(cfg.results_dir) / cfg.experiment}" +
        ("" if cfg.logger.sim or cfg.logger.mode == "disabled" else " (not logged to W&B; logger.sim=true logs them)"))


def refuse_hydra_plugins(hydra_cfg) -> str | None:
    """A refusal when the command line picked a Hydra launcher or sweeper parameters this harness does not use."""
    target = OmegaConf.select(hydra_cfg, "launcher._target_")
    if target and target != BASIC_LAUNCHER:
        choice = OmegaConf.select(hydra_cfg, "runtime.choices") or {}
        return (f"hydra/launcher={choice.get('hydra/launcher', target)}: runs are dispatched by this harness's "
                f"cluster group (submitit, pp tasks per run, one run at a time locally), not by a Hydra "
                f"launcher; use cluster=slurm cluster.partition=NAME (conf/cluster/slurm.yaml) or cluster=local")
    if OmegaConf.select(hydra_cfg, "sweeper.params"):
        return ("hydra.sweeper.params: experiments list their axes in grid.product (every combination) and "
                "grid.setups (zipped); give axes on the command line with -m key=a,b")
    return None


def start(hydra_cfg, overrides: list[str]) -> int:
    """Entry of both modes: a plain run (@hydra.main's task) and -m (the vp sweeper)."""
    refusal = refuse_hydra_plugins(hydra_cfg)
    if refusal:
        print(f"sweep refused, nothing was submitted: {refusal}", file=sys.stderr)
        return 2
    # each job is composed again with the command line (and its extra config search path)
    searchpath = [o for o in hydra_cfg.overrides.hydra if o.startswith("hydra.searchpath")]
    return run(list(overrides) + searchpath)


@hydra.main(config_path="../conf", config_name="config", version_base="1.3")
def main(cfg: DictConfig) -> None:
    hc = HydraConfig.get()
    code = start(hc, list(hc.overrides.task))
    if code:
        sys.exit(code)


def precheck(argv: list[str]) -> int:
    """Compose the command line as @hydra.main will, so that a bad override (a wrong type, an unknown key) is
    refused here with the field and the fix, exit code 2, instead of Hydra's error for the whole config."""
    if any(a.startswith("-") and a not in ("-m", "--multirun") for a in argv):
        return 0  # --help, --cfg, ...: Hydra's own flags
    from hydra import initialize_config_dir

    with initialize_config_dir(str(Path(__file__).resolve().parents[1] / "conf"), version_base="1.3"):
        try:
            fixed, _, _ = split_overrides([a for a in argv if not a.startswith("-")])
            compose_checked(fixed)
        except ValueError as err:
            print(f"sweep refused, nothing was submitted: {err}", file=sys.stderr)
            return 2
    return 0


if __name__ == "__main__":
    if code := precheck(sys.argv[1:]):
        sys.exit(code)
    try:
        main()
    except BrokenPipeError:  # `--help | head`: the reader left
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
