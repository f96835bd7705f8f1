"""Tensor parallelism in the cost model: one device's share of a stage's work under each mode (vp.tp.modes), and
what the tensor-parallel layers send, from vp.tp.traffic's closed form (the one source, which `vp.bench tp`
checks against measured counts), placed on the mesh's groups and timed on the two-level network.

Compute, per device of a stage's tp group (tp = 1 is 1-D with t = 1: the whole stage):
  1-D   Megatron: qkv and fc1 column-parallel (N/t), proj and fc2 row-parallel (K/t), every device on all n
        tokens; attention on heads/t; elementwise work as the activations split (Korthikanti et al. 2022,
        without sequence parallelism: 24 s b h of 34 divide by t, the 10 s b h of LayerNorms, residuals and
        dropout masks do not; with it (Split.sequence_parallel) all 34 do)
  grid  SUMMA on [q, q, d]: per linear q steps of one GEMM on m = n/(dq) tokens x K/q x N/q blocks
        (F: m x N/q x K/q; B: m x K/q x N/q; W: K/q x N/q x m); attention on heads/q of n/(dq) tokens;
        elementwise work on the device's 1/tp share
Communication: layer_collectives and stage_collectives of vp.tp.traffic, each tagged with the pass that issues
it; a pass takes its compute plus their seconds (1-D's all-reduces block the next GEMM), less what a grid's
SUMMA loop hides: the runtime prefetches step t+1's blocks during step t's GEMM (pass_comm_s).
Collectives issued once per iteration (the depth and batch all-reduces) run after the flush, like dp's.
"""
from dataclasses import dataclass, replace
from functools import lru_cache

from vp.config import RunConfig
from vp.cost.gemm import Gemm
from vp.cost.network import OPS, Network, group_index, span
from vp.cost.profiles import Hardware, cost_table
from vp.mesh import Mesh
from vp.schedule import Schedule
from vp.tp.modes import TensorMode, get_mode
from vp.tp.traffic import GRAD_ITEMSIZE, ITERATION, LOGGED, Collective, Shape, layer_collectives, stage_collectives

SUMMA_OPS = ("broadcast", "reduce")  # a grid linear's per-step collectives (vp/tp/summa.py)
COLUMN_PARALLEL = (True, False, True, False)  # qkv, proj, fc1, fc2 in 1-D: column-, row-, column-, row-parallel
# a layer's saved activations, s b h bytes at 2 bytes per element (Korthikanti et al. 2022, flash attention):
# 1-D without sequence parallelism divides SPLIT_SBH by t and keeps REPLICATED_SBH on every device
SPLIT_SBH, REPLICATED_SBH = 24, 10


