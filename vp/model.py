"""A GPT (pre-LayerNorm blocks, causal attention, GELU MLP, learned positions, untied input and output
embeddings, final LayerNorm) that can be cut into pipeline stages of any number of layers.

Every parameter is drawn from a generator seeded by (seed, its global name), and a vocabulary matrix
row by row in fixed blocks, so any stage or vocabulary shard is built alone with the values it has in
the uncut model. The uncut model (`reference_model`) is the single-process reference.
"""
import contextlib
import math
import threading
import zlib

import torch
import torch.nn as nn
import torch.nn.functional as F

from vp.recompute import attention, run_layers
from vp.tp.stage import TensorParallelStage
from vp.vocab.output import Shard, local_loss
from vp.wgrad import WeightGradStore, linear

VOCAB_BLOCK = 1024  # rows of a vocabulary matrix drawn from one generator
STD = 0.02
_META = threading.local()  # .on: seeded_normal and vocab_rows return meta tensors (vp.init builds stages so)
_META.on = False


@contextlib.contextmanager
def meta():
    """Modules built inside hold meta parameters: shapes only, no memory (vp.init.materialise fills them)."""
    with torch.device("meta"):
        _META.on, was = True, _META.on
        try:
            yield
        finally:
            _META.on = was


def seeded_normal(shape, seed: int, name: str, std: float = STD, out: torch.Tensor | None = None) -> torch.Tensor:
    """N(0, std) drawn from a CPU generator seeded by (seed, name); into `out` (a CPU tensor) when given, with no
    temporary. Under `meta()`, only the shape (the stage is materialised later, vp.init)."""
    if _META.on and out is None:
        return torch.empty(shape, device="meta")
    gen = torch.Generator().manual_seed(zlib.crc32(f"{seed}/{name}".encode()))
    return torch.randn(shape, generator=gen, out=out).mul_(std)


def vocab_rows(seed: int, name: str, vocab_size: int, start: int, end: int, hidden: int,
               out: torch.Tensor | None = None) -> torch.Tensor:
    """Rows [start, end) of a [padded_vocab, hidden] matrix; rows >= vocab_size (padding) are zero."""
    if _META.on and out is None:
        return torch.empty(end - start, hidden, device="meta")
    out = torch.empty(end - start, hidden) if out is None else out
    for block in range(start // VOCAB_BLOCK, (end - 1) // VOCAB_BLOCK + 1):
        lo, hi = max(start, block * VOCAB_BLOCK), min(end, (block + 1) * VOCAB_BLOCK)
        if hi - lo == VOCAB_BLOCK:  # a whole block: drawn in place, no temporary
            seeded_normal((VOCAB_BLOCK, hidden), seed, f"{name}/{block}", out=out[lo - start:hi - start])
        else:
            rows = seeded_normal((VOCAB_BLOCK, hidden), seed, f"{name}/{block}")
            out[lo - start:hi - start] = rows[lo - block * VOCAB_BLOCK:hi - block * VOCAB_BLOCK]
            del rows
    out[max(0, vocab_size - start):] = 0.0
    return out


class Linear(nn.Module):
    def __init__(self, weight: torch.Tensor):
        super().__init__()
        self.weight = nn.Parameter(weight)
        self.bias = nn.Parameter(torch.zeros(weight.shape[0]))

    def forward(self, x, wgrad: WeightGradStore | None = None):
        return linear(x, self.weight, self.bias, wgrad)


class Block(nn.Module):
    def __init__(self, hidden: int, heads: int, ffn: int, layers: int, seed: int, index: int):
        super().__init__()
        name = f"layers.{index}"
        out_std = STD / math.sqrt(2 * layers)  # GPT-2 scaling of the residual projections
        self.heads = heads
        self.recompute = "none"  # vp.recompute: the Stage that holds the block sets it
        self.ln1 = nn.LayerNorm(hidden)
        self.qkv = Linear(seeded_normal((3 * hidden, hidden), seed, f"{name}.qkv"))
        self.proj = Linear(seeded_normal((hidden, hidden), seed, f"{name}.proj", out_std))
        self.ln2 = nn.LayerNorm(hidden)
        self.fc1 = Linear(seeded_normal((ffn, hidden), seed, f"{name}.fc1"))
        self.fc2 = Linear(seeded_normal((hidden, ffn), seed, f"{name}.fc2", out_std))

    def forward(self, x, wgrad=None):
        b, s, h = x.shape
        # q, k, v: [b, heads, s, h/heads]
        q, k, v = self.qkv(self.ln1(x), wgrad).view(b, s, 3, self.heads, h // self.heads).permute(2, 0, 3, 1, 4)
        att = attention(q, k, v, self.recompute)
        x = x + self.proj(att.transpose(1, 2).reshape(b, s, h), wgrad)
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x), wgrad)), wgrad)


