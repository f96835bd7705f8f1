"""Activation recomputation (--recompute, RunConfig.recompute), by torch.utils.checkpoint (non-reentrant: the
backward graph is the forward's own, so the split backward's B and W passes, the tensor-parallel collectives and
the memory meter's hooks see the same functions; only the saved tensors are made again).

none       every layer keeps what its backward needs
selective  the attention core (softmax(QK^T / sqrt(d)) V) is recomputed in backward from its q, k, v, Megatron's
           choice: the core's own saved state (the s^2 probabilities of non-fused attention) is not kept
full       each transformer layer keeps only its input; its forward runs again inside its B, which then makes the
           tensors the layer's backward (and a later W) needs
"""
import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

MODES = ("none", "selective", "full")


def run_layers(blocks, x, wgrad, mode: str):
    """x through each block (block(x, wgrad)); under full recomputation each block as one checkpointed region."""
    for block in blocks:
        if mode == "full" and torch.is_grad_enabled():
            x = checkpoint(block, x, wgrad, use_reentrant=False)
        else:
            x = block(x, wgrad)
    return x


def attention(q, k, v, mode: str):
    """Causal scaled dot-product attention of q, k, v [b, heads, s, dh]; recomputed in backward when selective."""
    if mode == "selective" and torch.is_grad_enabled():
        return checkpoint(F.scaled_dot_product_attention, q, k, v, is_causal=True, use_reentrant=False)
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)
