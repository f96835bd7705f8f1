"""Hardware profiles: what one device computes and moves per second, how devices are networked, and the few
efficiencies that turn datasheet peaks into achieved rates. docs/cost-model.md gives every field's source.

Sources of the built-in profiles:
- memory_bytes: the device's capacity as torch reports it (torch.cuda.get_device_properties(0).total_memory, the
  total of torch.cuda.mem_get_info(); CUDA's totalGlobalMem, less than the marketed 80 or 141 GB and than
  nvidia-smi's total, which counts memory the driver reserves): 'NVIDIA H100 80GB HBM3' prints total_memory=81089MB
  under torch 2.7 / CUDA 12.8 (published readings range 81082-81090 MiB, 79.2 GiB; nvidia-smi shows 81559 MiB),
  'NVIDIA H200' total_memory=143156MB (139.8 GiB); the A100 profile keeps the nominal 80 GiB (no torch reading
  of an A100-SXM4-80GB at hand). A measured GPU profile should set it from torch on the machine;
- peak_flops, mem_bandwidth, sms, link_bandwidth: NVIDIA's A100 (80 GB SXM4), H100 (SXM5) and
  H200 (SXM) datasheets: dense BF16/FP16 tensor FLOP/s (A100 312 T, H100/H200 989 T), HBM bandwidth (2039 GB/s,
  3.35 TB/s, 4.8 TB/s), SMs (108, 132, 132), NVLink per GPU (600 GB/s A100, 900 GB/s H100/H200, both
  directions together: half of it each way);
- ib_bandwidth: one InfiniBand NIC per GPU as in DGX A100 (HDR, 200 Gb/s = 25 GB/s each way) and DGX H100/H200
  (NDR, 400 Gb/s = 50 GB/s each way);
- link_latency, ib_latency, collective_latency: NCCL's own tuning model (src/graph/tuning.cc, Simple protocol:
  8.4 us per collective, 3.4 us per NVLink ring step, 14 us per network step);
- gemm_efficiency: the measured maximum achievable matmul FLOP/s over the datasheet peak (S. Bekman,
  ml-engineering, "Maximum Achievable Matmul FLOPS" table, BF16: A100 SXM 85.9 %, H100 SXM 80.1 %, GH200 83.0 %,
  the H100 die with HBM3e as in H200);
- attention_efficiency: FlashAttention-2 reaches 50-73 % of peak on A100 (Dao 2023); on H100 FlashAttention-2
  reaches about 35 % and FlashAttention-3 75 % in the FP16 forward (Shah et al. 2024);
- align_penalty: chosen so that this model reproduces the ~25 % speedup nanoGPT got on an A100 from padding the
  GPT-2 vocabulary from 50257 to 50304 rows (A. Karpathy, 2023); tests/test_cost_model.py recomputes it;
- tile_m, tile_n, tile_k_overhead: the largest cuBLAS/CUTLASS half-precision tile (NVIDIA, Matrix Multiplication
  Background User's Guide) and a pipeline fill of about four k-steps of 32;
- mem_efficiency: assumed (elementwise kernels on large tensors reach roughly 80 % of HBM bandwidth); the
  calibrated profile a100_paper fits it.
A measured profile (python -m harness.calibrate --measure) carries the microbenchmarks' tables in `measured`
(vp.cost.tables reads them; the analytical fields, fitted to the same tables, answer outside them) and says where
they were taken in `machine`.
"""
import math
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

from vp.cost.tables import Tables
from vp.files import write_text_atomic
from vp.flops import DEVICE_PEAKS

GiB = 1024**3


