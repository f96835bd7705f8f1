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
The broadcasts of step t+1 are started before step t's GEMM and the reduces run asynchronously, so gloo moves
the next blocks while this step computes. Per product each device is the root of one broadcast per channel
and takes part in q reduces.
"""
import torch

from vp.tp.context import TensorParallel


def _fetch(tp: TensorParallel, mine: torch.Tensor, t: int, channel: str, owner: int):
    """Start broadcasting step t's block over `channel` from index t; owner: this device's index there."""
    buf = mine.contiguous() if owner == t else torch.empty_like(mine, memory_format=torch.contiguous_format)
    return buf, tp.broadcast_async(buf, t, channel)


def ab(a: torch.Tensor, b: torch.Tensor, tp: TensorParallel) -> torch.Tensor:
    """a: A[j, c] [m, K/q], b: B[r, c] [K/q, N/q] -> C[j, c] [m, N/q]."""
    q = tp.q
    out = torch.zeros(a.shape[0], b.shape[1], dtype=a.dtype, device=a.device)  # [m, N/q]
    nxt = (_fetch(tp, a, 0, "row", tp.c), _fetch(tp, b, 0, "col", tp.r))
    for t in range(q):
        (a_t, wa), (b_t, wb) = nxt
        if t + 1 < q:  # the next step's blocks travel while this step multiplies
            nxt = (_fetch(tp, a, t + 1, "row", tp.c), _fetch(tp, b, t + 1, "col", tp.r))
        wa.wait()
        wb.wait()
        out.addmm_(a_t, b_t)  # A[j, t] [m, K/q] @ B[t, c] [K/q, N/q]
    return out


def abt(a: torch.Tensor, b: torch.Tensor, tp: TensorParallel) -> torch.Tensor:
    """a: A[j, c] [m, N/q], b: B[r, c] [K/q, N/q] -> C[j, c] [m, K/q] with C = A B^T."""
    q, reduces = tp.q, []
    nxt = _fetch(tp, b, 0, "col", tp.r)
    for t in range(q):
        b_t, wb = nxt
        if t + 1 < q:
            nxt = _fetch(tp, b, t + 1, "col", tp.r)
        wb.wait()
        partial = a @ b_t.t()  # A[j, c] [m, N/q] @ B[t, c]^T [N/q, K/q]: column c's share of C[j, t]
        reduces.append((partial, tp.reduce_async(partial, t, "row")))
    for _, work in reduces:
        work.wait()
    return reduces[tp.c][0]


def atb(a: torch.Tensor, b: torch.Tensor, tp: TensorParallel) -> torch.Tensor:
    """a: A[j, c] [m, K/q], b: B[j, c] [m, N/q] -> C[r, c] [K/q, N/q] with C = A^T B over this depth layer's rows."""
    q, reduces = tp.q, []
    nxt = _fetch(tp, a, 0, "row", tp.c)
    for t in range(q):
        a_t, wa = nxt
        if t + 1 < q:
            nxt = _fetch(tp, a, t + 1, "row", tp.c)
        wa.wait()
        partial = a_t.t() @ b  # A[j, t]^T [K/q, m] @ B[j, c] [m, N/q]: row r's share of C[t, c]
        reduces.append((partial, tp.reduce_async(partial, t, "col")))
    for _, work in reduces:
        work.wait()
    return reduces[tp.r][0]
