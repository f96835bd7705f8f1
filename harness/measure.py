"""python -m harness.calibrate --measure: this machine's hardware profile from microbenchmarks (vp.cost.measure),
never from the runs it will predict.

The GEMMs measured are a log grid of shapes and every GEMM the jobs of the given experiments (default smoke and
tp_smoke) would run, as the cost model lists them (vp.cost.pass_work); attention likewise. The profile holds the
tables and, fitted to them, the analytical model's parameters (peak, GEMM and attention ceilings, elementwise
bandwidth, per-operation cost, link latency and bandwidth) that answer outside the tables, and `machine`: host,
device, torch version, dtype, threads per rank, how compute was timed (clock), cores, load average and date.
"""
import datetime
import os
import platform
import re
import socket
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

import torch

from vp.cost import PROFILES, GiB, Hardware, fit_link, pass_work
from vp.cost.costs import vocab_tensors
from vp.cost.memory import rank_params
from vp.cost import measure as M
from vp.cost import measure_comm as C
from vp.cost.measure_crowding import CROWDING_CYCLES, CROWDING_PROCESSES, CROWDING_REPEATS, crowding, processes
from vp.cost import measure_passes as P
from vp.cost.gemm import Gemm, alignment, quantization
from vp.cost.tables import Tables, as_text, layer_key, optimizer_key, rows, tp_layer_key, tp_vocab_key
from vp.flops import DEVICE_NAMES
from vp.metrics import device_peak
from vp.schedule import build
from vp.schedule.methods import get_method

CPU_GRID = (16, 64, 256, 1024, 4096)  # each dimension of the log grid of GEMM shapes
GPU_GRID = (64, 256, 1024, 4096, 16384)
GRID_FLOPS = {"cpu": 4e9, "cuda": 1e13}  # grid shapes above this are left to the analytical model
CPU_RANKS = 64  # the ranks of a CPU run share one node in the network model up to this many
BUILTIN_OF = {"A100": "a100_80g", "H100": "h100", "H100 PCIe": "h100", "H200": "h200"}  # vp.flops model -> profile
GROUPS = (2, 4, 8)  # group sizes of the collectives (the local sweeps run at most 8 ranks)
# how compute is timed (vp.cost.measure.Timer; one thread per rank on CPU): a profile timed otherwise is measured again
CLOCK = {"cpu": "thread_time", "cuda": "cuda_events"}
# how the caches stand when GEMMs are timed (vp.cost.measure.Timer's cold): a profile timed otherwise is measured again
CACHES = "gemm cold; weight gradients in place"
COLLECTIVE_SIZES = [256, 16384, 2**20, 2**24]  # payload bytes (all_gather up to 64 MiB gathered)
# how collectives are timed (vp.cost.measure_comm.collectives): a profile timed otherwise is measured again
COLLECTIVES = "groups side by side in worlds of 2-8 processes; mean of 10"
# and on a CPU their CPU time off the compute path (vp.cost.measure_comm._cpu_off_path): a CPU profile without it is
# measured again
COLLECTIVES_CPU = "CPU time on a CommStream beside computing ranks, worlds of 2-4"
# how a woken rank's wait for a core is timed on a CPU (vp.cost.measure_comm.wake): a CPU profile timed otherwise (or
# without it) is measured again
WAKE = "pairs computing 10 ms between exchanges, 4 processes against 2 on 2 cores"
# how the slowdown of ranks computing at once is timed on a CPU (crowding): a CPU profile timed otherwise (or without
# it) is measured again
CROWDING = (f"slowest of up to {CROWDING_PROCESSES} processes at once over one alone, bursts of {CROWDING_CYCLES} "
            f"passes, {CROWDING_REPEATS} alternations")
# which passes are timed as the runtime runs them (vp.cost.measure_passes): a profile without them is measured again
PASSES = ("layers, output layer and an empty stage pass in 3 rounds across the calibration; tensor-parallel layers "
          "and vocabulary layers in their group's world")


def machine(device: torch.device, dtype: str, threads: int) -> dict:
    """Where and how the profile was measured: what a cached profile must match to be reused."""
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
    else:
        name = _cpu_name() or platform.processor() or "cpu"
    return {"host": socket.gethostname(), "device": device.type, "device_name": name, "torch": str(torch.__version__),
            "dtype": dtype, "threads": threads, **how_timed(device.type), "cores": len(os.sched_getaffinity(0)),
            "load_average": [round(x, 2) for x in os.getloadavg()],
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}