@dataclass(frozen=True)
class Hardware:
    name: str
    peak_flops: float  # dense FLOP/s of one device at the run's dtype
    # compute: GEMMs by shape (vp.cost.gemm), elementwise work by bytes
    mem_bandwidth: float = 2.039e12  # bytes/s of device memory (HBM)
    sms: int = 108  # streaming multiprocessors: one GEMM tile each per wave; 0 = no tile or wave quantization
    tile_m: int = 256  # GEMM output tile (rows x columns) the library runs
    tile_n: int = 128
    tile_k_overhead: int = 128  # per-tile fixed cost (pipeline fill, epilogue) in k elements
    gemm_efficiency: float = 0.859  # fraction of peak a large, aligned GEMM reaches
    attention_efficiency: float = 0.6  # fraction of peak of fused (flash) attention, on the FLOPs it executes
    mem_efficiency: float = 0.8  # fraction of mem_bandwidth elementwise kernels reach
    align_penalty: float = 0.23  # alignment: speed 1 / (1 + align_penalty (16 / aligned bytes - 1)) (gemm.py)
    efficiency: dict = field(default_factory=dict)  # per pass kind: multiplier on its modelled GEMM speed (1.0)
    pass_overhead_s: float = 0.0  # fixed cost of any pass (launches, Python, synchronisation)
    kernel_s: float = 0.0  # fixed cost of each operation a pass issues (dispatch, launch; measured profiles)
    cores: int = 0  # compute units the devices of a node share (CPU cores; 0: every device has its own)
    # seconds a rank that waited for a peer then waits for a core, where more devices compute than there are cores
    # (measured on CPU: vp.cost.measure_comm.wake; vp.schedule.sharing), and a transfer or collective step waits
    # for one where the devices hold every core (vp.cost.costs.comm_wake_s); 0: the cores are shared at once
    wake_s: float = 0.0
    # how much slower the slowest of the ranks goes while every core of the node computes than a pass alone (the
    # cores share the last-level cache and the memory bus and do not keep one speed; measured on CPU:
    # vp.cost.measure_crowding); the simulator's sharing goes from 1 with one core at work to this with all of them
    # (vp.schedule.sharing); 1: passes do not slow each other
    crowding: float = 1.0
    optimizer_s_per_param: float = 0.0  # the optimizer step per parameter a device holds (measured; 0: not modelled)
    # network: gpus_per_node devices on NVLink, nodes on InfiniBand (vp.cost.network)
    gpus_per_node: int = 8
    link_bandwidth: float = 300e9  # bytes/s each way between two devices of one node
    link_latency: float = 3.4e-6  # seconds per ring step inside a node
    ib_bandwidth: float = 25e9  # bytes/s each way per device between nodes
    ib_latency: float = 14e-6  # seconds per ring step between nodes
    collective_latency: float = 8.4e-6  # fixed cost of one collective call
    # memory
    memory_bytes: float = 80 * GiB  # the device's capacity as torch reports it (total_memory); planners keep a margin
    bytes_per_param: float = 18.0  # bf16 weight + fp32 grad + fp32 master weight and two Adam moments
    act_bytes: int = 2  # bytes per activation element (bf16)
    overhead_bytes: float = 2 * GiB  # CUDA context, allocator slack
    # NCCL's buffers (vp.cost.memory.comm_buffer_bytes), estimated, not measured: a communicator that runs
    # collectives (ring/tree buffers of NCCL_BUFFSIZE = 4 MiB per channel and protocol, up to 32 channels; with
    # NVLink SHARP on H100/H200 its multicast buffers), and a two-rank point-to-point link (link_buffer_bytes)
    comm_bytes: float = 0.5 * GiB
    link_comm_bytes: float = -1.0  # -1: link_buffer_bytes(LINK_MAX_CTAS), the runtime's link communicators
    fitted_to: str = ""  # what harness.calibrate fitted the profile to (a published table, a results folder)
    machine: dict = field(default_factory=dict)  # measured profiles: host, device, torch, threads, date
    measured: dict = field(default_factory=dict)  # measured profiles: gemm, attention, collectives tables

    def __post_init__(self):
        object.__setattr__(self, "tables", Tables.of(self.measured))
        # (Gemm, speedup) -> seconds (vp.cost.gemm.gemm_time): a pure function of this frozen profile; a search
        # prices the same few hundred shapes hundreds of thousands of times
        object.__setattr__(self, "gemm_memo", {})
        # the cost model's figures at the grain a search repeats them (a stage part's seconds for its layer shape,
        # a stage's tensor-parallel collectives for its group): cost_table()
        object.__setattr__(self, "cost_memo", {})
        if self.link_comm_bytes < 0:
            object.__setattr__(self, "link_comm_bytes", link_buffer_bytes(LINK_MAX_CTAS))

    def contention(self, ranks_here: int) -> float:
        """How much slower each device computes when `ranks_here` ranks share the node's `cores` (CPU runs with
        more processes than cores; each was measured alone): 1 when devices do not share compute."""
        return max(1.0, ranks_here / self.cores) if self.cores > 0 else 1.0

    def eff(self, kind: str) -> float:
        """Multiplier on the modelled GEMM speed of a pass kind (calibrated from real runs; 1.0 otherwise)."""
        return float(self.efficiency.get(kind, 1.0))

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "Hardware":
        """A profile read from a file or a record, validated as a whole (check_profile) before any use."""
        return check_profile(d)


