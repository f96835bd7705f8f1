"""The typed config tree of a sweep, registered in Hydra's ConfigStore: `schema` is the first entry of
conf/config.yaml's defaults, and each cluster file starts from its own (`/schema_cluster_local@_here_`,
`/schema_cluster_slurm@_here_`; stored outside the `cluster` group so they are not options of it). Hydra then refuses a value of the wrong type (`force=maybe`, `run.pp=two`) while composing;
`check` below adds what types cannot say: unknown keys, ranges and choices, each refused with the field and
the fix.

`run` is typed from vp.config.RunConfig itself (every field that no config group sets), so a field added
there is a typed `run.<field>` here without a line in this file; its ranges are vp.config.validate's.
The YAML files give the values, this file the types.
"""
import difflib
from dataclasses import MISSING as DC_MISSING, dataclass, field, fields, make_dataclass
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, DictConfig, OmegaConf

import math

from vp.checks import MAX_GLOBAL_BATCH, MAX_PLAN_GPUS, MAX_SCHEDULE_SIZE, MAX_TOKENS_PER_MICROBATCH
from vp.config import RunConfig

# RunConfig fields that come from the model, vocab and method groups, not from `run`
FROM_GROUPS = ("method", "layers", "hidden", "heads", "ffn_hidden", "vocab_size", "pad_multiple")


def _run_field(f):
    default = f.default if f.default is not DC_MISSING else MISSING
    return f.name, f.type, field(default=default)


RunSchema = make_dataclass("RunSchema", [_run_field(f) for f in fields(RunConfig) if f.name not in FROM_GROUPS])


def ranged(lo=None, hi=None, choices=None, fix: str = "", default=MISSING):
    """A field whose value `check` keeps within lo..hi (or among choices); `fix` ends the refusal message."""
    return field(default=default, metadata={"lo": lo, "hi": hi, "choices": choices, "fix": fix})


@dataclass
class ModelSchema:
    name: str = MISSING
    layers: int = MISSING
    hidden: int = MISSING
    heads: int = MISSING
    ffn_hidden: int | None = None


@dataclass
class VocabSchema:
    name: str = MISSING
    size: int = MISSING
    pad_multiple: int | None = None


@dataclass
class MethodSchema:
    name: str = MISSING
    chunks: int | None = None


@dataclass
class HardwareSchema:
    name: str = MISSING
    profile: dict[str, Any] | None = None  # a calibrated profile (python -m harness.calibrate); null = built-in


@dataclass
class LoggerSchema:
    name: str = MISSING
    mode: str = ranged(choices=("offline", "online", "disabled"), fix="logger=wandb (offline), wandb_online or off")
    project: str | None = None
    entity: str | None = None
    sim: bool = False  # also log backend=sim records (predictions) to W&B
    live: bool | None = None  # the run's W&B run opens when it starts (harness.live); null: on for cluster=slurm
    live_timeout_s: float = ranged(1, 3600, default=120.0,
                                   fix="seconds a live run's W&B writer gets to log the record and finish")


@dataclass
class LocalCluster:
    name: str = MISSING
    max_local_ranks: int = ranged(1, 256, fix="the processes one run may start on this machine")
    timeout_min: int = ranged(1, 7 * 24 * 60, fix="minutes before a job is killed and recorded as timeout")
    rendezvous: str = ranged(choices=("file",), fix="local ranks meet through a file in the job folder")
    folder: str = MISSING


