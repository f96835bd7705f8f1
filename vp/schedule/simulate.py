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
from collections import defaultdict
from dataclasses import dataclass, field
from typing import NamedTuple

from vp.schedule.actions import COLLECTIVES, P2P, Action, Schedule
from vp.schedule.rules import enters, local_needs, members, p2p_peer, root_of, waits_on

class ScheduleError(ValueError):
    """A schedule that cannot run; the message names rank, step and action."""


@dataclass(frozen=True)
class Costs:
    """Durations and memory of actions.

    compute[(kind, stage)] for F/B/W and compute[(kind, None)] for S/T/IF/IB (per rank);
    comm[kind] for the collective instances (C0, C1, C2, IF, IB, and S/T of the naive algorithm),
    comm[("P2P", src, dst)] per transfer between two ranks and 'P2P' for any pair not named;
    memory[(kind, stage)] is what F (or S) holds until its B or W (or T) releases it.
    """
    compute: dict = field(default_factory=dict)
    comm: dict = field(default_factory=dict)
    memory: dict = field(default_factory=dict)

    def time(self, kind: str, stage: int | None) -> float:
        return self.compute.get((kind, stage), self.compute.get((kind, None), 0.0))

    def p2p(self, src: int, dst: int) -> float:
        return self.comm.get(("P2P", src, dst), self.comm.get("P2P", 0.0))

    def mem(self, kind: str, stage: int | None) -> float:
        return self.memory.get((kind, stage), self.memory.get((kind, None), 0.0))


def unit_costs(s: Schedule, passes: dict | None = None, stage_weights: list[float] | None = None,
               comm: dict | None = None) -> Costs:
    """Costs from per-pass costs of one rank's full share of layers; a stage pass costs its share.

    Defaults: F=1, B=2 (B=1 and W=1 where W is split), everything else 0; a stage's weight is its share
    of one rank's layers (1/chunks for an even split), which is also its activation memory.
    """
    p = {"F": 1.0, "B": 1.0 if s.split_w else 2.0, "W": 1.0 if s.split_w else 0.0,
         "S": 0.0, "T": 0.0, "IF": 0.0, "IB": 0.0}
    p.update(passes or {})
    weights = stage_weights or [1.0 / s.chunks] * s.n_stages
    compute = {(k, st): p[k] * weights[st] for k in ("F", "B", "W") for st in range(s.n_stages)}
    compute.update({(k, None): p[k] for k in ("S", "T", "IF", "IB")})
    memory = {("F", st): weights[st] for st in range(s.n_stages)}
    return Costs(compute, dict(comm or {}), memory)


@dataclass
class SimResult:
    makespan: float
    busy: list[float]
    peak_activations: list[float]
    timeline: list[list[tuple[Action, float, float]]]

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


class _Step(NamedTuple):
    """What the simulator needs of one action that depends on the schedule alone (not on costs)."""
    action: Action
    needs: tuple  # keys of `end` this action waits for on its own rank (rules.local_needs)
    entry: object  # the collective instance it enters, or None (rules.enters)
    waits: tuple  # the collective instances it waits on (rules.waits_on)
    stage: int | None  # F, B, W: its stage; sends and receives: the peer
    match: tuple | None  # sends and receives: the key a send and its receive share


def _plan(s: Schedule) -> list[list[_Step]]:
    """Per rank, what each action needs, enters and waits on: once per schedule (a sweep simulates one schedule
    with many costs)."""
    return s.memo("simulator_plan", _make_plan)


def _make_plan(s: Schedule) -> list[list[_Step]]:
    plan = []
    for r, acts in enumerate(s.ranks):
        steps = []
        for a in acts:
            needs = tuple((r, *n) for n in local_needs(s, a))
            if a.kind in P2P:
                peer, match = p2p_peer(s, a)
                steps.append(_Step(a, needs, None, (), peer, match))
            else:
                st = s.stage(r, a.chunk) if a.kind in ("F", "B", "W") else None
                steps.append(_Step(a, needs, enters(s, a), tuple(waits_on(s, a)), st, None))
        plan.append(steps)
    return plan


