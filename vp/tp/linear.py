"""The linear layer on a [q, q, d] grid: Y = X W + b with X, Y in activation blocks and W in q x q blocks.

  forward   Y[j, c] = ab(X, W)[j, c] + b[c]                  broadcasts of X-blocks over ROW, W-blocks over COL
  backward  grad X = abt(grad Y, W)                          broadcasts of W-blocks over COL, reduces over ROW
            grad W = atb(X, grad Y), this depth layer's rows  broadcasts of X-blocks over ROW, reduces over COL
            grad b[c] = sum of grad Y[j, c] over local rows   no communication
Given a WeightGradStore, the atb loop is deferred to the W pass (split backward, V-Half). Replicated parameters
get their gradients summed once per iteration by vp.tp.grads: the weight over DEP, the bias over the batch group.
"""
import torch
import torch.nn as nn

from vp.tp import summa
from vp.tp.context import TensorParallel
from vp.tp.layout import block, grid_weight
from vp.wgrad import WeightGradStore, accumulated


def _accumulate(param: torch.Tensor, grad: torch.Tensor):
    param.grad = grad if param.grad is None else param.grad.add_(grad)
    accumulated(param)


class _GridLinear(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, tp, store):
        ctx.save_for_backward(x)
        ctx.weight, ctx.tp, ctx.store, ctx.has_bias = weight, tp, store, bias is not None
        y = summa.ab(x, weight.to(x.dtype), tp)  # [m, N/q]
        return y + bias.to(y.dtype) if bias is not None else y

    @staticmethod
    def backward(ctx, grad_y):
        (x,), weight, tp = ctx.saved_tensors, ctx.weight, ctx.tp
        grad_y = grad_y.contiguous()  # [m, N/q]
        grad_x = summa.abt(grad_y, weight.to(grad_y.dtype), tp)  # [m, K/q]
        grad_b = grad_y.sum(0).to(weight.dtype) if ctx.has_bias else None

        def weight_grad():  # [K/q, N/q]: this depth layer's share
            _accumulate(weight, summa.atb(x.to(grad_y.dtype), grad_y, tp).to(weight.dtype))

        if ctx.store is None:
            return grad_x, summa.atb(x.to(grad_y.dtype), grad_y, tp).to(weight.dtype), grad_b, None, None
        ctx.store.defer(weight_grad, x, grad_y)
        return grad_x, None, grad_b, None, None


class GridLinear(nn.Module):
    """Block W^T[r, c] [K/q, N/q] and bias block b[c] [N/q] of a full nn.Linear-style module (weight [N, K])."""
    REPLICATED = {"weight": "dep", "bias": "batch"}  # weight: same on every depth layer; bias: on every (r, k)

    def __init__(self, full: nn.Module, tp: TensorParallel, rows: torch.Tensor | None = None):
        super().__init__()
        self.tp = tp
        w, b = full.weight.detach(), full.bias.detach()
        if rows is not None:  # a permutation of the output rows (head-major QKV)
            w, b = w[rows], b[rows]
        self.weight = nn.Parameter(grid_weight(w, tp.q, tp.r, tp.c))  # [K/q, N/q]
        self.bias = nn.Parameter(block(b, tp.q, tp.c, 0).clone())  # [N/q]

    def forward(self, x, wgrad: WeightGradStore | None = None):
        """x [..., K/q] -> [..., N/q]"""
        y = _GridLinear.apply(x.reshape(-1, x.shape[-1]), self.weight, self.bias, self.tp, wgrad)
        return y.view(*x.shape[:-1], y.shape[-1])