@dataclass
class SlurmCluster:
    name: str = MISSING
    partition: str = MISSING
    # null: from the partition (harness.slurm: sinfo and scontrol), the value most of its nodes have
    gpus_per_node: int | None = ranged(0, 64, default=None, fix="GPUs of a node; 0 for CPU-only nodes, null: from "
                                                                "the partition")
    tasks_per_node: int | None = ranged(1, 1024, default=None, fix="null: the whole run on one node where it fits, "
                                                                   "else the fewest nodes that split it evenly")
    cpus_per_task: int | None = ranged(1, 1024, default=None, fix="CPU cores per task; null: the node's CPUs per GPU "
                                                                  "(1 on CPU-only nodes)")
    mem_gb: int | None = ranged(1, 1 << 20, default=None, fix="GB per node, or null for the partition's default")
    time_min: int | None = ranged(1, 30 * 24 * 60, default=None, fix="the job's time limit in minutes; null: the "
                                                                     "partition's")
    pending_grace_s: int = ranged(0, 24 * 3600, default=60, fix="seconds a job may pend for a reason that cannot "
                                                                "clear before it is cancelled")
    account: str | None = None
    qos: str | None = None
    setup: list[str] = field(default_factory=list)
    rendezvous: str = ranged(choices=("tcp", "file"), fix="tcp (the first node) or file (a shared file system)")
    wait: bool = True
    detach: bool = False  # Ctrl-C leaves the submitted jobs running (else it cancels them)
    check_shared_fs: bool = True  # a probe job checks that the nodes see the checkout and folders (harness.sharedfs)
    probe_s: int = ranged(1, 3600, default=30, fix="seconds the shared file system probe may wait for the queue")
    folder: str = MISSING


@dataclass
class FaultSchema:
    method: str = MISSING
    at: str = MISSING  # RANK:ACTION[:exit|raise|hang|oom]


@dataclass
class LimitsSchema:
    """Sanity limits checked before anything runs; raise one to go past it on purpose."""
    tokens_per_microbatch: int = ranged(1, default=MAX_TOKENS_PER_MICROBATCH, fix="micro_batch_size x seq_len")
    schedule_size: int = ranged(1, default=MAX_SCHEDULE_SIZE, fix="pp x microbatches x chunks")
    memory_gb: float | None = ranged(0.01, default=None, fix="GiB the local ranks of a run may use together; "
                                                              "null = what this machine has available")


@dataclass
class PlanSchema:
    """python -m harness.plan's settings (conf/plan/default.yaml; docs/planner.md)."""
    gpus: int = ranged(1, MAX_PLAN_GPUS, fix="the devices of one kind the run may use (dp x pp x tp)")
    global_batch: int = ranged(1, MAX_GLOBAL_BATCH, fix="sequences per iteration over all replicas (dp x microbatches x "
                                      "micro_batch_size)")
    top: int = ranged(1, 1000, fix="how many of the best plans to list and write to the experiment file")
    name: str | None = None  # the experiment file is plan_<name>.yaml; null: from model, vocab, hardware, gpus
    json: bool = False  # print one JSON object instead of the tables
    prune: bool = True  # skip candidates a safe bound shows cannot enter the answer; false: simulate every one
    tp_in_node: bool = True  # tensor-parallel groups inside one node (tp <= hardware gpus_per_node)
    memory_margin: float = ranged(0.0, 0.5, default=0.05, fix="the share of the device's memory a plan leaves free "
                                  "for fragmentation and what the model does not see (0.05: 5 %)")
    methods: list[str] | None = None  # null: every method; method=NAME fixes one
    out: str | None = None  # the experiment file; null: <user config folder>/experiment/plan_<name>.yaml
    figures: str = "plans"  # the folder of plan_<name>/ (Pareto figure, table, JSON)


@dataclass
class GridSchema:
    setups: list[dict[str, Any]] = field(default_factory=list)  # zipped: each a dict of overrides
    product: dict[str, list[Any]] = field(default_factory=dict)  # every combination


@dataclass
class SweepSchema:
    experiment: str = MISSING
    backend: str = ranged(choices=("real", "sim", "both"), fix="real runs processes, sim predicts with the cost "
                                                              "model, both does each and reports them side by side")
    results_dir: str = MISSING
    reports_dir: str | None = None
    dry_run: bool = False
    force: bool = False
    report: bool = True
    fault: Any = None  # null or a FaultSchema's keys (an Optional structured node cannot take a merged dict)
    limits: LimitsSchema = field(default_factory=LimitsSchema)
    run: RunSchema = field(default_factory=RunSchema)
    grid: GridSchema = field(default_factory=GridSchema)
    model: ModelSchema = field(default_factory=ModelSchema)
    vocab: VocabSchema = field(default_factory=VocabSchema)
    method: MethodSchema = field(default_factory=MethodSchema)
    hardware: HardwareSchema = field(default_factory=HardwareSchema)
    logger: LoggerSchema = field(default_factory=LoggerSchema)
    cluster: Any = MISSING  # LocalCluster or SlurmCluster, from the cluster file's own defaults
    plan: Any = None  # python -m harness.plan only (PlanSchema, from conf/plan/default.yaml)


