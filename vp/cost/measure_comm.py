"""Microbenchmarks of one machine's communication, for a measured hardware profile (vp.cost.measure says what
the profile holds and how each table is timed): collectives and point-to-point messages per group size, payload and
world, on a CPU also the CPU time a collective run off the compute path costs; and on a CPU the wait of a woken
rank for a core. Each benchmark runs in its own set of processes (in_world), which vp.cost.measure_passes shares.
"""
import os
import statistics
import sys
import tempfile
import time
import traceback
from queue import Empty

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from vp.comm_stream import CommStream

OPS = ("all_reduce", "broadcast", "all_gather", "reduce")


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
    group size dividing it: how a run's tensor-parallel groups (a 2-D grid's rows and columns), pipeline pairs and
    replicas communicate together. One set of processes per world (in_world)."""
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
