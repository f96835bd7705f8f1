"""The vocabulary layers inside a tensor-parallel group: the input embedding and the output layer with softmax
cross-entropy, the vocabulary split over the group's columns (vp.vocab.output.Shard: shard c of q; 1-D: t of t).

Input embedding, rows E_c [V/q, h] (a grid replicates them over rows and depth):
  1-D   forward: local rows (zero for ids outside the shard), all-reduce over tp ([b, s, h]); backward: none
  grid  forward: local rows [b/(dq), s, h], reduce-scatter over ROW along the hidden -> [b/(dq), s, h/q];
        backward: all-gather of the [b/(dq), s, h/q] gradient over ROW, rows of the shard's ids accumulate it
Output layer + cross-entropy, rows W_c [V/q, h], X the final LayerNorm's output:
  forward   grid: all-gather of X [n, h/q] over ROW -> [n, h] (1-D: X is whole); logits Y_c = X W_c^T [n, V/q];
            max all-reduced over ROW; (sum exp(Y_c - m), target logit) all-reduced over ROW as one [2, n]
            loss = sum_t w_t (log s_t + m_t - Y_t,y_t)   over this device's rows (the same on its whole ROW)
  backward  grad Y_c = w (softmax(Y)_c - onehot_c); grad W_c = grad Y_c^T X; grad X = sum_c grad Y_c W_c:
            grid: reduce-scatter over ROW along the hidden -> [n, h/q]; 1-D: all-reduce over tp -> [n, h]
1-D with sequence parallelism (vp.tp.sequence): the embedding's sum is reduce-scattered along the sequence ([b, s/t, h]
per device; backward: all-gather of its gradient); the output layer all-gathers X along the sequence and
reduce-scatters grad X (in place of the all-reduce).
Batch rows stay on their device: no reduction crosses rows. The statistics channel is the ROW group here; with
vocabulary parallelism over pipeline ranks x columns (vp.mesh "vocab" axis) it becomes that wider group.
"""
import torch
import torch.distributed as dist
import torch.nn as nn

from vp.tp.context import TensorParallel
from vp.tp.sequence import gather_sequence, scatter_sequence
from vp.vocab.output import Shard, check_inputs
from vp.wgrad import WeightGradStore, accumulated, compute_dtype, compute_weight


def _gather_hidden(x: torch.Tensor, tp: TensorParallel) -> torch.Tensor:
    """This device's block [b', s', h'] -> the whole [b', s, h] of its sequences: a grid gathers the hidden over ROW
    ([b', s, h/q] each), sequence parallelism the positions over the 1-D row ([b, s/t, h] each); plain 1-D has it."""
    if tp.sequence_parallel:
        return gather_sequence(x, tp, "row")
    if not tp.mode.grid:
        return x
    parts = tp.all_gather(x.contiguous(), "row")  # [q, ..., h/q]
    return parts.movedim(0, -2).reshape(*x.shape[:-1], -1)


def _sum_hidden(x: torch.Tensor, tp: TensorParallel) -> torch.Tensor:
    """Partial [b', s, h] summed over ROW, this device's block of the sum kept: a grid its column's [b', s, h/q]
    (reduce-scatter), sequence parallelism its positions [b, s/t, h] (reduce-scatter), plain 1-D all of it."""
    if tp.sequence_parallel:
        return scatter_sequence(x, tp, "row")
    if not tp.mode.grid:
        return tp.all_reduce(x.contiguous(), "row")
    parts = x.view(*x.shape[:-1], tp.q, -1).movedim(-2, 0).contiguous()  # [q, ..., h/q]
    return tp.reduce_scatter(parts, "row")


class _Embedding(torch.autograd.Function):
    @staticmethod
    def forward(ctx, weight, ids, shard, tp):
        local, inside = shard.local_targets(ids)
        ctx.save_for_backward(local, inside)
        ctx.weight, ctx.tp = weight, tp
        rows = weight[local] * inside[..., None].to(weight.dtype)  # [b, s, h]; zero outside the shard
        return _sum_hidden(rows, tp)

    @staticmethod
    def backward(ctx, grad):
        local, inside = ctx.saved_tensors
        grad = _gather_hidden(grad, ctx.tp)  # [b, s, h]
        w = ctx.weight
        grad_w = torch.zeros_like(w).index_add_(0, local.flatten(), (grad.to(w.dtype) * inside[..., None])
                                                .reshape(-1, grad.shape[-1]))  # masked: no host sync
        return grad_w, None, None, None


