"""The work of every pass as matrix shapes and bytes (vp.cost.passes: the seconds it takes on a hardware profile).

One transformer layer (Megatron GPT: fused bias-GeLU and bias-dropout-add, flash attention, causal), for one
microbatch of n = b s tokens, hidden h, feed-forward f:
  F  GEMMs qkv [n,h]x[h,3h], proj [n,h]x[h,h], fc1 [n,h]x[h,f], fc2 [n,f]x[f,h]; attention QK^T and PV as
     b*heads batched [s,d]x[d,s] and [s,s]x[s,d], of which causal flash attention executes half;
  B  the input gradient of each linear ([n,out]x[out,in]) and attention's backward (recompute of QK^T, then
     dV, dP, dQ, dK: 2.5x the forward);
  W  the weight gradient of each linear ([in,n]x[n,out], accumulated into fp32 gradients);
  elementwise, in activation elements of [n, h] read or written: F 18 + 2f/h (LayerNorms, q/k/v and output
  layout copies, GeLU, two dropout-adds), B 20 + 3f/h, W 9 + f/h (bias and LayerNorm weight gradients); GeLU's
  2f/h (F) and 3f/h (B) are timed by a measured profile's activation table where it has one (activation_time).
The output layer on a vocabulary shard of r rows: logits [n,h]x[h,r], input gradient [n,r]x[r,h], weight
gradient [r,n]x[n,h]; the fp32 cross entropy around them reads and writes act + 36 bytes per logit in the
forward part (cast, max, subtract, exp, sum, normalise) and 12 + act in the backward part (scale, cast back),
counted from the official implementation's tensor operations (megatron/core/tensor_parallel/cross_entropy.py).
Which GEMMs S and T hold is the vocabulary algorithm's row (s_gemms of logits, grad input, grad weight in S, the
rest in T; vp.schedule.methods.VOCAB). The input layer is memory bound: IF
gathers and writes rows (12 bytes per element of [n, h]), IB scatters the gradient into fp32 rows (act + 8); a
first stage without vocabulary parallelism also zeroes and accumulates autograd's dense gradient of its whole
embedding (2 act + 8 bytes per element of [V, h]: F.embedding's backward, as in Megatron), a fresh [V, h] tensor each
microbatch. Elementwise bytes are kept per tensor size with the bytes of fresh outputs among them: a measured
profile times each size at its own measured rate, and each fresh byte at its measured allocation cost
(vp.cost.gemm.elementwise_time). The layers' fresh outputs are not counted (activation-sized, which allocators
reuse), nor the output layer's: its large tensors are GEMM outputs, timed with their allocation in the GEMM table,
and its cross-entropy steps run in place.
"""

from dataclasses import dataclass
from functools import lru_cache

from vp.config import RunConfig
from vp.cost.gemm import Gemm
from vp.cost.profiles import Hardware
from vp.cost.tensor import ONE_DEVICE, Split
from vp.schedule import Schedule


@dataclass(frozen=True)
class Work:
    gemms: tuple[Gemm, ...] = ()
    attention_flops: float = 0.0  # FLOPs fused attention executes
    # elementwise traffic per tensor size: (bytes of each tensor it runs over, bytes moved, bytes of fresh outputs)
    mem: tuple[tuple[float, float, float], ...] = ()
    attention: tuple[tuple, ...] = ()  # (batch x heads, seq, head dim, backward) of each fused attention call
    kernels: int = 0  # operations issued (each costs the profile's kernel_s)
    # (elements, backward, bytes, tensor bytes) of each GeLU call: its bytes are in mem too; a measured activation
    # table prices the call instead of those bytes (activation_time)
    activation: tuple[tuple, ...] = ()

    @property
    def mem_bytes(self) -> float:
        """Elementwise bytes moved, over every tensor size."""
        return sum(moved for _, moved, _ in self.mem)

    def __add__(self, other: "Work") -> "Work":
        mem = {size: (moved, fresh) for size, moved, fresh in self.mem}
        for size, moved, fresh in other.mem:
            was = mem.get(size, (0.0, 0.0))
            mem[size] = (was[0] + moved, was[1] + fresh)
        return Work(self.gemms + other.gemms, self.attention_flops + other.attention_flops,
                    tuple((size, moved, fresh) for size, (moved, fresh) in mem.items()),
                    self.attention + other.attention, self.kernels + other.kernels,
                    self.activation + other.activation)

    def times(self, k: int) -> "Work":
        return Work(self.gemms * k, self.attention_flops * k,
                    tuple((size, moved * k, fresh * k) for size, moved, fresh in self.mem),
                    self.attention * k, self.kernels * k, self.activation * k)


