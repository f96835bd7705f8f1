"""Microbenchmarks of one machine, for a measured hardware profile (python -m harness.calibrate --measure).

Every figure is the median of several samples after a warm-up, each timed around the operation: CUDA events on a
GPU (synchronised once per sample); on a CPU the thread's CPU time (time.thread_time) where a rank computes on one
thread, else time.perf_counter. CPU time is what the operation costs on a core of its own: on a loaded machine the
wall clock also counts the time slices other processes took, which an operation longer than a slice always pays
and a shorter one mostly does not (a [256, 64000] x [64000, 256] GEMM at load 7-10: 468-534 ms wall, 233-262 ms CPU;
a 256^3 one 1.0-5.0 ms wall, 1.0-1.2 ms CPU), so wall-clock tables of one machine disagreed with each other by the
load they were measured at. How a run's own ranks share the cores is the simulator's part (vp.schedule.sharing).
Collectives wait on other processes and are timed on the wall clock. GEMMs are timed cold (Timer: the caches cleared
before each sample, as a layer meets its weights in a run); attention, elementwise steps and the activation warm
(each reads what the operation before it just wrote). What is measured, in the run's dtype and with the threads
one rank of a run gets:
  gemm        seconds of C[m, n] = A[m, k] B[k, n] per shape, the weight given as the runtime's linear layers
              hold it ([n, k], transposed); gemm_accumulate the jobs' weight-gradient shapes added in place;
  attention   seconds of causal scaled_dot_product_attention forward and backward per (batch x heads, seq,
              head dim);
  activation  seconds of GeLU forward and backward per tensor size;
  elementwise seconds of x += y (in place) and of x + y into a fresh output per tensor size (3 tensors' bytes
              moved): a per-operation cost, a rate per size, and what a fresh output costs beyond it (on a CPU,
              page faults wherever the allocator does not reuse memory);
  optimizer   seconds of one AdamW step (the runtime's optimizer) over many small tensors, and over one tensor of
              each large size the jobs hold (vocabulary matrices: a CPU step allocates temporaries that large);
              optimizer_sets the step over each rank's whole parameter set of the jobs (optimizer_set);
  layers      seconds per transformer layer of F, B, W and a whole backward, and output: of the output layer's
              forward and backward parts per shard shape and algorithm, as the runtime runs them
              (vp.cost.measure_passes);
  collectives seconds of all_reduce, broadcast, all_gather and reduce per group size and payload, and of a
              point-to-point message between two ranks (half a ping-pong), over gloo (CPU) or NCCL (GPU), each
              the slowest rank's time, started together after a barrier; on a CPU also the CPU time a collective
              costs its process where the runtime runs it, on a CommStream beside the passes (_cpu_off_path);
  wake        on a CPU, how long a rank woken by its peer waits for a core where ranks outnumber the cores
              (Hardware.wake_s: pairs computing between exchanges, four processes on two cores against two).
The tables go into the profile as they are (vp.cost.tables reads them); nothing here knows about runs.
"""
import os
import statistics
import sys
import tempfile
import time
import traceback
from pathlib import Path
from queue import Empty

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F

from vp.comm_stream import CommStream

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
OPS = ("all_reduce", "broadcast", "all_gather", "reduce")


def cache_bytes(device: torch.device) -> int:
    """Bytes written between the samples of a cold Timer: twice the largest cache (a GPU's L2, the CPU's last level
    as sysfs gives it), at least 64 MiB."""
    largest = 0
    if device.type == "cuda":
        largest = int(getattr(torch.cuda.get_device_properties(device), "L2_cache_size", 0))
    else:
        units = {"K": 2**10, "M": 2**20, "G": 2**30}
        for size in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*/size"):
            try:
                text = size.read_text().strip()
                largest = max(largest, int(text[:-1]) * units[text[-1]] if text[-1] in units else int(text))
            except (OSError, ValueError):
                continue
    return max(2 * largest, 64 * 2**20)


