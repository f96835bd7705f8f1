"""From a composed sweep config to validated jobs: expand the experiment's grid (with the command line's
axes put in), turn each job into a vp RunConfig, check everything before anything is submitted.

A job's id is the hash of its semantic config (vp.record.run_id), so a rerun finds what is done.
"""
import itertools
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from vp.checks import check_fault, check_memory, check_schedule_size, check_size, parse_fault
from vp.config import RunConfig, check_config
from vp.cost import PROFILES, Hardware
from vp.schedule.methods import get_method
from vp.record import run_id

from harness.records import read
from harness.slurm import Partition, Request, check_request, plan_request


@dataclass
class Job:
    index: int
    overrides: list[str]
    cfg: DictConfig | None
    run: RunConfig | None = None
    labels: dict = field(default_factory=dict)
    fault: tuple[int, str, str] | None = None
    run_id: str = ""
    path: Path | None = None
    request: Request | None = None  # cluster=slurm: what the job asks of the partition

    @property
    def name(self) -> str:
        return " ".join(self.overrides) or "(base config)"

    def status(self) -> str:
        """'done' when an ok record exists; 'stale' when it is a simulated one predicted by other code (a changed
        cost model or schedule: harness.sim.simulator_version); else 'todo' (a failed or unreadable record is run
        again). Stale and todo jobs run."""
        try:
            rec = read(self.path) if self.path is not None and self.path.exists() else None
        except ValueError:
            rec = None
        if rec is None or rec["status"] != "ok":
            return "todo"
        if rec.get("backend") == "sim":
            from harness.sim import simulator_version

            if (rec.get("env") or {}).get("simulator_version") != simulator_version():
                return "stale"
        return "done"


def _value(v) -> str:
    return "null" if v is None else str(v)


def grid_overrides(grid, given: dict[str, list[str] | None]) -> list[list[str]]:
    """setups (zipped override dicts) x product (a dict of lists, every combination), as override lists.

    `given` holds the command line's keys: key -> its values (one for `key=v`, several for `-m key=a,b`).
    A product axis given on the command line is dropped (the command line's value or sweep stands for it);
    setups that set a given key are kept only where their value is one of the given ones."""
    grid = OmegaConf.to_container(grid, resolve=True) if isinstance(grid, DictConfig) else (grid or {})
    setups = grid.get("setups") or [{}]
    product = grid.get("product") or {}
    for key, values in product.items():
        if not isinstance(values, list) or not values:
            raise ValueError(f"grid.product.{key} must be a non-empty list of values, got {values!r}")
    for key, values in given.items():
        in_setups = [s for s in setups if key in s]
        if not in_setups or values is None:
            continue
        kept = [s for s in setups if key not in s or _value(s[key]) in values]
        if not kept:
            have = sorted({_value(s[key]) for s in in_setups})
            raise ValueError(f"{key}={','.join(values)} matches none of the experiment's setups ({key}: "
                             f"{', '.join(have)}); pick one of those, or give the setups yourself, e.g. "
                             f"'grid.setups=[{{{key}: {values[0]}, ...}}]'")
        setups = kept
    keys = [k for k in product if k not in given]
    out = []
    for setup in setups:
        for combo in itertools.product(*(product[k] for k in keys)):
            items = list(setup.items()) + list(zip(keys, combo))
            out.append([f"{k}={_value(v)}" for k, v in items])
    return out


def _plain(grid) -> dict:
    return OmegaConf.to_container(grid, resolve=True) if isinstance(grid, DictConfig) else (grid or {})


def setup_keys(grid) -> set[str]:
    return {k for s in _plain(grid).get("setups") or [] for k in s}


def axis_keys(grid) -> set[str]:
    return setup_keys(grid) | set(_plain(grid).get("product") or {})