# operations one layer's pass issues in the runtime's model (vp.model.Block, vp.wgrad): F LayerNorm, qkv, attention,
# layout copy, proj, add, LayerNorm, fc1, GeLU, fc2, add; B their gradients (the GEMMs' input gradients, attention,
# GeLU, two LayerNorms, the copy, two residual sums); W a weight-gradient GEMM and a bias sum per linear. The output
# layer: one per GEMM plus the fused cross entropy's steps (vp.vocab.output), the input layer a gather and an add.
LAYER_KERNELS = {"F": 11, "B": 12, "W": 8}
OUTPUT_KERNELS = {True: 8, False: 4}
INPUT_KERNELS = 2


OUTPUT_GEMMS = ("logits", "grad_input", "grad_weight")  # in the order a vocabulary algorithm's S, then T, take them


@dataclass(frozen=True)
class Shapes:
    """A micro-batch's work on one device of a stage's tensor-parallel group (vp.cost.tensor.Split)."""
    tokens: int
    seq: int
    micro_batch: int
    hidden: int
    ffn: int
    act: int  # bytes per activation element
    split: Split = ONE_DEVICE
    heads: int = 1

    @classmethod
    def of(cls, cfg: RunConfig, hw: Hardware) -> "Shapes":
        return cls(cfg.micro_batch_size * cfg.seq_len, cfg.seq_len, cfg.micro_batch_size, cfg.hidden, cfg.ffn,
                   hw.act_bytes, Split.of(cfg), cfg.heads)

    @property
    def block_tokens(self) -> int:
        """Tokens of the device's token block (a grid splits the micro-batch's sequences d q ways)."""
        return self.tokens // self.split.blocks

    def linears(self) -> list[tuple[int, int]]:
        """(in, out) of qkv, proj, fc1, fc2."""
        h, f = self.hidden, self.ffn
        return [(h, 3 * h), (h, h), (h, f), (f, h)]

    def attention(self, gemms: float) -> float:
        """FLOPs of `gemms` causal attention products ([s,d]x[d,s]-sized, over all heads): half of each."""
        return gemms * 2.0 * self.micro_batch * self.seq * self.seq * self.hidden / 2

    @lru_cache(maxsize=4096)  # the shapes are frozen, the Work too: a search asks for a few thousand, many times
    def layer(self, kind: str) -> Work:
        """One device's share of a layer's pass: its GEMMs, attention and elementwise bytes (vp.cost.tensor)."""
        n, h, f, a, sp = self.tokens, self.hidden, self.ffn, self.act, self.split
        attention, elementwise = {"F": (2, 18 + 2 * f / h), "B": (5, 20 + 3 * f / h), "W": (0, 9 + f / h)}[kind]
        calls = () if kind == "W" else \
            ((self.micro_batch * self.heads * sp.layer_share(), self.seq, h // self.heads, kind == "B"),)
        share = sp.activation_share()
        # of the elementwise bytes, GeLU's: F reads and writes [n, f], B reads the gradient and the input, writes one
        gelu = () if kind == "W" else \
            ((n * f * share, kind == "B", (3 if kind == "B" else 2) * n * f * a * share, n * h * a * share),)
        return Work(sp.linear_gemms(kind, n, self.linears(), a), self.attention(attention) * sp.layer_share(),
                    ((n * h * a * share, elementwise * n * h * a * share, 0.0),), calls, LAYER_KERNELS[kind], gelu)

    def output(self, rows: int, names: tuple[str, ...], forward: bool) -> Work:
        """The named output-layer GEMMs on a shard of `rows` vocabulary rows, with the forward (S) or backward
        (T) part of the cross entropy, on the device's token block (the whole hidden: a grid gathers it)."""
        n, h, a = self.block_tokens, self.hidden, self.act
        gemm = {"logits": Gemm(n, rows, h, in_bytes=a, out_bytes=a),
                "grad_input": Gemm(n, h, rows, in_bytes=a, out_bytes=4),
                "grad_weight": Gemm(rows, h, n, in_bytes=a, out_bytes=4, accumulate=True)}
        per_logit = (a + 36) if forward else (12 + a)
        # the steps run in place on the GEMMs' outputs (vp.vocab.output), whose allocation the GEMMs' time holds
        return Work(tuple(gemm[x] for x in names), 0.0, ((4 * n * rows, per_logit * n * rows, 0.0),),
                    kernels=len(names) + OUTPUT_KERNELS[forward])

    def input(self, forward: bool, dense_rows: int = 0) -> Work:
        """The input layer on the device's token block: IF gathers rows, IB adds the gradient into fp32 rows. With
        dense_rows, IB is autograd's dense embedding gradient over that many rows (a pipeline's first stage without
        vocabulary parallelism, F.embedding; as Megatron's embedding): zeroed at the parameter's element size, then
        added into the fp32 gradient (read both, write one), each microbatch."""
        n, h = self.block_tokens, self.hidden
        mem = ((n * h * 4, (12 if forward else self.act + 8) * n * h, 0.0),)
        if dense_rows and not forward:  # the zeroed dense gradient is a fresh tensor each microbatch
            mem += ((dense_rows * h * 4, (2 * self.act + 8) * dense_rows * h, dense_rows * h * self.act),)
        return Work((), 0.0, mem, kernels=INPUT_KERNELS)


def pass_work(cfg: RunConfig, hw: Hardware, sched: Schedule) -> dict:
    """{(kind, stage): {eff_kind: Work}} for F/B/W of each stage and {(kind, None): ...} for S/T/IF/IB. The
    eff_kind says whose calibrated multiplier applies: the whole output layer in a last stage counts as S
    (its forward part) and T (backward), the whole input layer in a first stage as IF and IB."""
    sh = Shapes.of(cfg, hw)
    v, last = sh.split.vocab_rows(cfg.padded_vocab_size), sched.n_stages - 1  # the output rows of one device
    out, alike = {}, {}  # stages of equal layers and role share one parts dict (a pipeline has few kinds)
    for st, layers in enumerate(cfg.stage_layers):
        role = (layers, st == 0, st == last)
        if role not in alike:
            alike[role] = {kind: stage_parts(sh, kind, *role, sched.split_w, sched.vocab_parallel, cfg.recompute, v)
                           for kind in ("F", "B", "W")}
        out.update({(kind, st): alike[role][kind] for kind in ("F", "B", "W")})
    if sched.vocab_parallel:
        rows = sh.split.vocab_rows(cfg.padded_vocab_size, cfg.pp)
        out.update(vocab_parts(sh, rows, sched.vocab.s_gemms, sched.vocab.t_gemms))
    return out


def stage_parts(sh: Shapes, kind: str, layers: int, first: bool, last: bool, split_w: bool, vocab_parallel: bool,
                recompute: str, v: int | None) -> dict:
    """{eff_kind: Work} of pass `kind` (F, B, W) of a stage of `layers` layers, the first and (or) the last stage
    of the pipeline, whose output layer (where the vocabulary is not parallel) has v rows on one device: all
    pass_work reads of a stage (v only where a first or last stage holds a vocabulary layer)."""
    if kind == "W" and not split_w:
        return {}
    parts = {kind: sh.layer(kind).times(layers)}
    if kind == "B" and not split_w:
        parts[kind] = parts[kind] + sh.layer("W").times(layers)
    if kind == "B" and recompute != "none":  # B makes again the whole forward (full) or the attention
        fwd = sh.layer("F")  # core (selective) of its layers (vp.recompute), at F's calibrated factor
        parts["F"] = (fwd if recompute == "full" else
                      Work(attention_flops=fwd.attention_flops, attention=fwd.attention)).times(layers)
    if not vocab_parallel and last:
        backward = OUTPUT_GEMMS[1:2] if split_w else OUTPUT_GEMMS[1:]
        head = {"F": ("S", sh.output(v, OUTPUT_GEMMS[:1], True)), "B": ("T", sh.output(v, backward, False)),
                "W": ("T", Work((Gemm(v, sh.hidden, sh.block_tokens, in_bytes=sh.act, out_bytes=4,
                                      accumulate=True),)))}[kind]
        parts[head[0]] = head[1]
    if not vocab_parallel and first and kind != "W":
        parts["IF" if kind == "F" else "IB"] = sh.input(kind == "F", v)
    return parts


def vocab_parts(sh: Shapes, rows: int, s_gemms: int, t_gemms: int) -> dict:
    """{(kind, None): {kind: Work}} of the vocabulary-parallel passes on a shard of `rows` rows, the algorithm's S
    taking the first s_gemms of the output layer's GEMMs and T the other t_gemms."""
    assert s_gemms + t_gemms == len(OUTPUT_GEMMS), (s_gemms, t_gemms)
    return {("S", None): {"S": sh.output(rows, OUTPUT_GEMMS[:s_gemms], True)},
            ("T", None): {"T": sh.output(rows, OUTPUT_GEMMS[s_gemms:], False)},
            ("IF", None): {"IF": sh.input(True)}, ("IB", None): {"IB": sh.input(False)}}