CLUSTERS = {"local": LocalCluster, "slurm": SlurmCluster}
OPTIONAL_HERE = {("cluster", "partition")}  # checked only where it matters, with its own message (harness.jobs)


def register() -> None:
    cs = ConfigStore.instance()
    cs.store(name="schema", node=SweepSchema)
    for name, schema in CLUSTERS.items():
        cs.store(name=f"schema_cluster_{name}", node=schema)
    cs.store(name="schema_plan", node=PlanSchema)


SECTIONS = {"": SweepSchema, "run": RunSchema, "model": ModelSchema, "vocab": VocabSchema, "method": MethodSchema,
            "hardware": HardwareSchema, "logger": LoggerSchema, "fault": FaultSchema, "grid": GridSchema,
            "limits": LimitsSchema, "plan": PlanSchema}


def schema_of(path: str, cfg: DictConfig):
    """The dataclass that types cfg's node at `path` ('' for the root); the cluster's follows cluster.name."""
    if path == "cluster":
        return CLUSTERS.get(OmegaConf.select(cfg, "cluster.name"))
    return SECTIONS[path]


def unknown_key_message(path: str, key: str, schema) -> str:
    known = [f.name for f in fields(schema)]
    where = f"{path}.{key}" if path else key
    near = difflib.get_close_matches(key, known, n=1)
    hint = f"did you mean {path + '.' if path else ''}{near[0]}? " if near else ""
    return f"{where} is not a field of {path or 'the sweep config'}; {hint}its fields are {', '.join(known)}"


def check(cfg: DictConfig) -> None:
    """Unknown keys, ranges and choices of every typed section; ValueError names the field and the fix."""
    for path in (*SECTIONS, "cluster"):
        node = cfg if path == "" else OmegaConf.select(cfg, path)
        schema = schema_of(path, cfg)
        if path == "fault" and node is not None and not isinstance(node, DictConfig):
            raise ValueError(f"fault={node!r}: use null or fault={{method: M, at: 'RANK:ACTION[:exit|raise|hang|oom]'}}")
        if node is None or schema is None or not isinstance(node, DictConfig):
            if path == "cluster" and node is not None:
                raise ValueError(f"cluster.name={OmegaConf.select(cfg, 'cluster.name')!r} is unknown; "
                                 f"use cluster=local or cluster=slurm")
            continue
        known = {f.name: f for f in fields(schema)}
        for key in node:
            if key not in known:
                raise ValueError(unknown_key_message(path, str(key), schema))
        for name, f in known.items():
            if name not in node or OmegaConf.is_missing(node, name):
                if f.default is MISSING and f.default_factory is DC_MISSING and not (path, name) in OPTIONAL_HERE:
                    raise ValueError(f"{path + '.' if path else ''}{name} is not set; give it on the command line")
                continue
            value, where = node[name], f"{path}.{name}" if path else name
            if isinstance(value, float) and not math.isfinite(value):  # nan, inf: no setting means "no limit"
                raise ValueError(f"{where}={value} must be a finite number" +
                                 (f" ({f.metadata['fix']})" if f.metadata.get("fix") else ""))
            meta = f.metadata
            if not meta or value is None:
                continue
            if meta["choices"] and value not in meta["choices"]:
                raise ValueError(f"{where}={value} is unknown; use one of {', '.join(meta['choices'])} "
                                 f"({meta['fix']})")
            lo, hi = meta["lo"], meta["hi"]
            if (lo is not None and value < lo) or (hi is not None and value > hi):
                span = f"{lo}..{hi}" if hi is not None else f">= {lo}"
                raise ValueError(f"{where}={value} is out of range; use {span} ({meta['fix']})")
