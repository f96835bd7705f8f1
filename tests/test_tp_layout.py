"""The block index maps of the tensor-parallel layouts, as pure tensors (no processes): which device holds
which block, that blocks cover a tensor exactly as the layout says, and that SUMMA's steps, emulated on the
blocks, give the three products."""
import itertools

import pytest
import torch

from vp.mesh import Mesh
from vp.tp.layout import (assemble_grid_activation, assemble_grid_weight, block, grid_activation, grid_weight,
                          head_major, token_rows)

GRIDS = [(1, 1), (1, 2), (2, 1), (2, 2), (3, 2), (2, 3), (4, 1)]


def devices(q, d):
    return list(itertools.product(range(q), range(q), range(d)))  # (r, c, k)


@pytest.mark.parametrize("q,d", GRIDS)
def test_activation_blocks_partition_the_tensor(q, d):
    b, s, h = 2 * d * q, 3, 2 * q
    x = torch.arange(b * s * h).view(b, s, h)
    blocks = {(r, c, k): grid_activation(x, q, d, r, c, k) for r, c, k in devices(q, d)}
    owners = torch.zeros(b * s * h, dtype=torch.long)
    for (r, c, k), blk in blocks.items():
        assert blk.shape == (b // (d * q), s, h // q)
        j = k * q + r  # token block of P[r, c, k]
        assert torch.equal(blk, x[j * b // (d * q):(j + 1) * b // (d * q), :, c * h // q:(c + 1) * h // q])
        owners[blk.flatten()] += 1
    assert torch.all(owners == 1), "every activation element lives on exactly one device"
    assert torch.equal(assemble_grid_activation(blocks, q, d), x)


@pytest.mark.parametrize("q,d", GRIDS)
def test_weight_blocks_are_replicated_over_depth_only(q, d):
    n, k_in = 3 * q, 2 * q
    w = torch.arange(n * k_in).view(n, k_in)  # nn.Linear's [out, in]
    owners = torch.zeros(n * k_in, dtype=torch.long)
    for r, c, k in devices(q, d):
        blk = grid_weight(w, q, r, c)  # B[r, c] of B = W^T: inputs of row block r, outputs of column block c
        assert torch.equal(blk, w.t()[r * k_in // q:(r + 1) * k_in // q, c * n // q:(c + 1) * n // q])
        owners[blk.flatten()] += 1
    assert torch.all(owners == d), "each weight element is held by the d devices of one DEP group"
    assert torch.equal(assemble_grid_weight({(r, c): grid_weight(w, q, r, c) for r in range(q) for c in range(q)}, q), w)


@pytest.mark.parametrize("q,d", GRIDS)
def test_mesh_coordinates_agree_with_the_layout(q, d):
    mode = "2.5d" if d > 1 else "2d"
    mesh = Mesh(tp=q * q * d, tp_mode=mode, tp_depth=d)
    ids = torch.arange(d * q * 2)
    for rank in range(mesh.world):
        co = mesh.coords(rank)
        assert rank == mesh.tp_index(co.r, co.c, co.k) == (co.k * q + co.r) * q + co.c
        j = mesh.token_block(rank)
        assert torch.equal(token_rows(ids, d * q, j), grid_activation(ids[:, None, None].expand(-1, 1, q), q, d,
                                                                        co.r, co.c, co.k)[:, 0, 0])


@pytest.mark.parametrize("heads,parts", [(4, 1), (4, 2), (4, 4), (6, 3)])
def test_head_major_qkv_gives_each_block_whole_heads(heads, parts):
    dh = 2
    order = head_major(heads, dh, parts)
    assert sorted(order.tolist()) == list(range(3 * heads * dh))
    for c in range(parts):
        rows = block(order, parts, c, 0).view(3, heads // parts, dh)  # [qkv, local head, dim]
        for p in range(3):
            for i in range(heads // parts):
                head = c * heads // parts + i
                assert rows[p, i].tolist() == list(range((p * heads + head) * dh, (p * heads + head + 1) * dh))


@pytest.mark.parametrize("q,d", GRIDS)
def test_summa_steps_on_blocks_give_the_three_products(q, d):
    """Emulates every device's q steps with the sources vp.tp.summa uses (column t over ROW, row t over COL)."""
    g = torch.Generator().manual_seed(q * 10 + d)
    m, kk, n = 2 * d * q, 2 * q, 3 * q
    x, w, dy = torch.randn(m, kk, generator=g), torch.randn(n, kk, generator=g), torch.randn(m, n, generator=g)
    X = {dev: grid_activation(x, q, d, *dev) for dev in devices(q, d)}
    DY = {dev: grid_activation(dy, q, d, *dev) for dev in devices(q, d)}
    W = {(r, c, k): grid_weight(w, q, r, c) for r, c, k in devices(q, d)}
    Y, DX, DW = {}, {}, {}
    for r, c, k in devices(q, d):
        Y[(r, c, k)] = sum(X[(r, t, k)] @ W[(t, c, k)] for t in range(q))  # ab: A from column t, B from row t
        DX[(r, c, k)] = sum(DY[(r, t, k)] @ W[(c, t, k)].t() for t in range(q))  # abt: reduced at column c
        DW[(r, c, k)] = sum(X[(t, r, k)].t() @ DY[(t, c, k)] for t in range(q))  # atb: reduced at row r
    torch.testing.assert_close(assemble_grid_activation(Y, q, d), x @ w.t())
    torch.testing.assert_close(assemble_grid_activation(DX, q, d), dy @ w)
    full = {(r, c): sum(DW[(r, c, k)] for k in range(d)) for r in range(q) for c in range(q)}  # the DEP sum
    torch.testing.assert_close(assemble_grid_weight(full, q), dy.t() @ x)
