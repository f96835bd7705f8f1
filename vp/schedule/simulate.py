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
from dataclasses import replace
from operator import itemgetter

from vp.schedule.actions import Action, Schedule
from vp.schedule.costs import Costs, unit_costs
from vp.schedule.program import _MEM_HOLD, _PLAIN, _RECV, _SEND, _SYNC, _program
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


class ScheduleError(ValueError):
    """A schedule that cannot run; the message names rank, step and action."""


class SimResult:
    """makespan, per-rank busy seconds and peak activations, and per rank the (action, start, end) of each of its
    actions in order (timeline). The simulator records each rank's starts and ends as two flat lists of floats
    beside its actions (spans) and makes the timeline's tuples only when it is read."""

    def __init__(self, makespan: float, busy: list[float], peak_activations: list[float],
                 timeline: list[list[tuple[Action, float, float]]] | None = None, spans: list[tuple] | None = None):
        assert (timeline is None) != (spans is None), "a SimResult takes a timeline or spans"
        self.makespan, self.busy, self.peak_activations = makespan, busy, peak_activations
        self._timeline, self._spans = timeline, spans

    @property
    def timeline(self) -> list[list[tuple[Action, float, float]]]:
        if self._timeline is None:
            self._timeline = [list(zip(acts, starts, ends)) for acts, starts, ends in self._spans]
        return self._timeline

    @property
    def spans(self) -> list[tuple[list, list, list]]:
        """Per rank: (its actions, their starts, their ends), three lists in the rank's order."""
        if self._spans is None:
            self._spans = [tuple(list(map(itemgetter(n), tl)) for n in range(3)) for tl in self._timeline]
        return self._spans

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
             durations: list[list[float]] | None = None) -> SimResult:
    """Run the schedule on the execution model above (strict: all of a rank's collectives on one queue).
    durations[r][i]: the seconds of rank r's compute action i in place of the costs' (what processor sharing sets);
    costs with `sharing` are simulated to the fixed point of vp.schedule.sharing.

    Event-driven: each rank runs its actions in order until one must wait (a receive whose send is not posted, a
    collective not complete, a communicator not created); it is then parked on that one event and run again when
    the event happens, so each action is decided once and the cost is linear in the number of actions."""
    costs = costs or unit_costs(s)
    if costs.sharing is not None and durations is None:
        alone = replace(costs, sharing=None)
        return processor_sharing(s, costs, lambda d: simulate(s, alone, strict, d))[0]
    pp, ranks = s.pp, s.ranks
    prog = _program(s)
    steps, instances, members, roots = prog.steps, prog.instances, prog.members, prog.roots
    dur = [costs.time(k, st) for k, st in prog.time_keys]
    memd = [costs.mem(k, st) for k, st in prog.mem_keys]
    p2p = [costs.p2p(src, dst) for src, dst in prog.p2p_keys]
    comm = [costs.comm.get(inst.kind, 0.0) for inst in instances]
    n_inst = len(instances)
    idx, clock = [0] * pp, [0.0] * pp
    ends: list[list[float]] = [[] for _ in range(pp)]  # per rank, the end of each action done, in order
    starts: list[list[float]] = [[] for _ in range(pp)]  # and its start
    busy, mem, peak = [0.0] * pp, [0.0] * pp, [0.0] * pp
    posted: list = [None] * prog.channels  # when each send was posted
    receiver: list = [None] * prog.channels  # the rank parked on a receive of the channel
    entered: list[dict] = [{} for _ in range(n_inst)]  # instance -> {rank: time it entered}
    complete: list = [None] * n_inst  # instance -> when it completes on every rank (all-reduces; strict: all)
    parked: list[list] = [[] for _ in range(n_inst)]  # instance -> ranks waiting for it (or for its creation)
    lazy: dict = {}  # strict: ranks arrived at the creation of a group entered at the end of an action (IF)
    queue: list[list] = [[] for _ in range(pp)]  # strict: each rank's instances in the order it entered them
    head, free_at = [0] * pp, [0.0] * pp  # strict: first unfinished instance of each queue, and when it freed
    at_head = [0] * n_inst  # strict: how many members have the instance at the head of their queue
    opened: dict = {}  # strict: group -> its first instance (creating the communicator blocks until all arrive)
    group_of = [inst.group for inst in instances] if strict else None
    size = [len(group) for group in members]
    work = list(range(pp - 1, -1, -1))  # ranks that may move; popped from the end: rank 0 first

    def wake(inst):
        work.extend(parked[inst])
        parked[inst] = []

    def enter(inst, r, t):
        got = entered[inst]
        got[r] = t
        if strict:
            q = queue[r]
            q.append(inst)
            if head[r] == len(q) - 1:
                at_head[inst] += 1
                if at_head[inst] == size[inst]:
                    launch(inst)
        elif roots[inst] is None:
            if len(got) == pp:
                complete[inst] = max(got.values()) + comm[inst]
                wake(inst)
        elif r == roots[inst]:
            wake(inst)

    def launch(first):
        """Strict mode: start an instance that heads the queue of every member, and every one that then does."""
        ready = [first]
        while ready:
            inst = ready.pop()
            group = members[inst]
            t = max(max(map(entered[inst].__getitem__, group)), max(map(free_at.__getitem__, group)))
            complete[inst] = done = t + comm[inst]
            for q in group:
                h = head[q] = head[q] + 1
                free_at[q] = done
                if h < len(queue[q]):
                    nxt = queue[q][h]
                    at_head[nxt] += 1
                    if at_head[nxt] == size[nxt]:
                        ready.append(nxt)
            wake(inst)

    def created(r, entry, at_end, ready) -> bool:
        """Strict mode: whether the communicator of a group is there when rank r enters its first instance; until
        every member has arrived the rank waits in its creation (untimed: once per run), parked."""
        got = lazy.setdefault(entry, {}) if at_end else entered[entry]
        if r not in got:
            if at_end:
                got[r] = ready
            else:
                enter(entry, r, ready)
            if len(got) == len(members[entry]):
                wake(entry)
        if len(got) < len(members[entry]):
            parked[entry].append(r)
            return False
        return True

    PLAIN, SEND, RECV, SYNC, HOLD = _PLAIN, _SEND, _RECV, _SYNC, _MEM_HOLD
    while work:
        r = work.pop()
        i, prog_r, end_r = idx[r], steps[r], ends[r]
        n, t_clock, t_busy, t_mem, t_peak = len(prog_r), clock[r], busy[r], mem[r], peak[r]
        ended, started = end_r.append, starts[r].append
        own = durations[r] if durations is not None else None
        while i < n:
            code, needs, a, b, c = prog_r[i]
            ready = t_clock
            for j in needs:
                e = end_r[j]
                if e > ready:  # ready = max(ready, e)
                    ready = e
            if code == PLAIN:
                d = dur[a] if own is None else own[i]
                finish = ready + d
                started(ready)
            elif code == SEND:
                posted[a] = ready
                waiting = receiver[a]
                if waiting is not None:
                    receiver[a] = None
                    work.append(waiting)
                started(ready)
                ended(ready)
                t_clock = ready
                i += 1
                continue
            elif code == RECV:
                sent = posted[a]
                if sent is None:
                    receiver[a] = r
                    break
                finish = (sent if sent > ready else ready) + p2p[b]
                started(ready)
                ended(finish)
                t_clock = finish
                i += 1
                continue
            elif code == SYNC:  # enters and/or waits on collective instances
                entry, at_end, waits, is_coll, d = a
                if entry >= 0:
                    if strict:
                        if opened.setdefault(group_of[entry], entry) == entry and \
                                not created(r, entry, at_end, ready):
                            break
                        if not at_end and r not in entered[entry]:
                            enter(entry, r, ready)
                    elif not at_end:  # enter(entry, r, ready), inlined: the default mode's most frequent call
                        got = entered[entry]
                        if r not in got:
                            got[r] = ready
                            root = roots[entry]
                            if root is None:
                                if len(got) == pp:
                                    complete[entry] = max(got.values()) + comm[entry]
                                    work += parked[entry]
                                    parked[entry] = []
                            elif r == root:
                                work += parked[entry]
                                parked[entry] = []
                start = ready
                for inst in waits:
                    root = roots[inst]
                    if strict or root is None:
                        done = complete[inst]
                    else:  # sent from the root: this rank waits for the root alone
                        got = entered[inst]
                        if root in got and r in got:
                            x, y = got[root], got[r]
                            done = (y if y > x else x) + (0.0 if r == root else comm[inst])
                        else:
                            done = None
                    if done is None:
                        parked[inst].append(r)
                        break
                    if done > start:
                        start = done
                else:
                    done = start
                if done is None:
                    break
                if is_coll:  # a collective action: launched, done when its launch is (Costs.compute of its kind)
                    finish = start + (dur[d] if own is None else own[i])  # its CPU time, shared as a pass's
                    started(start)
                    ended(finish)
                    t_clock = finish
                    i += 1
                    continue
                d = dur[d] if own is None else own[i]
                finish = start + d
                if at_end:
                    enter(entry, r, finish)
                started(start)
            else:  # _MISSING
                if a >= 0 and posted[a] is None:  # a receive waits for its send first
                    receiver[a] = r
                    break
                _missing(s, r, i)
            if c:  # memory: F and S hold, B/W and T free
                if c == HOLD:
                    t_mem += memd[b]
                    if t_mem > t_peak:
                        t_peak = t_mem
                else:  # a negative free holds more (B of a recomputed layer makes what its W needs)
                    t_mem -= memd[b]
                    if t_mem > t_peak:
                        t_peak = t_mem
            t_busy += d
            ended(finish)
            t_clock = finish
            i += 1
        idx[r], clock[r], busy[r], mem[r], peak[r] = i, t_clock, t_busy, t_mem, t_peak
    stuck = [r for r in range(pp) if idx[r] < len(ranks[r])]
    if stuck:
        lines = [f"rank {r} blocked at step {idx[r]} ({ranks[r][idx[r]].text()})" for r in stuck]
        if strict:
            lines += [_queue_head(instances, members, q, queue, head, entered) for q in range(pp)
                      if head[q] < len(queue[q])]
        mode = "deadlock (one ordered queue of collectives per rank)" if strict else "deadlock"
        raise ScheduleError(f"{mode}: " + "; ".join(lines) + "\n" + s.grid((stuck[0], idx[stuck[0]]), 6))
    makespan = max((max(e) for e in ends if e), default=0.0)
    return SimResult(makespan, busy, peak, spans=list(zip(ranks, starts, ends)))


def _missing(s: Schedule, r: int, i: int):
    a = s.ranks[r][i]
    done = {(x.kind, x.mb, x.chunk) for x in s.ranks[r][:i]}
    key = next(n for n in local_needs(s, a) if n not in done)
    raise ScheduleError(f"rank {r}, step {i} ({a.text()}): needs {Action(r, *key).text()} earlier on rank {r}\n"
                        + s.grid((r, i), 6))


def _queue_head(instances, members, r: int, queue, head, entered) -> str:
    """Strict mode: why the collective at the head of rank r's queue cannot start."""
    inst = queue[r][head[r]]
    missing = [q for q in members[inst] if q not in entered[inst]]
    if missing:
        return f"rank {r}'s queue waits at {instances[inst].text()}, not entered by rank(s) {missing}"
    behind = [f"rank {q} ({instances[queue[q][head[q]]].text()} first)" for q in members[inst]
              if queue[q][head[q]] != inst]
    return (f"rank {r}'s queue waits at {instances[inst].text()}, queued behind other collectives on "
            f"{', '.join(behind)}")
