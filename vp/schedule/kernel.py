"""The simulator's loop, compiled: vp/schedule/simulate.py's execution model over the program's flat arrays
(vp/schedule/program.py). jit() compiles it with numba (a dependency of the project, imported on first use;
compiled once and cached on disk beside this file) for programs of COMPILE_FROM steps or more, and from then on in
that process for every program; smaller ones in a process that has not met a larger one, and every one where numba
is not installed (a bare GPU node's python), run the same functions as Python: the same figures, without numba's
import and cache loads (a fraction of a CPU second) in a small run's processes, at several microseconds a step.

Event-driven: each rank runs its steps in order until one must wait (a receive whose send is not posted, a
collective not complete, a communicator not created); it is then parked on that one event (a linked list per
instance, in the order parked) and pushed back on the work stack when the event happens, so each step is decided
once. Every float is computed by the same operations in the same order as the interpreted simulator it replaced
(tests/fixtures/simulator_reference.json holds its figures to the bit).

Arrays (all int64 but the costs): off[r]..off[r + 1] are rank r's steps in rec; rec[g] = (code, a, b, c, n0, n1),
program._Program's step codes, needs[n0:n1] the rank-local steps whose ends step g waits for; a _SYNC step's a is
its row of sync = (instance entered or -1, entered at the end, a collective action, time index, w0, w1),
waits[w0:w1] the instances it waits on. Instances: roots (-1: none), group (an index into gstart/gmembers, the
ranks of each group). own: per step, durations in place of dur's (processor sharing), or empty.
"""
import math
import sys
import types

import numpy as np

COMPILE_FROM = 5000  # steps (or actions, for the program's loop): from here on the compiled functions run
_jitted: dict = {}


def kernel(fn):
    """Mark fn as one of its module's compiled functions (jit() compiles every one the module marks)."""
    fn.__kernel__ = True
    return fn


def jit(fn, size: int):
    """fn compiled by numba where size >= COMPILE_FROM (or fn was compiled before in this process) and numba is
    installed, else fn. Every function marked @kernel in fn's module is compiled as a clone whose globals hold the
    compiled clones, so fn's calls among them stay compiled while the module's own functions stay Python; the ones
    fn calls are inlined into it (a call that passes arrays counts their references, atomically, which cost more
    than the loop's own work)."""
    got = _jitted.get(fn)  # compiled already in this process: for every size
    if got is None and size < COMPILE_FROM:
        return fn
    if got is None:
        try:
            from numba import njit
        except ImportError:
            got = _jitted[fn] = fn
            return got
        module = sys.modules[fn.__module__].__dict__
        ns = dict(module)
        for name, f in module.items():
            if getattr(f, "__kernel__", False) and f.__module__ == fn.__module__:
                clone = types.FunctionType(f.__code__, ns, f.__name__, f.__defaults__, f.__closure__)
                clone.__qualname__, clone.__module__ = f.__qualname__, f.__module__
                inline = "never" if f is fn else "always"
                try:
                    ns[name] = njit(cache=True, inline=inline)(clone)
                except RuntimeError:  # no writable place for the cache (numba names none): compiled per process
                    ns[name] = njit(inline=inline)(clone)
        got = _jitted[fn] = ns[fn.__name__]
    return got


PLAIN, SEND, RECV, SYNC, MISSING = range(5)  # a step's code (program._Program): what the loop does with it
NONE, HOLD, FREE = range(3)  # a step's memory: F, S hold their activations (peak counted); B, W, T free them
OK, STOPPED, MISSING_INPUT, OVERFLOW = range(4)  # status: all ran; some rank blocked; a step's input comes later


@kernel
def _wake(inst, head, tail, nxt, work, n_work):
    """Push the ranks parked on inst on the work stack, in the order they parked."""
    r = head[inst]
    while r >= 0:
        work[n_work] = r
        n_work += 1
        following = nxt[r]
        nxt[r] = -1
        r = following
    head[inst] = -1
    tail[inst] = -1
    return n_work


@kernel
def _park(inst, r, head, tail, nxt):
    nxt[r] = -1
    if tail[inst] < 0:
        head[inst] = r
    else:
        nxt[tail[inst]] = r
    tail[inst] = r


@kernel
def _launch(first, st, comm, group, gstart, gmembers, size, complete, park, work, n_work, ready):
    """Strict mode: start an instance that heads the queue of every member, and every one that then does."""
    entered, queue, qstart, qlen, head, free_at, at_head = st
    ready[0] = first
    n_ready = 1
    while n_ready:
        n_ready -= 1
        inst = ready[n_ready]
        g = group[inst]
        t_in, t_free = -math.inf, -math.inf
        for k in range(gstart[g], gstart[g + 1]):
            q = gmembers[k]
            if entered[inst, q] > t_in:
                t_in = entered[inst, q]
            if free_at[q] > t_free:
                t_free = free_at[q]
        done = (t_in if t_in >= t_free else t_free) + comm[inst]
        complete[inst] = done
        for k in range(gstart[g], gstart[g + 1]):
            q = gmembers[k]
            head[q] += 1
            free_at[q] = done
            if head[q] < qlen[q]:
                following = queue[qstart[q] + head[q]]
                at_head[following] += 1
                if at_head[following] == size[following]:
                    ready[n_ready] = following
                    n_ready += 1
        n_work = _wake(inst, park[0], park[1], park[2], work, n_work)
    return n_work


