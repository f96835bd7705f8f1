"""Which device holds which block: slicing full tensors into a device's blocks and assembling them back.
Pure tensor index maps (no communication); the layers cut their parameters with these, the tests check them.

Grid [q, q, d], device P[r, c, k], token block j = k*q + r (docs/tensor-parallel.md):
  activation X [b, s, K]  ->  X[j-th of d*q sequence blocks, :, c-th of q hidden blocks]   [b/(dq), s, K/q]
  weight W [N, K] (nn.Linear's [out, in])  ->  the block B[r, c] of B = W^T               [K/q, N/q]
  vector v [N] (bias, LayerNorm)  ->  v[c-th block], the same on every (r, k)              [N/q]
1-D, device t of tp: column-parallel W [N, K] -> rows t-th block [N/tp, K]; row-parallel -> columns [N, K/tp].
The fused QKV projection is first permuted head-major (head_major_qkv), so each column block holds the q, k and v
rows of whole heads and attention needs no communication.
"""
import torch


def block(t: torch.Tensor, parts: int, index: int, dim: int) -> torch.Tensor:
    """The index-th of `parts` equal blocks of t along dim."""
    assert t.shape[dim] % parts == 0, f"dimension {dim} of {tuple(t.shape)} does not split {parts} ways"
    return t.chunk(parts, dim)[index]


def head_major(heads: int, head_dim: int, parts: int) -> torch.Tensor:
    """Row order of a fused [3 * heads * head_dim, ...] QKV tensor (rows [part, head, dim], as the single-process
    model views them) that makes its `parts` equal row blocks hold whole heads: block c = [q, k, v] of heads
    c*heads/parts .. (c+1)*heads/parts - 1, each [heads/parts, head_dim]."""
    assert heads % parts == 0, f"{heads} heads do not split {parts} ways"
    rows = torch.arange(3 * heads * head_dim).view(3, parts, heads // parts, head_dim)  # [qkv, part, head, dim]
    return rows.transpose(0, 1).reshape(-1)


def head_major_qkv(t: torch.Tensor, heads: int, parts: int) -> torch.Tensor:
    """A QKV weight [3h, h] or bias [3h] in head-major order for `parts` column blocks."""
    return t[head_major(heads, t.shape[0] // (3 * heads), parts)]


def grid_weight(w: torch.Tensor, q: int, r: int, c: int) -> torch.Tensor:
    """W [N, K] -> block B[r, c] of B = W^T: [K/q, N/q] (the same on every depth layer)."""
    return block(block(w, q, c, 0), q, r, 1).t().contiguous()


def grid_activation(x: torch.Tensor, q: int, depth: int, r: int, c: int, k: int) -> torch.Tensor:
    """x [b, ..., K] -> X[k*q + r, c]: [b/(dq), ..., K/q]."""
    return block(block(x, depth * q, k * q + r, 0), q, c, -1).contiguous()


def token_rows(x: torch.Tensor, blocks: int, j: int) -> torch.Tensor:
    """The sequences of token block j of `blocks`: x[b] -> x[b/blocks]."""
    return block(x, blocks, j, 0)


# -- the inverse maps (assembling what the devices hold; tests and checkpoints) ---------------------------
def assemble_grid_weight(blocks: dict[tuple[int, int], torch.Tensor], q: int) -> torch.Tensor:
    """{(r, c): [K/q, N/q]} -> W [N, K]."""
    bt = torch.cat([torch.cat([blocks[(r, c)] for c in range(q)], 1) for r in range(q)], 0)  # W^T [K, N]
    return bt.t().contiguous()


def assemble_grid_activation(blocks: dict[tuple[int, int, int], torch.Tensor], q: int, depth: int) -> torch.Tensor:
    """{(r, c, k): [b/(dq), ..., K/q]} -> x [b, ..., K]."""
    rows = [torch.cat([blocks[(j % q, c, j // q)] for c in range(q)], -1) for j in range(depth * q)]
    return torch.cat(rows, 0)
