"""What the launch environment gives one process: its device, its CPUs, its rendezvous port, NCCL's settings,
and its tie to the process that started it.

Read only at entry points (vp.launch, vp.run, harness.task), from the environment they are handed, so that
tests can pass fake SLURM or torchrun variables.
"""
import ctypes
import os
import signal
import sys

EPHEMERAL = (32768, 60999)  # Linux's default ip_local_port_range: ports the kernel hands to outgoing connections
PORT_BASE = 10000  # job-derived rendezvous ports lie in [PORT_BASE, the ephemeral range's start)

# NCCL's failure settings for CUDA runs (a variable already set wins):
#  TORCH_NCCL_ASYNC_ERROR_HANDLING=3  a timed-out or failed collective takes the process down at once, without
#      aborting communicators one by one (1 does that first; serial aborts of several communicators can hang);
#      the rank that failed in Python aborts all its communicators together (vp.comm.abort_all)
#  TORCH_NCCL_DUMP_ON_TIMEOUT=1, TORCH_NCCL_TRACE_BUFFER_SIZE  the flight recorder: on a timeout each rank dumps
#      its last collectives (which one it is stuck in), the evidence a deadlock leaves on GPUs
NCCL_ENV = {"TORCH_NCCL_ASYNC_ERROR_HANDLING": "3", "TORCH_NCCL_DUMP_ON_TIMEOUT": "1",
            "TORCH_NCCL_TRACE_BUFFER_SIZE": "2000"}


def device_index(local_rank: int, visible: int, local_world: int | None = None) -> int:
    """The CUDA device of a process among the `visible` ones: the only one under per-task GPU binding (SLURM
    --gpus-per-task, or CUDA_VISIBLE_DEVICES set per process), else the local rank's. local_world: the processes
    on this node when the launcher gives them all the same devices (vp.launch, torchrun); more of them than visible
    devices would put two ranks on one GPU, which NCCL refuses deep inside its setup ("Duplicate GPU detected")."""
    if visible < 1:
        raise ValueError("device=cuda but no CUDA device is visible to this process; check CUDA_VISIBLE_DEVICES "
                         "and the job's GPU request (e.g. --gpus-per-node), or run with device=cpu")
    if local_world is not None and local_world > visible:
        raise ValueError(f"{local_world} processes on this node share {visible} visible CUDA device(s): NCCL needs "
                         f"a GPU of its own for each rank; run at most {visible} ranks per node (dp x pp x tp), "
                         f"make more GPUs visible (CUDA_VISIBLE_DEVICES), or use device=cpu")
    if visible == 1:
        return 0
    if local_rank >= visible:
        raise ValueError(f"local rank {local_rank} sees {visible} CUDA devices; start at most {visible} processes "
                         f"per node, or bind one GPU to each task (SLURM --gpus-per-task=1)")
    return local_rank


def cpu_threads(procs_here: int, env=os.environ, affinity: set[int] | None = None) -> int:
    """Threads for one of `procs_here` processes sharing this allocation: SLURM_CPUS_PER_TASK when SLURM set it
    (each task has its own CPUs), else this process's CPU affinity (its cgroup or cpuset) shared evenly."""
    if env.get("SLURM_CPUS_PER_TASK", "").isdigit():
        return max(1, int(env["SLURM_CPUS_PER_TASK"]))
    cpus = len(affinity if affinity is not None else os.sched_getaffinity(0))
    return max(1, cpus // max(1, procs_here))


def cpu_model(cpuinfo: str = "/proc/cpuinfo") -> str:
    """The CPU's model name and this machine's logical CPUs ('AMD EPYC 7B13 x 2'): what tells one kind of node from
    another in a report's MFU (harness.report.measured); '' where /proc/cpuinfo cannot be read."""
    try:
        with open(cpuinfo) as f:
            names = [line.split(":", 1)[1].strip() for line in f if line.startswith("model name")]
    except OSError:
        return ""
    return f"{names[0]} x {len(names)}" if names else ""


def ephemeral_range() -> tuple[int, int]:
    try:
        low, high = open("/proc/sys/net/ipv4/ip_local_port_range").read().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return EPHEMERAL


def rendezvous_port(job_id: str, env=os.environ, ephemeral: tuple[int, int] | None = None) -> int:
    """The TCP port rank 0 listens on: SLURM's reserved ports when the step has them (SLURM_STEP_RESV_PORTS,
    e.g. '12000-12003'), else one derived from the job id below the ephemeral range, where no outgoing
    connection of another program can be holding it."""
    reserved = env.get("SLURM_STEP_RESV_PORTS", "")
    if reserved:
        return int(reserved.split(",")[0].split("-")[0])
    low = (ephemeral or ephemeral_range())[0]
    if low <= PORT_BASE:
        raise ValueError(f"the ephemeral port range starts at {low}, below {PORT_BASE}: no port is safe from it; "
                         f"use cluster.rendezvous=file or reserve ports in SLURM (MpiParams=ports=...)")
    job = int(str(job_id).split("_")[0])
    return PORT_BASE + job % (low - PORT_BASE)


# The runtime's point-to-point transfers and collectives run on streams of their own, concurrently with compute
# (docs/gpu-path.md); CUDA maps streams onto CUDA_DEVICE_MAX_CONNECTIONS hardware queues (default 8, at most 32),
# and two streams on one queue are ordered as if they were one. At 1 (Megatron sets it for tensor-parallel overlap)
# every NCCL kernel sits behind the one issued before it: a send waiting for its receiver blocks the rank's other
# transfers and collectives, and plain 1F1B deadlocks. Unset, a run asks for the most queues.
CUDA_CONNECTIONS = "CUDA_DEVICE_MAX_CONNECTIONS"
MIN_CONNECTIONS, MAX_CONNECTIONS = 8, 32


def cuda_connections(env=os.environ) -> int:
    """Set CUDA_DEVICE_MAX_CONNECTIONS to the maximum where unset (call before the process creates its CUDA
    context: CUDA reads it then); refuse a value below CUDA's default of 8. Returns the value in force."""
    value = env.setdefault(CUDA_CONNECTIONS, str(MAX_CONNECTIONS))
    if not value.isdigit() or int(value) < MIN_CONNECTIONS:
        raise ValueError(f"{CUDA_CONNECTIONS}={value} serialises the rank's NCCL kernels on too few hardware queues: "
                         f"a send waiting for its receiver would block every other transfer and collective, and the "
                         f"pipeline deadlocks; unset it (the run then uses {MAX_CONNECTIONS}) or set it to at least "
                         f"{MIN_CONNECTIONS}")
    return int(value)


def nccl_environment(env=os.environ) -> dict:
    """Apply NCCL_ENV to `env` where unset; returns what was set."""
    added = {k: v for k, v in NCCL_ENV.items() if k not in env}
    env.update(added)
    return added


def die_with_parent() -> None:
    """Linux: this process gets SIGKILL when the process that started it ends (prctl PR_SET_PDEATHSIG), and exits
    at once when that process ended before this call (it was adopted by init). A rank or task whose launcher died
    (Ctrl-C while it was being started, a killed controller) so never runs on, waiting for peers that are gone."""
    if not sys.platform.startswith("linux"):
        return
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)
    except OSError:
        return
    if os.getppid() == 1:
        os._exit(1)
