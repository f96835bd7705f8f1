"""Tensor-parallel layers against their single-process fp32 references, in real gloo processes: forward, grad of
the input and grad of every weight (gathered from every device, replicas checked equal), on 1-D t=2 and 4, 2-D
[2,2,1] and 2.5-D [2,2,2] and [1,1,2], the batch split d*q ways. Tolerance: 1e-5 of the tensor's largest entry."""
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from tp_util import GRIDS, PLACEMENTS, TESTED, assemble, mesh_of, place, placed, tagged_grads, unpermute_qkv
from vp.config import padded_vocab_size
from vp.model import Block, Linear, vocab_rows
from vp.tp.attention import local_attention
from vp.tp.block import shard_block
from vp.tp.context import TensorParallel
from vp.tp.grads import reduce_replicated
from vp.tp.layout import grid_activation
from vp.tp.linear import GridLinear
from vp.tp.megatron import ColumnLinear, RowLinear, copy_to_tp
from vp.tp.norm import GridLayerNorm
from vp.tp.vocab import VocabEmbedding, VocabOutput
from vp.vocab.output import Shard
from vp.wgrad import WeightGradStore

SEED, B, S, H, HEADS, FFN, N, VOCAB = 5, 4, 4, 8, 4, 16, 12, 37
KINDS = ["linear", "layernorm", "attention", "vocab", "block", "block_split_w"]


