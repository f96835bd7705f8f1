"""1-D tensor parallelism (Megatron-LM): a column-parallel linear followed by a row-parallel one, with two
conjugate identity/all-reduce ops around them, on the "tp" channel of t devices.

  y = x W^T, W [N, K]:  column-parallel: device i holds rows W_i [N/t, K], gets the whole x, yields y_i [., N/t];
                        row-parallel:    device i holds columns W_i [N, K/t], gets x_i [., K/t], yields a partial
                                         x_i W_i^T that the all-reduce sums; the bias is added once, after it.
Per transformer layer: two all-reduces of [b, s, h] forward (after the attention and MLP row-parallel linears)
and two backward (before the QKV and fc1 column-parallel linears). Weight gradients are local: every device sees
the whole batch, so nothing is reduced at the end of an iteration (replicated LayerNorms, row-parallel biases
and the position embedding get the same gradient on every device, from identical all-reduced inputs).
With sequence parallelism (tp.sequence_parallel, vp.tp.sequence) the column-parallel linear all-gathers its input
along the sequence and the row-parallel one reduce-scatters its output: the row-parallel bias is then added to a
sequence shard, and its gradient is summed over tp once per iteration.
"""
import torch
import torch.nn as nn

from vp.tp.context import TensorParallel
from vp.tp.layout import block
from vp.tp.sequence import SEQUENCE_REPLICATED, gather_linear, scatter_to_sequence
from vp.wgrad import WeightGradStore, linear


class _CopyToTP(torch.autograd.Function):
    """Megatron's f. Forward: identity. Backward: all-reduce of the input gradient over tp ([b, s, h])."""

    @staticmethod
    def forward(ctx, x, tp):
        ctx.tp = tp
        return x

    @staticmethod
    def backward(ctx, grad):
        return ctx.tp.all_reduce(grad.contiguous(), "tp"), None


class _ReduceFromTP(torch.autograd.Function):
    """Megatron's g. Forward: all-reduce of the partial outputs over tp ([b, s, h]). Backward: identity."""

    @staticmethod
    def forward(ctx, x, tp):
        return tp.all_reduce(x.contiguous(), "tp")

    @staticmethod
    def backward(ctx, grad):
        return grad, None


def copy_to_tp(x, tp: TensorParallel):
    return _CopyToTP.apply(x, tp)


def reduce_from_tp(x, tp: TensorParallel):
    return _ReduceFromTP.apply(x, tp)


class ColumnLinear(nn.Module):
    """Rows W_t [N/t, K] and bias b_t [N/t] of a full linear. Forward: x [., K] (whole, replicated) ->
    y_t [., N/t], no communication (the f op before it all-reduces the input gradient in backward). Sequence
    parallel: x [b, s/t, K] -> y_t [b, s, N/t], the all-gather (g) fused in (vp.tp.sequence.gather_linear)."""
    REPLICATED = {}  # nothing is replicated: every parameter is split over tp

    def __init__(self, full: nn.Module, tp: TensorParallel, rows: torch.Tensor | None = None):
        super().__init__()
        self.tp = tp
        w, b = full.weight.detach(), full.bias.detach()
        if rows is not None:  # a permutation of the output rows (head-major QKV)
            w, b = w[rows], b[rows]
        self.weight = nn.Parameter(block(w, tp.q, tp.c, 0).clone())  # [N/t, K]
        self.bias = nn.Parameter(block(b, tp.q, tp.c, 0).clone())  # [N/t]

    def forward(self, x, wgrad: WeightGradStore | None = None):
        if self.tp.sequence_parallel:
            return gather_linear(x, self.weight, self.bias, self.tp, wgrad)
        return linear(x, self.weight, self.bias, wgrad)


class RowLinear(nn.Module):
    """Columns W_t [N, K/t] of a full linear and its whole bias [N]. Forward: x_t [., K/t] -> all-reduced
    sum over tp of x_t W_t^T, plus the bias: [., N]. Backward: none here (the input gradient is local). Sequence
    parallel: reduce-scattered instead (g-bar), [b, s, K/t] -> [b, s/t, N] plus the bias."""
    REPLICATED = {}  # the bias is replicated, but its gradient is already the same on every device

    def __init__(self, full: nn.Module, tp: TensorParallel):
        super().__init__()
        self.tp = tp
        if tp.sequence_parallel:  # the bias sees this device's positions only: its gradient is a share
            self.REPLICATED = {"bias": SEQUENCE_REPLICATED}
        self.weight = nn.Parameter(block(full.weight.detach(), tp.q, tp.c, 1).clone())  # [N, K/t]
        self.bias = nn.Parameter(full.bias.detach().clone())  # [N]

    def forward(self, x, wgrad: WeightGradStore | None = None):
        reduce = scatter_to_sequence if self.tp.sequence_parallel else reduce_from_tp
        return reduce(linear(x, self.weight, None, wgrad), self.tp) + self.bias
