"""Closed forms of what the tensor-parallel layers send, per device and iteration: the list of collectives
(channel, op, group size, elements, calls), then bytes as vp.comm.Comm counts them and bytes on the wire under
ring algorithms. Pure Python (no torch), so the cost model can evaluate it at paper scale.

Comm counts, per call: every member of an all-reduce, reduce, all-gather (its own part) or reduce-scatter (its
whole input) its input; the root of a broadcast its block. In a q-step SUMMA loop every device is the root of
one broadcast per channel. The wire model (ring / pipelined chain; per device, averaged over the group):
all-reduce 2(p-1)/p n, broadcast and reduce (p-1)/p n, all-gather (p-1) n, reduce-scatter (p-1)/p n. Under it
a SUMMA linear moves 3(q-1) X-blocks and 3(q-1) W-blocks per device (docs/tensor-parallel.md), 1-D 2(t-1)/t of
[n, h] per all-reduce.

Per transformer layer (n = micro-batch tokens, m = n/(dq) tokens per grid device, linears (K, N) = (h, 3h),
(h, h), (h, ffn), (ffn, h), X-block m K/q, W-block K N/q^2), per micro-batch unless "per iteration":
  1-D   4 all-reduces of [n, h] over tp (2 forward after the row-parallel linears, 2 backward before the
        column-parallel ones); nothing per iteration
  1-D sequence parallel (vp.tp.sequence): forward 2 all-gathers of [n/t, h] (before qkv, fc1) and 2 reduce-scatters
        of [n, h] (after proj, fc2), backward their conjugates, and in W (inside B when not split) the 2 all-gathers
        again for the weight gradients; per iteration the all-reduce of the LayerNorms' and biases' shares, 6h
  grid  per linear: 2q broadcasts of X-blocks over ROW (ab, atb), 2q of W-blocks over COL (ab, abt), q reduces
        of X-blocks over ROW (abt), q of W-blocks over COL (atb); per LayerNorm 2 all-reduces of [2, m] over ROW;
        per iteration the DEP all-reduce of the 4 W-blocks and the batch all-reduce of the biases and LayerNorm
        vectors, (9h + ffn)/q elements
Outside the layers (stage_collectives): the vocabulary layers, the final LayerNorm, the position embedding's and
vocabulary shards' gradients, and the iteration loss summed over token blocks, placed on a pipeline's first and
last stages. Each collective names the pass that issues it (the cost model times it inside that pass, blocking),
the iteration (once, after the flush) or LOGGED (once, after the iteration's timed step: the loss summed for the
log, which the runtime's iteration time leaves out, so the cost model counts its bytes and prices no time).
"""
from dataclasses import dataclass

from vp.tp.modes import TensorMode

OPS = ("all_reduce", "broadcast", "reduce", "all_gather", "reduce_scatter")
ITERATION = "iteration"  # a collective issued once per iteration, after the pipeline's flush
LOGGED = "logged"  # once per iteration, after its timed step (vp.runtime.loop: the loss summed for the log)
GRAD_ITEMSIZE = 4  # gradients of the fp32 parameters (mixed precision computes in the run's dtype under autocast)


@dataclass(frozen=True)
class Collective:
    channel: str
    op: str
    group: int  # devices in the group
    elements: float  # what one call hands to Comm (all_gather: this device's part; reduce_scatter: the whole input)
    calls: float  # calls per device per iteration
    itemsize: int = 4
    pass_kind: str = ITERATION  # the pass that issues it (F, B, W), ITERATION (once, after the flush) or LOGGED

    def counted_bytes(self) -> float:
        """Bytes vp.comm.Comm counts on one device, per iteration."""
        share = 1.0 / self.group if self.op == "broadcast" else 1.0  # a broadcast counts at its root only
        return self.calls * share * self.elements * self.itemsize

    def wire_bytes(self) -> float:
        """Bytes one device sends per iteration under ring / pipelined-chain algorithms."""
        p = self.group
        factor = {"all_reduce": 2 * (p - 1) / p, "broadcast": (p - 1) / p, "reduce": (p - 1) / p,
                  "all_gather": p - 1, "reduce_scatter": (p - 1) / p}[self.op]
        return self.calls * factor * self.elements * self.itemsize


