"""What a SLURM partition can give, what one run asks of it, and why a pending job waits.

The facts of a partition come from SLURM itself: its limits from `scontrol show partition NAME -o` (State,
MaxTime, DefaultTime, MaxNodes, MinNodes, MaxCPUsPerNode, MaxMemPerNode) and its nodes from `sinfo -N -p NAME`
(CPUs, memory and the GPUs of each node's Gres). A run's request (`Request`) takes what the user gave in
`cluster.*` and the partition's facts for the rest; a job smaller than a node takes part of one (tasks per node =
the world where it fits), a larger one spans the fewest nodes that split it evenly. `check_request` refuses, before
anything is submitted, what the partition cannot give, naming the field and the fix.

A pending job's reason (squeue %r) is shown while the sweep waits; `stuck` says which reasons cannot clear by
themselves (harness.dispatch cancels such a job after a grace and records it failed with the reason).
"""
import re
import shutil
import subprocess
from collections import Counter
from dataclasses import dataclass, field

COMMANDS = ("sbatch", "squeue", "sinfo", "scontrol", "scancel")  # what cluster=slurm calls
NODE_FORMAT = "%N|%c|%m|%G|%T"  # sinfo -N: node name, CPUs, memory (MB), Gres, state


@dataclass(frozen=True)
class Node:
    name: str
    cpus: int
    mem_mb: int
    gpus: int
    state: str


@dataclass(frozen=True)
class Partition:
    name: str
    state: str
    nodes: tuple[Node, ...]
    max_time_min: int | None = None      # None: UNLIMITED
    default_time_min: int | None = None  # None: NONE (SLURM then applies MaxTime)
    max_nodes: int | None = None         # per job; None: UNLIMITED
    min_nodes: int = 0
    max_cpus_per_node: int | None = None
    max_mem_per_node_mb: int | None = None

    def typical(self, attr: str) -> int:
        """The value of a node attribute that most of the partition's nodes have (ties: the larger)."""
        counts = Counter(getattr(n, attr) for n in self.nodes)
        return max(counts, key=lambda v: (counts[v], v)) if counts else 0

    @property
    def time_limit_min(self) -> int | None:
        """The limit a job that asks for none gets: DefaultTime, else MaxTime (None: unlimited)."""
        return self.default_time_min if self.default_time_min is not None else self.max_time_min

    def describe(self) -> str:
        n = len(self.nodes)
        mixed = "" if len({(x.cpus, x.gpus, x.mem_mb) for x in self.nodes}) <= 1 else " (mostly)"
        return (f"partition {self.name}: {n} node{'s' if n != 1 else ''} of{mixed} {self.typical('gpus') or 'no'} "
                f"GPUs, {self.typical('cpus')} CPUs, {self.typical('mem_mb') / 1024:.0f} GiB; max time "
                f"{_minutes(self.max_time_min)}")


def _minutes(value: int | None) -> str:
    return "unlimited" if value is None else f"{value} min"


