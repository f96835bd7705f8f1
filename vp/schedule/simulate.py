"""The one simulator: per-rank start and end of every action, makespan, bubble rate and peak activations.

Execution model (the same one the runtime follows):
- each rank runs its actions in order, one at a time;
- a compute action starts when the previous action on its rank is done, its same-rank inputs are done
  (rules.local_needs) and the collectives it waits on are complete (rules.waits_on);
- a send (SF, SB) is posted without blocking; a receive (RF, RB) blocks until the matching send has
  been posted, plus the transfer time (the runtime keeps each direction of traffic on its own process
  group, so sends and receives on one link are always in the same order on both sides);
- a collective instance completes when every rank has entered it, plus its communication time, except
  that a receiver of C0 or IB (copies sent from one root) waits for the root alone; entering never
  blocks (collectives are launched asynchronously, each group on its own process group).

strict=True is the least NCCL guarantees: communicators that cannot progress concurrently (one connection,
CUDA_DEVICE_MAX_CONNECTIONS=1, too few free SMs, a device sync) and that are created lazily. Every rank runs all
its collectives, of every group, on one ordered queue: an instance starts when every member of its group has
entered it and has finished everything queued before it on that rank (rooted ones too: a broadcast's kernel runs
on every member), and completes its communication time later, on every member at once. And the first instance
of each group blocks the rank that enters it until every member has entered it (communicator creation; a
deadlock check only, untimed, since communicators outlive the first iteration). Two ranks that enter two
collectives in opposite orders deadlock here; validate() also checks that order statically. Sends and receives
keep their own channels, as in the default mode.
"""
import functools
import gc
import math
from dataclasses import replace
from itertools import chain
from operator import itemgetter

import numpy as np

from vp.schedule.actions import Action, Schedule
from vp.schedule.costs import Costs, unit_costs
from vp.schedule import kernel
from vp.schedule.critical import critical_path
from vp.schedule.program import _program
from vp.schedule.rules import local_needs
from vp.schedule.sharing import processor_sharing

def collector_paused(fn):
    """Run fn with Python's cyclic garbage collector paused: building, validating and simulating a schedule allocate
    millions of small tuples that form no cycles, and each collection walks every live one, so with the collector on
    the cost grows faster than the schedule."""
    @functools.wraps(fn)
    def run(*args, **kwargs):
        if not gc.isenabled():
            return fn(*args, **kwargs)
        gc.disable()
        try:
            return fn(*args, **kwargs)
        finally:
            gc.enable()
    return run


_NONE = np.zeros(0)  # no durations of the caller's: the costs'


class ScheduleError(ValueError):
    """A schedule that cannot run; the message names rank, step and action."""


class SimResult:
    """makespan, per-rank busy seconds and peak activations, and per rank the (action, start, end) of each of its
    actions in order (timeline). The simulator leaves every step's start and end in two flat arrays (flat: the
    ranks' actions, each rank's first step, starts, ends), split into per-rank lists (spans) when they are read
    and into the timeline's tuples when it is read."""

    def __init__(self, makespan: float, busy: list[float], peak_activations: list[float],
                 timeline: list[list[tuple[Action, float, float]]] | None = None, spans: list[tuple] | None = None,
                 flat: tuple | None = None):
        assert (timeline is not None) + (spans is not None) + (flat is not None) == 1, \
            "a SimResult takes a timeline, spans or flat arrays"
        self.makespan, self.busy, self.peak_activations = makespan, busy, peak_activations
        self.path = None  # simulate(..., path=True): the critical path (vp.schedule.critical)
        self._timeline, self._spans, self._flat = timeline, spans, flat

    @property
    def timeline(self) -> list[list[tuple[Action, float, float]]]:
        if self._timeline is None:
            self._timeline = [list(zip(acts, starts, ends)) for acts, starts, ends in self.spans]
        return self._timeline

    @property
    def spans(self) -> list[tuple[list, list, list]]:
        """Per rank: (its actions, their starts, their ends), three lists in the rank's order."""
        if self._spans is None and self._flat is not None:
            self._spans = [(acts, starts.tolist(), ends.tolist()) for acts, starts, ends in self.rank_spans()]
        elif self._spans is None:
            self._spans = [tuple(list(map(itemgetter(n), tl)) for n in range(3)) for tl in self._timeline]
        return self._spans

    def rank_spans(self):
        """Per rank: (its actions, their starts, their ends), the last two numpy views of the flat arrays where the
        simulator left them (nothing converted: for a reader of a few steps per rank), else spans' lists."""
        if self._flat is None:
            return self.spans
        ranks, off, starts, ends = self._flat
        return [(acts, starts[a:b], ends[a:b]) for acts, a, b in zip(ranks, off.tolist(), off[1:].tolist())]

    @property
    def bubble_rate(self) -> float:
        total = len(self.busy) * self.makespan
        return 1.0 - sum(self.busy) / total if total else 0.0

    @property
    def bubble_fraction(self) -> list[float]:
        """Per rank: the fraction of the makespan the rank is not computing."""
        return [1.0 - b / self.makespan if self.makespan else 0.0 for b in self.busy]

    def summary(self) -> dict:
        return {"makespan": self.makespan, "bubble_rate": self.bubble_rate, "busy": self.busy,
                "bubble_fraction": self.bubble_fraction, "peak_activations": self.peak_activations}