@dataclass(frozen=True)
class Shape:
    """A tensor-parallel stage and its work per iteration."""
    mode: TensorMode
    tp: int
    tp_depth: int
    hidden: int
    ffn: int
    seq_len: int
    micro_batch_size: int
    microbatches: int
    padded_vocab_size: int
    itemsize: int = 4
    sequence_parallel: bool = False  # 1-D: all-gathers and reduce-scatters along the sequence (vp.tp.sequence)

    @property
    def q(self) -> int:
        return self.mode.side(self.tp, self.tp_depth)

    @property
    def depth(self) -> int:
        return self.mode.depth(self.tp_depth)

    @property
    def tokens(self) -> int:
        """Tokens of one micro-batch on one device (grid: its token block)."""
        return self.micro_batch_size * self.seq_len // self.mode.batch_blocks(self.tp, self.tp_depth)

    def linears(self) -> list[tuple[int, int]]:
        """(K, N) of the block's linears: QKV, attention output, fc1, fc2."""
        h, f = self.hidden, self.ffn
        return [(h, 3 * h), (h, h), (h, f), (f, h)]


def _keep(cols: list[Collective]) -> list[Collective]:
    """A group of one sends nothing (the layers skip it)."""
    return [c for c in cols if c.group > 1 and c.calls and c.elements]


def layer_collectives(s: Shape) -> list[Collective]:
    """One transformer layer, per device and iteration, each collective tagged with the pass that issues it
    (W: the weight-gradient half of the backward, which runs inside B when a schedule does not split it)."""
    mb, h, n, size = s.microbatches, s.hidden, s.tokens, s.itemsize
    if s.sequence_parallel:
        t = s.tp
        return _keep([Collective("tp", "all_gather", t, n * h / t, 2 * mb, size, "F"),  # g before qkv, fc1
                      Collective("tp", "reduce_scatter", t, n * h, 2 * mb, size, "F"),  # g-bar after proj, fc2
                      Collective("tp", "reduce_scatter", t, n * h, 2 * mb, size, "B"),  # g's backward
                      Collective("tp", "all_gather", t, n * h / t, 2 * mb, size, "B"),  # g-bar's backward
                      Collective("tp", "all_gather", t, n * h / t, 2 * mb, size, "W"),  # qkv, fc1 inputs for grad W
                      Collective("tp", "all_reduce", t, 6 * h, 1, GRAD_ITEMSIZE)])  # LayerNorms, proj/fc2 biases
    if not s.mode.grid:
        return _keep([Collective("tp", "all_reduce", s.tp, n * h, 2 * mb, size, "F"),  # after proj, fc2
                      Collective("tp", "all_reduce", s.tp, n * h, 2 * mb, size, "B")])  # before qkv, fc1
    q, d = s.q, s.depth
    cols = []
    for k_in, n_out in s.linears():
        x_block, w_block = n * k_in / q, k_in * n_out / q**2
        cols += [Collective("row", "broadcast", q, x_block, q * mb, size, "F"),  # ab: Y = X W
                 Collective("col", "broadcast", q, w_block, q * mb, size, "F"),
                 Collective("col", "broadcast", q, w_block, q * mb, size, "B"),  # abt: grad X = grad Y W^T
                 Collective("row", "reduce", q, x_block, q * mb, size, "B"),
                 Collective("row", "broadcast", q, x_block, q * mb, size, "W"),  # atb: grad W = X^T grad Y
                 Collective("col", "reduce", q, w_block, q * mb, size, "W")]
    cols += [Collective("row", "all_reduce", q, 2 * n, 2 * mb, size, "F"),  # 2 LayerNorms: sums of x and x^2
             Collective("row", "all_reduce", q, 2 * n, 2 * mb, size, "B")]
    weights = sum(k_in * n_out for k_in, n_out in s.linears()) / q**2
    cols.append(Collective("dep", "all_reduce", d, weights, 1, GRAD_ITEMSIZE))
    cols.append(Collective("batch", "all_reduce", q * d, (9 * h + s.ffn) / q, 1, GRAD_ITEMSIZE))
    return _keep(cols)


