"""What makes one search fast without changing its answer: the cost model's figures memoised for the search, and the
CPU seconds of each of its phases.

Memo: most of what the search asks the cost model for a candidate depends on a few of its fields only (the tail
after the flush on its mesh and model, not on how its replica's batch is cut into microbatches; a pass's seconds on
its stage and micro-batch, not on how many replicas run it), and thousands of candidates share those fields. Each
value is computed once per key, the key being *every* field of the RunConfig but the ones the value is declared not
to read (IGNORES): a field added to RunConfig (a new knob of the space) is part of every key until someone shows a
value does not read it, so the memo can be too fine, never wrong. tests/test_plan.py (test_planner_memo_*) checks
every memoised value against the cost model called afresh, for every candidate of whole spaces. The memo is kept on
the search, never at module level: it holds one hardware profile's figures and is dropped with the search.

Built, StageCommunicators: the schedules and the communicators the search has derived, kept for the candidates that
share them (a schedule is the same for every mesh, micro-batch size and knob with its method, pipeline, microbatches
and chunks: the search builds it and the simulator's program of it once, and simulates it once per distinct costs).

Phases: Plan.phases, the search's CPU seconds (time.process_time) split by what it was doing, so a slow search says
where its time went (python -m vp.bench plan prints them).
"""
import time
from collections import Counter, OrderedDict
from dataclasses import fields, replace
from operator import attrgetter

from vp.channels import rank_communicators
from vp.config import RunConfig
from vp.schedule import Schedule, build
from vp.schedule.build import build_unplaced
from vp.schedule.methods import get_method

RUN_FIELDS = tuple(f.name for f in fields(RunConfig))

# value -> the RunConfig fields it does not read (the cost model's functions, vp/cost/; checked by the tests above):
OPTIMIZER = ("zero", "overlap_grad_reduce", "bucket_mb")  # how gradients are reduced and optimizer state is held
IGNORES = {
    # parameters, gradients, optimizer state and communicator buffers per stage: the mesh and the model, not the
    # micro-batch (the schedule's communicators do not depend on its microbatch count: StageCommunicators), nor when
    # gradients are reduced or how activations are split (sequence parallelism shards activations, no parameter)
    "fixed": ("micro_batch_size", "microbatches", "recompute", "overlap_grad_reduce", "bucket_mb",
              "sequence_parallel"),
    # the tail after the flush (without the simulated iteration): the tensor group's and the replicas'
    # once-per-iteration reductions and the optimizer step, over parameters: no activation, no microbatch count
    "tail": ("micro_batch_size", "microbatches", "recompute"),
    # of which what is not the data-parallel reduction (vp.cost.costs.tail_parts: tp tails, the optimizer step,
    # zero's all-gather): whether and in what buckets the reduction overlaps does not enter it
    "tail parts": ("micro_batch_size", "microbatches", "recompute", "overlap_grad_reduce", "bucket_mb"),
    # a pass's own work and what F holds per microbatch: one device of a stage on one microbatch (its shape, the
    # stage's layers, the tensor layout), whatever the number of replicas or microbatches or the optimizer
    "compute": ("dp", "microbatches") + OPTIMIZER,
    "held": ("dp", "microbatches") + OPTIMIZER,
    # the bracket of held activations (vp.plan.bounds.activation_bounds on the skeleton): held and the schedule's
    # shape (its microbatches too)
    "bracket": ("dp",) + OPTIMIZER,
    # pass_times: a pass's own work (compute) and its stage's tensor-parallel collectives, over its mesh's network
    "pass": OPTIMIZER,
    # the makespan's bounds A, B and E from the pass times (those above) and the schedule's shape
    "span": OPTIMIZER,
    # the whole cost model of a visited candidate (vp.cost.pass_costs: communication over its mesh, the CPU's
    # sharing of cores) and the bound from it: the optimizer's knobs act after the flush (tail)
    "full": OPTIMIZER,
    "full span": OPTIMIZER,
}


class Memo:
    """memo(name, fn, run, *args): fn(run, *args), computed once per (name, key of run) for one search (one hardware
    profile, one Problem). args must be determined by the key (the skeleton of run: method, pp, chunks and, unless
    ignored, microbatches). calls and computed count per name, for the benchmark's figures."""

    def __init__(self):
        self.values: dict = {}
        self.skeletons: dict = {}  # (method, pp, microbatches, chunks) -> the schedule's shape without actions
        self.calls, self.computed = Counter(), Counter()
        self._key = {name: attrgetter(*(f for f in RUN_FIELDS if f not in ignore))
                     for name, ignore in IGNORES.items()}

    def __call__(self, name: str, fn, run: RunConfig, *args):
        key = (name, self._key[name](run))
        self.calls[name] += 1
        got = self.values.get(key, self)
        if got is self:
            got = self.values[key] = fn(run, *args)
            self.computed[name] += 1
        return got


