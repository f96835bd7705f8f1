"""A transformer block (the single-process vp.model.Block) cut for a tensor-parallel group, from the full block
built with the model's seeds, so every device holds slices of the same values as the reference.

MegatronBlock (1-D, device t of t):  x [b, s, h] replicated
  x + g(proj_row(attn(qkv_col(f(ln1(x)))))) ; then the same with fc1_col, gelu, fc2_row
  sequence parallel: x [b, s/t, h], positions of device t; x + g-bar(proj_row(attn(qkv_col(g(ln1(x)))))), the
  LayerNorms on the shard (vp.tp.sequence)
GridBlock ([q, q, d], device P[r, c, k]):  x [b/(dq), s, h/q] = X[k*q + r, c]
  x + proj(attn(qkv(ln1(x)))) ; x + fc2(gelu(fc1(ln2(x))))   with grid LayerNorms and SUMMA linears
In both, QKV is permuted head-major so each device computes attention for whole heads (heads % q == 0).
"""
import copy

import torch.nn as nn
import torch.nn.functional as F

from vp.tp.attention import local_attention
from vp.tp.context import TensorParallel
from vp.tp.layout import head_major
from vp.tp.linear import GridLinear
from vp.tp.megatron import ColumnLinear, RowLinear, copy_to_tp
from vp.tp.norm import GridLayerNorm
from vp.tp.sequence import SEQUENCE_REPLICATED


class MegatronBlock(nn.Module):
    def __init__(self, full: nn.Module, tp: TensorParallel):
        super().__init__()
        hidden = full.qkv.weight.shape[1]
        self.tp, self.heads = tp, full.heads // tp.q  # heads of this device
        rows = head_major(full.heads, hidden // full.heads, tp.q)
        self.ln1, self.ln2 = sequence_norm(full.ln1, tp), sequence_norm(full.ln2, tp)  # replicated: [h]
        self.qkv = ColumnLinear(full.qkv, tp, rows)  # [3h/t, h]
        self.proj = RowLinear(full.proj, tp)  # [h, h/t]
        self.fc1 = ColumnLinear(full.fc1, tp)  # [ffn/t, h]
        self.fc2 = RowLinear(full.fc2, tp)  # [h, ffn/t]
        self.recompute = full.recompute  # vp.recompute

    def forward(self, x, wgrad=None):
        """x [b, s, h] -> [b, s, h], the same on every device (sequence parallel: [b, s/t, h], this device's
        positions)."""
        att = local_attention(self.qkv(self._f(self.ln1(x)), wgrad), self.heads, self.recompute)  # [b, s, h/t]
        x = x + self.proj(att, wgrad)
        return x + self.fc2(F.gelu(self.fc1(self._f(self.ln2(x)), wgrad)), wgrad)

    def _f(self, x):
        """f before a column-parallel linear; under sequence parallelism the linear gathers (g) itself."""
        return x if self.tp.sequence_parallel else copy_to_tp(x, self.tp)


def sequence_norm(full: nn.LayerNorm, tp: TensorParallel) -> nn.LayerNorm:
    """A whole LayerNorm for a 1-D device; applied to a sequence shard, its gradient is summed over tp."""
    norm = copy.deepcopy(full)
    if tp.sequence_parallel:
        norm.REPLICATED = {"weight": SEQUENCE_REPLICATED, "bias": SEQUENCE_REPLICATED}
    return norm


class GridBlock(nn.Module):
    def __init__(self, full: nn.Module, tp: TensorParallel):
        super().__init__()
        hidden = full.qkv.weight.shape[1]
        self.heads = full.heads // tp.q
        rows = head_major(full.heads, hidden // full.heads, tp.q)
        self.ln1, self.ln2 = GridLayerNorm(full.ln1, tp), GridLayerNorm(full.ln2, tp)  # [h/q]
        self.qkv = GridLinear(full.qkv, tp, rows)  # [h/q, 3h/q]: W^T block of the head-major weight
        self.proj = GridLinear(full.proj, tp)  # [h/q, h/q]
        self.fc1 = GridLinear(full.fc1, tp)  # [h/q, ffn/q]
        self.fc2 = GridLinear(full.fc2, tp)  # [ffn/q, h/q]
        self.recompute = full.recompute  # vp.recompute

    def forward(self, x, wgrad=None):
        """x [b/(dq), s, h/q] -> the same block of the output."""
        x = x + self.proj(local_attention(self.qkv(self.ln1(x), wgrad), self.heads, self.recompute), wgrad)
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x), wgrad)), wgrad)


def shard_block(full: nn.Module, tp: TensorParallel) -> nn.Module:
    """The layer factory of a tensor mode: the full block cut for this device."""
    return (GridBlock if tp.mode.grid else MegatronBlock)(full, tp)
