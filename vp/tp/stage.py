"""A pipeline stage (vp.model.Stage) cut for one device of a tensor-parallel group, built from the full stage's
seeded parameters and the vocabulary rows of this device's shard, so the single-process model stays the reference.

Every device receives the whole micro-batch's token ids and keeps its token block (grid: sequences
[j b/(dq), (j+1) b/(dq)) with j = k*q + r; 1-D: all of them); activations between blocks stay in the mode's layout
(grid: [b/(dq), s, h/q], 1-D: [b, s, h], 1-D sequence parallel: [b, s/t, h], positions of device t). Parameter
names are the single-process ones (embed, head and pos under modules of those names), so tests and checkpoints can
match them.
"""
import torch
import torch.nn as nn

from vp.recompute import run_layers
from vp.tp.block import sequence_norm, shard_block
from vp.tp.context import TensorParallel
from vp.tp.grads import reduce_replicated
from vp.tp.layout import block, token_rows
from vp.tp.norm import GridLayerNorm
from vp.tp.sequence import SEQUENCE_REPLICATED
from vp.tp.vocab import VocabEmbedding, VocabOutput
from vp.vocab.output import Shard
from vp.wgrad import WeightGradStore


class Position(nn.Module):
    """The learned position embedding [s, h], cut to column c on a grid ([s, h/q], replicated over rows, depth)."""
    REPLICATED = {"weight": "batch"}

    def __init__(self, full: torch.Tensor, tp: TensorParallel):
        super().__init__()
        self.tp = tp
        w = block(full.detach(), tp.q, tp.c, 1) if tp.mode.grid else full.detach()
        self.weight = nn.Parameter(w.clone())
        if tp.sequence_parallel:  # whole on every device, each adding the rows of its positions
            self.REPLICATED = {"weight": SEQUENCE_REPLICATED}

    def rows(self, seq: int) -> torch.Tensor:
        """The rows of this device's `seq` positions (sequence parallel: block t of s/t of them)."""
        return self.weight[self.tp.c * seq:(self.tp.c + 1) * seq] if self.tp.sequence_parallel else self.weight[:seq]


class TensorParallelStage(nn.Module):
    def __init__(self, full: nn.Module, tp: TensorParallel, shard: Shard, embed_rows: torch.Tensor | None,
                 head_rows: torch.Tensor | None, blocks=None):
        """full: the stage built without vocabulary layers (vp.model.Stage, local_vocab=False); embed_rows and
        head_rows: this device's shard of the input embedding and output weight (first and last stage), or None
        under vocabulary parallelism, where the vocabulary layers are pipeline passes (vp.vocab) and the first
        stage takes the summed embedding's block, the last returns X = final_norm(x)."""
        super().__init__()
        self.tp, self.first, self.last = tp, full.first, full.last
        self.embed = self.head = None
        if self.first:
            self.pos = Position(full.pos, tp)
            if embed_rows is not None:
                self.embed = VocabEmbedding(embed_rows, shard, tp)
        # blocks: (name, whole block) of full's layers, by default full's own (vp.init.one_at_a_time: materialised
        # one at a time from a meta stage, so that the whole stage is never held)
        self.layers = nn.ModuleDict({name: shard_block(b, tp) for name, b in blocks or full.layers.items()})
        self.recompute = full.recompute  # vp.recompute
        if self.last:
            self.final_norm = GridLayerNorm(full.final_norm, tp) if tp.mode.grid else sequence_norm(full.final_norm, tp)
            if head_rows is not None:
                self.head = VocabOutput(head_rows, shard, tp)

    def local(self, t: torch.Tensor) -> torch.Tensor:
        """This device's sequences of a whole micro-batch tensor [b, ...]."""
        return token_rows(t, self.tp.batch_blocks, self.tp.token_block)

    def forward(self, x, wgrad: WeightGradStore | None = None):
        """x: the micro-batch's token ids [b, s] (first stage with its embedding), else this device's activation
        block (on a first stage without one: the block of the summed embedding)."""
        if self.first:
            x = self.embed(self.local(x)) if self.embed is not None else x
            x = x + self.pos.rows(x.shape[1])
        x = run_layers(self.layers.values(), x, wgrad, self.recompute)
        return self.final_norm(x) if self.last else x

    def loss(self, x, targets, weights, wgrad: WeightGradStore | None = None):
        """Weighted cross-entropy of this device's sequences (targets, weights: the whole micro-batch's [b, s])."""
        return self.head(x, self.local(targets), self.local(weights), wgrad)

    def reduce_grads(self):
        """Once per iteration, before the optimizer step: gradients of replicated parameters (vp.tp.grads)."""
        reduce_replicated([self], self.tp)

    def total_loss(self, loss: torch.Tensor) -> torch.Tensor:
        """The micro-batches' loss over every token block (a grid device holds its block's share)."""
        return self.tp.all_reduce(loss.detach().clone().reshape(1), "batch")[0]
