"""The cost model: pass times, communication times and memory of a run on a hardware profile.

FLOPs come from vp.flops (the paper's counts); a pass takes FLOPs / (peak * efficiency of its kind);
a message takes latency + bytes / bandwidth (one link model). Memory counts parameters, gradients and
optimizer state per rank (bytes_per_param) and activations held between a pass and the one that frees it.
"""
import statistics
from dataclasses import asdict, dataclass, field

import numpy as np

from vp.config import RunConfig
from vp.flops import DEVICE_PEAKS, layer_flops
from vp.schedule import Costs, Schedule, build
from vp.schedule.actions import COMPUTE
from vp.schedule.rules import enters, p2p_peer, root_of

GiB = 1024**3


@dataclass(frozen=True)
class Hardware:
    name: str
    peak_flops: float  # dense FLOP/s of one device at the run's dtype
    efficiency: dict = field(default_factory=dict)  # achievable fraction of peak, per pass kind
    link_bandwidth: float = 25e9  # bytes/s between two devices
    link_latency: float = 10e-6  # seconds per message
    memory_bytes: float = 80 * GiB
    bytes_per_param: float = 18.0  # bf16 weight + fp32 grad + fp32 master weight and two Adam moments
    act_bytes: int = 2  # bytes per activation element (bf16)
    overhead_bytes: float = 2 * GiB  # CUDA context, communicator buffers, allocator slack
    pass_overhead_s: float = 0.0  # fixed cost of launching any pass (CPU runs: Python and dispatch)

    def eff(self, kind: str) -> float:
        return self.efficiency.get(kind, self.efficiency.get("F", 0.5))

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "Hardware":
        known = set(cls.__dataclass_fields__)
        unknown = sorted(set(d) - known)
        if unknown:
            raise ValueError(f"hardware profile: unknown field(s) {unknown}; known: {sorted(known)}")
        if float(d.get("peak_flops", 0)) <= 0:
            raise ValueError("hardware profile: peak_flops must be a positive number of FLOP/s")
        return cls(**d)


# transformer passes (F, B, W); output-layer GEMMs (S, T), also when the whole output layer sits in the
# last stage's F and B; input-layer lookups and their gradient (IF, IB), which are memory bound
_GPU_EFF = {"F": 0.5, "B": 0.5, "W": 0.5, "S": 0.7, "T": 0.7, "IF": 0.02, "IB": 0.02}
PROFILES = {
    "a100_80g": Hardware("a100_80g", DEVICE_PEAKS["A100"], dict(_GPU_EFF), 25e9, 10e-6, 80 * GiB),
    "h100": Hardware("h100", DEVICE_PEAKS["H100"], dict(_GPU_EFF), 50e9, 8e-6, 80 * GiB),
    "h200": Hardware("h200", DEVICE_PEAKS["H200"], dict(_GPU_EFF), 50e9, 8e-6, 141 * GiB),
}


def fit_link(points: list[list[float]]) -> tuple[float, float]:
    """(latency s, bandwidth bytes/s) from [bytes, seconds] points, by least squares."""
    pts = np.array(points, dtype=float)
    a = np.stack([np.ones(len(pts)), pts[:, 0]], axis=1)
    (latency, inv_bw), *_ = np.linalg.lstsq(a, pts[:, 1], rcond=None)
    return max(0.0, float(latency)), 1.0 / max(float(inv_bw), 1e-15)


def message_time(hw: Hardware, nbytes: float) -> float:
    return hw.link_latency + nbytes / hw.link_bandwidth


def op_time(hw: Hardware, op: str, nbytes: float, group: int) -> float:
    """Seconds of one operation on a tensor of nbytes over a group of `group` ranks, on one flat link: a send,
    a broadcast or a reduce moves the tensor once (pipelined); a ring all-gather moves (group-1) tensors, a ring
    all-reduce 2 (group-1) / group of it."""
    if group < 2:
        return 0.0
    moved = {"send": 1.0, "broadcast": 1.0, "reduce": 1.0, "all_gather": group - 1.0,
             "all_reduce": 2.0 * (group - 1) / group}[op]
    return message_time(hw, moved * nbytes)


def layer_params(cfg: RunConfig) -> int:
    h, f = cfg.hidden, cfg.ffn
    return 4 * h * h + 2 * h * f + 9 * h + f  # qkv, out, fc1, fc2 (with biases) and two LayerNorms


def layer_activation_bytes(cfg: RunConfig, hw: Hardware) -> float:
    """Saved activations of one layer for one microbatch: 34 s b h bytes at 2 bytes/element (Korthikanti
    et al., no recomputation, with flash attention so no s^2 term), scaled to the profile's element size."""
    return 34 * cfg.seq_len * cfg.micro_batch_size * cfg.hidden * hw.act_bytes / 2