@kernel
def _enter(inst, r, t, strict, pp, st, n_in, t_max, roots, comm, group, gstart, gmembers, size, complete, park,
           work, n_work, ready):
    """Rank r enters instance inst at t; an all-reduce completes when every rank has entered (strict: when it heads
    every member's queue), a rooted one wakes its receivers when the root enters."""
    entered = st[0]
    entered[inst, r] = t
    n_in[inst] += 1
    if t > t_max[inst]:
        t_max[inst] = t
    if strict:
        queue, qstart, qlen, head, at_head = st[1], st[2], st[3], st[4], st[6]
        queue[qstart[r] + qlen[r]] = inst
        qlen[r] += 1
        if head[r] == qlen[r] - 1:
            at_head[inst] += 1
            if at_head[inst] == size[inst]:
                n_work = _launch(inst, st, comm, group, gstart, gmembers, size, complete, park, work, n_work, ready)
    elif roots[inst] < 0:
        if n_in[inst] == pp:
            complete[inst] = t_max[inst] + comm[inst]
            n_work = _wake(inst, park[0], park[1], park[2], work, n_work)
    elif r == roots[inst]:
        n_work = _wake(inst, park[0], park[1], park[2], work, n_work)
    return n_work


@kernel
def run(off, rec, needs, sync, waits, dur, memd, p2p, comm, roots, group, gstart, gmembers, channels, strict, own):
    """(status, rank, step, idx, busy, peak, starts, ends, entered, queue, qstart, qlen, head): the simulation of
    the module docstring; status MISSING_INPUT names the rank and its step whose input comes later on it; STOPPED
    leaves idx[r] < off[r + 1] on each blocked rank (and strict mode's queues, for the message)."""
    pp = off.shape[0] - 1
    n_inst = roots.shape[0]
    n = rec.shape[0]
    has_own = own.shape[0] == n and n > 0
    size = np.empty(n_inst, np.int64)
    for inst in range(n_inst):
        size[inst] = gstart[group[inst] + 1] - gstart[group[inst]]
    idx = off[:pp].copy()
    clock, busy, mem, peak = np.zeros(pp), np.zeros(pp), np.zeros(pp), np.zeros(pp)
    starts, ends = np.zeros(n), np.zeros(n)
    posted = np.full(channels, np.nan)  # when each send was posted
    receiver = np.full(channels, -1, np.int64)  # the rank parked on a receive of the channel
    entered = np.full((n_inst, pp), np.nan)  # when each rank entered each instance
    n_in, t_max = np.zeros(n_inst, np.int64), np.full(n_inst, -math.inf)
    complete = np.full(n_inst, np.nan)  # when an instance completes on every rank (all-reduces; strict: all)
    park = (np.full(n_inst, -1, np.int64), np.full(n_inst, -1, np.int64), np.full(pp, -1, np.int64))
    # strict: each rank's instances in the order it entered them, its first unfinished one, when it freed; how many
    # members have an instance at the head of their queue; each group's first instance (creating the communicator
    # blocks until all arrive) and the ranks arrived at the creation of a group entered at the end of an action
    qstart = np.zeros(pp + 1, np.int64)
    if strict:
        for r in range(pp):
            qstart[r + 1] = qstart[r]
            for g in range(off[r], off[r + 1]):
                if rec[g, 0] == SYNC and sync[rec[g, 1], 0] >= 0:
                    qstart[r + 1] += 1
    st = (entered, np.zeros(qstart[pp], np.int64), qstart, np.zeros(pp, np.int64), np.zeros(pp, np.int64),
          np.zeros(pp), np.zeros(n_inst, np.int64))
    queue, qlen, head = st[1], st[3], st[4]
    opened = np.full(gstart.shape[0], -1, np.int64)
    lazy = np.zeros((n_inst if strict else 0, pp), np.bool_)
    n_lazy = np.zeros(n_inst, np.int64)
    ready = np.zeros(n_inst + 1, np.int64)
    work = np.zeros(pp + 1, np.int64)
    for r in range(pp):  # popped from the end: rank 0 first
        work[r] = pp - 1 - r
    n_work = pp
    while n_work:
        if n_work > pp:  # a rank waits in one place at a time: never
            return OVERFLOW, -1, -1, idx, busy, peak, starts, ends, entered, queue, qstart, qlen, head
        n_work -= 1
        r = work[n_work]
        g, last, base = idx[r], off[r + 1], off[r]
        t_clock, t_busy, t_mem, t_peak = clock[r], busy[r], mem[r], peak[r]
        while g < last:
            code, a, b, c = rec[g, 0], rec[g, 1], rec[g, 2], rec[g, 3]
            ready_at = t_clock
            for k in range(rec[g, 4], rec[g, 5]):
                e = ends[base + needs[k]]
                if e > ready_at:
                    ready_at = e
            if code == PLAIN:
                d = own[g] if has_own else dur[a]
                finish = ready_at + d
                starts[g] = ready_at
            elif code == SEND:
                posted[a] = ready_at
                waiting = receiver[a]
                if waiting >= 0:
                    receiver[a] = -1
                    work[n_work] = waiting
                    n_work += 1
                starts[g] = ready_at
                ends[g] = ready_at
                t_clock = ready_at
                g += 1
                continue
            elif code == RECV:
                sent = posted[a]
                if math.isnan(sent):
                    receiver[a] = r
                    break
                finish = (sent if sent > ready_at else ready_at) + p2p[b]
                starts[g] = ready_at
                ends[g] = finish
                t_clock = finish
                g += 1
                continue
            elif code == SYNC:  # enters and/or waits on collective instances
                entry, at_end, is_coll, d_at = sync[a, 0], sync[a, 1], sync[a, 2], sync[a, 3]
                if entry >= 0:
                    if strict:
                        if opened[group[entry]] < 0:
                            opened[group[entry]] = entry
                        if opened[group[entry]] == entry:  # the communicator is created: every member arrives
                            if at_end:
                                if not lazy[entry, r]:
                                    lazy[entry, r] = True
                                    n_lazy[entry] += 1
                                    if n_lazy[entry] == size[entry]:
                                        n_work = _wake(entry, park[0], park[1], park[2], work, n_work)
                                arrived = n_lazy[entry]
                            else:
                                if math.isnan(entered[entry, r]):
                                    n_work = _enter(entry, r, ready_at, strict, pp, st, n_in, t_max, roots, comm,
                                                    group, gstart, gmembers, size, complete, park, work, n_work,
                                                    ready)
                                    if n_in[entry] == size[entry]:
                                        n_work = _wake(entry, park[0], park[1], park[2], work, n_work)
                                arrived = n_in[entry]
                            if arrived < size[entry]:
                                _park(entry, r, park[0], park[1], park[2])
                                break
                    if not at_end and math.isnan(entered[entry, r]):
                        n_work = _enter(entry, r, ready_at, strict, pp, st, n_in, t_max, roots, comm, group, gstart,
                                        gmembers, size, complete, park, work, n_work, ready)
                start = ready_at
                parked = False
                for k in range(sync[a, 4], sync[a, 5]):
                    inst = waits[k]
                    root = roots[inst]
                    if strict or root < 0:
                        done = complete[inst]
                    else:  # sent from the root: this rank waits for the root alone
                        x, y = entered[inst, root], entered[inst, r]
                        if math.isnan(x) or math.isnan(y):
                            done = math.nan
                        else:
                            done = (y if y > x else x) + (0.0 if r == root else comm[inst])
                    if math.isnan(done):
                        _park(inst, r, park[0], park[1], park[2])
                        parked = True
                        break
                    if done > start:
                        start = done
                if parked:
                    break
                d = own[g] if has_own else dur[d_at]
                finish = start + d
                starts[g] = start
                if is_coll:  # a collective action: launched, done when its launch is (Costs.compute of its kind)
                    ends[g] = finish
                    t_clock = finish
                    g += 1
                    continue
                if at_end:
                    n_work = _enter(entry, r, finish, strict, pp, st, n_in, t_max, roots, comm, group, gstart,
                                    gmembers, size, complete, park, work, n_work, ready)
            else:  # MISSING
                if a >= 0 and math.isnan(posted[a]):  # a receive waits for its send first
                    receiver[a] = r
                    break
                idx[r] = g
                return MISSING_INPUT, r, g - base, idx, busy, peak, starts, ends, entered, queue, qstart, qlen, head
            if c:  # memory: F and S hold, B/W and T free (a negative free holds more)
                if c == HOLD:
                    t_mem += memd[b]
                else:
                    t_mem -= memd[b]
                if t_mem > t_peak:
                    t_peak = t_mem
            t_busy += d
            ends[g] = finish
            t_clock = finish
            g += 1
        idx[r], clock[r], busy[r], mem[r], peak[r] = g, t_clock, t_busy, t_mem, t_peak
    status = OK
    for r in range(pp):
        if idx[r] < off[r + 1]:
            status = STOPPED
    return status, -1, -1, idx, busy, peak, starts, ends, entered, queue, qstart, qlen, head
