"""LayerNorm over a hidden dimension split q ways (grid layouts): device P[r, c, k] holds x [n, h/q] and the
gamma, beta blocks [h/q] of column c.

  forward   sums of x and x^2 over the local hidden block, all-reduced over ROW as one [2, n] tensor:
            mean = sum x / h,  var = sum x^2 / h - mean^2,  x^ = (x - mean) / sqrt(var + eps),  y = x^ gamma + beta
  backward  g = grad y * gamma; sums of g and g x^ all-reduced over ROW as one [2, n] tensor:
            grad x = (g - sum g / h - x^ sum(g x^) / h) / sqrt(var + eps)
            grad gamma = sum over rows of grad y x^,  grad beta = sum over rows of grad y   (local rows only)
gamma and beta are replicated over rows and depth: vp.tp.grads sums their gradients over the batch group.
1-D keeps the model's whole nn.LayerNorm on every device (its input is replicated).
"""
import torch
import torch.nn as nn

from vp.tp.context import TensorParallel
from vp.tp.layout import block


class _GridLayerNorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, gamma, beta, hidden, eps, tp):
        xf = x.float()  # statistics in fp32 whatever the compute dtype
        sums = torch.stack([xf.sum(-1), (xf * xf).sum(-1)])  # [2, n]
        sums = tp.all_reduce(sums, "row") / hidden
        mean, var = sums[0], sums[1] - sums[0] ** 2  # [n]
        rstd = torch.rsqrt(var + eps)[:, None]  # [n, 1]
        xhat = (xf - mean[:, None]) * rstd  # [n, h/q]
        ctx.save_for_backward(xhat, rstd, gamma)
        ctx.hidden, ctx.tp, ctx.dtype = hidden, tp, x.dtype
        return (xhat * gamma + beta).to(x.dtype)

    @staticmethod
    def backward(ctx, grad_y):
        xhat, rstd, gamma = ctx.saved_tensors
        grad_y = grad_y.float()
        g = grad_y * gamma  # [n, h/q]
        sums = torch.stack([g.sum(-1), (g * xhat).sum(-1)])  # [2, n]
        sums = ctx.tp.all_reduce(sums, "row") / ctx.hidden
        grad_x = (g - sums[0][:, None] - xhat * sums[1][:, None]) * rstd
        grad_gamma, grad_beta = (grad_y * xhat).sum(0).to(gamma.dtype), grad_y.sum(0).to(gamma.dtype)
        return grad_x.to(ctx.dtype), grad_gamma, grad_beta, None, None, None


class GridLayerNorm(nn.Module):
    """The column-c blocks of a full nn.LayerNorm's gamma and beta."""
    REPLICATED = {"weight": "batch", "bias": "batch"}

    def __init__(self, full: nn.LayerNorm, tp: TensorParallel):
        super().__init__()
        self.tp, self.hidden, self.eps = tp, full.normalized_shape[0], full.eps
        self.weight = nn.Parameter(block(full.weight.detach(), tp.q, tp.c, 0).clone())  # [h/q]
        self.bias = nn.Parameter(block(full.bias.detach(), tp.q, tp.c, 0).clone())  # [h/q]

    def forward(self, x):
        """x [..., h/q] -> [..., h/q]"""
        y = _GridLayerNorm.apply(x.reshape(-1, x.shape[-1]), self.weight, self.bias, self.hidden, self.eps, self.tp)
        return y.view(x.shape)