def parse_time(text: str) -> int | None:
    """A SLURM time (`UNLIMITED`, `MM`, `MM:SS`, `HH:MM:SS`, `D-HH`, `D-HH:MM`, `D-HH:MM:SS`) in whole minutes,
    rounded up; None for UNLIMITED, INFINITE and NONE."""
    text = text.strip()
    if text.upper() in ("UNLIMITED", "INFINITE", "NONE", "N/A", ""):
        return None
    days, _, rest = text.rpartition("-")
    parts = [int(p) for p in rest.split(":")]
    if days:
        h, m, s = (parts + [0, 0])[:3]
    else:
        h, m, s = {1: (0, parts[0], 0), 2: (0, *parts), 3: tuple(parts)}[len(parts)]
    seconds = ((int(days or 0) * 24 + h) * 60 + m) * 60 + s
    return -(-seconds // 60)


def parse_gpus(gres: str) -> int:
    """GPUs of a node's Gres: `gpu:8`, `gpu:a100:8(S:0-1)`, `gpu:a100:4,gpu:v100:2`, `gpu` (one), `(null)`."""
    total = 0
    for entry in re.sub(r"\([^)]*\)", "", gres).split(","):
        parts = entry.strip().split(":")
        if parts[0] == "gpu":
            total += int(parts[-1]) if len(parts) > 1 and parts[-1].isdigit() else 1
    return total


def parse_fields(line: str) -> dict[str, str]:
    """`Key=Value Key=Value ...` (one line of `scontrol show ... -o`); a value runs to the next blank."""
    return {m.group(1): m.group(2) for m in re.finditer(r"(?:^|\s)([A-Za-z]+)=(\S*)", line)}


def _number(text: str) -> int:
    return int(re.match(r"\d+", text).group())  # sinfo marks aggregated values with '+'


def parse_nodes(text: str) -> list[Node]:
    """Lines of `sinfo -h -N -o '%N|%c|%m|%G|%T'`; a node listed twice (several partitions) counts once."""
    nodes = {}
    for line in text.splitlines():
        if not line.strip():
            continue
        name, cpus, mem, gres, state = line.strip().split("|")
        nodes[name] = Node(name, _number(cpus), _number(mem), parse_gpus(gres), state.rstrip("*~#!%$@^-+").lower())
    return list(nodes.values())


def _limit(value: str) -> int | None:
    return None if value.upper() in ("UNLIMITED", "INFINITE", "") else _number(value)


def partition_from(scontrol_line: str, sinfo_text: str) -> Partition:
    f = parse_fields(scontrol_line)
    return Partition(name=f["PartitionName"], state=f.get("State", "UP"), nodes=tuple(parse_nodes(sinfo_text)),
                     max_time_min=parse_time(f.get("MaxTime", "UNLIMITED")),
                     default_time_min=parse_time(f.get("DefaultTime", "NONE")),
                     max_nodes=_limit(f.get("MaxNodes", "UNLIMITED")), min_nodes=_limit(f.get("MinNodes", "0")) or 0,
                     max_cpus_per_node=_limit(f.get("MaxCPUsPerNode", "UNLIMITED")),
                     max_mem_per_node_mb=_limit(f.get("MaxMemPerNode", "UNLIMITED")))


def _call(args: list[str], timeout_s: float = 30) -> subprocess.CompletedProcess:
    """A SLURM command's result; one that does not answer within timeout_s (a busy controller) is a failed call
    (exit code 124, as timeout(1) gives), which every caller handles as SLURM not answering now."""
    try:
        return subprocess.run(args, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return subprocess.CompletedProcess(args, 124, "", f"`{' '.join(args)}` did not answer within {timeout_s:g} s")


class NoAnswer(ValueError):
    """SLURM's commands are here but its controller did not answer."""


def query_partition(name: str, call=_call) -> Partition:
    """The partition's facts from scontrol and sinfo; ValueError when it does not exist, NoAnswer when SLURM does
    not answer."""
    out = call(["scontrol", "show", "partition", name, "-o"])
    if out.returncode != 0 or not out.stdout.strip():
        said = (out.stderr or out.stdout).strip()
        if "not found" not in said:
            raise NoAnswer(f"cluster.partition={name}: SLURM did not answer `scontrol show partition {name}` "
                             f"({said or 'no output'}); check that `sinfo` works here, or list the jobs with "
                             f"dry_run=true")
        known = call(["sinfo", "-h", "-o", "%P"]).stdout.split()
        raise ValueError(f"cluster.partition={name} does not exist; partitions here: "
                         f"{', '.join(p.rstrip('*') for p in known) or 'none'} (sinfo lists them)")
    nodes = call(["sinfo", "-h", "-N", "-p", name, "-o", NODE_FORMAT])
    if nodes.returncode != 0:
        raise ValueError(f"cluster.partition={name}: `sinfo -N -p {name}` failed ({nodes.stderr.strip()})")
    return partition_from(out.stdout.strip().splitlines()[0], nodes.stdout)


def slurm_here() -> bool:
    return shutil.which("sinfo") is not None and shutil.which("scontrol") is not None


@dataclass(frozen=True)
class Request:
    """What one run asks of SLURM. None: left to the partition's default (cpus_per_task only while the partition's
    facts are unknown, i.e. a dry run without SLURM)."""
    nodes: int
    tasks_per_node: int
    gpus_per_node: int
    cpus_per_task: int | None
    mem_gb: int | None
    time_min: int | None
    partition: Partition | None = field(default=None, compare=False)

    def describe(self) -> str:
        p = self.partition
        time = f"{self.time_min} min" if self.time_min else \
            f"the partition's time limit ({_minutes(p.time_limit_min)})" if p else "the partition's time limit"
        cpus = f"{self.cpus_per_task} CPU{'s' if self.cpus_per_task != 1 else ''}/task" if self.cpus_per_task \
            else "CPUs/task from the partition"
        return (f"{self.nodes} node{'s' if self.nodes > 1 else ''} x {self.tasks_per_node} task"
                f"{'s' if self.tasks_per_node > 1 else ''}, {self.gpus_per_node or 'no'} GPU"
                f"{'s' if self.gpus_per_node != 1 else ''}/node, {cpus}" +
                (f", {self.mem_gb} GB/node" if self.mem_gb else "") + f", {time}")


def tasks_per_node(world: int, capacity: int, tp: int = 1) -> int:
    """Tasks on each node for the fewest nodes that split the world evenly with at most `capacity` each: the whole
    world when it fits on one node (part of a node), else spanning nodes, keeping a stage's tp ranks (consecutive in
    vp.mesh's order) on one node where tp fits."""
    fits = [t for t in range(min(world, max(capacity, 1)), 0, -1) if world % t == 0]
    return next((t for t in fits if t % tp == 0), fits[0])


def plan_request(world: int, tp: int, cuda: bool, cl, part: Partition | None) -> Request:
    """The request of a run of `world` ranks from the cluster config `cl` (cluster.* values given win) and the
    partition's facts (None: not known here, a dry run without SLURM)."""
    if not cuda and cl.gpus_per_node:
        raise ValueError(f"cluster.gpus_per_node={cl.gpus_per_node} but run.device=cpu: a CPU run takes no GPUs; drop "
                         f"cluster.gpus_per_node (or set it to 0), or run on GPUs with run.device=cuda")
    gpus_node = cl.gpus_per_node if cl.gpus_per_node is not None else part.typical("gpus") if part else \
        (8 if cuda else 0)
    if cuda and not gpus_node:
        where = "cluster.gpus_per_node=0" if cl.gpus_per_node is not None else \
            f"the nodes of partition {cl.partition} have no GPUs (no gpu in their Gres)"
        raise ValueError(f"run.device=cuda but {where}; pick a GPU partition (sinfo -o '%P %G' lists them)" +
                         (", set cluster.gpus_per_node" if part is None else "") + _cpu_hint(world, tp, cl, part))
    if cuda and part is not None and cl.gpus_per_node and not part.typical("gpus") and \
            not any(n.gpus for n in part.nodes):
        raise ValueError(f"cluster.gpus_per_node={cl.gpus_per_node} but the nodes of partition {part.name} have no "
                         f"GPUs (no gpu in their Gres); pick a GPU partition (sinfo -o '%P %G' lists them)"
                         + _cpu_hint(world, tp, cl, part))
    cpus_node = None
    if part:
        cpus_node = part.typical("cpus")
        if part.max_cpus_per_node:
            cpus_node = min(cpus_node, part.max_cpus_per_node)
    cpus = cl.cpus_per_task or (None if cpus_node is None else max(1, cpus_node // gpus_node) if cuda else 1)
    if cl.tasks_per_node:
        per_node = cl.tasks_per_node
        assert world % per_node == 0, "checked by harness.jobs.check"
    else:
        capacity = gpus_node if cuda else (cpus_node // (cpus or 1) if cpus_node else world)
        per_node = tasks_per_node(world, capacity, tp)
    return Request(world // per_node, per_node, per_node if cuda else 0, cpus, cl.mem_gb, cl.time_min, part)


def _cpu_hint(world: int, tp: int, cl, part: Partition | None) -> str:
    """`, or use run.device=cpu run.dtype=fp32` where this partition could run the job on CPUs; else where the
    CPU runs are (the CPU experiments, or a prediction)."""
    from omegaconf import OmegaConf

    cpu = OmegaConf.merge(cl, {"gpus_per_node": None})
    try:
        req = plan_request(world, tp, False, cpu, part)
        if part is not None:
            check_request(req, part)
    except ValueError:
        return (f"; on CPUs these {world} ranks do not fit partition {cl.partition} either: run a CPU experiment "
                f"(experiment=smoke), or predict this one with backend=sim")
    fits = "" if part is None else \
        f" for runs of at most {sum(n.cpus for n in part.nodes)} ranks (its CPUs; larger ones: backend=sim)"
    return (", or use run.device=cpu run.dtype=fp32" + (" without cluster.gpus_per_node" if cl.gpus_per_node else "")
            + fits)


def check_request(req: Request, part: Partition) -> None:
    """The partition can give the request: enough nodes with the GPUs, CPUs and memory asked per node, within its
    node count and time limits; ValueError names the cluster.* field and the fix."""
    if part.state.upper() != "UP":
        raise ValueError(f"cluster.partition={part.name} is {part.state}; pick a partition that is UP (sinfo)")
    where = f"partition {part.name}"
    if not part.nodes:
        raise ValueError(f"cluster.partition={part.name} has no nodes (sinfo -N -p {part.name}); pick another "
                         f"partition")
    cpus_node = req.tasks_per_node * (req.cpus_per_task or 1)
    if part.max_cpus_per_node and cpus_node > part.max_cpus_per_node:
        raise ValueError(f"{req.tasks_per_node} tasks x cluster.cpus_per_task={req.cpus_per_task} = {cpus_node} CPUs "
                         f"per node, but {where} allows {part.max_cpus_per_node} (MaxCPUsPerNode); lower "
                         f"cluster.cpus_per_task (or cluster.tasks_per_node)")
    mem_mb = (req.mem_gb or 0) * 1024
    if part.max_mem_per_node_mb and mem_mb > part.max_mem_per_node_mb:
        raise ValueError(f"cluster.mem_gb={req.mem_gb} but {where} allows {part.max_mem_per_node_mb // 1024} GB per "
                         f"node (MaxMemPerNode); lower cluster.mem_gb, or null for the partition's default")
    fit = [n for n in part.nodes if n.gpus >= req.gpus_per_node and n.cpus >= cpus_node and n.mem_mb >= mem_mb]
    if len(fit) < req.nodes:
        most = lambda attr: max((getattr(n, attr) for n in part.nodes), default=0)  # noqa: E731
        t = req.tasks_per_node
        if req.gpus_per_node and not most("gpus"):
            fix = (f"its nodes have no GPUs; pick a GPU partition (sinfo -o '%P %G' lists them), or run on CPUs with "
                   f"run.device=cpu and cluster.gpus_per_node null")
        elif req.gpus_per_node > most("gpus"):
            fix = (f"{req.gpus_per_node} GPUs per node are more than its nodes have ({most('gpus')}); set "
                   f"cluster.tasks_per_node to at most {most('gpus')} (or null) and cluster.gpus_per_node to null")
        elif cpus_node > most("cpus"):
            fix = (f"{t} task{'s' if t > 1 else ''} x cluster.cpus_per_task={req.cpus_per_task} = {cpus_node} CPUs per "
                   f"node are more than its nodes have ({most('cpus')}); set cluster.cpus_per_task to at most "
                   f"{max(1, most('cpus') // t)} (or null)" + (" or lower cluster.tasks_per_node" if t > 1 else ""))
        elif mem_mb > most("mem_mb"):
            fix = (f"cluster.mem_gb={req.mem_gb} is more than its nodes have ({most('mem_mb') // 1024} GB); lower "
                   f"cluster.mem_gb (or null)")
        else:
            fix = (f"{req.nodes} nodes are needed and {len(fit)} of its {len(part.nodes)} nodes fit; use fewer ranks "
                   f"(run.dp x run.pp x run.tp), more tasks per node, or another partition")
        raise ValueError(f"partition {part.name} cannot give {req.describe()}: {fix}")
    if part.max_nodes is not None and req.nodes > part.max_nodes:
        raise ValueError(f"the job needs {req.nodes} nodes but {where} allows {part.max_nodes} per job (MaxNodes); "
                         f"raise cluster.tasks_per_node, use fewer ranks, or another partition")
    if req.nodes < part.min_nodes:
        raise ValueError(f"the job needs {req.nodes} nodes but {where} asks at least {part.min_nodes} (MinNodes); "
                         f"lower cluster.tasks_per_node or use another partition")
    if req.time_min is not None and part.max_time_min is not None and req.time_min > part.max_time_min:
        raise ValueError(f"cluster.time_min={req.time_min} but {where} allows {part.max_time_min} min (MaxTime); "
                         f"lower cluster.time_min, or null for the partition's limit")


# Pending reasons that cannot clear by themselves: the request is past a limit of the partition, account or QOS,
# or names something that does not exist (SLURM's job reason codes, slurm.schedmd.com/job_reason_codes.html).
# `stuck` adds two that depend on the cluster's state.
NEVER = {
    "PartitionConfig": "the partition cannot give what the job asks (CPUs, GPUs or memory per node)",
    "PartitionNodeLimit": "the job asks more or fewer nodes than the partition's limits",
    "PartitionTimeLimit": "the job's time limit is above the partition's",
    "BadConstraints": "the job's constraints cannot be met by any node",
    "InvalidAccount": "the account is not valid (cluster.account)",
    "InvalidQOS": "the QOS is not valid (cluster.qos)",
    "AccountNotAllowed": "the account may not use the partition (cluster.account)",
    "QOSNotAllowed": "the QOS may not use the partition (cluster.qos)",
    "DependencyNeverSatisfied": "a dependency can never be met",
}
PER_JOB = re.compile(r"^(Assoc|QOS)(Max\w*Per(Job|Node)\w*|Min\w+)$")  # e.g. QOSMaxGRESPerJob, QOSMinCpuNotSatisfied
JOB_COUNT = re.compile(r"^(AssocMaxJobsLimit|QOSMaxJobsPerUserLimit|QOSMaxJobsPerAccountLimit)$")


NODES_DOWN = ("ReqNodeNotAvail", "Nodes required for job are DOWN")  # SLURM 23+ / 22.05's text of one reason
UNUSABLE = ("down", "drain", "fail", "inval", "future")  # node states that take no new job until someone acts


def stuck(reason: str, running: int = 1, nodes_up: int = 1) -> str | None:
    """Why a job pending with `reason` (squeue %r) will never start by itself, or None while it may. `running`:
    this user's jobs running now (a limit of jobs at once that holds a job while none of them runs is a limit of
    zero); `nodes_up`: the partition's nodes that can take a job (a job waiting for nodes of which none is up
    waits for an administrator)."""
    name = reason.split(",")[0].strip()
    if name in NEVER:
        return NEVER[name]
    if PER_JOB.match(name):
        return "the request is past a per-job limit of the account or QOS (cluster.account, cluster.qos)"
    if JOB_COUNT.match(name) and running == 0:
        return "the account or QOS may run no job at all now (a jobs-at-once limit of 0), and none of yours runs"
    if reason.startswith(NODES_DOWN) and nodes_up == 0:
        return "every node of the partition is down, drained or invalid"
    return None


def nodes_up(partition: str, call=_call) -> int:
    """The partition's nodes that can take a new job now (sinfo); unknown counts as one."""
    out = call(["sinfo", "-h", "-N", "-p", partition, "-o", NODE_FORMAT])
    if out.returncode != 0:
        return 1
    return sum(not n.state.startswith(UNUSABLE) for n in parse_nodes(out.stdout))


@dataclass(frozen=True)
class JobState:
    state: str   # PENDING, RUNNING, COMPLETED, ... ; GONE once squeue no longer knows the job
    reason: str  # squeue %r: why it pends ("None" once it runs)


def job_states(job_ids: list[str], call=_call) -> dict[str, JobState] | None:
    """The state and reason of each job from one squeue call (works without SLURM accounting); a job squeue no
    longer knows is GONE. None while squeue does not answer."""
    out = call(["squeue", "-h", "-t", "all", "-j", ",".join(map(str, job_ids)), "-o", "%i|%T|%r"])
    if out.returncode != 0 and "Invalid job id" not in out.stderr:
        return None
    found = {}
    for line in out.stdout.splitlines():
        if line.count("|") >= 2:
            job_id, state, reason = line.strip().split("|", 2)
            found[job_id] = JobState(state, reason)
    return {str(j): found.get(str(j), JobState("GONE", "")) for j in job_ids}


def running_jobs(call=_call) -> int:
    """This user's jobs running now (any job, not only this sweep's)."""
    import getpass

    out = call(["squeue", "-h", "-u", getpass.getuser(), "-t", "RUNNING", "-o", "%i"])
    return len(out.stdout.split()) if out.returncode == 0 else 1  # unknown: assume the limit may clear


def cancel(job_id: str, call=_call) -> None:
    call(["scancel", str(job_id)])


def cancel_all(job_ids: list[str], call=_call) -> None:
    """One scancel for every job of the list (Ctrl-C of a sweep: the jobs it submitted)."""
    if job_ids:
        call(["scancel", *map(str, job_ids)])