def _cpu_name() -> str | None:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return None


def default_name(device: str) -> str:
    """The cached profile of this machine, device and torch: DEVICE_HOST_torchVERSION in the names Hydra takes."""
    return re.sub(r"[^A-Za-z0-9_-]+", "_", f"{device}_{socket.gethostname()}_torch{torch.__version__}")


def how_timed(device: str) -> dict:
    """How this code times a profile (clock, caches, collectives, passes): a profile timed otherwise is measured
    again."""
    return {"clock": CLOCK[device], "caches": CACHES, "collectives": COLLECTIVES, "passes": PASSES,
            **({"wake": WAKE, "collectives_cpu": COLLECTIVES_CPU, "crowding": CROWDING} if device == "cpu" else {})}


def same_machine(profile: dict, device: str, dtype: str) -> bool:
    have = profile.get("machine") or {}
    want = {"host": socket.gethostname(), "device": device, "torch": torch.__version__, "dtype": dtype,
            **how_timed(device)}
    return all(have.get(k) == v for k, v in want.items())


def job_shapes(experiments: list[str], act_bytes: int) -> dict[str, set]:
    """What every pass of every job of the experiments runs: "gemm" (m, n, k) of the GEMMs into a fresh output,
    "gemm_accumulate" (m, n, k) of those added into their output (weight gradients), "attention" (batch x heads, seq, head dim), "tensors" (bytes
    of the elementwise steps' tensors), "vocab" (elements of the vocabulary matrices the devices hold), "gelu"
    (elements of each GeLU call), "ranks" (each rank's parameters and large tensors: vp.cost.optimizer_key) and
    "layers" (the transformer layer of each job without tensor parallelism: vp.cost.tables.layer_key), "output"
    (its output layer's shard: tokens, rows, hidden, algorithm; vp.cost.passes.pass_factors), "tp_layers" (the
    tensor-parallel layer of each job with it: vp.cost.tables.tp_layer_key) and "tp_vocab" (the vocabulary layers
    of its stages, where they hold them: vp.cost.tables.tp_vocab_key)."""
    from hydra import initialize_config_dir

    from harness.sweep import plan

    skeleton = Hardware("shapes", 1.0, act_bytes=act_bytes)
    out = {key: set() for key in ("gemm", "gemm_accumulate", "attention", "tensors", "vocab", "gelu", "ranks",
                                  "layers", "output", "tp_layers", "tp_vocab")}
    conf = str(Path(__file__).resolve().parents[1] / "conf")
    with initialize_config_dir(conf, version_base="1.3"):
        for name in experiments:
            _, jobs = plan([f"experiment={name}", "backend=sim", "logger=off"])
            for job in jobs:
                run = job.run
                sched = build(run.method, run.pp, run.microbatches, run.n_chunks)
                out["vocab"] |= {n for rank in vocab_tensors(run, sched) for n in rank}
                out["ranks"] |= {optimizer_key(n, large)
                                 for n, large in zip(rank_params(run, sched), vocab_tensors(run, sched))}
                for key, shape in pass_shapes(run).items():
                    out[key].add(shape)
                for parts in pass_work(run, skeleton, sched).values():
                    for work in parts.values():
                        for g in work.gemms:
                            out["gemm_accumulate" if g.accumulate else "gemm"].add((g.m, g.n, g.k))
                        out["attention"] |= {(max(1, round(bh)), s, d) for bh, s, d, _ in work.attention}
                        out["tensors"] |= {int(size) for size, _, _ in work.mem}
                        out["gelu"] |= {max(1, round(elements)) for elements, _, _, _ in work.activation}
    return out