class Stage(nn.Module):
    """Transformer layers [first_layer, first_layer + n_layers) and the parts of the vocabulary layers the
    stage owns. `local_vocab` puts the whole input embedding in the first stage and the output layer in
    the last (baseline placement); otherwise they live in vocabulary shards (vp.vocab) and the first stage
    takes the summed embedding, the last stage returns X = final_norm(x).
    """

    def __init__(self, cfg, seed: int, first_layer: int, n_layers: int, first: bool, last: bool,
                 local_vocab: bool):
        super().__init__()
        h, v, vp = cfg.hidden, cfg.vocab_size, cfg.padded_vocab_size
        self.first, self.last, self.local_vocab = first, last, local_vocab
        self.vocab_size = v
        if first:
            self.pos = nn.Parameter(seeded_normal((cfg.seq_len, h), seed, "pos.weight"))
            if local_vocab:
                self.embed = nn.Parameter(vocab_rows(seed, "embed.weight", v, 0, vp, h))
        self.layers = nn.ModuleDict({str(i): Block(h, cfg.heads, cfg.ffn, cfg.layers, seed, i)
                                     for i in range(first_layer, first_layer + n_layers)})
        self.recompute = getattr(cfg, "recompute", "none")
        for block in self.layers.values():
            block.recompute = self.recompute
        if last:
            self.final_norm = nn.LayerNorm(h)
            if local_vocab:
                self.head = nn.Parameter(vocab_rows(seed, "head.weight", v, 0, vp, h))

    def forward(self, x, wgrad: WeightGradStore | None = None):
        """x: token ids [b, s] (first stage, local vocabulary), else activations [b, s, h]."""
        if self.first:
            if self.local_vocab:
                x = F.embedding(x, self.embed)
            x = x + self.pos[: x.shape[1]]
        x = run_layers(self.layers.values(), x, wgrad, self.recompute)
        return self.final_norm(x) if self.last else x

    def logits(self, x, wgrad: WeightGradStore | None = None):
        """x W^T in fp32 [b, s, padded vocab], padded vocabulary rows masked out (-inf)."""
        logits = linear(x, self.head, None, wgrad).float()
        if logits.shape[-1] > self.vocab_size:
            logits = logits.masked_fill(torch.arange(logits.shape[-1], device=logits.device) >= self.vocab_size,
                                        float("-inf"))
        return logits

    def loss(self, x, targets, weights, wgrad: WeightGradStore | None = None):
        """sum_t weights_t * cross_entropy(x_t W^T, target_t), padded vocabulary rows masked out, fused as
        Megatron's cross-entropy (vp.vocab.output.local_loss): what the runtime runs on the last stage.
        x [b, s, h], targets and weights [b, s]."""
        shard = Shard(0, 1, self.head.shape[0], self.vocab_size)
        return local_loss(shard, self.head, x.reshape(-1, x.shape[-1]), targets.reshape(-1), weights.reshape(-1),
                          wgrad)

    def reference_loss(self, x, targets, weights, wgrad: WeightGradStore | None = None):
        """The same loss by the plain formulation (logits, then torch's cross-entropy): the single-process
        reference, which the fused `loss` must match."""
        return weighted_cross_entropy(self.logits(x, wgrad), targets, weights)


def weighted_cross_entropy(logits, targets, weights):
    """sum_t weights_t * cross_entropy(logits_t, target_t); logits [b, s, V], targets and weights [b, s]."""
    ce = F.cross_entropy(logits.flatten(0, 1), targets.flatten(), reduction="none")
    return (ce * weights.flatten()).sum()


def reference_model(cfg, seed: int) -> Stage:
    """The uncut model: every layer, the input embedding and the output layer in one stage."""
    return Stage(cfg, seed, 0, cfg.layers, first=True, last=True, local_vocab=True)


def build_stage(cfg, seed: int, stage: int, stage_layers: list[int], local_vocab: bool, tp=None,
                device: torch.device = torch.device("cpu")) -> nn.Module:
    """Stage `stage` of the model on `device`, built on the meta device and materialised there parameter by
    parameter with the eager build's values (vp.init); with tp (a vp.tp.context.TensorParallel), this device's part
    of it: the blocks come from the tensor mode's layer factory (vp.tp.block.shard_block), each cut from its whole
    block, materialised one at a time on the host."""
    from vp.init import materialise, one_at_a_time

    first_layer = sum(stage_layers[:stage])
    first, last = stage == 0, stage == len(stage_layers) - 1
    if tp is None:
        with meta():
            built = Stage(cfg, seed, first_layer, stage_layers[stage], first, last, local_vocab)
        return materialise(built, cfg, seed, device)
    with meta():
        full = Stage(cfg, seed, first_layer, stage_layers[stage], first, last, local_vocab=False)
    host = torch.device("cpu")
    if first:
        full.pos = materialise(nn.ParameterDict({"pos": full.pos}), cfg, seed, host)["pos"]
    if last:
        materialise(full.final_norm, cfg, seed, host, "final_norm.")
    blocks = one_at_a_time(full, cfg, seed)
    if not local_vocab:  # vocabulary parallelism: the vocabulary layers are pipeline passes (vp.run)
        return TensorParallelStage(full, tp, None, None, None, blocks).to(device)
    shard = Shard.of(tp.c, tp.columns, cfg.padded_vocab_size, cfg.vocab_size)

    def rows(name):  # this device's vocabulary shard, drawn alone with the uncut model's values
        return vocab_rows(seed, name, cfg.vocab_size, shard.start, shard.start + shard.rows, cfg.hidden)

    return TensorParallelStage(full, tp, shard, rows("embed.weight") if first else None,
                               rows("head.weight") if last else None, blocks).to(device)