def randomized(module: nn.Module, seed: int) -> nn.Module:
    """Every parameter (biases and LayerNorms too) drawn from one seed, so none is trivially 0 or 1."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for _, p in sorted(module.named_parameters()):
            p.copy_(torch.randn(p.shape, generator=g) * 0.3 + (1.0 if p.dim() == 1 and p.shape[0] == H else 0.0))
    return module


def references():
    g = torch.Generator().manual_seed(SEED)
    parts = {
        "fc_in": randomized(Linear(torch.zeros(N, H)), SEED + 1),
        "fc_out": randomized(Linear(torch.zeros(H, N)), SEED + 2),
        "norm": randomized(nn.LayerNorm(H), SEED + 3),
        "block": randomized(Block(H, HEADS, FFN, 2, SEED, 0), SEED + 4),
    }
    data = {"x": torch.randn(B, S, H, generator=g), "dy": torch.randn(B, S, H, generator=g),
            "ids": torch.randint(0, VOCAB, (B, S), generator=g), "targets": torch.randint(0, VOCAB, (B, S), generator=g),
            "weights": torch.rand(B, S, generator=g) / (B * S)}
    return parts, data


def attention_reference(block, x):
    b, s, h = x.shape
    q, k, v = block.qkv(x).view(b, s, 3, block.heads, h // block.heads).permute(2, 0, 3, 1, 4)
    att = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    return block.proj(att.transpose(1, 2).reshape(b, s, h))


def vocab_reference(embed, head, data, x):
    """embedding(ids) and the weighted cross-entropy of x against the targets (padding rows masked)."""
    out = F.embedding(data["ids"], embed)
    logits = x @ head.t()
    logits[..., VOCAB:] = float("-inf")
    ce = F.cross_entropy(logits.flatten(0, 1), data["targets"].flatten(), reduction="none")
    return out, (ce * data["weights"].flatten()).sum()


# -- one device ---------------------------------------------------------------------------------------------
def local(tp: TensorParallel, t: torch.Tensor) -> torch.Tensor:
    return grid_activation(t, tp.q, tp.depth, tp.r, tp.c, tp.k) if tp.mode.grid else t


def rows(tp: TensorParallel, t: torch.Tensor) -> torch.Tensor:
    return t.chunk(tp.batch_blocks, 0)[tp.token_block] if tp.mode.grid else t


def run_module(tp, module, fn, data, grid, store=None):
    """fn(module, x block) -> output block; backward with the dy block; gradients reduced once."""
    x = local(tp, data["x"]).clone().requires_grad_()
    y = fn(module, x)
    y.backward(local(tp, data["dy"])[..., : y.shape[-1]] if y.shape[-1] != x.shape[-1] else local(tp, data["dy"]))
    if store is not None:
        store.flush()
    unreduced = tagged_grads(module, grid)
    reduce_replicated([module], tp)
    act = "act" if grid else "rep"
    return {"y": (act, y.detach()), "dx": (act, x.grad), "grads": tagged_grads(module, grid), "unreduced": unreduced}


def check_device(tp: TensorParallel, kind: str) -> dict:
    parts, data = references()
    grid = tp.mode.grid
    if kind == "linear":  # x -> fc_out(fc_in(x)): column- then row-parallel in 1-D, two SUMMA linears on a grid
        if grid:
            m = nn.ModuleDict({"fc_in": GridLinear(parts["fc_in"], tp), "fc_out": GridLinear(parts["fc_out"], tp)})
            return run_module(tp, m, lambda m, x: m["fc_out"](m["fc_in"](x)), data, grid)
        m = nn.ModuleDict({"fc_in": ColumnLinear(parts["fc_in"], tp), "fc_out": RowLinear(parts["fc_out"], tp)})
        return run_module(tp, m, lambda m, x: m["fc_out"](m["fc_in"](copy_to_tp(x, tp))), data, grid)
    if kind == "layernorm":
        m = GridLayerNorm(parts["norm"], tp) if grid else parts["norm"]
        return run_module(tp, m, lambda m, x: m(x), data, grid)
    if kind == "attention":
        blk = shard_block(parts["block"], tp)

        def attn(m, x):
            return m.proj(local_attention(m.qkv(x if grid else copy_to_tp(x, tp)), m.heads))
        return run_module(tp, blk, attn, data, grid)
    if kind in ("block", "block_split_w"):
        store = WeightGradStore() if kind == "block_split_w" else None
        return run_module(tp, shard_block(parts["block"], tp), lambda m, x: m(x, store), data, grid, store)
    padded = padded_vocab_size(VOCAB, None, tp.columns)
    shard = Shard.of(tp.c, tp.columns, padded, VOCAB)
    end = shard.start + shard.rows
    m = nn.ModuleDict({"embed": VocabEmbedding(vocab_rows(SEED, "embed", VOCAB, shard.start, end, H), shard, tp),
                       "head": VocabOutput(vocab_rows(SEED, "head", VOCAB, shard.start, end, H), shard, tp)})
    x = local(tp, data["x"]).clone().requires_grad_()
    emb = m["embed"](rows(tp, data["ids"]))
    loss = m["head"](x, rows(tp, data["targets"]), rows(tp, data["weights"]))
    (loss + (emb * local(tp, data["dy"])).sum()).backward()
    reduce_replicated([m], tp)
    act = "act" if grid else "rep"
    total = tp.all_reduce(loss.detach().reshape(1), "batch")[0]
    return {"y": (act, emb.detach()), "dx": (act, x.grad), "loss": total, "grads": tagged_grads(m, grid)}


def run_checks(rank, world, names):
    name, mesh, me, comm = place(rank, world, names)
    try:
        if name is None:
            return None
        tp = TensorParallel.of(mesh, me, comm)
        return name, (tp.r, tp.c, tp.k), {kind: check_device(tp, kind) for kind in KINDS}
    finally:
        comm.close()


# -- the test process: references and comparisons ---------------------------------------------------------
@pytest.fixture(scope="module")
def results(pools):
    out = {}
    for name, coords, per_kind in placed(pools(8), run_checks, PLACEMENTS):
        for kind, value in per_kind.items():
            out.setdefault((name, kind), {})[coords] = value
    return out


def reference_of(kind: str):
    """(output, grad x, {param name: grad}, loss) of the single-process modules."""
    parts, data = references()
    x = data["x"].clone().requires_grad_()
    loss = None
    if kind == "linear":
        m = nn.ModuleDict({"fc_in": parts["fc_in"], "fc_out": parts["fc_out"]})
        y = m["fc_out"](m["fc_in"](x))
    elif kind == "layernorm":
        m = parts["norm"]
        y = m(x)
    elif kind == "attention":
        m = parts["block"]
        y = attention_reference(m, x)
    elif kind in ("block", "block_split_w"):
        m = parts["block"]
        y = m(x)
    else:
        padded = padded_vocab_size(VOCAB, None, 4)  # the real rows' gradients do not depend on the padding
        m = nn.ModuleDict({"embed": nn.Module(), "head": nn.Module()})
        m["embed"].weight = nn.Parameter(vocab_rows(SEED, "embed", VOCAB, 0, padded, H))
        m["head"].weight = nn.Parameter(vocab_rows(SEED, "head", VOCAB, 0, padded, H))
        y, loss = vocab_reference(m["embed"].weight, m["head"].weight, data, x)
        (loss + (y * data["dy"]).sum()).backward()
        return y.detach(), x.grad, {n: p.grad[:VOCAB] for n, p in m.named_parameters()}, loss.detach()
    y.backward(data["dy"])
    return y.detach(), x.grad, {n: p.grad for n, p in m.named_parameters() if p.grad is not None}, loss


def gathered(per_device: dict, field: str, name: str):
    tp, mode, depth = GRIDS[name]
    mesh = mesh_of(name)
    values = {coords: v[field] for coords, v in per_device.items()}
    tag = next(iter(values.values()))[0]
    return assemble(tag, {c: t for c, (_, t) in values.items()}, mesh.q, mesh.depth)


def close(actual, expected, what, rtol=1e-5):
    """Relative to the tensor's scale: max |a - b| <= rtol * max |b| (summation orders differ by layout)."""
    assert actual.shape == expected.shape, f"{what}: shape {tuple(actual.shape)} != {tuple(expected.shape)}"
    err = (actual - expected).abs().max().item() / max(expected.abs().max().item(), 1e-30)
    assert err <= rtol, f"{what}: relative error {err:.2e} > {rtol:.0e}"


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("grid", TESTED)
def test_layer_matches_single_process(results, grid, kind):
    per_device = results[(grid, kind)]
    mesh = mesh_of(grid)
    assert len(per_device) == mesh.world
    ref_y, ref_dx, ref_grads, ref_loss = reference_of(kind)
    close(gathered(per_device, "y", grid), ref_y, "output")
    close(gathered(per_device, "dx", grid), ref_dx, "grad of the input")
    names = next(iter(per_device.values()))["grads"]
    assert set(names) == set(ref_grads), (sorted(names), sorted(ref_grads))
    for pname in names:
        pieces = {c: v["grads"][pname][1] for c, v in per_device.items()}
        tag = names[pname][0]
        full = unpermute_qkv(pname, assemble(tag, pieces, mesh.q, mesh.depth), HEADS, mesh.q)
        if kind == "vocab":
            assert torch.count_nonzero(full[VOCAB:]) == 0, "padded vocabulary rows received gradient"
            full = full[:VOCAB]
        close(full, ref_grads[pname], f"grad of {pname}")
    if ref_loss is not None:
        for v in per_device.values():
            close(v["loss"], ref_loss, "loss")


@pytest.mark.parametrize("grid", [g for g in TESTED if GRIDS[g][2] > 1])
def test_depth_all_reduce_completes_weight_gradients(results, grid):
    """Before the DEP all-reduce each depth layer holds the weight gradient of its own token blocks only: wrong
    alone, right summed over depth. (Colossal-AI's legacy 2.5-D never performs this sum.)"""
    per_device = results[(grid, "block")]
    mesh = mesh_of(grid)
    _, _, ref_grads, _ = reference_of("block")
    for pname in ("qkv.weight", "fc2.weight"):
        layers = []
        for k in range(mesh.depth):
            pieces = {(r, c, 0): v["unreduced"][pname][1] for (r, c, kk), v in per_device.items() if kk == k}
            layers.append(unpermute_qkv(pname, assemble("grid_w", pieces, mesh.q, 1), HEADS, mesh.q))
        err = (layers[0] - ref_grads[pname]).abs().max() / ref_grads[pname].abs().max()
        assert err > 1e-2, f"{pname}: one depth layer alone already matches the full-batch gradient"
        close(sum(layers), ref_grads[pname], f"sum over depth of {pname}")
