"""The metrics of a run, produced in one place for measured and simulated runs alike (the record's `metrics`).

MFU uses the paper's model FLOPs per iteration (vp.flops.model_flops, the unpadded vocabulary) divided by the
iteration time, the number of devices and the device's dense peak. Per rank: peak memory, the mean time of each
pass kind (`pass_time_s`), the fraction of the iteration spent outside compute passes (`bubble_fraction`); over
the run, `bubble_rate` = the mean bubble fraction (1 - busy / (devices x time)).
"""
import copy
import statistics
import time
from dataclasses import dataclass, field, fields
from functools import reduce
from itertools import compress
from operator import add, itemgetter, sub

from vp.channels import Communicators
from vp.cost.memory import comm_buffer_bytes
from vp.cost.profiles import PROFILES, Hardware
from vp.flops import DEVICE_NAMES, DEVICE_PEAKS, model_flops
from vp.schedule.actions import COMPUTE, Action


@dataclass
class RankMeasurement:
    """What one rank measured over a run (gathered to rank 0, then turned into the run's Metrics)."""
    rank: int
    replica: int
    host: str
    device: str
    losses: list  # per iteration; None where this rank does not know the loss
    seconds: list  # per iteration
    events: list  # per measured iteration: (action, arrived, start, end) seconds since the iteration began
    peak_memory_bytes: float
    memory_detail: dict
    parameters: int
    bytes_sent: float  # per iteration, all channels
    bytes_by_channel: dict  # per iteration
    collectives: dict  # calls per iteration, by operation
    barriers_per_microbatch: float
    peak_flops: float = 0.0
    communicators: int = 0  # NCCL communicators this rank holds (vp.comm.Comm.communicators)
    links: int = 0  # of which point-to-point links of two ranks (vp.comm.Comm.held)
    cpu: list = field(default_factory=list)  # CPU runs, per measured iteration: {pass kind: [CPU seconds of each]}
    memory_breakdown: dict = field(default_factory=dict)  # parameters, gradients, optimizer_states, activations,
    #                                                       comm_buffers (bytes; vp.runtime.memory.held_static)

    def pass_times(self) -> tuple[dict, dict]:
        """(mean seconds, passes per iteration) of each compute pass kind over the measured iterations."""
        spans: dict[str, list[float]] = {}
        for events in self.events:
            for text, _, start, end in events:
                kind = _kind(text)
                if kind in COMPUTE:
                    spans.setdefault(kind, []).append(end - start)
        n = max(1, len(self.events))
        return ({k: statistics.fmean(v) for k, v in spans.items()}, {k: len(v) // n for k, v in spans.items()})

    def pass_cpu_times(self) -> dict:
        """Mean CPU seconds of each compute pass kind over the measured iterations (CPU runs; {} on GPU)."""
        per_kind: dict[str, list[float]] = {}
        for iteration in self.cpu:
            for kind, seconds in iteration.items():
                if kind in COMPUTE:
                    per_kind.setdefault(kind, []).extend(seconds)
        return {k: statistics.fmean(v) for k, v in per_kind.items()}

    def tail(self, measured: list[int]) -> float:
        """Mean over the measured iterations of the time after the rank's last action: the end of its sends,
        the data-parallel gradient all-reduce and the optimizer step."""
        return statistics.fmean(self.seconds[it] - max((end for *_, end in events), default=0.0)
                                for events, it in zip(self.events, measured))

    def bubble_fraction(self, measured: list[int]) -> float:
        """Mean over the measured iterations of 1 - (time in compute passes) / (iteration time)."""
        fractions = []
        for events, it in zip(self.events, measured):
            busy = sum(end - start for text, _, start, end in events if _kind(text) in COMPUTE)
            fractions.append(1.0 - busy / self.seconds[it])
        return statistics.fmean(fractions)


def _per_rank(per_rank: list[dict]) -> dict:
    """{kind: [value of each rank, None where it has none]} from each rank's {kind: value}."""
    kinds = sorted({k for d in per_rank for k in d})
    return {k: [d.get(k) for d in per_rank] for k in kinds}


def _kind(text: str) -> str:
    return Action.parse(0, text).kind


@dataclass
class Metrics:
    loss: list | None
    iteration_time_s: float  # median over measured iterations (simulated: the makespan)
    iteration_times_s: list
    tokens_per_s: float
    mfu: float
    model_flops: float
    peak_flops: float
    devices: int
    peak_memory_bytes: list  # per rank
    memory_detail: list  # per rank
    pass_time_s: dict  # pass kind -> per rank (None where the rank runs no such pass)
    pass_count: dict  # pass kind -> per rank, passes per iteration
    bubble_fraction: list  # per rank
    bubble_rate: float
    bytes_sent: list  # per rank, per iteration
    bytes_by_channel: list = field(default_factory=list)  # per rank, per iteration
    collectives: list = field(default_factory=list)  # per rank
    barriers_per_microbatch: list = field(default_factory=list)  # per rank
    communicators: list = field(default_factory=list)  # per rank: NCCL communicators it holds
    comm_buffer_bytes: list = field(default_factory=list)  # per rank: NCCL's buffers (vp.cost.memory, estimated)
    device_memory_bytes: float | None = None  # simulated: the device's capacity
    tail_s: list = field(default_factory=list)  # per rank: after its last action (all-reduce, optimizer step)
    # real CPU runs: per pass kind and rank, the mean CPU seconds the rank's thread spent in the pass's compute; the
    # rest of pass_time_s it waited for a core (other processes, communication threads, the system)
    pass_cpu_time_s: dict = field(default_factory=dict)
    # per rank: bytes of parameters, gradients, optimizer_states, activations, comm_buffers (a real run: as it held
    # them; simulated: vp.cost.memory.memory_breakdown)
    memory_breakdown: list = field(default_factory=list)

    def to_dict(self) -> dict:
        """The fields as they are (plain numbers, lists and dicts): dataclasses.asdict's deep copy cost a Python
        call per element, and a simulated cluster repeats each figure over dp x pp x tp devices. pass_cpu_time_s
        only where measured (real CPU runs): simulated and GPU records are as they were without it."""
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        if not out["pass_cpu_time_s"]:
            del out["pass_cpu_time_s"]
        return out

    @classmethod
    def from_measurements(cls, cfg, per_rank: list[RankMeasurement]) -> "Metrics":
        """The run's metrics from every rank's measurements of iterations warmup..iterations-1."""
        measured = list(range(cfg.warmup, cfg.iterations))
        iter_s = [max(r.seconds[i] for r in per_rank) for i in measured]
        t = statistics.median(iter_s)
        peak = statistics.fmean(r.peak_flops for r in per_rank)
        losses = replica_sum(per_rank)
        passes = [r.pass_times() for r in per_rank]
        kinds = sorted({k for times, _ in passes for k in times})
        bubble = [r.bubble_fraction(measured) for r in per_rank]
        return cls(loss=losses, iteration_time_s=t, iteration_times_s=iter_s,
                   pass_time_s=_per_rank([times for times, _ in passes]),
                   pass_count={k: [counts.get(k, 0) for _, counts in passes] for k in kinds},
                   peak_memory_bytes=[r.peak_memory_bytes for r in per_rank],
                   memory_detail=[r.memory_detail for r in per_rank], bubble_fraction=bubble,
                   memory_breakdown=[r.memory_breakdown for r in per_rank],
                   bubble_rate=statistics.fmean(bubble), bytes_sent=[r.bytes_sent for r in per_rank],
                   bytes_by_channel=[r.bytes_by_channel for r in per_rank],
                   collectives=[r.collectives for r in per_rank],
                   barriers_per_microbatch=[r.barriers_per_microbatch for r in per_rank],
                   communicators=[r.communicators for r in per_rank],
                   comm_buffer_bytes=[comm_buffer_bytes(Communicators(r.communicators - r.links, r.links),
                                                        device_profile(r.device)) for r in per_rank],
                   tail_s=[r.tail(measured) for r in per_rank], pass_cpu_time_s=_per_rank(
                       [r.pass_cpu_times() for r in per_rank]), **throughput(cfg, t, len(per_rank), peak))

    @classmethod
    def from_simulation(cls, cfg, result, peak_flops: float, static_bytes: list, bytes_sent: list,
                        device_memory_bytes: float, tail_s: float = 0.0, communicators: list | None = None,
                        hw=None, static_parts: list | None = None) -> "Metrics":
        """The run's metrics from a simulated iteration (vp.schedule.SimResult) with the cost model's figures;
        tail_s: what follows the pipeline's flush on every rank (the tensor-parallel grid's and the data-parallel
        gradient all-reduces); communicators: the vp.cost.memory.Communicators of each pipeline rank, whose NCCL
        buffers (at hw's sizes) count in the peak memory; static_parts: vp.cost.memory.static_breakdown, for the
        memory_breakdown; the cost model's lists hold one device per pipeline rank."""
        t = result.makespan + tail_s
        sums: dict[tuple[str, int], list] = {}  # (kind, rank) -> [seconds, passes]
        for r, (actions, starts, ends) in enumerate(result.spans):  # each kind's end - start summed in order, in C
            kinds = list(map(itemgetter(1), actions))
            spans = list(map(sub, ends, starts))
            for kind in dict.fromkeys(kinds):
                if kind in COMPUTE:
                    mine = list(compress(spans, map(kind.__eq__, kinds)))
                    sums[(kind, r)] = [reduce(add, mine, 0.0), len(mine)]
        ranks = range(len(result.busy))
        kinds = [k for k in COMPUTE if any((k, r) in sums for r in ranks)]
        bubble = [1.0 - b / t for b in result.busy]

        def per_rank(values: list) -> list:  # every replica's pipeline, and every device of a stage's tp group,
            return [copy.copy(v) for _ in range(cfg.dp) for v in values for _ in range(cfg.tp)]  # own dicts  # behaves alike: rank = (d pp + p) tp + t

        comm = [comm_buffer_bytes(held, hw) for held in communicators] if communicators else [0.0] * len(ranks)

        return cls(loss=None, iteration_time_s=t, iteration_times_s=[t],
                   pass_time_s={k: per_rank([sums[(k, r)][0] / sums[(k, r)][1] if (k, r) in sums else None
                                             for r in ranks]) for k in kinds},
                   pass_count={k: per_rank([sums[(k, r)][1] if (k, r) in sums else 0 for r in ranks]) for k in kinds},
                   peak_memory_bytes=per_rank([s + a + c for s, a, c in
                                               zip(static_bytes, result.peak_activations, comm)]),
                   memory_detail=per_rank([{"static": s, "activations": a, "comm_buffers": c}
                                           for s, a, c in zip(static_bytes, result.peak_activations, comm)]),
                   communicators=per_rank([h.groups + h.links for h in communicators or []]),
                   comm_buffer_bytes=per_rank(comm),
                   bubble_fraction=per_rank(bubble), bubble_rate=statistics.fmean(bubble),
                   bytes_sent=per_rank(bytes_sent), device_memory_bytes=device_memory_bytes,
                   tail_s=per_rank([tail_s] * len(result.busy)),
                   memory_breakdown=per_rank([{**parts, "activations": a, "comm_buffers": c} for parts, a, c in
                                              zip(static_parts, result.peak_activations, comm)])
                   if static_parts else [],
                   **throughput(cfg, t, cfg.dp * len(result.busy) * cfg.tp, peak_flops))


def device_profile(device: str) -> Hardware:
    """The built-in profile of a GPU named exactly in vp.flops.DEVICE_NAMES (for its NCCL buffer sizes), else the
    default profile's figures (CPU runs: what NCCL would hold)."""
    model = DEVICE_NAMES.get(device, "")
    return PROFILES.get({"A100": "a100_80g", "H100": "h100", "H200": "h200"}.get(model.split(" ")[0], ""),
                        Hardware("default", 1.0))


def replica_sum(per_rank: list[RankMeasurement]) -> list | None:
    """The global batch's loss per iteration: the sum over replicas of the loss a rank of each replica knows."""
    known = {}
    for r in per_rank:
        if all(x is not None for x in r.losses):
            known.setdefault(r.replica, r.losses)
    if len(known) != len({r.replica for r in per_rank}):
        return None
    return [sum(values) for values in zip(*known.values())]


def throughput(cfg, seconds: float, devices: int, peak_flops: float) -> dict:
    """tokens/s and MFU of one iteration (one global batch of dp x microbatches) of `seconds` on `devices`
    devices of `peak_flops` each."""
    sequences = cfg.dp * cfg.microbatches * cfg.micro_batch_size
    flops = model_flops(sequences, cfg.seq_len, cfg.hidden, cfg.ffn, cfg.layers, cfg.vocab_size)
    return {"tokens_per_s": sequences * cfg.seq_len / seconds, "mfu": flops / (seconds * devices * peak_flops),
            "model_flops": flops, "peak_flops": peak_flops, "devices": devices}


def device_peak(device: "torch.device") -> tuple[float, str]:
    """(peak FLOP/s, how it was found): the datasheet figure of a GPU named exactly in DEVICE_NAMES, else a
    matmul probe (bf16 on GPUs, fp32 on CPU). torch is imported here and in probe_peak only: backend=sim imports
    this module for Metrics and never touches a device."""
    import torch

    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        return table_peak(name) or (probe_peak(device), f"probe:matmul ({name!r} is not in vp.flops.DEVICE_NAMES)")
    return probe_peak(device), "probe:matmul"


def table_peak(name: str) -> tuple[float, str] | None:
    """(datasheet peak, 'table:MODEL') of a device CUDA names exactly as in DEVICE_NAMES, else None."""
    model = DEVICE_NAMES.get(name)
    return (DEVICE_PEAKS[model], f"table:{model}") if model else None


def probe_peak(device: "torch.device", reps: int = 8) -> float:
    """FLOP/s of the best of a few n x n matmuls: n = 512 in fp32 on CPU threads, n = 8192 in bf16 on a GPU."""
    import torch

    n, dtype = (8192, torch.bfloat16) if device.type == "cuda" else (512, torch.float32)
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    best = float("inf")
    for _ in range(reps):
        if device.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        a @ b
        if device.type == "cuda":
            torch.cuda.synchronize()
        best = min(best, time.perf_counter() - t0)
    return 2 * n**3 / best