@dataclass(frozen=True)
class Split:
    """How a stage's work divides over its tensor-parallel group: one device's share."""
    mode: TensorMode
    tp: int
    depth: int
    sequence_parallel: bool = False  # 1-D: the activations outside the tp regions split along the sequence

    @classmethod
    def of(cls, cfg: RunConfig) -> "Split":
        return _split(cfg.tp_mode, cfg.tp, cfg.tp_depth, cfg.sequence_parallel)

    @property
    def sequence_shards(self) -> int:
        """How many ways a stage's activation is split along the sequence (sequence parallel: t, else 1)."""
        return self.tp if self.sequence_parallel else 1

    @property
    def q(self) -> int:
        """Grid side; 1-D: the number of devices (which split heads, ffn and the vocabulary)."""
        return self.mode.side(self.tp, self.depth)

    @property
    def blocks(self) -> int:
        """Token blocks of a micro-batch (d q on a grid, 1 in 1-D)."""
        return self.mode.batch_blocks(self.tp, self.depth)

    def hidden_share(self, hidden: int) -> int:
        """The hidden columns one device holds of an activation passed between stages (grid: h/q)."""
        return hidden // self.q if self.mode.grid else hidden

    def linear_gemms(self, kind: str, tokens: int, linears: list[tuple[int, int]], a: int) -> tuple[Gemm, ...]:
        """One device's GEMMs of the linears (K, N) in pass kind F (Y = X W), B (grad X) or W (grad W)."""
        out = []
        for (k_in, n_out), column in zip(linears, COLUMN_PARALLEL):
            if self.mode.grid:
                m, k_in, n_out, steps = tokens // self.blocks, k_in // self.q, n_out // self.q, self.q
            else:
                m, steps = tokens, 1
                k_in, n_out = (k_in, n_out // self.tp) if column else (k_in // self.tp, n_out)
            gemm = {"F": Gemm(m, n_out, k_in, in_bytes=a, out_bytes=a), "B": Gemm(m, k_in, n_out, in_bytes=a, out_bytes=a),
                    "W": Gemm(k_in, n_out, m, in_bytes=a, out_bytes=4, accumulate=True)}[kind]
            out += [gemm] * steps
        return tuple(out)

    def layer_share(self) -> float:
        """One device's share of a layer's attention FLOPs (heads/t, or heads/q of n/(dq) tokens)."""
        return 1.0 / self.tp

    def activation_share(self) -> float:
        """One device's share of a layer's saved activations and elementwise traffic (sequence parallel: the
        10 s b h of LayerNorms, residuals and linear inputs split t ways too, Korthikanti's 34 s b h / t)."""
        if self.mode.grid or self.sequence_parallel:
            return 1.0 / self.tp
        return (REPLICATED_SBH + SPLIT_SBH / self.tp) / (REPLICATED_SBH + SPLIT_SBH)

    def vocab_rows(self, padded_vocab: int, shards: int = 1) -> int:
        """Rows of the output layer one device holds: the vocabulary over `shards` pipeline ranks x its columns."""
        return padded_vocab // (shards * self.q)


@lru_cache(maxsize=1024)
def _split(tp_mode: str, tp: int, tp_depth: int, sequence_parallel: bool) -> Split:
    """Split.of from the fields it reads (the mesh's depth: the mode's of tp_depth): the cost model asks for it per
    stage and per pass of every candidate; a frozen value, shared."""
    mode = get_mode(tp_mode)
    return Split(mode, tp, mode.depth(tp_depth), sequence_parallel)


ONE_DEVICE = Split(get_mode("1d"), 1, 1)  # tp = 1: the whole stage on one device


def tp_shape(cfg: RunConfig, microbatches: int | None = None) -> Shape:
    """The run's tensor-parallel shape; microbatches: another count in its place (per_microbatch_shape)."""
    return Shape(get_mode(cfg.tp_mode), cfg.tp, cfg.tp_depth, cfg.hidden, cfg.ffn, cfg.seq_len, cfg.micro_batch_size,
                 cfg.microbatches if microbatches is None else microbatches, cfg.padded_vocab_size,
                 4 if cfg.dtype == "fp32" else 2, cfg.sequence_parallel)


def per_microbatch_shape(cfg: RunConfig) -> Shape:
    """tp_shape as the key of a table of figures per microbatch (pass_comm_s): the microbatch count only multiplies
    the calls of the collectives a pass issues (by a whole number: vp.tp.traffic), and per_pass divides them by it
    again, exactly (integers), so such figures are the same for every count, and their tables are keyed with one."""
    return tp_shape(cfg, 1)


def stage_tp_collectives(cfg: RunConfig, sched: Schedule, stage: int) -> list[Collective]:
    """What one device of a stage's tp group sends per iteration inside the stage (loss and vocabulary shards
    aside: rank_tp_collectives)."""
    if cfg.tp < 2:
        return []
    layers, rest = _stage_parts(cfg, sched, stage)
    return layers + rest


def _stage_parts(cfg: RunConfig, sched: Schedule, stage: int) -> tuple[list[Collective], list[Collective]]:
    """A stage's collectives per device and iteration: its transformer layers', and the rest (vocabulary layers,
    final LayerNorm, embeddings' gradients)."""
    layers, rest = _parts(tp_shape(cfg), cfg.stage_layers[stage], stage == 0, stage == sched.n_stages - 1,
                          not sched.vocab_parallel)
    return list(layers), list(rest)


@lru_cache(maxsize=4096)
def _parts(shape: Shape, layers: int, first: bool, last: bool, vocab_layers: bool) -> tuple[tuple, tuple]:
    """_stage_parts from all it reads (frozen values): a search asks for the same few stages thousands of times."""
    return (tuple(replace(c, calls=c.calls * layers) for c in layer_collectives(shape)),
            tuple(stage_collectives(shape, first=first, last=last, vocab_layers=vocab_layers, loss=False)))


def loss_rank(sched: Schedule) -> int:
    """The pipeline rank that knows the iteration's loss: T's rank 0 with vocabulary parallelism, else the rank
    of the last stage (vp.runtime.executor)."""
    return 0 if sched.vocab_parallel else sched.last_rank


def rank_tp_collectives(cfg: RunConfig, sched: Schedule, rank: int) -> list[Collective]:
    """Everything one device of pipeline rank `rank` sends on tensor-parallel channels per iteration: its stages
    (their once-per-iteration gradient sums as the runtime sends them: one flat buffer per channel over all the
    rank's stages, vp.tp.grads.reduce_replicated), the loss summed over token blocks, and with vocabulary
    parallelism the within-stage halves of C0, IF, IB (channels C0.row, IF.row, IB.row, at their roots) and the
    gradient of the vocabulary shards a grid replicates over its token blocks."""
    if cfg.tp < 2:
        return []
    shape, split = tp_shape(cfg), Split.of(cfg)
    stages = [c for st, at in enumerate(sched.stage_ranks) if at == rank for c in stage_tp_collectives(cfg, sched, st)]
    cols = [c for c in stages if c.pass_kind != ITERATION] + _one_buffer_each(
        [c for c in stages if c.pass_kind == ITERATION])
    cols += stage_collectives(shape, first=False, last=False, vocab_layers=False, loss=rank == loss_rank(sched))
    if sched.vocab_parallel:
        cols += vocab_row_steps(cfg, sched, rank, split)
    return [c for c in cols if c.group > 1 and c.calls and c.elements]


def _one_buffer_each(cols: list[Collective]) -> list[Collective]:
    """Collectives of one channel and op as one call of all their elements (the same bytes, one latency)."""
    merged: dict[tuple, float] = {}
    for c in cols:
        key = (c.channel, c.op, c.group, c.itemsize, c.pass_kind)
        merged[key] = merged.get(key, 0.0) + c.calls * c.elements
    return [Collective(channel, op, group, elements, 1, itemsize, kind)
            for (channel, op, group, itemsize, kind), elements in merged.items()]


def vocab_row_steps(cfg: RunConfig, sched: Schedule, rank: int, split: Split) -> list[Collective]:
    """The vocabulary passes' steps inside a stage's tp group (vp.runtime.executor.launch): the root of C0
    gathers X's hidden over its grid row, the root of IF sums the embedding over the row (1-D: all-reduce,
    grid: reduce-scatter of the fp32 [n, h]), the root of IB gathers the gradient's hidden (1-D sequence parallel:
    C0 and IB gather the positions, IF reduce-scatters along the sequence); every device
    all-reduces its shards' gradients over its token blocks (grid)."""
    mb, q, h = cfg.microbatches, split.q, cfg.hidden
    n = cfg.micro_batch_size * cfg.seq_len // split.blocks
    act = 4 if cfg.dtype == "fp32" else 2
    first, last = rank == sched.first_rank, rank == sched.last_rank
    rows = split.vocab_rows(cfg.padded_vocab_size, cfg.pp)
    if split.sequence_parallel:  # the stage's activation is this device's positions: gather X, scatter the sum
        return [Collective("C0.row", "all_gather", q, n * h / q, mb * last, act, "C0"),
                Collective("IF.row", "reduce_scatter", q, n * h, mb * first, 4, "IF"),
                Collective("IB.row", "all_gather", q, n * h / q, mb * first, act, "IB")]
    if not split.mode.grid:
        return [Collective("IF.row", "all_reduce", q, n * h, mb * first, 4, "IF")]
    return [Collective("C0.row", "all_gather", q, n * h / q, mb * last, act, "C0"),
            Collective("IF.row", "reduce_scatter", q, n * h, mb * first, 4, "IF"),
            Collective("IB.row", "all_gather", q, n * h / q, mb * first, act, "IB"),
            Collective("batch", "all_reduce", split.blocks, 2 * rows * h, 1, GRAD_ITEMSIZE)]


TP_AXES = ("tp", "row", "col", "dep", "batch")  # the mesh axes of the tensor-parallel channels (vp.tp.traffic)


def _group(cfg: RunConfig, channel: str, rank: int) -> tuple[int, ...]:
    """The global ranks of a channel's group around the first device of pipeline rank `rank` (replica 0)."""
    axis = "row" if "." in channel else channel  # C0.row, IF.row, IB.row: a grid row (1-D: the tp group)
    if axis not in TP_AXES:  # placement() describes these groups alone: the memos keyed on it must see them all
        raise ValueError(f"tensor-parallel channel {channel!r} on mesh axis {axis!r}, not one of {TP_AXES}: "
                         f"add it to vp.cost.tensor.TP_AXES")
    mesh = cfg.mesh
    return group_index(mesh, axis)[mesh.rank(0, rank, 0)]


@lru_cache(maxsize=65536)
def placement(mesh: Mesh, rank: int, gpus_per_node: int) -> tuple[tuple[int, int], ...]:
    """Per axis of TP_AXES, (ranks, nodes) of the group around the first device of pipeline rank `rank` (replica
    0): all that the seconds of a collective on a tensor-parallel channel read of its group (Network.span), so a
    figure made of such collectives is the same for two stages, or two meshes, of equal placement."""
    return placements(mesh, gpus_per_node)[rank]


@lru_cache(maxsize=4096)
def placements(mesh: Mesh, gpus_per_node: int) -> tuple:
    """placement() of every pipeline rank of a mesh, worked out once per mesh (a planner's costs read every rank's
    for thousands of candidates on a few hundred meshes)."""
    return tuple(tuple(span(group_index(mesh, axis)[mesh.rank(0, rank, 0)], gpus_per_node) for axis in TP_AXES)
                 for rank in range(mesh.pp))


def seconds(cfg: RunConfig, net: Network, cols: list[Collective], rank: int, per: int = 1) -> float:
    """Seconds of the collectives on a device of pipeline rank `rank`, divided by `per` (microbatches)."""
    return sum(c.calls / per * net.collective(OPS[c.op], _group(cfg, c.channel, rank), c.elements * c.itemsize)
               for c in cols)


def pass_comm_s(cfg: RunConfig, net: Network, sched: Schedule, stage: int,
                summa_gemm_s: dict[str, float] | None = None,
                layer_factors: dict[str, float] | None = None,
                rest_factors: dict[str, float] | None = None) -> dict[str, float]:
    """{F, B, W: seconds per microbatch} a stage's tensor-parallel collectives add to its passes (W's in B when
    the schedule does not split the weight gradient): its layers' (per_pass, with what a grid's SUMMA loop hides
    behind summa_gemm_s, the layers' GEMM seconds per pass kind) times layer_factors, and the rest of the stage's
    (vocabulary layers, final LayerNorm) times rest_factors, where a measured profile timed such layers and
    vocabulary layers in their group's world (vp.cost.passes.pass_factors)."""
    rank, (layers, rest) = sched.where(stage)[0], _stage_parts(cfg, sched, stage)
    group = lambda channel: _group(cfg, channel, rank)  # noqa: E731
    if not layer_factors and not rest_factors:  # all in one sum, as the reference digests were computed
        return per_pass(layers + rest, net, group, cfg.microbatches, sched.split_w, Split.of(cfg), summa_gemm_s)
    ours = per_pass(layers, net, group, cfg.microbatches, sched.split_w, Split.of(cfg), summa_gemm_s)
    theirs = per_pass(rest, net, group, cfg.microbatches, sched.split_w)
    layer_factors, rest_factors = layer_factors or {}, rest_factors or {}
    return {k: ours[k] * layer_factors.get(k, 1.0) + theirs[k] * rest_factors.get(k, 1.0) for k in ours}


def layer_comm_s(net: Network, mode: str, tp: int, depth: int, micro_batch: int, seq: int, hidden: int, ffn: int,
                 itemsize: int, split_w: bool, summa_gemm_s: dict[str, float] | None = None) -> dict[str, float]:
    """{F, B, W: seconds} of one tensor-parallel transformer layer's collectives per microbatch, alone in a group
    of tp devices (a tp_layers row of a measured profile: vp.cost.passes.pass_factors)."""
    split = Split(get_mode(mode), tp, depth)
    shape = Shape(split.mode, tp, depth, hidden, ffn, seq, micro_batch, 1, 0, itemsize)
    return per_pass(layer_collectives(shape), net, _alone(mode, tp, depth), 1, split_w, split, summa_gemm_s)


def vocab_comm_s(net: Network, mode: str, tp: int, depth: int, micro_batch: int, seq: int, hidden: int, vocab: int,
                 itemsize: int) -> dict[str, float]:
    """{F, B, W: seconds} of the collectives of a stage's vocabulary layers and final LayerNorm per microbatch (a
    stage both first and last, without vocabulary parallelism), alone in a group of tp devices (a tp_vocab row)."""
    shape = Shape(get_mode(mode), tp, depth, hidden, 4 * hidden, seq, micro_batch, 1, vocab, itemsize)
    cols = stage_collectives(shape, first=True, last=True, vocab_layers=True, loss=False)
    return per_pass(cols, net, _alone(mode, tp, depth), 1, False)


def _alone(mode: str, tp: int, depth: int):
    """group_of(channel) for a tensor-parallel group alone in its world (a measured row's): the groups of device 0."""
    mesh = Mesh(tp=tp, tp_mode=mode, tp_depth=depth)
    return lambda channel: group_index(mesh, channel)[0]


def per_pass(cols: list[Collective], net: Network, group_of, per: int, split_w: bool, split: Split | None = None,
             summa_gemm_s: dict[str, float] | None = None) -> dict[str, float]:
    """{F, B, W: seconds} of the collectives each pass issues, divided by `per` (microbatches), one after the
    other; group_of(channel) gives a channel's global ranks. Given a grid pass's SUMMA GEMM seconds G and its step
    collectives' seconds C (broadcasts and reduces), the part the runtime hides is taken off: vp/tp/summa.py starts
    step t+1's broadcasts before step t's GEMM and reduces asynchronously, so over q steps the pass takes
    c + (q-1) max(g, c) + g = max(G, C) + min(G, C)/q instead of G + C, a credit of (1 - 1/q) min(G, C).
    1-D's all-reduces block the next GEMM: no credit."""
    out, summa = {"F": 0.0, "B": 0.0, "W": 0.0}, {"F": 0.0, "B": 0.0, "W": 0.0}
    for c in cols:
        if c.pass_kind in (ITERATION, LOGGED):  # once per iteration: after the flush (tail_s) or not timed
            continue
        kind = c.pass_kind if split_w or c.pass_kind != "W" else "B"
        s = c.calls / per * net.collective(OPS[c.op], group_of(c.channel), c.elements * c.itemsize)
        out[kind] += s
        if c.op in SUMMA_OPS:
            summa[kind] += s
    if summa_gemm_s and split is not None and split.mode.grid:
        for kind, gemm in summa_gemm_s.items():
            out[kind] -= (1 - 1 / split.q) * min(gemm, summa[kind])
    return out


def tail_s(cfg: RunConfig, net: Network, sched: Schedule, rank: int) -> float:
    """Seconds of a device's once-per-iteration tensor-parallel collectives after the flush."""
    return seconds(cfg, net, [c for c in rank_tp_collectives(cfg, sched, rank) if c.pass_kind == ITERATION], rank)


def tails_s(cfg: RunConfig, hw: Hardware, sched: Schedule) -> list[float]:
    """tail_s of every pipeline rank on the profile's network, each worked out once per profile for all it reads:
    the tensor-parallel shape (tp_shape), the pipeline's size and vocabulary, the rank's stages (their layers and
    places, in order), whether it holds the loss, the first or the last stage, and its groups' placement
    (vp.cost.profiles.cost_table); and the whole pipeline's once for all those keys derive from (the stages' layers,
    the placement of stages and chunks, the mesh: runs that differ in the optimizer's knobs alone share it)."""
    if cfg.tp < 2:  # nothing sent (tail_s: a sum of no collectives)
        return [0] * cfg.pp
    net = Network.of(hw, cfg.world)
    table = cost_table(hw, ("tp tail", tp_shape(cfg), cfg.pp, sched.vocab_parallel, net.busy))
    layers_of = tuple(cfg.stage_layers)
    whole = (layers_of, sched.placement, sched.chunks, cfg.mesh)
    out = table.get(whole)
    if out is not None:
        return list(out)
    last, stages, ranks = sched.n_stages - 1, [[] for _ in range(cfg.pp)], sched.stage_ranks
    for st, layers in enumerate(layers_of):
        stages[ranks[st]].append((layers, st == 0, st == last))
    out, loss, places = [], loss_rank(sched), placements(cfg.mesh, net.gpus_per_node)
    for rank in range(cfg.pp):
        key = (tuple(stages[rank]), rank == loss, rank == sched.first_rank, rank == sched.last_rank, places[rank])
        got = table.get(key)
        if got is None:
            got = table[key] = tail_s(cfg, net, sched, rank)
        out.append(got)
    table[whole] = tuple(out)
    return out
