"""The seconds every pass takes on a hardware profile: its work (vp.cost.work: GEMM shapes, attention, elementwise
bytes, operations) timed by the GEMM model or the profile's tables (vp.cost.gemm), times the factors a measured
profile timed passes with (vp.cost.factors), plus a stage's tensor-parallel collectives (vp.cost.tensor). What
repeats over a search's candidates (a stage's figures per layer shape and role) is worked out once per profile
(vp.cost.profiles.cost_table).
"""
from dataclasses import dataclass, field

from vp.config import RunConfig
from vp.cost.gemm import elementwise_time, gemm_time
from vp.cost.network import Network
from vp.cost.profiles import Hardware, cost_table
from vp.cost.tensor import pass_comm_s, per_microbatch_shape, placements
from vp.cost.tables import tp_layer_key, tp_vocab_key
# LAYER_KERNELS, OUTPUT_GEMMS, pass_work: the work's names, which callers import from here too
from vp.cost.work import LAYER_KERNELS, OUTPUT_GEMMS, Shapes, Work, pass_work, stage_parts, vocab_parts  # noqa: F401
from vp.schedule import Schedule


# pass kinds without the per-pass fixed part (pass_overhead_s): W exchanges nothing with other ranks and enters no
# autograd graph (docs/cost-model.md, "What a pass costs beyond its work")
UNSYNCHRONISED = ("W",)


@dataclass(frozen=True)
class Seconds:
    """A pass's modelled time split the way calibration fits it: per eff_kind the GEMM and attention seconds at
    multiplier 1, the elementwise seconds, the operations' fixed costs (kernel_s each), and how many per-pass parts
    (pass_overhead_s) it pays: 1, or 0 for a W pass (UNSYNCHRONISED)."""
    compute: dict = field(default_factory=dict)
    memory: float = 0.0
    fixed: float = 0.0
    passes: float = 1.0

    def work(self, hw: Hardware) -> float:
        """Seconds of the pass's operations: everything but the per-pass part."""
        return self.fixed + self.memory + sum(s / hw.eff(k) for k, s in self.compute.items())

    def total(self, hw: Hardware) -> float:
        return hw.pass_overhead_s * self.passes + self.work(hw)


def _each(fn, calls: tuple) -> list:
    """[fn(*call) for call in calls], fn called once per distinct call: a stage's work repeats its layer's calls once
    per layer (Work.times), so the list is read from the few distinct ones, in the same order (the same sums)."""
    got = {call: fn(*call) for call in set(calls)}
    return list(map(got.__getitem__, calls))


def attention_time(hw: Hardware, work: Work) -> float:
    """Fused attention: the profile's measured table where it holds every call's shape, else FLOPs at
    attention_efficiency."""
    measured = _each(hw.tables.attention_s, work.attention) if hw.tables.attention else [None]
    if work.attention and all(t is not None for t in measured):
        return sum(measured)
    return work.attention_flops / (hw.peak_flops * hw.attention_efficiency)


def activation_time(hw: Hardware, work: Work) -> float:
    """Seconds the GeLU calls take beyond their bytes in work.mem: the profile's measured activation table less
    those bytes at the elementwise rate, where the table holds every call (on a CPU, erf computes well below the
    bandwidth); 0 elsewhere (the bytes alone, as on a GPU)."""
    if not work.activation or not len(hw.tables.activation):
        return 0.0
    measured = _each(hw.tables.activation_s, tuple((elements, back) for elements, back, _, _ in work.activation))
    if any(t is None for t in measured):
        return 0.0
    return sum(measured) - sum(_each(lambda nbytes, size: elementwise_time(hw, nbytes, size),
                                     tuple((nbytes, size) for _, _, nbytes, size in work.activation)))


def work_seconds(hw: Hardware, parts: dict) -> Seconds:
    compute, memory, fixed, seconds = {}, 0.0, 0.0, {}
    for eff_kind, work in parts.items():
        # a stage repeats its layers' GEMM objects (Work.times): each timed once, found again by its identity
        shapes = {id(g): g for g in work.gemms}
        for key, g in shapes.items():
            if g not in seconds:
                seconds[g] = gemm_time(hw, g)
            shapes[key] = seconds[g]
        gemm = sum(map(shapes.__getitem__, map(id, work.gemms)))
        compute[eff_kind] = compute.get(eff_kind, 0.0) + gemm + attention_time(hw, work)
        memory += sum(elementwise_time(hw, moved, size, fresh) for size, moved, fresh in work.mem)
        if work.activation:
            memory += activation_time(hw, work)
        fixed += work.kernels * hw.kernel_s
    return Seconds(compute, memory, fixed, per_pass(parts))


