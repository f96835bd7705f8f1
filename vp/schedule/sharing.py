"""Compute passes that share a node's cores: processor sharing, found as a fixed point of the one simulator.

A CPU run with more processes than cores (each pass timed alone, vp.cost.measure) does not slow every pass by
processes / cores: a pass slows only while other processes compute beside it. A pass progresses at the rate

    min(1, cores / n(t)) / crowd(n(t)),   n(t) = devices x (pipeline ranks computing at t),

where `devices` is how many devices of the node each simulated pipeline rank stands for (its data-parallel replicas
and tensor-parallel peers run the same passes at the same time), and crowd(n) = 1 + (crowding - 1) (min(n, cores)
- 1) / (cores - 1): cores computing at once take from each other what they share (the last-level cache, the memory
bus) and do not keep one speed, and ranks that meet wait for the slowest, so a pass beside peers goes slower than
alone even with a core of its own; `crowding` is the profile's measured slowdown of the slowest of the cores at work
(Hardware.crowding; 1 where not measured). The simulator runs each rank
ahead until it blocks, not in global time order, so n(t) is not known while it runs. It is found as a fixed point
instead: simulate; for each compute action, take n(t) of the other ranks from that timeline and solve for its end e
with integral over [start, e] of that rate dt = its time alone (the part of it that competes for cores);
simulate again with those durations; repeat until the makespan moves by less than `tolerance` (relative). From
the fourth round on the new durations are averaged with the last ones, which stops two ranks that alternate
between overlapping and not from oscillating. A duration never falls below its time alone, so the makespan never
falls below the uncontended one (the planner's lower bounds stay bounds).

The sharing above is fluid: a rank that stops waiting computes at once at its share. An operating system hands
cores over in time slices: a rank woken by its peer's message waits for a core while the others finish theirs.
Where the profile measured that wait (Hardware.wake_s, CPU profiles), each compute action that follows a wait of
its rank and starts while more devices compute than there are cores takes wake_s longer.
"""
from bisect import bisect_right
from dataclasses import dataclass, field

from vp.schedule.actions import COLLECTIVES, COMPUTE

TOLERANCE = 1e-3  # relative change of the makespan at which the fixed point stops
MAX_ROUNDS = 40
DAMP_FROM = 4  # rounds before this one take the new durations as they are, later ones average with the last


@dataclass(frozen=True)
class Sharing:
    """How the devices of a node share its cores (Costs.sharing; None: every device computes alone).

    cores: the node's compute units; devices: devices of the node each pipeline rank of the schedule stands for;
    cpu[(kind, stage)] (keys as Costs.compute): the seconds of a pass that compete for cores, by default all of it
    (a stage's tensor-parallel collectives wait on other processes and run at their own speed); a collective
    action (C0, C1, C2) competes where cpu names its kind (the CPU time of a collective run off the compute path,
    vp.cost.costs.comm_cpu_times), else it takes no core; wake_s: what a pass pays on top where its rank waited
    for a peer before it and more devices compute than there are cores (Hardware.wake_s: a scheduler hands cores
    over in time slices, not at once as the fluid sharing above); crowding: how much slower a pass runs with every
    core computing than alone (Hardware.crowding)."""
    cores: float
    devices: float = 1.0
    cpu: dict = field(default_factory=dict)
    wake_s: float = 0.0
    crowding: float = 1.0

    def __post_init__(self):
        assert self.cores > 0 and self.devices > 0 and self.crowding >= 1.0, (self.cores, self.devices,
                                                                               self.crowding)

    def rate(self, n: float) -> float:
        """How fast a pass progresses (1: as timed alone) while n devices compute on the node, itself among them:
        its share of the cores, min(1, cores / n), slowed by the company of the other cores at work (shared caches
        and memory, uneven speeds): from 1 with one core at work to `crowding` with all of them, in proportion to
        the cores at work."""
        busy = min(n, self.cores)
        crowd = 1.0 + (self.crowding - 1.0) * (busy - 1.0) / (self.cores - 1.0) if self.cores > 1 and busy > 1 else 1.0
        return min(1.0, self.cores / n) / crowd

    def computes(self, kind: str) -> bool:
        """Whether an action of this kind takes a core: a pass, or a collective action with CPU time."""
        return kind in COMPUTE or (kind in COLLECTIVES and (kind, None) in self.cpu)


