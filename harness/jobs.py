"""From a composed sweep config to validated jobs: expand the experiment's grid, compose each job with
Hydra, turn it into a vp RunConfig, check everything before anything is submitted.

A job's id is the hash of its semantic config (vp.record.run_id), so a rerun finds what is done.
"""
import itertools
import json
from dataclasses import dataclass, field
from pathlib import Path

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import MissingMandatoryValue

from vp.config import RunConfig, check_config
from vp.cost import PROFILES, Hardware
from vp.schedule.methods import get_method
from vp.record import run_id

GROUPS = ("model", "vocab", "method", "cluster", "logger", "hardware")
BACKENDS = ("real", "sim")
LOGGER_MODES = ("offline", "online", "disabled")


@dataclass
class Job:
    index: int
    overrides: list[str]
    cfg: DictConfig
    run: RunConfig | None = None
    labels: dict = field(default_factory=dict)
    run_id: str = ""
    path: Path | None = None

    @property
    def name(self) -> str:
        return " ".join(self.overrides) or "(base config)"

    @property
    def backend(self) -> str:
        return self.cfg.backend

    def status(self) -> str:
        """'done' when an ok record exists, else 'todo' (or the failed status of the last attempt)."""
        if self.path is None or not self.path.exists():
            return "todo"
        try:
            return "done" if json.loads(self.path.read_text()).get("status") == "ok" else "todo"
        except (OSError, json.JSONDecodeError):
            return "todo"


def grid_overrides(grid) -> list[list[str]]:
    """setups (a list of override dicts, zipped) x product (a dict of lists, every combination)."""
    grid = OmegaConf.to_container(grid, resolve=True) if isinstance(grid, DictConfig) else (grid or {})
    unknown = set(grid) - {"setups", "product"}
    if unknown:
        raise ValueError(f"grid has unknown key(s) {sorted(unknown)}; use grid.setups (a list of override "
                         f"dicts) and grid.product (a dict of lists)")
    setups = grid.get("setups") or [{}]
    product = grid.get("product") or {}
    for key, values in product.items():
        if not isinstance(values, list) or not values:
            raise ValueError(f"grid.product.{key} must be a non-empty list of values, got {values!r}")
    keys = list(product)
    out = []
    for setup in setups:
        for combo in itertools.product(*(product[k] for k in keys)):
            items = list(setup.items()) + list(zip(keys, combo))
            out.append([f"{k}={_value(v)}" for k, v in items])
    return out


def _value(v) -> str:
    return "null" if v is None else str(v)


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


def check(job: Job, gpus_here: int) -> None:
    """Everything that can be known before submission; ValueError names the field and the fix."""
    cfg = job.cfg
    if cfg.backend not in BACKENDS:
        raise ValueError(f"backend={cfg.backend} is unknown; use backend=real or backend=sim")
    if cfg.logger.mode not in LOGGER_MODES:
        raise ValueError(f"logger.mode={cfg.logger.mode} is unknown; use one of {', '.join(LOGGER_MODES)}")
    for name in ("model", "vocab", "method", "run"):
        try:
            OmegaConf.to_container(cfg[name], resolve=True, throw_on_missing=True)
        except MissingMandatoryValue as err:
            raise ValueError(f"{name}.{err.key} is not set; give it on the command line") from None
    if not isinstance(cfg.vocab.size, int) or cfg.vocab.size < 1:
        raise ValueError(f"vocab.size={cfg.vocab.size!r} must be a positive integer")
    job.run = check_config(run_config(cfg))
    if cfg.backend == "sim":
        hardware_of(cfg)
        return
    if cfg.cluster.name == "local":
        if job.run.world > cfg.cluster.max_local_ranks:
            raise ValueError(f"run.dp x run.pp = {job.run.world} local processes but cluster.max_local_ranks="
                             f"{cfg.cluster.max_local_ranks}; use cluster=slurm, backend=sim, or raise "
                             f"cluster.max_local_ranks")
        if job.run.device == "cuda" and gpus_here < job.run.world:
            raise ValueError(f"run.device=cuda needs {job.run.world} GPUs here but {gpus_here} are visible; use "
                             f"run.device=cpu (with run.dtype=fp32), cluster=slurm, or backend=sim")
    elif cfg.cluster.name == "slurm":
        try:
            partition = cfg.cluster.partition
        except MissingMandatoryValue:
            partition = None
        if not partition:
            raise ValueError("cluster.partition is not set; run with cluster=slurm cluster.partition=NAME "
                             "(sinfo lists the partitions)")
        per_node = cfg.cluster.tasks_per_node or cfg.cluster.gpus_per_node or job.run.world
        if job.run.world % per_node:
            raise ValueError(f"the world of {job.run.world} tasks (run.dp x run.pp) does not split over nodes of "
                             f"cluster.tasks_per_node={per_node}; set cluster.tasks_per_node to a divisor of "
                             f"{job.run.world}")
        if job.run.device == "cuda" and not cfg.cluster.gpus_per_node:
            raise ValueError("run.device=cuda but cluster.gpus_per_node=0; set cluster.gpus_per_node or "
                             "run.device=cpu")
    else:
        raise ValueError(f"cluster={cfg.cluster.name} is unknown; use cluster=local or cluster=slurm")


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