@collector_paused
def simulate(s: Schedule, costs: Costs | None = None, strict: bool = False,
             durations: list[list[float]] | None = None, path: bool = False) -> SimResult:
    """Run the schedule on the execution model above (strict: all of a rank's collectives on one queue).
    durations[r][i]: the seconds of rank r's compute action i in place of the costs' (what processor sharing sets);
    costs with `sharing` are simulated to the fixed point of vp.schedule.sharing. path: the result's `path` is the
    iteration's critical path (vp.schedule.critical; None in strict mode or with processor sharing, where it bounds
    nothing).

    Event-driven: each rank runs its actions in order until one must wait (a receive whose send is not posted, a
    collective not complete, a communicator not created); it is then parked on that one event and run again when
    the event happens, so each action is decided once and the cost is linear in the number of actions. The loop is
    vp/schedule/kernel.py, compiled."""
    costs = costs or unit_costs(s)
    if costs.sharing is not None and durations is None:
        alone = replace(costs, sharing=None)
        return processor_sharing(s, costs, lambda d: simulate(s, alone, strict, d))[0]
    pp, ranks = s.pp, s.ranks
    prog = _program(s)
    dur = np.array([costs.time(k, st) for k, st in prog.time_keys], np.float64)
    memd = np.array([costs.mem(k, st) for k, st in prog.mem_keys], np.float64)
    p2p = np.array([costs.p2p(src, dst) for src, dst in prog.p2p_keys], np.float64)
    comm = np.array([costs.comm.get(kind, 0.0) for kind in prog.inst_kinds], np.float64)[prog.inst_kind]
    own = _NONE if durations is None else np.fromiter(chain.from_iterable(durations), np.float64, len(prog.rec))
    status, r, i, idx, busy, peak, starts, ends, entered, queue, qstart, qlen, head = kernel.jit(
        kernel.run, len(prog.rec))(
        prog.off, prog.rec, prog.needs, prog.sync, prog.waits, dur, memd, p2p, comm, prog.roots_at, prog.group,
        prog.gstart, prog.gmembers, prog.channels, strict, own)
    if status == kernel.MISSING_INPUT:
        _missing(s, int(r), int(i))
    assert status != kernel.OVERFLOW, "the simulator's work stack overflowed"
    if status == kernel.STOPPED:
        idx = (idx - prog.off[:pp]).tolist()
        stuck = [r for r in range(pp) if idx[r] < len(ranks[r])]
        lines = [f"rank {r} blocked at step {idx[r]} ({ranks[r][idx[r]].text()})" for r in stuck]
        if strict:
            queues = [queue[qstart[q]:qstart[q] + qlen[q]].tolist() for q in range(pp)]
            lines += [_queue_head(prog.instances, prog.members, q, queues, head, entered) for q in range(pp)
                      if head[q] < len(queues[q])]
        mode = "deadlock (one ordered queue of collectives per rank)" if strict else "deadlock"
        raise ScheduleError(f"{mode}: " + "; ".join(lines) + "\n" + s.grid((stuck[0], idx[stuck[0]]), 6))
    makespan = float(ends.max()) if len(ends) else 0.0
    result = SimResult(makespan, busy.tolist(), peak.tolist(), flat=(ranks, prog.off, starts, ends))
    if path and not strict and durations is None:
        result.path = critical_path(prog, starts, ends, entered, comm)
    return result


def _missing(s: Schedule, r: int, i: int):
    a = s.ranks[r][i]
    done = {(x.kind, x.mb, x.chunk) for x in s.ranks[r][:i]}
    key = next(n for n in local_needs(s, a) if n not in done)
    raise ScheduleError(f"rank {r}, step {i} ({a.text()}): needs {Action(r, *key).text()} earlier on rank {r}\n"
                        + s.grid((r, i), 6))


def _queue_head(instances, members, r: int, queue, head, entered) -> str:
    """Strict mode: why the collective at the head of rank r's queue cannot start (entered[inst, q]: NaN where rank q
    has not entered the instance)."""
    inst = queue[r][head[r]]
    missing = [q for q in members[inst] if math.isnan(entered[inst, q])]
    if missing:
        return f"rank {r}'s queue waits at {instances[inst].text()}, not entered by rank(s) {missing}"
    behind = [f"rank {q} ({instances[queue[q][head[q]]].text()} first)" for q in members[inst]
              if queue[q][head[q]] != inst]
    return (f"rank {r}'s queue waits at {instances[inst].text()}, queued behind other collectives on "
            f"{', '.join(behind)}")