class Timer:
    """Median seconds of fn() over samples: CUDA events, or on a CPU the calling thread's CPU time when torch
    computes on it alone (one intra-op thread), else the wall clock (wall=True: always the wall clock).

    cold=True writes a buffer larger than the caches before each sample (outside the timed part), so the operation
    reads its operands from memory, as a layer's GEMMs do in a run, where a whole microbatch's other work has
    passed since its weights were last used (the practice of GPU GEMM benchmarks, which clear the L2). Timed warm,
    a small GEMM's operands stay cached between samples: on this project's 2-core CPU a [256, 256] x [256, 1024]
    GEMM took 1.7 ms warm, 2.5 ms cold, and 2.4-3.5 ms inside a transformer layer (docs/cost-model.md)."""

    def __init__(self, device: torch.device, target_s: float = 0.02, min_reps: int = 3, max_reps: int = 15,
                 wall: bool = False, cold: bool = False):
        self.device, self.target_s, self.min_reps, self.max_reps = device, target_s, min_reps, max_reps
        self.clock = time.perf_counter if wall or torch.get_num_threads() > 1 else time.thread_time
        self.flush = torch.empty(cache_bytes(device) // 4, device=device) if cold else None

    def sample(self, fn) -> float:
        if self.flush is not None:
            self.flush.fill_(1.0)
        if self.device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            torch.cuda.synchronize()
            return start.elapsed_time(end) / 1e3
        t0 = self.clock()
        fn()
        return self.clock() - t0

    def __call__(self, fn) -> float:
        first = self.sample(fn)  # warm-up (allocations, kernel selection), also sizes the number of samples
        reps = max(self.min_reps, min(self.max_reps, int(self.target_s / max(first, 1e-7))))
        return statistics.median(self.sample(fn) for _ in range(reps))


def gemms(shapes, device: torch.device, dtype: torch.dtype, timer: Timer, deadline: float,
          accumulate: bool = False) -> list[list[float]]:
    """[m, n, k, seconds] per shape (smallest first; shapes left when the deadline passes are not measured).
    accumulate: C[m, n] += G[k, m]^T X[k, n] in place, as the runtime adds a weight gradient into the existing one
    (vp.vocab.output.accumulate_product): no fresh output, whose page faults a large fresh product pays on a CPU."""
    out = []
    for m, n, k in sorted(shapes, key=lambda s: s[0] * s[1] * s[2]):
        if time.perf_counter() > deadline:
            break
        if accumulate:
            g, x = torch.randn(k, m, device=device, dtype=dtype), torch.randn(k, n, device=device, dtype=dtype)
            c = torch.zeros(m, n, device=device, dtype=dtype)
            out.append([m, n, k, timer(lambda: c.addmm_(g.t(), x))])
            continue
        a = torch.randn(m, k, device=device, dtype=dtype)
        w = torch.randn(n, k, device=device, dtype=dtype)
        out.append([m, n, k, timer(lambda: torch.matmul(a, w.t()))])
    return out


def attention(shapes, device: torch.device, dtype: torch.dtype, timer: Timer) -> list[list[float]]:
    """[batch x heads, seq, head_dim, forward s, backward s] per shape: causal attention as the model runs it."""
    out = []
    for bh, s, d in shapes:
        q, k, v = (torch.randn(1, bh, s, d, device=device, dtype=dtype, requires_grad=True) for _ in range(3))
        grad = torch.randn(1, bh, s, d, device=device, dtype=dtype)
        forward = timer(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True))

        def step():
            F.scaled_dot_product_attention(q, k, v, is_causal=True).backward(grad)

        out.append([bh, s, d, forward, max(0.0, timer(step) - forward)])
    return out


def elementwise(device: torch.device, dtype: torch.dtype, timer: Timer, sizes=None) -> list[list[float]]:
    """[bytes moved, seconds of x += y, seconds of x + y into a tensor the operation allocates] per number of
    elements, by default from a few hundred bytes to beyond the caches."""
    out = []
    for numel in sorted(set(sizes or [2**e for e in range(6, 25, 2)])):
        x, y = (torch.randn(numel, device=device, dtype=dtype) for _ in range(2))
        out.append([3 * numel * x.element_size(), timer(lambda: x.add_(y)), timer(lambda: torch.add(x, y))])
    return out


def activation(device: torch.device, dtype: torch.dtype, timer: Timer, sizes) -> list[list[float]]:
    """[elements, seconds of GeLU forward, seconds of its backward] per tensor size: the runtime's activation
    (F.gelu, exact), which on a CPU computes well below the rate of plain elementwise work (erf per element)."""
    out = []
    for numel in sorted(set(sizes)):
        x, grad = (torch.randn(numel, device=device, dtype=dtype) for _ in range(2))
        out.append([numel, timer(lambda: F.gelu(x)), timer(lambda: torch.ops.aten.gelu_backward(grad, x))])
    return out