COST_TABLES = 4096  # tables a profile's cost_memo holds before it starts afresh (30B on 1024 GPUs: ~700, 16k figures)


def cost_table(hw: Hardware, key: tuple) -> dict:
    """The profile's table of memoised figures for `key` (hw.cost_memo), which the caller fills, each figure under
    the rest of what it reads: a figure must be a function of the profile (frozen), of `key` and of its own key
    alone. `key` (layer shapes, tensor layouts: frozen values) is hashed once per call, the inner keys are small
    tuples. A pure cache: dropped with the profile; emptied past COST_TABLES tables, so a long-lived process that
    prices many problems on one profile holds a bounded number."""
    memo = hw.cost_memo
    table = memo.get(key)
    if table is None:
        if len(memo) >= COST_TABLES:
            memo.clear()
        table = memo[key] = {}
    return table


# Ranges of a profile's numbers; every one must also be finite. Fields not listed are >= 0 (latencies, overheads,
# fixed costs, byte counts). A profile is validated as a whole where it is read (Hardware.from_dict), so a NaN, a
# negative latency or a corrupt table never reaches the planner, the simulator or a sweep.
POSITIVE = ("peak_flops", "mem_bandwidth", "link_bandwidth", "ib_bandwidth", "gemm_efficiency",
            "attention_efficiency", "mem_efficiency", "memory_bytes", "bytes_per_param", "crowding")
AT_LEAST_ONE = ("gpus_per_node", "act_bytes", "tile_m", "tile_n")
INTEGERS = ("sms", "tile_m", "tile_n", "tile_k_overhead", "cores", "gpus_per_node", "act_bytes")


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def check_profile(d) -> "Hardware":
    """The Hardware of a profile mapping; ValueError naming the field, its value and the range, for an unknown
    field, a number that is not finite or out of range, a per-kind table that is not names to positive numbers, or
    a measured table that is not rows of numbers (and names)."""
    if not isinstance(d, dict):
        raise ValueError(f"hardware profile: expected a mapping of fields, got {type(d).__name__}")
    known = {f.name for f in fields(Hardware)}
    unknown = sorted(set(d) - known)
    if unknown:
        raise ValueError(f"hardware profile: unknown field(s) {unknown}; known: {sorted(known)}")
    name = d.get("name")
    where = f"hardware profile {name}" if isinstance(name, str) and name else "hardware profile"
    if not isinstance(name, str) or not name:
        raise ValueError(f"{where}: name={name!r} must be a non-empty string")
    if "peak_flops" not in d:
        raise ValueError(f"{where}: peak_flops is missing; give the device's dense FLOP/s")
    for f in fields(Hardware):
        if f.name not in d or f.type not in ("float", "int", float, int):
            continue
        value = d[f.name]
        if not _number(value):
            raise ValueError(f"{where}: {f.name}={value!r} must be a finite number")
        if f.name in INTEGERS and value != int(value):
            raise ValueError(f"{where}: {f.name}={value!r} must be a whole number")
        low, word = (1, "at least 1") if f.name in AT_LEAST_ONE else (0, "> 0") if f.name in POSITIVE else \
            (0, ">= 0")
        if value < low or (word == "> 0" and value <= 0):
            raise ValueError(f"{where}: {f.name}={value!r} must be {word}")
    efficiency = d.get("efficiency", {})
    if not isinstance(efficiency, dict) or not all(isinstance(k, str) and _number(v) and v > 0
                                                   for k, v in efficiency.items()):
        raise ValueError(f"{where}: efficiency={efficiency!r} must map pass kinds to positive finite numbers")
    if not isinstance(d.get("machine", {}), dict):
        raise ValueError(f"{where}: machine must be a mapping")
    _check_tables(d.get("measured", {}), where)
    fixed = d.get("overhead_bytes", Hardware.overhead_bytes)
    if "memory_bytes" in d and d["memory_bytes"] <= fixed:
        raise ValueError(f"{where}: memory_bytes={d['memory_bytes']!r} is not above overhead_bytes={fixed!r} (CUDA "
                         f"context, allocator slack): give the device's capacity as torch reports it, "
                         f"torch.cuda.get_device_properties(0).total_memory, in bytes")
    ints = {k: int(d[k]) for k in INTEGERS if k in d}
    try:
        return Hardware(**{**d, **ints})
    except (TypeError, ValueError, KeyError, IndexError, ZeroDivisionError) as err:  # Tables.of reading the rows
        raise ValueError(f"{where}: measured tables do not read ({type(err).__name__}: {err}); measure the "
                         f"profile again (python -m harness.calibrate --measure)") from None