def rank_params(cfg: RunConfig, sched: Schedule) -> list[int]:
    """Parameters held by each rank: its layers, its vocabulary shard(s) or whole vocabulary layers."""
    v, h = cfg.padded_vocab_size, cfg.hidden
    per_stage = [n * layer_params(cfg) for n in cfg.stage_layers]
    per_stage[0] += cfg.seq_len * h
    per_stage[-1] += 2 * h
    if not sched.vocab_parallel:
        per_stage[0] += v * h
        per_stage[-1] += v * h
    out = [2 * (v // cfg.pp) * h if sched.vocab_parallel else 0 for _ in range(cfg.pp)]
    for st, n in enumerate(per_stage):
        out[sched.where(st)[0]] += n
    return out


EFF_KINDS = COMPUTE  # one efficiency per pass kind


def pass_flops(cfg: RunConfig, sched: Schedule) -> dict:
    """FLOPs of each pass, split by the efficiency that applies to them: {(kind, stage): {eff_kind: flops}}
    for F/B/W (stage passes) and {(kind, None): ...} for S/T/IF/IB. The whole output layer in a last stage
    runs at output-layer speed (S forward, T backward), the whole input layer in a first stage at IF/IB."""
    n, h = cfg.micro_batch_size * cfg.seq_len, cfg.hidden
    layer = layer_flops(n, cfg.seq_len, h, cfg.ffn)  # forward + backward of one layer
    split = sched.split_w
    frac = {"F": 1 / 3, "B": (1 / 3) if split else (2 / 3), "W": (1 / 3) if split else 0.0}
    head = 2.0 * n * h * cfg.padded_vocab_size  # one GEMM of the whole output layer
    last = sched.n_stages - 1
    out = {}
    for st, layers in enumerate(cfg.stage_layers):
        for kind in ("F", "B", "W"):
            parts = {kind: layers * layer * frac[kind]}
            if not sched.vocab_parallel and st == last:
                parts.update({"F": {"S": head}, "B": {"T": (1 if split else 2) * head},
                              "W": {"T": head if split else 0.0}}[kind])
            if not sched.vocab_parallel and st == 0 and kind != "W":
                parts[{"F": "IF", "B": "IB"}[kind]] = (1 if kind == "F" else 2) * n * h
            out[(kind, st)] = parts
    if sched.vocab_parallel:
        gemm = head / cfg.pp  # one GEMM of a shard; the algorithm's row says how many S and T compute
        out.update({("S", None): {"S": sched.vocab.s_gemms * gemm}, ("T", None): {"T": sched.vocab.t_gemms * gemm},
                    ("IF", None): {"IF": n * h}, ("IB", None): {"IB": 2 * n * h}})
    return out


def payloads(cfg: RunConfig, sched: Schedule) -> dict[str, list[tuple[str, float]]]:
    """What each communicating action sends, as (operation, bytes of the tensor handed to Comm), in the order
    the runtime issues them: the one source of message sizes for the cost model's times and traffic().

    P2P carries a stage's activation or input gradient in the compute dtype; C0 X and the loss weights in fp32
    ([n, h+1]); C1 the shard statistics [3, n] fp32 (all-gather) and, where S precomputed it (Algorithm 2), grad X
    [n, h] fp32 (all-reduce); C2 grad X; IF the partial embeddings of the fp32 shards; IB the first stage's
    embedding gradient in the compute dtype; the naive algorithm's S the max [n] and (sum, target) [2, n], its
    T grad X."""
    n, h = cfg.micro_batch_size * cfg.seq_len, cfg.hidden
    act = n * h * (4 if cfg.dtype == "fp32" else 2)
    grad32 = 4 * n * h
    return {"SF": [("send", act)], "SB": [("send", act)], "C0": [("broadcast", 4 * n * (h + 1))],
            "C1": [("all_gather", 12 * n)] + ([("all_reduce", grad32)] if sched.vocab.grad_x_in_s else []),
            "C2": [("all_reduce", grad32)], "IF": [("reduce", grad32)], "IB": [("broadcast", act)],
            "S": [("all_reduce", 4 * n), ("all_reduce", 8 * n)] if sched.vocab.synchronous else [],
            "T": [("all_reduce", grad32)] if sched.vocab.synchronous else []}


def traffic(cfg: RunConfig, sched: Schedule) -> list[dict[str, float]]:
    """Bytes each rank sends per iteration on each channel, counted as the runtime's Comm counts them: a send
    or a collective's tensor on every member, a broadcast on its root only."""
    sizes = payloads(cfg, sched)
    out = []
    for r, acts in enumerate(sched.ranks):
        sent: dict[str, float] = {}
        for a in acts:
            if a.kind in ("SF", "SB"):
                peer, _ = p2p_peer(sched, a)
                channel = ("fwd" if a.kind == "SF" else "bwd") + ("+" if peer > r else "-")
            elif (inst := enters(sched, a)) is not None:
                channel = inst.group
            else:
                continue
            for op, nbytes in sizes[a.kind]:
                if op != "broadcast" or root_of(sched, channel) == r:
                    sent[channel] = sent.get(channel, 0.0) + nbytes
        if cfg.dp > 1:  # the gradient all-reduce over the replicas, one flat fp32 buffer
            sent["dp"] = 4.0 * rank_params(cfg, sched)[r]
        out.append(dict(sorted(sent.items())))
    return out


def dp_allreduce_s(cfg: RunConfig, hw: Hardware, sched: Schedule) -> float:
    """Seconds of the data-parallel gradient all-reduce after the pipeline's flush (the slowest rank's)."""
    if cfg.dp < 2:
        return 0.0
    return max(op_time(hw, "all_reduce", 4.0 * n, cfg.dp) for n in rank_params(cfg, sched))


def pass_costs(cfg: RunConfig, hw: Hardware, sched: Schedule) -> Costs:
    """Seconds per action and bytes held per microbatch, for the simulator."""
    n, h, v, p = cfg.micro_batch_size * cfg.seq_len, cfg.hidden, cfg.padded_vocab_size, cfg.pp
    speed = {k: hw.peak_flops * hw.eff(k) for k in EFF_KINDS}
    compute = {key: hw.pass_overhead_s + sum(f / speed[k] for k, f in parts.items())
               for key, parts in pass_flops(cfg, sched).items()}
    memory = {}
    for st, layers in enumerate(cfg.stage_layers):
        held = layers * layer_activation_bytes(cfg, hw)
        if not sched.vocab_parallel and st == sched.n_stages - 1:
            held += n * v * 4 + n * h * hw.act_bytes  # fp32 softmax of the whole vocabulary and the layer input
        memory[("F", st)] = held
    if sched.vocab_parallel:
        memory[("S", None)] = n * (v // p) * 4 + n * h * hw.act_bytes
    sizes = payloads(cfg, sched)
    comm = {kind: sum(op_time(hw, op, nbytes, p) for op, nbytes in sizes[kind])
            for kind in ("C0", "C1", "C2", "IF", "IB", "S", "T")}
    comm["P2P"] = sum(op_time(hw, op, nbytes, 2) for op, nbytes in sizes["SF"])
    return Costs(compute, comm, memory)


def static_bytes(cfg: RunConfig, hw: Hardware, sched: Schedule) -> list[float]:
    """Parameters, gradients and optimizer state per rank, plus the fixed overhead."""
    return [n * hw.bytes_per_param + hw.overhead_bytes for n in rank_params(cfg, sched)]


def record_costs(record: dict) -> tuple[Schedule, Costs]:
    """The schedule of a recorded run and the costs its record implies: for a simulated run, its hardware
    profile through the cost model; otherwise its pass times (per kind and rank) with communication from its
    link probe. Timelines, benchmarks and reports replay records through this one function."""
    cfg = RunConfig.from_dict(record["config"])
    sched = build(cfg.method, cfg.pp, cfg.microbatches, cfg.n_chunks)
    profile = (record.get("env") or {}).get("hardware")
    if record["backend"] == "sim" and profile:
        return sched, pass_costs(cfg, Hardware.from_dict(profile), sched)
    pass_s = record["metrics"].get("pass_time_s") or {}
    compute = {}
    for st in range(sched.n_stages):
        rank = sched.where(st)[0]
        for kind in ("F", "B", "W"):
            per_rank = pass_s.get(kind) or []
            if rank < len(per_rank) and per_rank[rank] is not None:
                compute[(kind, st)] = per_rank[rank]
    for kind in ("S", "T", "IF", "IB"):
        values = [t for t in pass_s.get(kind) or [] if t is not None]
        if values:
            compute[(kind, None)] = statistics.mean(values)
    comm = {}
    probe = (record.get("env") or {}).get("link_probe") or []
    if len(probe) >= 2:
        latency, bandwidth = fit_link(probe)
        link = Hardware("link_probe", 1.0, link_latency=latency, link_bandwidth=bandwidth,
                        act_bytes=4 if cfg.dtype == "fp32" else 2)
        comm = pass_costs(cfg, link, sched).comm
    return sched, Costs(compute, comm)
