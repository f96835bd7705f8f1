"""The planner's search space: every run of one model on `gpus` devices with one global batch, as RunConfigs.

Axes (each fixable to one value through Problem.fixed, keyed by its RunConfig field):
  method             every row of vp.schedule.methods.METHODS (or Problem.methods)
  dp, pp, tp         every factorization gpus = dp x pp x tp
  tp_mode, tp_depth  1d (tp = t), 2d (tp = q^2, q >= 2), 2.5d (tp = q^2 d, q >= 2, d >= 2); a tensor-parallel group
                     stays inside one node (tp <= the profile's gpus_per_node) unless Problem.tp_in_node is False
  micro_batch_size   every divisor of the sequences of one replica (global_batch / dp); microbatches = the rest
  chunks             interleaved families: every c >= 2 with layers divisible by pp x c
  redis_last_layers  redis: 0 .. layers // pp layers left on the last stage (vp.config.redis_layers places them)
  knobs              the production features (KNOBS): zero {0, 1} and overlap_grad_reduce where dp > 1, recompute
                     {none, selective, full}, sequence_parallel where 1-D tp > 1 (once RunConfig has the field)
The vocabulary is padded by vp.config's rule (a multiple of the vocabulary shards, or the given pad_multiple).
A candidate that cannot run is a Rejection with the reason it failed and the checks' own message (the fix).
"""
import itertools
import math
import re
from dataclasses import dataclass, field, fields
from typing import Iterator, NamedTuple

from vp.checks import MAX_SCHEDULE_SIZE, MAX_TOKENS_PER_MICROBATCH, check_schedule_size, check_size
from vp.config import RECOMPUTE, ZERO_STAGES, RunConfig, check_config, check_knobs
from vp.schedule.methods import METHODS, get_method

# The production features as axes: RunConfig field -> (its values, the first being "off"; where it applies). Where a
# knob does not apply it stays off (vp.config refuses it there). A knob whose RunConfig field does not exist yet is
# left out, so adding one is one line here (and its memory and time in vp.cost).
_ALL_KNOBS = {
    "zero": (tuple(ZERO_STAGES), lambda r: r.dp > 1),
    "overlap_grad_reduce": ((False, True), lambda r: r.dp > 1),
    "recompute": (tuple(RECOMPUTE), lambda r: True),
    "sequence_parallel": ((False, True), lambda r: r.tp > 1 and r.tp_mode == "1d"),
}
KNOBS = {k: v for k, v in _ALL_KNOBS.items() if k in {f.name for f in fields(RunConfig)}}
AXES = ("method", "dp", "pp", "tp", "tp_mode", "tp_depth", "micro_batch_size", "microbatches", "chunks",
        "redis_last_layers", *KNOBS)


@dataclass(frozen=True)
class Problem:
    base: RunConfig  # the model, vocabulary, sequence, dtype and every field that is not searched
    gpus: int
    global_batch: int  # sequences per iteration, over all replicas
    fixed: dict = field(default_factory=dict)  # axis -> the one value it may take
    methods: tuple[str, ...] = tuple(METHODS)
    gpus_per_node: int = 8
    tp_in_node: bool = True
    tokens_per_microbatch: int = MAX_TOKENS_PER_MICROBATCH  # the sweep's limits, so every plan row is runnable
    schedule_size: int = MAX_SCHEDULE_SIZE
    # fraction of the device's capacity kept free for the allocator's fragmentation and what the model does not see
    memory_margin: float = 0.05

    def __post_init__(self):
        for name in ("gpus", "global_batch"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"plan.{name}={value!r} must be a positive integer")
        m = self.memory_margin
        if isinstance(m, bool) or not isinstance(m, (int, float)) or not 0 <= m < 1:
            raise ValueError(f"plan.memory_margin={m!r} must be a fraction in [0, 1): the share of the device's "
                             f"memory a plan leaves free (0.05 keeps 5 %)")
        unknown = sorted(set(self.fixed) - set(AXES))
        if unknown:
            raise ValueError(f"cannot fix {unknown}: the planner's axes are {', '.join(AXES)}")
        for name in self.methods:
            get_method(name)

    def budget(self, capacity: float) -> float:
        """Bytes a plan may use on a device of `capacity` bytes: the capacity less the margin."""
        return capacity * (1.0 - self.memory_margin)


class Rejection(NamedTuple):
    run: RunConfig | None
    reason: str  # a short class of the failure, counted per class
    message: str  # the check's own message: what is wrong and how to fix it
    excess: float = 0.0  # memory: bytes above the device's (to name the closest-to-fitting)


