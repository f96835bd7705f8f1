"""Sequence parallelism for 1-D tensor parallelism (Korthikanti et al. 2022, "Reducing Activation Recomputation in
Large Transformer Models", arXiv 2205.05198), as Megatron-LM's sequence_parallel.

Outside the column-/row-parallel pairs (LayerNorms, residual additions, the position embedding, the final LayerNorm)
device t of tp holds positions [t s/tp, (t+1) s/tp) of every sequence of the micro-batch: x [b, s/t, h], not the
whole [b, s, h] every device of plain 1-D holds. Megatron's f / g pair becomes g / g-bar:
  g      before a column-parallel linear: all-gather along the sequence, [b, s/t, h] -> [b, s, h];
         backward: reduce-scatter of the input gradient along the sequence (in place of f's all-reduce)
  g-bar  after a row-parallel linear: reduce-scatter of the partial outputs, [b, s, h] -> [b, s/t, h];
         backward: all-gather of the output gradient (in place of g's all-reduce)
A ring all-reduce is a reduce-scatter then an all-gather: the bytes on the wire are the same, in twice as many
collectives. The column-parallel linear keeps only its input's shard for backward and gathers it again for the
weight gradient (Megatron does so too), so that what a layer saves is 1/t of plain 1-D's LayerNorm and linear-input
activations; under a split backward (V-Half) that gather runs in W with the weight-gradient GEMM.
Parameters applied to a sequence shard (LayerNorm gamma and beta, the row-parallel biases, the position embedding)
get this device's positions' share of their gradient: they are REPLICATED over "tp" and vp.tp.grads sums them once
per iteration, after the data-parallel reduction (Megatron's all-reduce of its sequence_parallel parameters).
"""
import torch
import torch.nn.functional as F

from vp.tp.context import TensorParallel
from vp.tp.layout import block
from vp.wgrad import WeightGradStore, _accumulate, _grad_weight, compute_dtype, compute_weight

SEQUENCE_REPLICATED = "tp"  # the channel over which a sequence-sharded parameter's gradient is summed


def gather_sequence(x: torch.Tensor, tp: TensorParallel, channel: str) -> torch.Tensor:
    """[b, s/t, *] on each device of the channel -> [b, s, *] (all_gather_into_tensor through vp.comm)."""
    parts = tp.all_gather(x.contiguous(), channel)  # [t, b, s/t, *]
    return parts.movedim(0, 1).reshape(x.shape[0], -1, *x.shape[2:])


def scatter_sequence(x: torch.Tensor, tp: TensorParallel, channel: str) -> torch.Tensor:
    """Partial [b, s, *] of the devices of the channel, summed: this device's positions [b, s/t, *]
    (reduce_scatter_tensor through vp.comm)."""
    b, s = x.shape[:2]
    parts = x.reshape(b, tp.q, s // tp.q, *x.shape[2:]).movedim(1, 0).contiguous()  # [t, b, s/t, *]
    return tp.reduce_scatter(parts, channel)


def sequence_block(x: torch.Tensor, tp: TensorParallel) -> torch.Tensor:
    """[b, s, *] -> this device's positions [b, s/t, *], no communication."""
    return block(x, tp.q, tp.c, 1)


class _ScatterToSequence(torch.autograd.Function):
    """g-bar. Forward: reduce-scatter of the partial [b, s, h] along the sequence over tp. Backward: all-gather."""

    @staticmethod
    def forward(ctx, x, tp):
        ctx.tp = tp
        return scatter_sequence(x, tp, "tp")

    @staticmethod
    def backward(ctx, grad):
        return gather_sequence(grad, ctx.tp, "tp"), None


def scatter_to_sequence(x: torch.Tensor, tp: TensorParallel) -> torch.Tensor:
    return _ScatterToSequence.apply(x, tp)


class _GatherLinear(torch.autograd.Function):
    """g and a column-parallel linear: y = gather(x) W_t^T + b_t, x [b, s/t, K] -> y [b, s, N/t].
    Backward: grad x = reduce-scatter of grad y W_t along the sequence; grad W_t = grad y^T gather(x) (gathered
    again: the shard is what is saved), now or, given a WeightGradStore, in the W pass."""

    @staticmethod
    def forward(ctx, x, weight, bias, tp, store):
        dtype = compute_dtype(x) or x.dtype
        x = x.to(dtype)
        ctx.save_for_backward(x)  # the shard [b, s/t, K], in the compute dtype
        ctx.weight, ctx.tp, ctx.store = weight, tp, store
        return F.linear(gather_sequence(x, tp, "tp"), compute_weight(weight, dtype), bias.to(dtype))

    @staticmethod
    def backward(ctx, grad_out):
        (x,), weight, tp = ctx.saved_tensors, ctx.weight, ctx.tp
        grad_out = grad_out.to(x.dtype)  # [b, s, N/t]
        grad_x = scatter_sequence(grad_out @ compute_weight(weight, x.dtype), tp, "tp")  # [b, s/t, K]
        grad_b = grad_out.reshape(-1, grad_out.shape[-1]).sum(0, dtype=weight.dtype)
        if ctx.store is None:
            return grad_x, _grad_weight(gather_sequence(x, tp, "tp"), grad_out).to(weight.dtype), grad_b, None, None
        ctx.store.defer(lambda: _accumulate(weight, _grad_weight(gather_sequence(x, tp, "tp"), grad_out)))
        return grad_x, None, grad_b, None, None


def gather_linear(x, weight, bias, tp: TensorParallel, store: WeightGradStore | None = None):
    return _GatherLinear.apply(x, weight, bias, tp, store)