def optimizer(device: torch.device, timer: Timer, numel: int = 2**17, tensors: int = 16) -> list[float]:
    """[elements per tensor, tensors, seconds] of one step of the runtime's optimizer (vp.runtime.loop: AdamW, its
    settings) over `tensors` fp32 tensors of `numel` parameters each."""
    params = [torch.nn.Parameter(torch.randn(numel, device=device)) for _ in range(tensors)]
    for q in params:
        q.grad = torch.randn_like(q)
    opt = torch.optim.AdamW(params, lr=1e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.01)
    return [numel, tensors, timer(opt.step)]


SMALL_TENSOR = 2**17  # elements of each small tensor standing for a rank's layers in optimizer_set


def optimizer_set(device: torch.device, timer: Timer, params: int, large: tuple[int, ...],
                  reps: int = 3) -> list[float]:
    """[parameters, seconds, *large] of one step of the runtime's optimizer over one rank's parameters as a job
    holds them: its large tensors (vocabulary matrices or shards) and the rest in tensors of SMALL_TENSOR
    elements, the gradients fresh before every step, as the runtime's backward makes them after zero_grad(None).
    The per-tensor rows (optimizer) miss what a rank's set costs together: AdamW's foreach steps allocate a
    temporary per tensor of the group, so the temporaries of every large tensor are alive at once, and whether a
    tensor's temporaries come from reused memory or fresh pages depends on what else the process holds (on this
    project's 2-core CPU one 8.2M-element tensor alone took 24.5 ms a step in one profile and 65-75 ms in fresh
    processes minutes later; a vocab-2 rank's set, two such shards and 1.6M parameters in small tensors, 100-165 ms
    with fresh gradients, as a run does)."""
    sizes = list(large)
    rest = params - sum(large)
    sizes += [SMALL_TENSOR] * (rest // SMALL_TENSOR) + ([rest % SMALL_TENSOR] if rest % SMALL_TENSOR else [])
    tensors = [torch.nn.Parameter(torch.randn(n, device=device)) for n in sizes]
    opt = torch.optim.AdamW(tensors, lr=1e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.01)

    def fresh_grads():
        for q in tensors:
            q.grad = None
        for q in tensors:
            q.grad = torch.full_like(q, 1e-3)

    fresh_grads()
    opt.step()  # the first step makes the optimizer's state
    samples = []
    for _ in range(reps):
        fresh_grads()
        samples.append(timer.sample(opt.step))
    return [params, statistics.median(samples), *large]


def _collective_rank(rank: int, world: int, init: str, device_type: str, threads: int, groups, sizes, reps,
                     queue) -> None:
    torch.set_num_threads(threads)
    device = torch.device("cpu")
    if device_type == "cuda":
        device = torch.device("cuda", rank)
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if device_type == "cuda" else "gloo", init_method=init, rank=rank,
                            world_size=world, **({"device_id": device} if device_type == "cuda" else {}))
    stream = CommStream(device, "benchmark") if device_type == "cpu" and world <= CPU_MAX_WORLD else None
    try:
        rows = []
        for n in [n for n in groups if world % n == 0]:
            # the world in groups of n, every group at work at once (each rank takes part in creating all)
            pg = [dist.new_group(list(range(g, g + n))) for g in range(0, world, n)][rank // n]
            for nbytes in [b for b in sizes if b * n <= 2**26]:  # all_gather's output: n payloads
                t = torch.ones(max(1, nbytes // 4), device=device)
                bufs = [torch.empty_like(t) for _ in range(n)]
                calls = {"all_reduce": lambda: dist.all_reduce(t, group=pg),
                         "broadcast": lambda: dist.broadcast(t, group=pg, group_src=0),
                         "all_gather": lambda: dist.all_gather(bufs, t, group=pg),
                         "reduce": lambda: dist.reduce(t, group=pg, group_dst=0)}
                if n == 2:
                    calls["p2p"] = lambda: _ping(t, rank % n, pg)  # its rank in the group
                for op, call in calls.items():
                    row = [op, n, nbytes, _slowest(call, device, reps) / (2 if op == "p2p" else 1), world]
                    if stream is not None and op != "p2p" and nbytes <= CPU_MAX_BYTES:
                        row.append(_cpu_off_path(call, rank, world, stream))
                    rows.append(row)
        if rank == 0:
            queue.put(rows)
    finally:
        if stream is not None:
            stream.close(wait=False)
        dist.barrier()
        dist.destroy_process_group()


def _ping(t, rank: int, pg) -> None:
    if rank == 0:
        dist.send(t, group=pg, group_dst=1)
        dist.recv(t, group=pg, group_src=1)
    else:
        dist.recv(t, group=pg, group_src=0)
        dist.send(t, group=pg, group_dst=0)


def _slowest(call, device: torch.device, reps: int, budget_s: float = 0.25, min_reps: int = 3) -> float:
    """Mean over reps of the slowest rank's seconds of one call (of all the world's groups), every rank started
    after a barrier; fewer reps (at least min_reps) once they add up to budget_s (every rank sees the same samples,
    so all stop together). The mean, not the median: a collective among processes that share cores now and then
    waits a scheduler time slice for a peer (on 2 cores, 0.3 ms typically and up to 8 ms), and a run pays every
    such wait."""
    call()  # warm-up: connections, buffers
    samples = []
    while len(samples) < reps and (len(samples) < min_reps or sum(samples) < budget_s):
        dist.barrier()
        if device.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        call()
        if device.type == "cuda":
            torch.cuda.synchronize()
        took = torch.tensor([time.perf_counter() - t0], device=device)
        dist.all_reduce(took, op=dist.ReduceOp.MAX)
        samples.append(float(took.item()))
    return statistics.fmean(samples)


CPU_COMPUTE_S = 0.002  # seconds a rank of the CPU-time benchmark computes while its collective runs (x1 or x2)
# the CPU-time benchmark's worlds and payloads (vp.cost.tables extrapolates beyond them): a vocabulary-parallel run's
# collectives on this many processes carry a microbatch's activations (256 KiB in the smoke sweep); worlds of 8
# processes each computing beside its collectives on 2 cores took 20 s more
CPU_MAX_WORLD, CPU_MAX_BYTES, CPU_REPS = 4, 2**20, 12


def _cpu_off_path(call, rank: int, world: int, stream) -> float:
    """CPU seconds one call costs its process where the runtime runs it off the compute path: submitted to a
    CommStream (vp.comm_stream: a worker thread on CPU) while this thread computes (GEMMs for CPU_COMPUTE_S, twice
    that on odd ranks, so the ranks enter at different times as a pipeline's do), then waited for. gloo's threads
    and the worker move and sum the payload on the cores the passes use: the process's CPU time less this thread's,
    over CPU_REPS calls, the mean over the world's ranks. (With every core busy on purpose: on idle cores gloo's
    threads also poll while they wait, about twice the CPU time on 2 cores, which takes nothing from a pass.)"""
    a = torch.randn(256, 256)
    busy_s = CPU_COMPUTE_S * (1 + rank % 2)
    stream.submit(call).wait()
    dist.barrier()
    c0, t0 = time.process_time(), time.thread_time()
    for _ in range(CPU_REPS):
        handle = stream.submit(call)
        end = time.thread_time() + busy_s
        while time.thread_time() < end:
            a @ a
        handle.wait()
    mean = torch.tensor([max(0.0, (time.process_time() - c0) - (time.thread_time() - t0)) / CPU_REPS])
    dist.all_reduce(mean)
    return float(mean.item()) / world


def collectives(device_type: str, worlds: list[int], groups: list[int], sizes: list[int], reps: int = 10,
                threads: int = 1, timeout_s: float = 600.0) -> list[list]:
    """[op, group size n, payload bytes, seconds, world(, CPU seconds: on a CPU)] for every op and payload, and
    [p2p, 2, bytes, s, world], with `world` processes at work in world / n groups at once, for each world and each
    group size dividing it:
    how a run's tensor-parallel groups (a 2-D grid's rows and columns), pipeline pairs and replicas communicate
    together. One set of processes per world (in_world)."""
    return [row for world in worlds
            for row in in_world(world, _collective_rank, (device_type, threads, [n for n in groups if n <= world],
                                                           sizes, reps), timeout_s, "collective")]


WAKE_COMPUTE_S = 0.01  # CPU seconds each rank of the wake-up benchmark computes between two exchanges, as a pass


def wake(cores: int, compute_s: float = WAKE_COMPUTE_S, exchanges: int = 24, timeout_s: float = 120.0) -> float:
    """Seconds a rank that has waited for a peer then waits for a core, where more ranks compute than there are
    cores (Hardware.wake_s, vp.schedule.sharing): pairs of processes held to two cores, each computing compute_s
    of CPU time and then exchanging a small message with its partner (a round trip); half the mean round trip with
    four processes at it (the cores shared twice over) less half of it with one pair (a core each). The fluid
    sharing of the simulator has a woken rank compute at once at its share; a scheduler hands cores over in time
    slices. The wait depends on how long the ranks compute between messages (on this project's 2-core CPU, half the
    added round trip was 2.0-2.1 ms with 10 ms between exchanges, 4.2 ms with 5 ms); compute_s is a pass of the
    smoke model's order. 0 on a machine of one core (no pair has a core each there). The two cores taken are the
    first two of the process's affinity, which may be hyperthreads of one physical core; a CPU quota (cgroup
    cpu.max) below two cores makes the pair already crowded and the wait too small."""
    if cores < 2:
        return 0.0
    alone, crowded = (in_world(world, _wake_rank, (2, compute_s, exchanges), timeout_s, "wake-up")
                      for world in (2, 4))
    return max(0.0, (crowded - alone) / 2)


def _wake_rank(rank: int, world: int, init: str, cores: int, compute_s: float, exchanges: int, queue) -> None:
    os.sched_setaffinity(0, sorted(os.sched_getaffinity(0))[:cores])
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    mean = or_exit(_wake_pairs, rank, compute_s, exchanges)
    dist.all_reduce(mean)
    if rank == 0:
        queue.put(float(mean) / world)
    dist.barrier()
    dist.destroy_process_group()


def or_exit(body, *args):
    """body(*args) in a benchmark rank of in_world; if it fails, the rank prints the cause and ends at once, since
    its peers wait for it in a collective or a receive (in_world then stops them all)."""
    try:
        return body(*args)
    except BaseException:
        traceback.print_exc()
        sys.stderr.flush()
        os._exit(1)


def _wake_pairs(rank: int, compute_s: float, exchanges: int) -> torch.Tensor:
    """The mean round trip of this rank's exchanges with its partner (rank ^ 1), each after compute_s of work."""
    peer, message, work, rtts = rank ^ 1, torch.ones(16), torch.randn(128, 128), []
    for _ in range(exchanges + 4):  # the first 4: warm-up
        end = time.thread_time() + compute_s
        while time.thread_time() < end:
            work @ work
        t0 = time.perf_counter()
        if rank % 2 == 0:
            dist.send(message, peer)
            dist.recv(message, peer)
        else:
            dist.recv(message, peer)
            dist.send(message, peer)
        rtts.append(time.perf_counter() - t0)
    return torch.tensor([statistics.fmean(rtts[4:])], dtype=torch.float64)


def in_world(world: int, target, args: tuple, timeout_s: float = 600.0, what: str = "collective") -> list:
    """What rank 0 of `world` processes puts on its queue, each running target(rank, world, init, *args, queue)
    after joining a process group through `init`. The processes are forked from a server that imported torch once
    (a spawned process per rank would import it again, several seconds each on a loaded machine)."""
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(["torch", "torch.distributed", __name__])
    queue = ctx.Queue()
    with tempfile.TemporaryDirectory() as tmp:
        init = f"file://{os.path.join(tmp, 'rendezvous')}"
        procs = [ctx.Process(target=target, args=(r, world, init, *args, queue), daemon=True) for r in range(world)]
        for p in procs:
            p.start()
        try:
            rows, give_up = None, time.monotonic() + timeout_s
            while rows is None:
                try:
                    rows = queue.get(timeout=1.0)
                except Empty:
                    if any(p.exitcode not in (None, 0) for p in procs):
                        break
                    if time.monotonic() > give_up:  # every rank alive, none done: one hangs in a collective
                        for p in procs:
                            p.kill()
                        raise RuntimeError(f"the {what} benchmark gave no result within {timeout_s:g} s "
                                           f"(a rank hangs, or the machine is far slower than expected)")
        finally:
            if rows is None:  # a rank failed: its peers wait for it in a collective
                for p in procs:
                    if p.is_alive():
                        p.kill()
            for p in procs:
                p.join(timeout=60)
                if p.is_alive():
                    p.kill()
    if rows is None or any(p.exitcode for p in procs):
        raise RuntimeError(f"a {what} benchmark process failed (exit codes {[p.exitcode for p in procs]})")
    return rows
