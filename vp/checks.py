"""Checks of a run's inputs that need more than its config alone, made before any process starts: the
injected-fault spec against the run's schedule, the run's size and memory against this machine, and output
files. Every refusal is a ValueError that names the field and the fix (or the override)."""
import os
import tempfile
from pathlib import Path

from vp.config import RunConfig

GiB = 1024**3
MAX_TOKENS_PER_MICROBATCH = 131072  # micro_batch_size x seq_len above this is taken for a typo
MAX_SCHEDULE_SIZE = 262144  # pp x microbatches x chunks: SIZE_COST to build, validate and simulate at the limit
SIZE_COST = "about 15-18 CPU seconds and 1.1 GiB"  # vocab-2, pp 256 x 1024 microbatches, 2 loaded cores (vp.bench sim)
MAX_LOCAL_RANKS = 8  # processes one run starts on this machine by default (the sweep's cluster.max_local_ranks)
MAX_PLAN_GPUS = 65536  # plan.gpus: the largest machines built (a 7b plan on 65536 GPUs takes about a minute)
MAX_GLOBAL_BATCH = 2**20  # plan.global_batch: sequences per iteration, far above any published run
MAX_BENCH_TOKENS = 2**20  # vp.bench vocab --tokens: the [tokens, vocabulary] logits of a 128k vocabulary are 512 GiB
PROCESS_BYTES = 0.4 * GiB  # a rank's Python, torch and communication buffers before any tensor of the run
FAULT_MODES = ("exit", "raise", "hang", "oom")  # oom: what a NCCL call raises when CUDA is out of memory
PICTURE_SUFFIXES = (".png", ".pdf", ".svg")


def parse_fault(text: str) -> tuple[int, str, str]:
    """"RANK:ACTION[:exit|raise|hang|oom]" -> (rank, action, mode); the action is checked by check_fault."""
    parts = str(text).split(":")
    if len(parts) in (3, 4) and parts[1].startswith("C") and parts[2].isdigit():  # C1:3 names its microbatch
        parts = [parts[0], f"{parts[1]}:{parts[2]}", *parts[3:]]
    if len(parts) not in (2, 3) or not parts[0].isdigit() or (len(parts) == 3 and parts[2] not in FAULT_MODES):
        raise ValueError(f"fault {text!r}: use RANK:ACTION[:{'|'.join(FAULT_MODES)}], e.g. 1:F2:exit")
    return int(parts[0]), parts[1], parts[2] if len(parts) == 3 else "exit"


def check_fault(cfg: RunConfig, fault: tuple[int, str, str]) -> None:
    """The rank exists and executes the action in its first iteration (where the runtime injects it)."""
    from vp.schedule import build

    from vp.mesh import Mesh

    rank, action, _ = fault
    if not 0 <= rank < cfg.world:
        raise ValueError(f"fault rank {rank} does not exist: dp={cfg.dp} x pp={cfg.pp} has ranks 0..{cfg.world - 1}")
    stage_rank = Mesh(dp=cfg.dp, pp=cfg.pp).coords(rank).p
    texts = [a.text() for a in build(cfg.method, cfg.pp, cfg.microbatches, cfg.n_chunks).ranks[stage_rank]]
    if action not in texts:
        raise ValueError(f"fault action {action!r} is not executed by rank {rank} of method={cfg.method} "
                         f"(pp={cfg.pp}, microbatches={cfg.microbatches}); its first actions are "
                         f"{' '.join(texts[:12])} (python -m vp.schedule show lists them all)")


def check_size(cfg: RunConfig, limit: int, override: str) -> None:
    tokens = cfg.micro_batch_size * cfg.seq_len
    if tokens > limit:
        raise ValueError(f"seq_len={cfg.seq_len} x micro_batch_size={cfg.micro_batch_size} = {tokens} tokens per "
                         f"microbatch is above the sanity limit of {limit}; use a smaller seq_len, or {override}")


def check_schedule_size(pp: int, microbatches: int, chunks: int, limit: int, override: str) -> None:
    size = pp * microbatches * chunks
    if size > limit:
        raise ValueError(f"pp={pp} x microbatches={microbatches} x chunks={chunks} = {size} is above the schedule "
                         f"size limit of {limit} (building, validating and simulating grow with it: {SIZE_COST} "
                         f"at {MAX_SCHEDULE_SIZE}); use fewer ranks or microbatches, or {override}")


def estimate_rank_bytes(cfg: RunConfig) -> list[float]:
    """Peak bytes of each rank of a real run, as the cost model counts them: parameters, gradients and AdamW
    state, and the activations the schedule holds at its peak (in the run's dtype)."""
    from vp.cost import Hardware, pass_costs, static_bytes
    from vp.schedule import build, simulate

    sched = build(cfg.method, cfg.pp, cfg.microbatches, cfg.n_chunks)
    fp32 = cfg.dtype == "fp32"
    hw = Hardware("estimate", 1e12, act_bytes=4 if fp32 else 2, bytes_per_param=16 if fp32 else 18,
                  overhead_bytes=PROCESS_BYTES)
    result = simulate(sched, pass_costs(cfg, hw, sched))
    return [s + a for s, a in zip(static_bytes(cfg, hw, sched), result.peak_activations)]


def available_bytes() -> float | None:
    """Memory this machine can give now (MemAvailable), or None where that cannot be read."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def check_memory(cfg: RunConfig, ranks_here: int, limit_bytes: float | None, override: str) -> None:
    """The ranks that run on this machine fit in limit_bytes (default: what it has available now)."""
    limit = limit_bytes if limit_bytes is not None else available_bytes()
    if limit is None:
        return
    per_rank = estimate_rank_bytes(cfg) * cfg.dp  # every data-parallel replica holds the same
    need = sum(sorted(per_rank, reverse=True)[:ranks_here])
    if need > limit:
        raise ValueError(f"the run needs about {need / GiB:.1f} GiB here ({ranks_here} ranks, the largest "
                         f"{max(per_rank) / GiB:.1f} GiB) but {limit / GiB:.1f} GiB are available; use a smaller "
                         f"seq_len, micro_batch_size, microbatches, hidden or vocabulary, or {override}")


def check_output_file(path: str, option: str, suffixes=PICTURE_SUFFIXES) -> Path:
    """An output file that can be written: a known suffix and an existing, writable folder."""
    p = Path(path)
    if p.suffix.lower() not in suffixes:
        raise ValueError(f"{option} {path}: the suffix must be one of {', '.join(suffixes)} (it picks the format)")
    folder = p.parent.resolve()
    if not folder.is_dir():
        raise ValueError(f"{option} {path}: the folder {folder} does not exist; create it or pick another path")
    writable_folder(folder, option)
    if p.exists() and not os.access(p, os.W_OK):
        raise ValueError(f"{option} {path}: the file is not writable; pick another path")
    return p


def writable_folder(folder: Path, option: str) -> None:
    """Creating a file in folder works (a probe file, removed at once); os.access alone misleads root."""
    try:
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as err:
        raise ValueError(f"{option}: cannot write in {folder} ({err.strerror}); pick a writable folder") from None


def writable_path(path: Path, option: str) -> None:
    """path (a folder) can be created and written: checked at its nearest existing folder, creating nothing."""
    probe = Path(path).resolve()
    while not probe.exists():
        probe = probe.parent
    if not probe.is_dir():
        raise ValueError(f"{option}={path}: {probe} is a file, not a folder; pick another {option}")
    writable_folder(probe, f"{option}={path}")