def simulate(s: Schedule, costs: Costs | None = None, strict: bool = False) -> SimResult:
    """Run the schedule on the execution model above (strict: all of a rank's collectives on one queue)."""
    costs = costs or unit_costs(s)
    pp, ranks = s.pp, s.ranks
    plan = _plan(s)
    idx, clock = [0] * pp, [0.0] * pp
    end: dict[tuple, float] = {}
    entered: dict[tuple, dict[int, float]] = defaultdict(dict)
    posted: dict[tuple, float] = {}
    timeline: list[list] = [[] for _ in range(pp)]
    busy, mem, peak = [0.0] * pp, [0.0] * pp, [0.0] * pp
    changed = [False]  # an entry was recorded without the rank advancing
    lazy: dict = defaultdict(dict)  # strict: ranks waiting to create a group entered at the end of an action
    queue: list[list] = [[] for _ in range(pp)]  # strict: each rank's instances in the order it entered them
    head, free_at = [0] * pp, [0.0] * pp  # strict: first unfinished instance of each queue, and when it freed
    done: dict = {}  # strict: instance -> completion time, the same on every member
    opened: dict = {}  # strict: group -> its first instance (creating the communicator blocks until all arrive)

    def enter(inst, r, t):
        entered[inst][r] = t
        queue[r].append(inst)
        changed[0] = True
        if strict:
            advance()

    def advance():
        """Strict mode: start every instance that heads the queue of each member of its group."""
        moved = True
        while moved:
            moved = False
            for r in range(pp):
                if head[r] == len(queue[r]):
                    continue
                inst = queue[r][head[r]]
                group = members(s, inst.group)
                if all(head[q] < len(queue[q]) and queue[q][head[q]] == inst for q in group):
                    start = max(max(entered[inst][q], free_at[q]) for q in group)
                    done[inst] = start + costs.comm.get(inst.kind, 0.0)
                    for q in group:
                        head[q], free_at[q] = head[q] + 1, done[inst]
                    moved = True

    def completion(inst, r):
        """When rank r has the result of a collective instance, or None while it cannot be known."""
        if strict:
            return done.get(inst)
        got = entered[inst]
        if inst.group in ("C0", "IB"):  # the root sends a copy to each rank
            root = root_of(s, inst.group)
            if root not in got or r not in got:
                return None
            return max(got[root], got[r]) + (0.0 if r == root else costs.comm.get(inst.kind, 0.0))
        if len(got) < pp:
            return None
        return max(got.values()) + costs.comm.get(inst.kind, 0.0)

    def ready_after_local(r, i, a, needs):
        t = clock[r]
        for key in needs:
            if key not in end:
                raise ScheduleError(f"rank {r}, step {i} ({a.text()}): needs "
                                    f"{Action(*key).text()} earlier on rank {r}\n" + s.grid((r, i), 6))
            t = max(t, end[key])
        return t

    def step_p2p(r, i, a, needs, peer, key):
        if a.kind[0] == "S":
            posted[(r, peer, key)] = finish = ready_after_local(r, i, a, needs)
            ready = finish
        else:
            sent = posted.get((peer, r, key))
            if sent is None:  # asked again once the peer moved (most asks of a large schedule are these)
                return False
            ready = ready_after_local(r, i, a, needs)
            finish = max(ready, sent) + costs.p2p(peer, r)
        end[(r, a.kind, a.mb, a.chunk)] = finish
        timeline[r].append((a, ready, finish))
        clock[r], idx[r] = finish, i + 1
        return True

    def step(r):
        i = idx[r]
        a, needs, entry, waits, st, match = plan[r][i]
        if match is not None:
            return step_p2p(r, i, a, needs, st, match)
        ready = ready_after_local(r, i, a, needs)
        if strict and entry and opened.setdefault(entry.group, entry) == entry:
            created = entered[entry] if entry.phase == "start" else lazy[entry]
            if r not in created:
                created[r] = ready
                changed[0] = True
                if entry.phase == "start":
                    enter(entry, r, ready)
            if len(created) < len(members(s, entry.group)):
                return False  # this rank waits in the communicator's creation (untimed: once per run)
        if entry and entry.phase == "start" and r not in entered[entry]:
            enter(entry, r, ready)
        start = ready
        for inst in waits:
            t = completion(inst, r)
            if t is None:
                return False
            start = max(start, t)
        if a.kind in COLLECTIVES:
            end[(r, a.kind, a.mb, a.chunk)] = start
            timeline[r].append((a, start, start))
            clock[r], idx[r] = start, i + 1
            return True
        dur = costs.time(a.kind, st)
        finish = start + dur
        if a.kind in ("F", "S"):
            mem[r] += costs.mem(a.kind, st)
            peak[r] = max(peak[r], mem[r])
        elif a.kind == "W" or (a.kind == "B" and not s.split_w):
            mem[r] -= costs.mem("F", st)
        elif a.kind == "T":
            mem[r] -= costs.mem("S", None)
        if entry and entry.phase == "end":
            enter(entry, r, finish)
        end[(r, a.kind, a.mb, a.chunk)] = finish
        timeline[r].append((a, start, finish))
        busy[r] += dur
        clock[r], idx[r] = finish, i + 1
        return True

    progress = True
    while progress:
        progress = False
        for r in range(pp):
            while idx[r] < len(ranks[r]) and step(r):
                progress = True
            progress = progress or changed[0]
            changed[0] = False
    stuck = [r for r in range(pp) if idx[r] < len(ranks[r])]
    if stuck:
        lines = [f"rank {r} blocked at step {idx[r]} ({ranks[r][idx[r]].text()})" for r in stuck]
        if strict:
            lines += [_queue_head(s, q, queue, head, entered) for q in range(pp) if head[q] < len(queue[q])]
        mode = "deadlock (one ordered queue of collectives per rank)" if strict else "deadlock"
        raise ScheduleError(f"{mode}: " + "; ".join(lines) + "\n" + s.grid((stuck[0], idx[stuck[0]]), 6))
    makespan = max((max(e for _, _, e in tl) for tl in timeline if tl), default=0.0)
    return SimResult(makespan, busy, peak, timeline)


def _queue_head(s: Schedule, r: int, queue, head, entered) -> str:
    """Strict mode: why the collective at the head of rank r's queue cannot start."""
    inst = queue[r][head[r]]
    missing = [q for q in members(s, inst.group) if q not in entered[inst]]
    if missing:
        return f"rank {r}'s queue waits at {inst.text()}, not entered by rank(s) {missing}"
    behind = [f"rank {q} ({queue[q][head[q]].text()} first)" for q in members(s, inst.group)
              if queue[q][head[q]] != inst]
    return f"rank {r}'s queue waits at {inst.text()}, queued behind other collectives on {', '.join(behind)}"