def processor_sharing(s, costs, simulate_with, tolerance: float = TOLERANCE, max_rounds: int = MAX_ROUNDS):
    """(SimResult, rounds): the fixed point above. simulate_with(durations) runs the simulator with per-rank,
    per-step durations of the compute actions (None: the costs' own, uncontended)."""
    share = costs.sharing
    result = simulate_with(None)
    alone, cpu = [], []  # per rank, per step: seconds alone, and the part of them that competes for cores
    for r, timeline in enumerate(result.timeline):
        a_r, c_r = [], []
        for a, _, _ in timeline:
            if share.computes(a.kind):
                stage = s.stage(r, a.chunk) if a.kind in ("F", "B", "W") else None
                d = costs.time(a.kind, stage)
                c = share.cpu.get((a.kind, stage), share.cpu.get((a.kind, None), d))
                a_r.append(d)
                c_r.append(min(c, d))
            else:  # a collective action keeps what its costs give it (launching, at once by default), a transfer 0
                a_r.append(costs.time(a.kind, None) if a.kind in COLLECTIVES else 0.0)
                c_r.append(0.0)
        alone.append(a_r)
        cpu.append(c_r)
    durations = alone
    for rounds in range(1, max_rounds + 1):
        new = stretched(result.timeline, alone, cpu, share)
        if rounds >= DAMP_FROM:
            new = [[(x + y) / 2 for x, y in zip(n_r, d_r)] for n_r, d_r in zip(new, durations)]
        durations = new
        last, result = result.makespan, simulate_with(durations)
        if abs(result.makespan - last) <= tolerance * result.makespan:
            return result, rounds
    return result, max_rounds


def stretched(timeline, alone, cpu, share: Sharing) -> list[list[float]]:
    """Per rank, per step: how long each compute action takes from its start in `timeline` when the other ranks
    compute as they do there (processor sharing); the part of it that does not compete for cores is added as is.
    With share.wake_s, an action that follows a wait of its rank and starts in a crowded moment first waits
    wake_s for a core, in which it takes no share of the cores from the others."""
    times, busy, spans = _computing(timeline, share)
    woken = set()
    if share.wake_s:
        for r, tl in enumerate(timeline):
            last_end = 0.0  # the end of the rank's last compute action (the iteration starts at 0)
            for i, (a, t0, t1) in enumerate(tl):
                if share.computes(a.kind) and t1 > t0:
                    if cpu[r][i] > 0 and t0 > last_end * (1 + 1e-12) and _crowded(t0, times, busy, share):
                        woken.add((r, i))  # it waited for a peer; now it waits for a core
                    last_end = t1
        if woken:
            times, busy, spans = _computing(timeline, share, {k: share.wake_s for k in woken})
    out = []
    for r, tl in enumerate(timeline):
        starts, ends = spans[r]
        row = []
        for i, (_, t0, _) in enumerate(tl):
            if cpu[r][i] > 0:
                wait = share.wake_s if (r, i) in woken else 0.0
                row.append(_finish(t0 + wait, cpu[r][i], times, busy, starts, ends, share) - t0 + alone[r][i]
                           - cpu[r][i])
            else:
                row.append(alone[r][i])
        out.append(row)
    return out


def _computing(timeline, share: Sharing, waits: dict | None = None) -> tuple[list, list, list]:
    """(times, busy, spans): busy[j] the ranks computing in [times[j], times[j + 1]); per rank the starts and ends of
    its compute actions (disjoint, in order), each begun after its wait for a core where `waits` has one."""
    deltas: dict = {}
    spans, waits = [], waits or {}
    for r, tl in enumerate(timeline):
        starts, ends = [], []
        for i, (a, t0, t1) in enumerate(tl):
            if share.computes(a.kind) and t1 > t0:
                t0 = min(t1, t0 + waits.get((r, i), 0.0))
                starts.append(t0)
                ends.append(t1)
                deltas[t0] = deltas.get(t0, 0) + 1
                deltas[t1] = deltas.get(t1, 0) - 1
        spans.append((starts, ends))
    times = sorted(deltas)
    busy, n = [], 0
    for t in times:
        n += deltas[t]
        busy.append(n)
    return times, busy, spans


def _crowded(t: float, times: list, busy: list, share: Sharing) -> bool:
    """Whether more devices compute at t (the segment holding t, this rank's own action among them) than the
    node has cores."""
    j = bisect_right(times, t) - 1
    return j >= 0 and share.devices * busy[j] > share.cores


def _finish(t: float, work: float, times: list, busy: list, starts: list, ends: list, share: Sharing) -> float:
    """The end e of `work` seconds of computing from t: integral over [t, e] of share.rate(n) = work, where n
    counts this rank and the others computing (busy, less this rank's own spans)."""
    j = bisect_right(times, t) - 1  # segment of the step function holding t (-1: before any)
    q = bisect_right(starts, t) - 1  # this rank's last span starting at or before t
    inf = float("inf")
    while True:
        total = busy[j] if j >= 0 else 0
        inside = q >= 0 and t < ends[q]
        others = total - 1 if inside else total
        rate = share.rate(share.devices * (1 + others))
        nxt = times[j + 1] if j + 1 < len(times) else inf
        own_edge = ends[q] if inside else (starts[q + 1] if q + 1 < len(starts) else inf)
        edge = min(nxt, own_edge)
        if edge == inf or rate * (edge - t) >= work:
            return t + work / rate
        work -= rate * (edge - t)
        t = edge
        if t >= nxt:
            j += 1
        if not inside and q + 1 < len(starts) and t >= starts[q + 1]:
            q += 1  # this rank's next span begins (leaving a span needs no step: `inside` compares with its end)
