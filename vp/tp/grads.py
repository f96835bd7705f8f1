"""Gradients of replicated parameters, summed once per iteration (after the last backward, before the step).

A grid device computes gradients from its own token block only, so every parameter held by several devices
gets the sum of their shares (its true gradient) by an all-reduce over the devices that hold it:
  dep    SUMMA weight blocks W[r, c]: the same block on every depth layer k; within a depth layer the atb loop
         already summed the rows of the q token blocks, so DEP completes the sum over all d*q of them
  batch  vectors cut by column only (linear biases, LayerNorm gamma/beta, the position embedding) and the
         vocabulary shards E_c, W_c: the same on every (r, k), each device summing its own rows
Bias scheme: every replica of a bias is live (each device adds its bias block to its own rows and keeps its own
copy); the batch all-reduce makes the copies' gradients, hence the copies, identical. (Colossal-AI's legacy
layers keep a live bias on row 0 only and hand the other rows zero gradients.)
1-D devices hold whole activations, so their replicated parameters (row-parallel biases, LayerNorms, the position
embedding) already get identical gradients and their groups here are of one device: nothing is sent. With sequence
parallelism (vp.tp.sequence) each device applies them to its own positions only: they are REPLICATED over tp, whose
all-reduce sums the shares.
Each channel's gradients travel as one flat buffer.
"""
import torch
import torch.nn as nn

from vp.tp.context import TensorParallel


def replicated(module: nn.Module) -> dict[str, list[nn.Parameter]]:
    """channel -> the parameters whose gradients are summed over it, in a fixed order."""
    out: dict[str, list[nn.Parameter]] = {}
    for _, sub in module.named_modules():
        for name, channel in getattr(sub, "REPLICATED", {}).items():
            param = getattr(sub, name, None)
            if isinstance(param, nn.Parameter):
                out.setdefault(channel, []).append(param)
    return out


def reduce_replicated(modules: list[nn.Module], tp: TensorParallel) -> None:
    """Sum the gradients of every replicated parameter of `modules` over the devices that hold it."""
    by_channel: dict[str, list[nn.Parameter]] = {}
    for m in modules:
        for channel, params in replicated(m).items():
            by_channel.setdefault(channel, []).extend(params)
    for channel in sorted(by_channel):
        params = [p for p in by_channel[channel] if p.grad is not None]  # the same on every device: one graph
        if tp.size(channel) == 1 or not params:
            continue
        flat = tp.all_reduce(torch.cat([p.grad.reshape(-1) for p in params]), channel)
        for p, g in zip(params, flat.split([p.numel() for p in params])):
            p.grad.copy_(g.view_as(p))
