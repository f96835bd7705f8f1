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
              costs its process where the runtime runs it, on a CommStream beside the passes
              (vp.cost.measure_comm, as wake);
  wake        on a CPU, how long a rank woken by its peer waits for a core where ranks outnumber the cores
              (Hardware.wake_s: pairs computing between exchanges, four processes on two cores against two);
  crowding    on a CPU, how much slower the slowest of the ranks goes while every core computes than a pass alone
              (Hardware.crowding, vp.cost.measure_crowding).
The tables go into the profile as they are (vp.cost.tables reads them); nothing here knows about runs.
"""
import statistics
import time
from pathlib import Path

import torch
import torch.nn.functional as F

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


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
