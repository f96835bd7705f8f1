"""Causal self-attention with whole heads and whole sequences on every device: no communication.

The fused QKV projection's output columns are laid out head-major per device (vp.tp.layout.head_major): the
device of column c (1-D: device t) gets [q, k, v] of its heads c*H/q .. (c+1)*H/q - 1, and its attention output
[., H/q * head_dim] is exactly column block c of the single-process output, the layout the output projection
expects. On a grid each device holds whole sequences of its token block, so the causal mask needs nothing else.
"""
import torch

from vp.recompute import attention


def local_attention(qkv: torch.Tensor, heads: int, recompute: str = "none") -> torch.Tensor:
    """qkv [b, s, 3 * heads * dh] (this device's heads, head-major) -> [b, s, heads * dh]; recompute: vp.recompute's
    mode (selective: the core recomputed in backward)."""
    b, s, width = qkv.shape
    dh = width // (3 * heads)
    q, k, v = qkv.view(b, s, 3, heads, dh).permute(2, 0, 3, 1, 4)  # each [b, heads, s, dh]
    att = attention(q, k, v, recompute)  # [b, heads, s, dh]
    return att.transpose(1, 2).reshape(b, s, heads * dh)
