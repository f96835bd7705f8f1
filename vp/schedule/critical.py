"""A simulated iteration's critical path: the chain of steps, each waiting on the one before it, whose durations sum
to the makespan. The planner bounds every other candidate of the same schedule by it (vp.plan.search).

Why it bounds. The simulator (kernel.run, default mode) decides each step's start as a maximum of sums: the rank's
clock (its previous step's end), the ends of its same-rank inputs, a matching send's post time (a receive then
ends its transfer later), a collective's completion (every member's entry plus its communication time; for a
rooted one, the root's and the rank's own entry). Which steps wait on which is the schedule's program
(program.py), the same for every costs. So the makespan is the longest path of one graph whose weights are the
costs, and any path of that graph sums, under any costs, to at most the makespan under those costs. The critical
path of one simulation, kept as counts of what it crosses (each pass kind and stage, each transfer's link, each
collective kind), is such a path: under the simulated costs it sums to the makespan (tests/test_critical.py checks
it, every method), under another candidate's costs to a lower bound on that candidate's makespan.

It does not bound where the durations are not the costs' alone: processor sharing (CPU runs: sharing) lengthens a
step by what runs beside it, and strict mode orders collectives by time; simulate() then leaves the path out.
"""
import math
from typing import NamedTuple

import numpy as np

from vp.schedule.kernel import PLAIN, RECV, SEND, SYNC, jit, kernel

_END, _READY = 0, 1  # walking back: why the step ended when it did (its duration), why it could start (its inputs)


class CriticalPath(NamedTuple):
    """What a critical path crosses, as counts: passes ((kind, stage), n), as Costs.time reads them, transfers
    ((src, dst), n), as Costs.p2p, collectives (kind, n), their communication time (Costs.comm)."""
    time: tuple
    p2p: tuple
    comm: tuple

    def seconds(self, costs) -> float:
        """The path's length under costs: at most the makespan of any simulation of its schedule with them (without
        processor sharing); under the simulated costs, the makespan (to rounding)."""
        t, p, c = costs.time, costs.p2p, costs.comm.get
        return (sum([n * t(kind, st) for (kind, st), n in self.time]) + sum([n * p(a, b) for (a, b), n in self.p2p])
                + sum([n * c(kind, 0.0) for kind, n in self.comm]))


def critical_path(prog, starts, ends, entered, comm) -> CriticalPath | None:
    """The critical path of one simulation of prog (program._Program) from kernel.run's starts, ends and entered
    (instance x rank) and the per-instance communication seconds it ran with; None where the walk does not close
    (a program that did not run to its end)."""
    if not len(ends):
        return CriticalPath((), (), ())
    ok, ct, cp, cc = jit(walk, len(prog.rec))(
        prog.off, prog.rec, prog.needs, prog.sync, prog.waits, prog.roots_at, prog.inst_kind,
        len(prog.inst_kinds), prog.entry_start, prog.entry_step, prog.entry_inst, len(prog.time_keys),
        len(prog.p2p_keys), starts, ends, entered, comm)
    if not ok:
        return None
    return CriticalPath(*(tuple((key, n) for key, n in zip(keys, counts.tolist()) if n)
                          for keys, counts in ((prog.time_keys, ct), (prog.p2p_keys, cp), (prog.inst_kinds, cc))))


@kernel
def _ready(g, r, off, rec, needs, ends):
    """(when step g of rank r could start by its rank and inputs: kernel.run's ready_at, the step that decides it or
    -1)."""
    at, by = 0.0, -1
    if g > off[r]:
        at, by = ends[g - 1], g - 1
    for k in range(rec[g, 4], rec[g, 5]):
        e = ends[off[r] + needs[k]]
        if e > at:
            at, by = e, off[r] + needs[k]
    return at, by


@kernel
def walk(off, rec, needs, sync, waits, roots, inst_kind, n_kinds, entry_start, entry_step, entry_inst, n_time,
         n_p2p, starts, ends, entered, comm):
    """(ok, counts per time key, per p2p key, per collective kind) of the path that ends at the last step to end,
    walked back: a step's end is its start plus its duration (a receive's: the later of its readiness and its send,
    plus the transfer); its start is the latest of what kernel.run took it from."""
    pp = off.shape[0] - 1
    n = rec.shape[0]
    n_inst = roots.shape[0]
    ct, cp, cc = np.zeros(n_time, np.int64), np.zeros(n_p2p, np.int64), np.zeros(n_kinds, np.int64)
    rank_of = np.zeros(n, np.int64)
    send_of = np.full(n + 1, -1, np.int64)  # channel -> its send step
    for r in range(pp):
        for g in range(off[r], off[r + 1]):
            rank_of[g] = r
            if rec[g, 0] == SEND:
                send_of[rec[g, 1]] = g
    entry_of = np.full((n_inst, pp), -1, np.int64)  # (instance, rank) -> the step that enters it
    for r in range(pp):
        for k in range(entry_start[r], entry_start[r + 1]):
            entry_of[entry_inst[k], r] = off[r] + entry_step[k]
    g = 0
    for h in range(n):
        if ends[h] > ends[g]:
            g = h
    state = _END
    for _ in range(4 * n + 4):  # every move goes to a step that ends or is ready no later: no step twice per state
        r = rank_of[g]
        code = rec[g, 0]
        if state == _READY:
            at, by = _ready(g, r, off, rec, needs, ends)
            if by < 0:
                return True, ct, cp, cc
            g, state = by, _END
            continue
        state = _READY
        if code == PLAIN:
            ct[rec[g, 1]] += 1
        elif code == RECV:
            cp[rec[g, 2]] += 1
            send = send_of[rec[g, 1]]
            if send < 0:
                return False, ct, cp, cc
            at, by = _ready(g, r, off, rec, needs, ends)
            if starts[send] > at:  # the send was posted after the receive was ready: the path crosses the link
                g = send
        elif code == SYNC:
            a = rec[g, 1]
            ct[sync[a, 3]] += 1
            at, by = _ready(g, r, off, rec, needs, ends)
            if starts[g] > at:  # it waited on a collective: to the entry that completed it
                q, e = -1, -1
                for k in range(sync[a, 4], sync[a, 5]):
                    inst = waits[k]
                    root = roots[inst]
                    if root < 0:  # every member's entry, plus the communication
                        t_max, q_max = -math.inf, -1
                        for x in range(pp):
                            if not math.isnan(entered[inst, x]) and entered[inst, x] > t_max:
                                t_max, q_max = entered[inst, x], x
                        if t_max + comm[inst] == starts[g]:
                            q, e = q_max, inst
                            cc[inst_kind[inst]] += 1
                            break
                    else:  # the root's entry and the rank's own, plus the communication where the rank is not it
                        x, y = entered[inst, root], entered[inst, r]
                        done = (y if y > x else x) + (0.0 if r == root else comm[inst])
                        if done == starts[g]:
                            q, e = (root if x >= y else r), inst
                            if r != root:
                                cc[inst_kind[inst]] += 1
                            break
                if q < 0 or entry_of[e, q] < 0:
                    return False, ct, cp, cc
                g = entry_of[e, q]
                if sync[rec[g, 1], 1]:  # entered at its end: the entering step's duration is on the path
                    state = _END
        elif code != SEND:
            return False, ct, cp, cc
    return False, ct, cp, cc
