"""The three SUMMA products on one depth layer of a [q, q, d] grid, as q-step loops (docs/tensor-parallel.md;
Optimus / Tesseract).

Blocks: device P[r, c, k] holds A[j, c] of an activation (j = k*q + r: its token block) and B[r, c] of a weight,
C comes out in the same layout. ROW (index = column) and COL (index = row) are the device's grid row and column
within its depth layer; nothing crosses depth layers here (the DEP all-reduce of weight gradients is vp.tp.grads).

  ab    C = A B     (forward):     step t: A[j, t] broadcast over ROW from column t, B[t, c] over COL from row t;
                                   C[j, c] += A[j, t] B[t, c]
  abt   C = A B^T   (grad of X):   step t: B[t, c] broadcast over COL from row t; partial A[j, c] B[t, c]^T is
                                   reduced over ROW to column t, which keeps C[j, t]
  atb   C = A^T B   (grad of W):   step t: A[j, t] broadcast over ROW from column t; partial A[j, t]^T B[j, c] is
                                   reduced over COL to row t, which keeps C[t, c] (this depth layer's share)
The broadcasts of step t+1 are started before step t's GEMM (_blocks) and each step's reduce starts as soon as
its partial is computed (_reduced), so the next blocks move while this step computes. Per product each device is
the root of one broadcast per channel and takes part in q reduces.
"""
import torch

from vp.tp.context import TensorParallel


def _blocks(tp: TensorParallel, mine: torch.Tensor, channel: str, owner: int):
    """Yield step t's block, broadcast over `channel` from index t, for t = 0..q-1; step t+1's broadcast is
    started before step t's block is handed out. owner: this device's index in the channel."""
    def fetch(t):
        buf = mine.contiguous() if owner == t else torch.empty_like(mine, memory_format=torch.contiguous_format)
        return buf, tp.broadcast_async(buf, t, channel)

    nxt = fetch(0)
    for t in range(tp.q):
        block, work = nxt
        if t + 1 < tp.q:  # the next step's block travels while this step multiplies
            nxt = fetch(t + 1)
        work.wait()
        yield block


def _reduced(tp: TensorParallel, partials, channel: str, keep: int) -> torch.Tensor:
    """Reduce step t's partial over `channel` to index t, each started as soon as it is computed (the generator
    computes step t+1's partial after step t's reduce began); this device keeps the sum sent to it, index keep."""
    reduces = [(partial, tp.reduce_async(partial, t, channel)) for t, partial in enumerate(partials)]
    for _, work in reduces:
        work.wait()
    return reduces[keep][0]


def ab(a: torch.Tensor, b: torch.Tensor, tp: TensorParallel) -> torch.Tensor:
    """a: A[j, c] [m, K/q], b: B[r, c] [K/q, N/q] -> C[j, c] [m, N/q]."""
    out = torch.zeros(a.shape[0], b.shape[1], dtype=a.dtype, device=a.device)  # [m, N/q]
    for a_t, b_t in zip(_blocks(tp, a, "row", tp.c), _blocks(tp, b, "col", tp.r)):
        out.addmm_(a_t, b_t)  # A[j, t] [m, K/q] @ B[t, c] [K/q, N/q]
    return out


def abt(a: torch.Tensor, b: torch.Tensor, tp: TensorParallel) -> torch.Tensor:
    """a: A[j, c] [m, N/q], b: B[r, c] [K/q, N/q] -> C[j, c] [m, K/q] with C = A B^T."""
    # step t: A[j, c] [m, N/q] @ B[t, c]^T [N/q, K/q] is column c's share of C[j, t]
    return _reduced(tp, (a @ b_t.t() for b_t in _blocks(tp, b, "col", tp.r)), "row", tp.c)


def atb(a: torch.Tensor, b: torch.Tensor, tp: TensorParallel) -> torch.Tensor:
    """a: A[j, c] [m, K/q], b: B[j, c] [m, N/q] -> C[r, c] [K/q, N/q] with C = A^T B over this depth layer's rows."""
    # step t: A[j, t]^T [K/q, m] @ B[j, c] [m, N/q] is row r's share of C[t, c]
    return _reduced(tp, (a_t.t() @ b for a_t in _blocks(tp, a, "row", tp.c)), "col", tp.r)