def per_pass(parts: dict) -> float:
    """How many per-pass parts a pass of these parts pays: none for a W pass (only a W pass holds a W part)."""
    return 0.0 if any(k in UNSYNCHRONISED for k in parts) else 1.0


def compute_times(cfg: RunConfig, hw: Hardware, sched: Schedule) -> dict:
    """Seconds of every pass's own work on one device computing alone: {(kind, stage or None): seconds}: each part
    composed from its operations (work_seconds), times the profile's factor for its kind where the profile timed
    passes as the runtime runs them (pass_factors; every run and mesh alike, so plans compare on one footing).
    A stage's seconds of each kind are worked out once per profile for all that stage_parts and _timed read of that
    kind (the layer shape and the factors' keys; the schedule's W for B and W, recomputation for B alone: the tables'
    keys; the stage's layers, and where the stage holds a vocabulary layer (a first or last stage of a schedule
    whose vocabulary is not parallel) which ones, the output rows of one device and the factors' vocabulary key:
    the role; stage_parts reads the schedule's vocabulary nowhere else), so a pipeline of many stages, and the
    search's thousands of meshes, methods and knobs over one layer shape, look them up
    (vp.cost.profiles.cost_table)."""
    from vp.cost.factors import pass_factors  # which composes passes with this module's functions

    factors = pass_factors(hw)
    tp = tp_key(cfg) if factors else None
    vocab = tp_vocab_key(cfg) if tp else None
    sh, split_w, recompute, vocab_parallel = Shapes.of(cfg, hw), sched.split_w, cfg.recompute, sched.vocab_parallel
    v, last = sh.split.vocab_rows(cfg.padded_vocab_size), sched.n_stages - 1  # the output rows of one device
    base = ("compute_times", sh, tp)
    tables = (cost_table(hw, base + ("F",)), cost_table(hw, base + ("B", split_w, recompute)),
              cost_table(hw, base + ("W", split_w)))
    out, roles = {}, {}
    for st, layers in enumerate(cfg.stage_layers):
        holds = not vocab_parallel and (st == 0 or st == last)  # a vocabulary layer: which, its rows, its factors
        role = (layers, st == 0, st == last, v, vocab) if holds else (layers,)
        got = roles.get(role)
        if got is None:
            got = []
            for kind, table in zip("FBW", tables):
                seconds = table.get(role)
                if seconds is None:
                    first, final, rows = role[1:4] if holds else (False, False, None)
                    seconds = table[role] = _timed(
                        hw, stage_parts(sh, kind, layers, first, final, split_w, vocab_parallel, recompute, rows),
                        factors, True, split_w, tp, vocab)
                got.append(seconds)
            roles[role] = got
        out[("F", st)], out[("B", st)], out[("W", st)] = got
    if sched.vocab_parallel:
        rows, algorithm = sh.split.vocab_rows(cfg.padded_vocab_size, cfg.pp), sched.vocab
        key = ("vocab", rows, algorithm.s_gemms, algorithm.t_gemms)
        table = tables[0]  # the vocabulary passes read neither the W split nor recomputation
        got = table.get(key)
        if got is None:
            got = table[key] = tuple((kind, _timed(hw, parts, factors, False, split_w, tp, vocab))
                                     for kind, parts in vocab_parts(sh, rows, *key[2:]).items())
        out.update(got)
    return out


def _timed(hw: Hardware, parts: dict, factors: dict, stage: bool, split_w: bool, tp: tuple | None,
           vocab: tuple | None) -> float:
    """Seconds of one pass of these parts (a stage's, or a vocabulary pass's): composed, times the factors."""
    if not parts:
        return 0.0
    if not factors:
        return work_seconds(hw, parts).total(hw)
    return hw.pass_overhead_s * per_pass(parts) + sum(
        work_seconds(hw, {k: w}).work(hw) * _factor(factors, k, stage, split_w, tp, vocab) for k, w in parts.items())