def pass_shapes(run) -> dict:
    """The passes of a run that the layers, output, tp_layers and tp_vocab tables time as the runtime runs them:
    without tensor parallelism {"layers": layer_key, "output": (tokens, rows, hidden, algorithm)}, with it
    {"tp_layers": tp_layer_key} (its layers in a world of its group, with their collectives) and, where its stages
    hold the vocabulary layers (no vocabulary parallelism), {"tp_vocab": tp_vocab_key}: the keys
    vp.cost.passes.pass_factors reads."""
    method, n = get_method(run.method), run.micro_batch_size * run.seq_len
    if run.tp != 1:
        return {"tp_layers": tp_layer_key(run), **({} if method.vocab.parallel else {"tp_vocab": tp_vocab_key(run)})}
    out = {"layers": layer_key(run)}
    if method.vocab.parallel and method.vocab.name in P.OUTPUT_ALGORITHMS:
        out["output"] = (n, run.padded_vocab_size // run.pp, run.hidden, method.vocab.name)
    elif not method.vocab.parallel and not method.family.split_w:
        out["output"] = (n, run.padded_vocab_size, run.hidden, "local")
    return out


def grid_shapes(device: str) -> set:
    dims = CPU_GRID if device == "cpu" else GPU_GRID
    return {(m, n, k) for m in dims for n in dims for k in dims if 2.0 * m * n * k <= GRID_FLOPS[device]}


def elementwise_sizes(tensor_bytes: set, element_bytes: int) -> list[int]:
    """Elements per tensor of the elementwise table: a log grid (every 4x from 64) and the jobs' own tensor sizes,
    since the rate can fall off a cliff between two grid points (a CPU allocator's reuse limit)."""
    return sorted({2**e for e in range(6, 25, 2)} | {max(1, int(b) // element_bytes) for b in tensor_bytes})


def activation_sizes(from_jobs: set) -> list[int]:
    """Elements per tensor of the activation table: a log grid (every 16x from 2^8) and the jobs' own."""
    return sorted({2**e for e in range(8, 25, 4)} | set(from_jobs))


def attention_shapes(from_jobs: set) -> set:
    """Each (seq, head dim) the jobs use at their batch x heads, and at a quarter and four times it (the table
    interpolates in batch x heads)."""
    out = set(from_jobs)
    for bh, s, d in from_jobs:
        out |= {(max(1, bh // 4), s, d), (bh * 4, s, d)}
    return out


def measure_profile(name: str, device_type: str, dtype: str, experiments: list[str], budget_s: float,
                    log=lambda line: print(line, file=sys.stderr, flush=True)) -> Hardware:
    if device_type == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda: torch sees no CUDA device here (a CPU build of torch, or no GPU); "
                         "measure with --device cpu, or on a GPU node with a CUDA torch")
    start = time.perf_counter()
    device = torch.device("cuda", 0) if device_type == "cuda" else torch.device("cpu")
    threads = 1 if device_type == "cpu" else torch.get_num_threads()
    torch.set_num_threads(threads)  # as one of several ranks on this machine (vp.hostenv.cpu_threads)
    torch_dtype = M.DTYPES[dtype]
    act_bytes = torch.finfo(torch_dtype).bits // 8
    here = machine(device, dtype, threads)
    log(f"measuring {here['device_name']} on {here['host']} ({dtype}, {threads} thread(s) per rank, "
        f"{here['cores']} cores, load average {here['load_average']})")
    jobs = job_shapes(experiments, act_bytes)
    timer, cold = M.Timer(device), M.Timer(device, cold=True, max_reps=5)  # each cold sample writes the buffer
    peak, how = device_peak(device)
    rounds = [pass_round(jobs, device, torch_dtype, timer)]  # the first round of three, before the GEMMs
    # the jobs' shapes, all of them, then the grid within the budget. A weight gradient is timed in place where the
    # runtime adds it in place: a product of the gradient's own dtype, fp32 (vp.vocab.output.accumulate_product); in
    # bf16/fp16 it casts a fresh product, as the plain table times it
    begin = time.perf_counter()
    in_place = jobs["gemm_accumulate"] if dtype == "fp32" else set()
    fresh = jobs["gemm"] | (jobs["gemm_accumulate"] - in_place)
    gemm_rows = M.gemms(sorted(fresh), device, torch_dtype, cold, float("inf"))
    accumulate_rows = M.gemms(sorted(in_place), device, torch_dtype, cold, float("inf"), accumulate=True)
    grid_deadline = max(begin + budget_s, time.perf_counter() + budget_s / 4)  # at least a quarter for the grid
    gemm_rows += M.gemms(sorted(grid_shapes(device_type) - fresh), device, torch_dtype, cold, grid_deadline)
    if not gemm_rows:
        raise ValueError(f"--budget-s {budget_s}: no GEMM could be measured in that time; give more seconds")
    log(f"  {len(gemm_rows) + len(accumulate_rows)} GEMM shapes ({len(fresh)} of the jobs of "
        f"{', '.join(experiments)}, and {len(accumulate_rows)} of their weight gradients accumulating in place), "
        f"{time.perf_counter() - start:.0f} s")
    attention_rows = M.attention(sorted(attention_shapes(jobs["attention"])), device, torch_dtype, timer)
    element_rows = M.elementwise(device, torch_dtype, timer, elementwise_sizes(jobs["tensors"], act_bytes))
    activation_rows = M.activation(device, torch_dtype, timer, activation_sizes(jobs["gelu"]))
    step = [M.optimizer(device, timer)] + [M.optimizer(device, timer, n, 1) for n in sorted(jobs["vocab"])]
    step_sets = [M.optimizer_set(device, timer, n, large) for n, large in sorted(jobs["ranks"])]
    log(f"  {len(attention_rows)} attention shapes, {len(element_rows)} elementwise and {len(activation_rows)} "
        f"activation sizes, the optimizer step over {len(step_sets)} ranks' parameters, "
        f"{time.perf_counter() - start:.0f} s")
    # worlds: on a GPU node every device at work (a job fills the node); on a CPU each process count a local run
    # has, which decides how long a process waits for a core to answer its peer
    ranks = torch.cuda.device_count() if device_type == "cuda" else max(GROUPS)
    groups = [n for n in GROUPS if n <= ranks]
    worlds = [ranks] if device_type == "cuda" else groups
    collective_rows = C.collectives(device_type, worlds, groups, COLLECTIVE_SIZES) if groups else []
    log(f"  {len(collective_rows)} collective and point-to-point timings over group sizes {groups} "
        f"in worlds of {worlds} processes, "
        f"{time.perf_counter() - start:.0f} s")
    wake_s = 0.0  # a GPU rank has a device of its own
    if device_type == "cpu":
        try:
            wake_s = C.wake(here["cores"])
            log(f"  a rank woken by its peer waits {wake_s * 1e3:.2f} ms for a core where ranks outnumber the "
                f"cores, {time.perf_counter() - start:.0f} s")
        except RuntimeError as err:  # optional: without it the simulator shares the cores at once
            log(f"  a woken rank's wait for a core not measured ({err}); wake_s 0")
    # the second round half-way through (on a CPU about 50 s in of 100): a slow first half-minute then weighs a third
    # of the rows, not two thirds as when it followed the optimizer step, 25 s in
    # (docs/measurements/cost-model-cpu-2026-12-03.md)
    rounds.append(pass_round(jobs, device, torch_dtype, timer))
    log(f"  the second of three rounds of {len(jobs['layers'])} layer and {len(jobs['output'])} output-layer shapes "
        f"as the runtime runs them (the first before the GEMMs, the third at the end), "
        f"{time.perf_counter() - start:.0f} s")
    # a tensor-parallel stage's layers and vocabulary layers in a world of its group (gloo; a GPU group would need
    # a device per rank)
    tp_shapes, tp_vocab_shapes = (sorted(k for k in jobs[table] if groups and k[1] <= max(groups))
                                  for table in ("tp_layers", "tp_vocab"))
    tp_layer_rows, tp_vocab_rows = [], []
    if device_type == "cpu" and dtype == "fp32" and tp_shapes:
        try:
            tp_layer_rows, tp_vocab_rows = P.tp_passes(tp_shapes, tp_vocab_shapes)
        except RuntimeError as err:  # optional: without it the collectives tables price tp layers' traffic
            log(f"  tensor-parallel layers not measured ({err}); the collectives tables price their traffic")
    if tp_layer_rows:
        log(f"  {len(tp_layer_rows)} tensor-parallel layer and {len(tp_vocab_rows)} vocabulary-layer shapes in "
            f"worlds of their groups, {time.perf_counter() - start:.0f} s")
    rounds.append(pass_round(jobs, device, torch_dtype, timer))  # the third, at the end
    crowd = 1.0  # a GPU rank has a device of its own
    if device_type == "cpu":
        try:
            crowd = crowding(jobs, torch_dtype, here["cores"])
            log(f"  the slowest of {processes(here['cores'])} processes computing at once took "
                f"x{crowd:.2f} a pass's time alone, {time.perf_counter() - start:.0f} s")
        except RuntimeError as err:  # optional: without it the ranks' passes go as fast together as alone
            log(f"  passes at once not measured ({err}); crowding 1")
    passes = {table: mean_rows([r[table] for r in rounds]) for table in rounds[0]}
    here["rounds"] = {table: round(spread([r[table] for r in rounds]), 3) for table in rounds[0] if passes[table]}
    log(f"  {len(rounds)} rounds of the passes as the runtime runs them, spread over the calibration (each row's "
        f"largest round over its smallest, median over rows): " +
        ", ".join(f"{table} +{100 * s:.0f} %" for table, s in here["rounds"].items()) +
        f", {time.perf_counter() - start:.0f} s")
    measured = {"gemm": gemm_rows, "gemm_accumulate": accumulate_rows, "attention": attention_rows,
                "elementwise": element_rows, "activation": activation_rows, "optimizer": step,
                "optimizer_sets": step_sets, "collectives": collective_rows, "tp_layers": tp_layer_rows,
                "tp_vocab": tp_vocab_rows, **passes}
    hw = fitted(name, device, dtype, peak, measured, here)
    return replace(hw, measured={k: as_text(v) for k, v in measured.items()}, wake_s=wake_s, crowding=crowd,
                   fitted_to=f"microbenchmarks ({how} peak), {time.perf_counter() - start:.0f} s")


def pass_round(jobs: dict, device: torch.device, dtype: torch.dtype, timer) -> dict[str, list]:
    """One round of the passes timed as the runtime runs them, the layers and the output layer's parts at the jobs'
    shapes (rows in the order of their keys, every round). measure_profile takes three, spread over the calibration,
    and keeps each row's mean: one short burst takes the machine's speed of its moment, which moves here by tens of
    percent within a minute (docs/cost-model.md)."""
    return {"layers": P.layers(sorted(jobs["layers"]), device, dtype, timer, cycles=6),
            "output": P.output_passes(sorted(jobs["output"]), device, dtype, timer, cycles=4),
            "pass_fixed": P.empty_passes(device, dtype, timer)}


def mean_rows(rounds: list[list[list]]) -> list[list]:
    """The rows of several rounds (the same keys in the same order): each field the mean over the rounds where they
    differ (the times), the value where they agree (the keys). The rounds' mean, not their median: a run's
    iteration sums its passes, so it pays the machine's slow moments in proportion."""
    if len({len(r) for r in rounds}) > 1:
        raise ValueError(f"rounds of {sorted({len(r) for r in rounds})} rows: each round times the same shapes")
    out = []
    for same in zip(*rounds):
        row = []
        for col in zip(*same):
            differ = any(v != col[0] for v in col)
            if differ and any(isinstance(v, (int, str)) for v in col):
                raise ValueError(f"rounds disagree on a row's key {list(col)}: each round times the same shapes, "
                                 f"in the same order")
            row.append(statistics.fmean(col) if differ else col[0])
        out.append(row)
    return out


def spread(rounds: list[list[list]]) -> float:
    """How far the rounds disagree: per row, its largest round's total time over its smallest's, less 1 (the times:
    the fields that differ between rounds); the median over rows (0 with fewer than two rounds or rows)."""
    out = []
    for same in zip(*rounds):
        timed = [i for i, col in enumerate(zip(*same)) if any(v != col[0] for v in col)]
        totals = [sum(row[i] for i in timed) for row in same]
        if timed and min(totals) > 0:
            out.append(max(totals) / min(totals) - 1)
    return statistics.median(out) if out else 0.0


def fitted(name: str, device: torch.device, dtype: str, peak: float, measured: dict, here: dict) -> Hardware:
    """The profile: the tables, and the analytical model's parameters fitted to them."""
    act_bytes = torch.finfo(M.DTYPES[dtype]).bits // 8
    if device.type == "cuda":
        builtin = BUILTIN_OF.get(DEVICE_NAMES.get(here["device_name"], ""), "h100")
        base = replace(PROFILES[builtin], peak_flops=peak,
                       gpus_per_node=max(1, torch.cuda.device_count()),
                       memory_bytes=float(torch.cuda.get_device_properties(device).total_memory))
    else:
        # gloo holds no NCCL buffers (comm_bytes, link_comm_bytes); its own are small and in the measured peak
        base = Hardware(name, peak, sms=0, tile_k_overhead=0, align_penalty=0.0, collective_latency=0.0,
                        bytes_per_param=16.0 if dtype == "fp32" else 18.0, overhead_bytes=0.0, comm_bytes=0.0,
                        link_comm_bytes=0.0,
                        gpus_per_node=CPU_RANKS, cores=here["cores"], memory_bytes=_memory())
    base = replace(base, name=name, act_bytes=act_bytes)
    # GEMM ceiling: achieved over what the shape model allows, median over GEMMs of at least 1e8 FLOPs
    large = [r for r in measured["gemm"] if 2.0 * r[0] * r[1] * r[2] >= 1e8] or measured["gemm"]
    gemm_eff = statistics.median(2.0 * m * n * k / s / (peak * _shape_efficiency(base, Gemm(m, n, k, 1, act_bytes,
                                                                                            act_bytes)))
                                 for m, n, k, s in large)
    attention_eff = statistics.median(2.0 * bh * s * s * d / fwd / peak for bh, s, d, fwd, _ in
                                      measured["attention"]) if measured["attention"] else base.attention_efficiency
    elem = [r[:2] for r in measured["elementwise"]]  # in place: the analytical model has no allocation cost
    kernel_s = min(s for _, s in elem)
    big = [r for r in elem if r[0] >= 2**20] or elem
    _, bandwidth = fit_link(big) if len(big) >= 2 else (0.0, elem[-1][0] / elem[-1][1])
    pairs = Tables.of({"collectives": measured["collectives"]}).collectives.get(("p2p", 2), {})
    p2p = list(zip(*pairs[min(pairs)])) if pairs else []  # the link model: a pair with the fewest processes at work
    link = {}
    if len(p2p) >= 2:
        latency, link_bw = fit_link(p2p)
        link = {"link_latency": latency, "link_bandwidth": link_bw}
        if device.type == "cpu":
            link |= {"ib_latency": latency, "ib_bandwidth": link_bw}
    # the overhead in two parts: per operation (kernel_s) and per pass, what a stage pass over no layer took (F, B, W)
    fixed = measured.get("pass_fixed") or []
    overhead = statistics.median(fixed[0][:3]) if fixed else 0.0
    return replace(base, gemm_efficiency=min(1.0, gemm_eff), attention_efficiency=min(1.0, attention_eff),
                   mem_bandwidth=bandwidth, mem_efficiency=1.0, kernel_s=kernel_s, pass_overhead_s=overhead,
                   machine=here,
                   optimizer_s_per_param=measured["optimizer"][0][2] / (measured["optimizer"][0][0] *
                                                                        measured["optimizer"][0][1]),
                   measured=measured, **link)


def _shape_efficiency(hw: Hardware, g: Gemm) -> float:
    fill = g.k / (g.k + hw.tile_k_overhead)
    return quantization(hw, g) * fill * alignment(hw, g)


def _memory() -> float:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            return float(line.split()[1]) * 1024
    return 16 * GiB


def summary(hw: Hardware) -> str:
    t = {k: rows(v) for k, v in hw.measured.items()}
    return (f"peak {hw.peak_flops / 1e9:.1f} GFLOP/s, GEMM ceiling {hw.gemm_efficiency:.2f}, attention "
            f"{hw.attention_efficiency:.2f}, elementwise {hw.mem_bandwidth / 1e9:.2f} GB/s, per operation "
            f"{hw.kernel_s * 1e6:.1f} us, optimizer {hw.optimizer_s_per_param * 1e9:.1f} ns per parameter, link {hw.link_latency * 1e6:.0f} us + {hw.link_bandwidth / 1e9:.2f} GB/s; "
            f"tables: {len(t.get('gemm', []))} GEMMs, {len(t.get('attention', []))} attention shapes, "
            f"{len(t.get('collectives', []))} collective timings")

