"""How much slower the ranks' passes go while every core of a CPU computes than a pass alone (Hardware.crowding),
timed with the calibration's own pass code (vp.cost.measure_passes) in processes of one thread each."""
import multiprocessing as mp
import statistics

import torch

from vp.cost import measure as M
from vp.cost import measure_comm as C
from vp.cost import measure_passes as P

CROWDING_REPEATS = 2  # alternations of each shape alone (each process in turn) and at once
CROWDING_CYCLES = 2  # timed passes of each kind in one burst
CROWDING_PROCESSES = 8  # at most this many processes at once (a local run has at most 8 ranks)


def processes(cores: int) -> int:
    """How many processes the benchmark runs at once on a machine of `cores` cores."""
    return min(cores, CROWDING_PROCESSES)


def crowding(jobs: dict, dtype: torch.dtype, cores: int, repeats: int = CROWDING_REPEATS,
             cycles: int = CROWDING_CYCLES, timeout_s: float = 600.0) -> float:
    """How much slower the ranks' passes go while every core computes than a pass alone (Hardware.crowding):
    min(cores, CROWDING_PROCESSES) processes of one thread each take the shapes of a round of the passes
    (harness.measure.pass_round) one by one and time each in short bursts (`cycles` passes of each kind): each
    process alone in turn (the others wait asleep), then all at once; `repeats` times, the order reversed every
    other time (a drift of the machine's speed falls on both alike). Per shape and pass: the slowest process's time
    at once (the mean over bursts) over a process's time alone (the mean over every process's bursts); the median
    over shapes and passes. Two things make it more than 1: the cores share the last-level cache and the memory
    bus, and they do not run at one speed, while ranks that meet every microbatch wait for the slowest of them. The
    profile's rows are timed alone; the simulator slows passes by this where the ranks compute together
    (vp.schedule.sharing). On this project's 2-core CPU it came out 1.03-1.14 in sixteen measurements
    (docs/measurements/cost-model-cpu-2026-12-03.md); with bursts of one pass, or without the reversed second time,
    it came out lower and looser (0.97-1.10). 1 on one core or without passes to time."""
    world = processes(cores)
    if world < 2 or not (jobs["layers"] or jobs["output"]):
        return 1.0
    ctx = mp.get_context("forkserver")
    gate, timings = ctx.Barrier(world), ctx.Queue()  # asleep while they wait, unlike a gloo barrier's threads
    return C.in_world(world, _crowding_rank, (jobs, dtype, repeats, cycles, gate, timings, timeout_s), timeout_s,
                      "crowding")


def _crowding_rank(rank: int, world: int, init: str, jobs: dict, dtype: torch.dtype, repeats: int, cycles: int, gate,
                   timings, timeout_s: float, queue):
    torch.set_num_threads(1)
    device, timer = torch.device("cpu"), M.Timer(torch.device("cpu"))
    burst = {"layers": lambda shape: P.layers([shape], device, dtype, timer, cycles=cycles)[0][5:],
             "output": lambda shape: P.output_passes([shape], device, dtype, timer, cycles=cycles)[0][4:]}
    shapes = [(table, shape) for table in ("layers", "output") for shape in sorted(jobs[table])]
    for table, shape in shapes:  # a first burst of each shape at once, untimed: first calls pay for fresh memory
        gate.wait()
        C.or_exit(burst[table], shape)
    timed = {}  # (shape, "alone" or "together") -> this process's bursts, each the passes' seconds
    order = [*range(world), "together"]
    for k in range(repeats):
        for table, shape in shapes:
            for phase in (order if k % 2 == 0 else order[::-1]):
                gate.wait()
                if phase in (rank, "together"):
                    timed.setdefault((shape, "alone" if phase == rank else phase), []).append(
                        C.or_exit(burst[table], shape))
    if rank:
        timings.put(timed)
    else:
        queue.put(gated_slowdown([timed] + [timings.get(timeout=timeout_s) for _ in range(world - 1)]))


def gated_slowdown(every: list[dict]) -> float:
    """The slowest of several processes computing at once over a process alone (crowding): every[p] is process
    p's bursts, {(shape, "alone" or "together"): [[seconds of each pass] per burst]}; per shape and pass, the mean
    over bursts of the slowest process's seconds at once over the mean of all processes' bursts alone, the median
    over shapes and passes (1 with none)."""
    ratios = []
    for (shape, phase), bursts in every[0].items():
        if phase != "together":
            continue
        for i in range(len(bursts[0])):
            at_once = statistics.fmean(max(p[(shape, "together")][b][i] for p in every) for b in range(len(bursts)))
            alone = statistics.fmean(b[i] for p in every for b in p[(shape, "alone")])
            if alone > 0:
                ratios.append(at_once / alone)
    return statistics.median(ratios) if ratios else 1.0