class Phases:
    """CPU seconds per phase of one search: `with phases("name"):` adds the block's time.process_time() to
    phases.seconds["name"]; nested blocks count in the innermost only."""

    def __init__(self):
        self.seconds: dict = {}
        self._stack: list = []

    def add(self, name: str, seconds: float) -> None:
        """seconds more of phase name, timed by the caller (a block run a hundred thousand times, where a with
        statement would cost as much as the block)."""
        self.seconds[name] = self.seconds.get(name, 0.0) + seconds

    def __call__(self, name: str) -> "Phases":
        self._stack.append([name, 0.0])
        return self

    def __enter__(self):
        self._stack[-1][1] = time.process_time()
        if len(self._stack) > 1:  # pause the enclosing phase
            outer = self._stack[-2]
            self.seconds[outer[0]] = self.seconds.get(outer[0], 0.0) + self._stack[-1][1] - outer[1]
        return self

    def __exit__(self, *exc):
        name, start = self._stack.pop()
        now = time.process_time()
        self.seconds[name] = self.seconds.get(name, 0.0) + now - start
        if self._stack:  # resume the enclosing phase
            self._stack[-1][1] = now
        return False


class Built:
    """The schedules built for one search, the most recently used kept up to a budget of actions (an action with its
    share of the simulator's program holds about 0.3 kB: a pipeline of 64 ranks and 512 microbatches about 0.11 GiB):
    candidates that differ only in data or tensor parallelism, or in the tensor mode, share their schedule, and are
    visited in the order of their bounds, not together, so a schedule dropped too soon is built again (at 30b on 1024
    GPUs a third of the builds were rebuilds with a third of this budget)."""

    def __init__(self, budget: int = 6_000_000):  # actions: with their programs, under 2 GiB
        self.held: OrderedDict = OrderedDict()  # (method, pp, microbatches, chunks) -> Schedule, least recent first
        self.actions, self.budget = 0, budget

    def __call__(self, run: RunConfig) -> Schedule:
        key = (run.method, run.pp, run.microbatches, run.n_chunks)
        s = self.held.pop(key, None)
        if s is None:
            s = build(*key)
            self.actions += sum(map(len, s.ranks))
        self.held[key] = s
        while self.actions > self.budget and len(self.held) > 1:
            _, old = self.held.popitem(last=False)
            self.actions -= sum(map(len, old.ranks))
        return s


def fewest_microbatches(method: str, pp: int) -> int:
    """The fewest microbatches a schedule of the method can be built with: one, or pp where its family runs a
    multiple of pp (interleaved)."""
    return pp if get_method(method).family.microbatches_multiple_of_pp else 1


class StageCommunicators:
    """The communicators device 0 of each stage holds (vp.channels.rank_communicators, what backend=sim counts), worked
    out once per kind of schedule and mesh for one search:
    - the channels and links a schedule uses depend on its method, pipeline and chunks, not on how many microbatches
      pass: each microbatch runs every pass of every rank (tests/test_plan.py checks one microbatch, pp, 2pp, 3pp),
      so the smallest schedule of a kind answers (fewest_microbatches: one, or pp where the family needs a multiple
      of pp), built below the microbatch count a run needs (vp.config) since only its passes' kinds are read, and
      without timing its vocabulary passes' places (vp.schedule.build.build_unplaced: the same passes on every rank);
    - device 0 of each stage lies in replica 0, whose groups are the same for every dp but the gradient all-reduce's
      over replicas, held once whenever dp > 1: so dp = 2 answers for every dp > 1 (tests/test_plan.py checks it)."""

    def __init__(self):
        self.smallest: dict = {}  # (method, pp, chunks) -> its schedule with fewest_microbatches
        self.held: dict = {}  # the key of of_stages() -> per stage, what its device 0 holds

    def of_stages(self, run: RunConfig) -> tuple:
        key = (run.method, run.pp, run.n_chunks, min(run.dp, 2), run.tp, run.tp_mode, run.tp_depth, run.dtype)
        got = self.held.get(key)
        if got is None:
            kind, m = (run.method, run.pp, run.n_chunks), fewest_microbatches(run.method, run.pp)
            if kind not in self.smallest:
                self.smallest[kind] = build_unplaced(run.method, run.pp, m, run.n_chunks)  # which passes, not when
            small = replace(run, microbatches=m, dp=min(run.dp, 2))
            device0 = [small.mesh.rank(0, p, 0) for p in range(run.pp)]
            held = rank_communicators(small, self.smallest[kind], device0)
            got = self.held[key] = tuple(held[r] for r in device0)
        return got