def divisors(n: int) -> list[int]:
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return sorted(set(small + [n // d for d in small]))


def tensor_layouts(p: Problem) -> Iterator[tuple[int, str, int]]:
    """(tp, tp_mode, tp_depth) of every tensor-parallel group the search considers."""
    for tp in divisors(p.gpus):
        if p.tp_in_node and tp > p.gpus_per_node:
            continue
        yield tp, "1d", 1
        for d in divisors(tp):
            q = math.isqrt(tp // d)
            if q >= 2 and q * q * d == tp:
                yield (tp, "2d", 1) if d == 1 else (tp, "2.5d", d)


def _choices(p: Problem, axis: str, values):
    return [p.fixed[axis]] if axis in p.fixed else list(values)


def candidates(p: Problem) -> Iterator[RunConfig | Rejection]:
    """Every point of the space, in a fixed order: a RunConfig that passed vp.config's checks and the sweep's
    limits, or a Rejection."""
    b = p.base
    layouts = [x for x in tensor_layouts(p)
               if all(p.fixed.get(k, v) == v for k, v in zip(("tp", "tp_mode", "tp_depth"), x))]
    if {"tp", "tp_mode", "tp_depth"} & set(p.fixed) and not layouts:  # a fixed layout the search does not list
        layouts = [(p.fixed.get("tp", 1), p.fixed.get("tp_mode", "1d"), p.fixed.get("tp_depth", 1))]
    methods, values = _choices(p, "method", p.methods), {name: getattr(b, name) for name in RUN_FIELDS}
    for tp, mode, depth in layouts:
        if p.gpus % tp:
            yield Rejection(None, "tp does not divide gpus", f"tp={tp} does not divide plan.gpus={p.gpus}")
            continue
        for pp in _choices(p, "pp", divisors(p.gpus // tp)):
            if (p.gpus // tp) % pp:
                yield Rejection(None, "pp does not divide gpus / tp", f"pp={pp} does not divide "
                                f"plan.gpus / tp = {p.gpus // tp}")
                continue
            dp = p.gpus // (tp * pp)
            if "dp" in p.fixed and p.fixed["dp"] != dp:
                continue
            if p.global_batch % dp:
                yield Rejection(None, "global batch not divisible by dp",
                                f"plan.global_batch={p.global_batch} does not split over dp={dp} replicas "
                                f"(dp = gpus / (pp x tp) = {p.gpus} / ({pp} x {tp})); use a multiple of {dp}")
                continue
            per_replica = p.global_batch // dp
            for mbs in _choices(p, "micro_batch_size", divisors(per_replica)):
                if per_replica % mbs:
                    continue
                m = per_replica // mbs
                if "microbatches" in p.fixed and p.fixed["microbatches"] != m:
                    continue
                for method in methods:
                    for extra in _method_axes(p, method, pp):
                        conf = {**values, "method": method, "dp": dp, "pp": pp, "tp": tp, "tp_mode": mode,
                                "tp_depth": depth, "micro_batch_size": mbs, "microbatches": m, **extra}
                        base = make(conf)
                        verdict = _verdict(p, base)
                        for knobs in knob_settings(p, base):
                            yield check(p, make({**conf, **knobs}), verdict)


RUN_FIELDS = tuple(f.name for f in fields(RunConfig))
# RunConfig's __init__ assigns its fields and nothing else (a frozen dataclass: no __post_init__, every field an init
# field), so a candidate is its fields' values set on a new instance, without the 30 object.__setattr__ calls of
# dataclasses.replace (a third of the space's time; tests/test_planner_speed.py compares with replace)
_FIELD_SET = frozenset(RUN_FIELDS)
_PLAIN = not hasattr(RunConfig, "__post_init__") and all(f.init for f in fields(RunConfig))


def make(values: dict) -> RunConfig:
    """RunConfig(**values) for values that name every field (a RunConfig's fields with some changed: the space's
    candidates), without __init__'s assignments where RunConfig's __init__ does nothing else (_PLAIN)."""
    if not _PLAIN or values.keys() != _FIELD_SET:  # RunConfig's own errors for a missing or unknown field
        return RunConfig(**values)
    run = object.__new__(RunConfig)
    run.__dict__.update(values)
    return run


def knob_settings(p: Problem, run: RunConfig) -> list[dict]:
    """Every setting of the knobs (KNOBS) for one configuration: a knob that applies takes each of its values (or
    the one fixed), one that does not stays off (or takes the fixed value, which vp.config then refuses)."""
    axes = []
    for name, (values, applies) in KNOBS.items():
        axes.append(_choices(p, name, values if applies(run) else values[:1]))
    return [dict(zip(KNOBS, combo)) for combo in itertools.product(*axes)]


def knob_key(run: RunConfig) -> tuple:
    """The run's knob values, in KNOBS order: what tells a configuration's knob variants apart."""
    return tuple(getattr(run, k) for k in KNOBS)


def configuration(run: RunConfig) -> RunConfig:
    """The run with every knob off: what its knob variants share (one row of the top-k among them)."""
    return run.with_(**{k: values[0] for k, (values, _) in KNOBS.items()})


def _method_axes(p: Problem, method: str, pp: int) -> list[dict]:
    spec, layers = get_method(method), p.base.layers
    if spec.family.chunks == 0:
        per_rank = layers // pp if layers % pp == 0 else 0
        found = [c for c in divisors(per_rank) if c >= 2] if per_rank else []
        return [{"chunks": c, "redis_last_layers": None} for c in _choices(p, "chunks", found or [2])]
    if spec.redistributes_layers:
        top = max(0, min(layers // pp, layers - (pp - 1)))
        return [{"chunks": None, "redis_last_layers": n} for n in _choices(p, "redis_last_layers", range(top + 1))]
    return [{"chunks": None, "redis_last_layers": None}]


# what a check's message starts with -> the reason it is counted under
REASONS = [
    (r"^layers=", "layers not divisible over the stages (pp x chunks)"),
    (r"^microbatches=\d+ is fewer than pp", "microbatches < pp"),
    (r"^microbatches=\d+: .*multiple of pp", "microbatches not a multiple of pp (interleaved)"),
    (r"^(hidden|heads|ffn_hidden)=\d+ is not divisible by", "heads, hidden or ffn not divisible over tp"),
    (r"^micro_batch_size=\d+ is not divisible by d\*q", "micro_batch_size not divisible over the grid's token "
                                                          "blocks"),
    (r"^pp=1: ", "a pipeline method needs pp >= 2"),
    (r"^(vocab_size|pad_multiple)=", "vocabulary does not split over its shards"),
    (r"^redis_last_layers=", "redis: too many layers on the last stage"),
    (r"^seq_len=\d+ x micro_batch_size", "tokens per microbatch above limits.tokens_per_microbatch"),
    (r"^pp=\d+ x microbatches=", "schedule above limits.schedule_size"),
    (r"^chunks=", "chunks do not fit the method"),
    (r"^zero=\d+ shards", "zero without data parallelism (dp = 1)"),
    (r"^overlap_grad_reduce overlaps", "overlap_grad_reduce without data parallelism (dp = 1)"),
    (r"^sequence_parallel", "sequence_parallel without 1-D tensor parallelism"),
]


def reason_of(message: str) -> str:
    for pattern, reason in REASONS:
        if re.search(pattern, message):
            return reason
    head = re.match(r"^([\w.]+)=", message)
    return f"{head.group(1)} refused" if head else "refused"


def _verdict(p: Problem, run: RunConfig) -> RunConfig | Rejection | None:
    """check(p, run), where the run's knobs pass their own checks: what its knob variants that pass theirs share."""
    try:
        check_knobs(run)
    except ValueError:
        return None
    return check(p, run)


def check(p: Problem, run: RunConfig, verdict: RunConfig | Rejection | None = None) -> RunConfig | Rejection:
    """The checks a sweep makes before it submits a job (vp.config.check_config and the sweep's limits). verdict:
    those checks' answer for the run with other knobs that passed their own checks (vp.config.check_knobs, all that
    read them): where the run's knobs pass them too, the answer is the same, and only they are made."""
    if verdict is not None:
        try:
            check_knobs(run)
        except ValueError:
            pass  # every check, so that the first to fail names the run's fault
        else:
            return run if isinstance(verdict, RunConfig) else verdict._replace(run=run)
    try:
        check_config(run)
        check_size(run, p.tokens_per_microbatch, "raise plan.tokens_per_microbatch (limits.tokens_per_microbatch)")
        check_schedule_size(run.pp, run.microbatches, run.n_chunks, p.schedule_size,
                            "raise plan.schedule_size (limits.schedule_size)")
    except ValueError as err:
        return Rejection(run, reason_of(str(err)), str(err))
    return run
