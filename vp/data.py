"""Deterministic synthetic data: the same token streams on every rank and every method, from the seed.

Each sequence is an arithmetic progression modulo the vocabulary (random start and step), so a model can
learn it from two tokens of context; the first target of each sequence (whose step is still unknown)
does not count towards the loss (mask 0), which exercises loss masking on every run.
"""
import zlib

import torch


def microbatch(seed: int, iteration: int, index: int, batch: int, seq_len: int, vocab_size: int):
    """-> ids [b, s], targets [b, s] (next tokens), mask [b, s] (1 where the token counts)."""
    gen = torch.Generator().manual_seed(zlib.crc32(f"{seed}/data/{iteration}/{index}".encode()))
    start = torch.randint(0, vocab_size, (batch, 1), generator=gen)
    step = torch.randint(1, max(2, min(vocab_size, 64)), (batch, 1), generator=gen)
    tokens = (start + step * torch.arange(seq_len + 1)) % vocab_size
    mask = torch.ones(batch, seq_len)
    mask[:, 0] = 0.0
    return tokens[:, :-1], tokens[:, 1:], mask


def loss_weights(mask: torch.Tensor, microbatches: int) -> torch.Tensor:
    """Gradient of the iteration loss (mean over microbatches of each one's masked token mean) per token."""
    return mask / (mask.sum().clamp_min(1.0) * microbatches)