def run_config(cfg: DictConfig) -> RunConfig:
    """The vp run of a composed job config."""
    run = OmegaConf.to_container(cfg.run, resolve=True)
    spec = get_method(cfg.method.name)
    # chunks are chosen per run only by methods that take them (interleaved); the others have a fixed count,
    # so a setup's run.chunks (e.g. 3 for 48 layers on 16 ranks) applies to interleaved alone
    run_chunks = run.pop("chunks", None)
    chunks = (run_chunks or cfg.method.chunks) if spec.family.chunks == 0 else None
    # likewise run.redis_last_layers (a paper grid's N per vocabulary) applies to redis alone
    if not spec.redistributes_layers:
        run["redis_last_layers"] = None
    return RunConfig(method=cfg.method.name, chunks=chunks, layers=cfg.model.layers, hidden=cfg.model.hidden,
                     heads=cfg.model.heads, ffn_hidden=cfg.model.ffn_hidden, vocab_size=cfg.vocab.size,
                     pad_multiple=cfg.vocab.pad_multiple, **run)


def hardware_of(cfg: DictConfig) -> Hardware:
    hw = cfg.hardware
    if hw.get("profile"):
        return Hardware.from_dict(OmegaConf.to_container(hw.profile, resolve=True))
    if hw.name not in PROFILES:
        raise ValueError(f"hardware={hw.name} has no built-in profile and no `profile:` section; use one of "
                         f"{', '.join(PROFILES)} or a calibrated profile (python -m harness.calibrate)")
    return PROFILES[hw.name]


def check(job: Job, gpus_here: int, partition: Callable[[], Partition | None] = lambda: None) -> None:
    """Everything that can be known before submission; ValueError names the field and the fix. `partition()`: the
    facts of cluster=slurm's partition (harness.slurm.query_partition, asked once per sweep; None where SLURM is
    not here)."""
    cfg = job.cfg
    job.run = check_config(run_config(cfg))
    limits = cfg.limits
    check_schedule_size(job.run.pp, job.run.microbatches, job.run.n_chunks, limits.schedule_size,
                        "raise limits.schedule_size")
    if cfg.fault is not None and cfg.fault.method == job.run.method:
        job.fault = parse_fault(cfg.fault.at)
        check_fault(job.run, job.fault)
    if cfg.backend == "sim":
        hardware_of(cfg)
        return
    check_size(job.run, limits.tokens_per_microbatch, "raise limits.tokens_per_microbatch")
    world = job.run.world
    if cfg.cluster.name == "local":
        if world > cfg.cluster.max_local_ranks:
            raise ValueError(f"run.dp x run.pp x run.tp = {world} local processes but cluster.max_local_ranks="
                             f"{cfg.cluster.max_local_ranks}; use cluster=slurm, backend=sim, or raise "
                             f"cluster.max_local_ranks")
        if job.run.device == "cuda" and gpus_here < world:
            raise ValueError(f"run.device=cuda needs {world} GPUs here but {gpus_here} are visible; use "
                             f"run.device=cpu (with run.dtype=fp32), cluster=slurm, or backend=sim")
        if job.run.device == "cpu":
            limit = limits.memory_gb * 2**30 if limits.memory_gb else None
            check_memory(job.run, world, limit, "set limits.memory_gb (GiB the local ranks may use together)")
        return
    if OmegaConf.is_missing(cfg.cluster, "partition") or not cfg.cluster.partition:
        raise ValueError("cluster.partition is not set; run with cluster=slurm cluster.partition=NAME "
                         "(sinfo lists the partitions)")
    given = cfg.cluster.tasks_per_node
    if given and world % given:
        raise ValueError(f"the world of {world} tasks (run.dp x run.pp x run.tp) does not split over nodes of "
                         f"cluster.tasks_per_node={given}; set cluster.tasks_per_node to a divisor of {world} "
                         f"(or null: chosen from the partition)")
    facts = partition()
    job.request = plan_request(world, job.run.tp, job.run.device == "cuda", cfg.cluster, facts)
    if facts is not None:
        check_request(job.request, facts)


def finish(job: Job, results_dir: Path) -> Job:
    """Labels, run id and record path of a checked job."""
    cfg = job.cfg
    job.labels = {"model": cfg.model.name, "vocab": cfg.vocab.name}
    profile = None
    if cfg.backend == "sim":
        job.labels["hardware"] = cfg.hardware.name
        profile = hardware_of(cfg).to_dict()
    job.run_id = run_id(job.run.to_dict(), cfg.backend, profile)
    job.path = results_dir / cfg.experiment / f"{job.run_id}.json"
    return job
