"""The input embedding split over p ranks along the vocabulary (arXiv 2411.05288, section 4.3).

IF: each rank looks up the token ids that fall in its rows (other tokens give zero rows); a SUM reduce to
    the first stage's rank yields exactly embedding(ids).
IB: the first stage's gradient of that embedding is sent to every rank, and each rank adds it to the rows
    of its own tokens: grad W_i[id - start] += grad_t for every token t whose id is in shard i.
"""
import torch

from vp.vocab.output import Shard, check_inputs
from vp.wgrad import accumulated


def local_lookup(shard: Shard, weight: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """ids [b, s] -> [b, s, h]: rows of this shard, zero for tokens outside it."""
    check_inputs(shard, weight, None, ids)
    with torch.no_grad():
        local, inside = shard.local_targets(ids)
        return weight[local] * inside[..., None].to(weight.dtype)


def accumulate_grad(shard: Shard, weight: torch.Tensor, ids: torch.Tensor, grad: torch.Tensor):
    """grad [b, s, h] of the summed embedding -> weight.grad rows of this shard's tokens."""
    with torch.no_grad():
        local, inside = shard.local_targets(ids.flatten())
        if weight.grad is None:
            weight.grad = torch.zeros_like(weight)
        # every token, zero where outside the shard: boolean indexing would wait for the device (a host sync)
        rows = grad.reshape(-1, grad.shape[-1]).to(weight.dtype) * inside[:, None]
        weight.grad.index_add_(0, local, rows)
    accumulated(weight)