def stage_collectives(s: Shape, first: bool = True, last: bool = True, vocab_layers: bool = True,
                      loss: bool = True) -> list[Collective]:
    """Everything but the transformer layers, per device and iteration: on the first stage the input embedding
    (vocab_layers) and the position embedding's gradient, on the last the final LayerNorm and the output layer
    with its loss (vocab_layers), and where the iteration's loss is known (loss) its sum over token blocks.
    The defaults: a one-stage model that holds its vocabulary layers."""
    mb, h, n, v, size = s.microbatches, s.hidden, s.tokens, s.padded_vocab_size, s.itemsize
    embed, output = first and vocab_layers, last and vocab_layers
    if s.sequence_parallel:
        t = s.tp
        return _keep([Collective("row", "reduce_scatter", t, n * h, mb * embed, size, "F"),  # embedding
                      Collective("row", "all_gather", t, n * h / t, mb * embed, size, "B"),  # embedding grad
                      Collective("row", "all_gather", t, n * h / t, mb * output, size, "F"),  # output layer X
                      Collective("row", "reduce_scatter", t, n * h, mb * output, size, "B"),  # output grad X
                      Collective("row", "all_reduce", t, n, mb * output, size, "F"),  # max of the logits
                      Collective("row", "all_reduce", t, 2 * n, mb * output, size, "F"),  # sum exp, target
                      Collective("tp", "all_reduce", t, first * s.seq_len * h + last * 2 * h, 1,
                                 GRAD_ITEMSIZE)])  # the position embedding, the final LayerNorm: shares summed
    if not s.mode.grid:
        return _keep([Collective("row", "all_reduce", s.tp, n * h, mb * embed, size, "F"),  # embedding
                      Collective("row", "all_reduce", s.tp, n * h, mb * output, size, "B"),  # output grad X
                      Collective("row", "all_reduce", s.tp, n, mb * output, size, "F"),  # max of the logits
                      Collective("row", "all_reduce", s.tp, 2 * n, mb * output, size, "F")])  # sum exp, target
    q, d = s.q, s.depth
    return _keep([
        Collective("row", "reduce_scatter", q, n * h, mb * embed, size, "F"),  # embedding fwd
        Collective("row", "all_gather", q, n * h / q, mb * embed, size, "B"),  # embedding grad
        Collective("row", "all_gather", q, n * h / q, mb * output, size, "F"),  # output layer X
        Collective("row", "reduce_scatter", q, n * h, mb * output, size, "B"),  # output layer grad X
        Collective("row", "all_reduce", q, n, mb * output, size, "F"),  # max of the logits
        Collective("row", "all_reduce", q, 2 * n, mb * output, size, "F"),  # sum exp, target logit
        Collective("row", "all_reduce", q, 2 * n, mb * last, size, "F"),  # final LayerNorm fwd
        Collective("row", "all_reduce", q, 2 * n, mb * last, size, "B"),  # final LayerNorm bwd
        Collective("batch", "all_reduce", q * d, (embed + output) * v * h / q + first * s.seq_len * h / q
                   + last * 2 * h / q, 1, GRAD_ITEMSIZE),  # vocabulary rows, position embedding, final LayerNorm
        Collective("batch", "all_reduce", q * d, 1, int(loss), 8, LOGGED),  # the iteration loss (fp64)
    ])


def counted_bytes(cols: list[Collective]) -> float:
    return sum(c.counted_bytes() for c in cols)


def wire_bytes(cols: list[Collective]) -> float:
    return sum(c.wire_bytes() for c in cols)


def by_channel(cols: list[Collective], wire: bool = False) -> dict[str, float]:
    out: dict[str, float] = {}
    for c in cols:
        out[c.channel] = out.get(c.channel, 0.0) + (c.wire_bytes() if wire else c.counted_bytes())
    return dict(sorted(out.items()))