def _check_tables(measured, where: str) -> None:
    """measured: table name -> rows (lists of finite numbers and names) or their text form (vp.cost.tables.rows)."""
    from vp.cost.tables import rows

    if not isinstance(measured, dict):
        raise ValueError(f"{where}: measured must be a mapping of table names to rows")
    for key, table in measured.items():
        try:
            got = rows(table)
        except (TypeError, ValueError, AttributeError) as err:
            raise ValueError(f"{where}: measured.{key} does not read as rows ({err})") from None
        if not isinstance(got, list):
            raise ValueError(f"{where}: measured.{key} must be rows of numbers, got {type(got).__name__}")
        for i, row in enumerate(got):
            if _number(row):  # a bare value (the optimizer's [parameters, seconds] pair of older profiles)
                continue
            if not isinstance(row, list) or not row or \
                    not all(_number(x) or (isinstance(x, str) and x) for x in row):
                raise ValueError(f"{where}: measured.{key} row {i} ({row!r}) must be a list of finite numbers "
                                 f"(and names); measure the profile again (python -m harness.calibrate --measure)")


def write_profile(hw: Hardware, path, header: str) -> Path:
    """The profile as a config of the Hydra `hardware` group (`# @package hardware`, a line saying what it
    sets, then `name` and `profile`), written whole or not at all; header: comment lines saying where it came from
    and how to use it."""
    import yaml

    comments = f"# hardware={hw.name}: a calibrated profile of the cost model (backend=sim)\n"
    comments += "".join(f"# {line}\n" for line in header.splitlines())
    check_profile(hw.to_dict())  # what is written reads back (a fit that gave a NaN or inf stops here)
    body = yaml.safe_dump({"name": hw.name, "profile": hw.to_dict()}, sort_keys=False)
    return write_text_atomic(path, f"# @package hardware\n{comments}{body}")


LINK_MAX_CTAS = 2  # NCCL channels (CTAs, one SM each) of a point-to-point link's communicator (vp.nccl.nccl_options)
NCCL_BUFFSIZE = 4 * 2**20  # NCCL's default buffer of the Simple protocol, per channel and connection
NCCL_LL_BUFFSIZE = 2**18  # the LL protocol's, per channel and connection (small messages)


def link_buffer_bytes(channels: int) -> float:
    """NCCL's buffers of one point-to-point link on each of its two ranks: one connection (a send on one rank, a
    receive on the other) per channel, each with the Simple and LL protocols' buffers (point-to-point never uses
    LL128, nor the ring/tree buffers of collectives, which a link never runs: vp.nccl.create warms it up with a
    send and a receive). Channels are what NCCL may use for the link, capped per communicator by max_ctas."""
    return channels * (NCCL_BUFFSIZE + NCCL_LL_BUFFSIZE)


H100_TOTAL_MIB = 81089  # torch.cuda.get_device_properties(0).total_memory of an H100 80GB HBM3, in MiB (above)
H200_TOTAL_MIB = 143156  # and of an H200 (141 GB HBM3e)

PROFILES = {
    "a100_80g": Hardware("a100_80g", DEVICE_PEAKS["A100"]),
    "h100": Hardware("h100", DEVICE_PEAKS["H100"], mem_bandwidth=3.35e12, sms=132, gemm_efficiency=0.801,
                     attention_efficiency=0.5, link_bandwidth=450e9, ib_bandwidth=50e9, comm_bytes=1 * GiB,
                     memory_bytes=H100_TOTAL_MIB * 2**20),
    "h200": Hardware("h200", DEVICE_PEAKS["H200"], mem_bandwidth=4.8e12, sms=132, gemm_efficiency=0.830,
                     attention_efficiency=0.5, link_bandwidth=450e9, ib_bandwidth=50e9,
                     memory_bytes=H200_TOTAL_MIB * 2**20, comm_bytes=1 * GiB),
}