def tp_key(cfg: RunConfig) -> tuple | None:
    """(tensor mode, tp, depth) of a run with tensor parallelism, as pass_factors keys its factors (the head of
    vp.cost.tables.tp_layer_key); None without."""
    return tp_layer_key(cfg)[:3] if cfg.tp > 1 else None


def layer_pass(kind: str, split_w: bool) -> str:
    """The layers row's pass that prices a schedule's pass kind: B of a schedule without W is the whole backward."""
    return "BW" if kind == "B" and not split_w else kind


def _factor(factors: dict, eff_kind: str, stage: bool, split_w: bool, tp: tuple | None = None,
            vocab: tuple | None = None) -> float:
    if eff_kind in ("F", "B", "W") and stage:  # a stage's layers
        kind = layer_pass(eff_kind, split_w)
        return factors.get(("tp", *tp, kind), factors.get(kind, 1.0)) if tp else factors.get(kind, 1.0)
    if vocab and stage and ("tp", *vocab, eff_kind) in factors:  # a tp stage's vocabulary layers
        return factors[("tp", *vocab, eff_kind)]  # as timed at this very shape (tp_vocab)
    if eff_kind in ("S", "T"):  # pooled over the algorithms (one or two rows each are noise apart)
        return factors.get(eff_kind, 1.0)
    return 1.0


def pass_times(cfg: RunConfig, hw: Hardware, sched: Schedule, compute: dict | None = None) -> dict:
    """Seconds of every pass: {(kind, stage or None): seconds}, its own work (compute_times, or `compute` if given)
    and a stage's tensor-parallel collectives (vp.cost.tensor.pass_comm_s: serial, less what a grid's prefetching
    SUMMA loop hides behind its GEMMs). Devices that share cores (a CPU run with more ranks than cores) are slowed
    where the simulator finds them computing at once (Costs.sharing, vp.cost.costs.sharing), not here."""
    out = dict(compute_times(cfg, hw, sched) if compute is None else compute)
    if cfg.tp > 1:
        from vp.cost.factors import pass_factors

        net, sh, factors, tp = Network.of(hw, cfg.world), Shapes.of(cfg, hw), pass_factors(hw), tp_key(cfg)
        split_w, vocab_parallel = sched.split_w, sched.vocab_parallel
        measured = {k: factors[key] for k in ("F", "B", "W")
                    if (key := ("tpcomm", *tp, layer_pass(k, split_w))) in factors}
        # the rest of a stage's collectives, as its vocabulary layers were timed (vocabulary parallelism runs other
        # code: its stages keep only the final LayerNorm's)
        rest = {} if vocab_parallel else {k: factors[("tpvocab", *tp, k)] for k in ("F", "B")
                                          if ("tpvocab", *tp, k) in factors}
        # a stage's collectives read the tensor-parallel shape, the stage's layers and place, the schedule's W and
        # vocabulary, the network (the profile, the ranks at work on a node) and, of the stage's tp groups, their
        # sizes and nodes (vp.cost.tensor.placement): once per profile for all of them (cost_table)
        table = cost_table(hw, ("pass_times", per_microbatch_shape(cfg), sh, split_w, vocab_parallel, net.busy))
        last, places, ranks = sched.n_stages - 1, placements(cfg.mesh, net.gpus_per_node), sched.stage_ranks
        for st, layers in enumerate(cfg.stage_layers):
            rank = ranks[st]
            role = (layers, st == 0, st == last, places[rank])
            got = table.get(role)
            if got is None:
                gemm = layer_gemm_s(hw, sh, split_w, layers)
                got = table[role] = tuple((kind, s) for kind, s in
                                          pass_comm_s(cfg, net, sched, st, gemm, measured, rest).items() if s)
            for kind, s in got:
                out[(kind, st)] += s
    return out


def layer_gemm_s(hw: Hardware, sh: "Shapes", split_w: bool, layers: int = 1) -> dict[str, float]:
    """{F, B, W: seconds} of `layers` layers' GEMMs per pass on a device (W's in B, at B's speed, where the schedule
    does not split the weight gradient): what a grid's SUMMA loop can hide its collectives behind."""
    gemm = {k: layers * sum(gemm_time(hw, g) for g in sh.layer(k).gemms) / hw.eff(k) for k in ("F", "B", "W")}
    if not split_w:
        gemm["B"] += gemm["W"] * hw.eff("W") / hw.eff("B")
        gemm["W"] = 0.0
    return gemm