class VocabEmbedding(nn.Module):
    REPLICATED = {"weight": "batch"}  # the same rows on every (r, k) of a grid

    def __init__(self, rows: torch.Tensor, shard: Shard, tp: TensorParallel):
        super().__init__()
        self.shard, self.tp = shard, tp
        self.weight = nn.Parameter(rows)  # [V/q, h]

    def forward(self, ids):
        """ids [b', s] of this device's sequences -> [b', s, h/q] (1-D: [b, s, h])."""
        check_inputs(self.shard, self.weight, None, ids)
        return _Embedding.apply(self.weight, ids, self.shard, self.tp)


class _VocabLoss(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, targets, weights, shard, tp, store):
        xf = _gather_hidden(x, tp)  # [b', s, h]
        whole = xf.shape
        xf = xf.reshape(-1, whole[-1])  # [n, h]
        dtype = compute_dtype(xf) or xf.dtype  # the GEMMs' dtype, forward and backward (docs/gpu-path.md, precision)
        xf = xf.to(dtype)
        y = (xf @ compute_weight(weight, dtype).t()).float()  # [n, V/q]
        if shard.valid < shard.rows:
            y[:, shard.valid:] = float("-inf")  # padding rows: no probability, no gradient
        m = tp.all_reduce(y.max(-1).values.clamp_min(torch.finfo(y.dtype).min), "row", dist.ReduceOp.MAX)  # [n]
        e = torch.exp(y - m[:, None])  # [n, V/q]
        local, inside = shard.local_targets(targets)
        t = torch.where(inside, y.gather(1, local[:, None])[:, 0], torch.zeros_like(m))  # target logit or 0
        s, t = tp.all_reduce(torch.stack([e.sum(-1), t]), "row").unbind(0)  # [n] each
        ctx.save_for_backward(xf, e.div_(s[:, None]), weights, local, inside)
        ctx.weight, ctx.tp, ctx.store, ctx.x_dtype, ctx.whole = weight, tp, store, x.dtype, whole
        return (weights * (torch.log(s) + m - t)).sum()  # loss = sum_t w_t (log s + m - Y_t,y_t)

    @staticmethod
    def backward(ctx, grad_loss):
        xf, probs, weights, local, inside = ctx.saved_tensors
        w = ctx.weight
        grad_y = probs  # softmax restricted to this shard, in place: [n, V/q]
        grad_y.scatter_add_(1, local[:, None], -inside[:, None].to(grad_y.dtype))  # masked: no host sync
        grad_y.mul_((weights * grad_loss)[:, None])  # w (softmax - onehot)
        grad_x = (grad_y.to(xf.dtype) @ compute_weight(w, xf.dtype)).to(ctx.x_dtype)  # [n, h]
        grad_x = _sum_hidden(grad_x.view(ctx.whole), ctx.tp)

        def weight_grad():  # [V/q, h]
            g = (grad_y.t().to(xf.dtype) @ xf).to(w.dtype)
            w.grad = g if w.grad is None else w.grad.add_(g)
            accumulated(w)

        if ctx.store is None:
            return grad_x, (grad_y.t().to(xf.dtype) @ xf).to(w.dtype), None, None, None, None, None
        ctx.store.defer(weight_grad, grad_y, xf)
        return grad_x, None, None, None, None, None, None


class VocabOutput(nn.Module):
    REPLICATED = {"weight": "batch"}

    def __init__(self, rows: torch.Tensor, shard: Shard, tp: TensorParallel):
        super().__init__()
        self.shard, self.tp = shard, tp
        self.weight = nn.Parameter(rows)  # [V/q, h]

    def forward(self, x, targets, weights, wgrad: WeightGradStore | None = None):
        """x [b', s, h/q] (1-D: [b, s, h], sequence parallel: [b, s/t, h]), targets and loss weights [b', s] of
        this device's sequences -> sum_t w_t cross_entropy_t over them."""
        check_inputs(self.shard, self.weight, None, targets)
        return _VocabLoss.apply(x, self.weight, targets.reshape(-1), weights.reshape(-1), self.shard, self.tp, wgrad)
