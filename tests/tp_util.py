"""Helpers for the tensor-parallel tests: several independent grids inside one pool of gloo processes, the
reference modules every process builds from one seed, and assembling per-device blocks into full tensors."""
import torch
import torch.nn as nn

from vp.channels import tp_slices
from vp.comm import Comm, make_groups
from vp.mesh import Mesh
from vp.tp.layout import assemble_grid_activation, assemble_grid_weight, head_major

# name -> (tp, mode, depth): the grids of the issue
GRIDS = {"1d-2": (2, "1d", 1), "1d-4": (4, "1d", 1), "2d-221": (4, "2d", 1), "2.5d-222": (8, "2.5d", 2),
         "2.5d-112": (2, "2.5d", 2), "1d-8": (8, "1d", 1)}
# grids run side by side in a pool of 8, each on consecutive ranks: the grids ...
PLACEMENTS = [["2.5d-222"], ["1d-4", "2d-221"], ["1d-2", "2.5d-112"]]
TESTED = [g for names in PLACEMENTS for g in names]
# ... and those of python -m vp.bench tp
BENCH_PLACEMENTS = [["1d-8"], ["2.5d-222"], ["1d-4", "2d-221"]]


def mesh_of(name: str, pp: int = 1) -> Mesh:
    tp, mode, depth = GRIDS[name]
    return Mesh(pp=pp, tp=tp, tp_mode=mode, tp_depth=depth)


def place(rank: int, world: int, names: list[str], pipeline: bool = False) -> tuple:
    """Build every grid's channels on every rank of the pool (new_group is collective over the world; idle
    ranks and ranks outside a channel's grids get groups of one); pipeline: also the run's pipeline channels.
    Returns (this rank's grid name, its mesh, its rank in that grid, its Comm); name None for an idle rank."""
    from vp.channels import mesh_channels

    slices, offset, mine = {}, 0, (None, None, rank)
    for name in names:
        mesh = mesh_of(name)
        parts = mesh_channels(mesh) if pipeline else tp_slices(mesh)
        for ch, groups in parts.items():
            groups = [[offset + r for r in g] for g in groups]
            slices.setdefault(ch, []).extend(groups)
        if offset <= rank < offset + mesh.world:
            mine = (name, mesh, rank - offset)
        offset += mesh.world
    assert offset <= world, f"grids {names} need {offset} ranks, the pool has {world}"
    for ch, groups in slices.items():
        covered = {r for g in groups for r in g}
        groups.extend([r] for r in range(world) if r not in covered)
    return (*mine, Comm(make_groups(slices, rank), torch.device("cpu")))


def placed(pool, fn, placements: list[list[str]]):
    """Run fn(rank, world, names) on every rank of the pool once per placement; yield what the busy ranks return
    (idle ranks return None)."""
    for names in placements:
        yield from (res for res in pool.run(fn, names) if res is not None)


# -- assembling what the devices hold -----------------------------------------------------------------------
def tag_of(module: nn.Module, pname: str, grid: bool) -> str:
    """How a parameter is laid out over the devices: grid_w (W^T blocks), cut0/cut1 (split over columns along
    dim 0/1, replicated over rows and depth), rep (whole on every device)."""
    from vp.tp.linear import GridLinear
    from vp.tp.megatron import RowLinear
    from vp.tp.stage import Position

    if isinstance(module, GridLinear) and pname == "weight":
        return "grid_w"
    if isinstance(module, RowLinear):
        return "cut1" if pname == "weight" else "rep"
    if isinstance(module, Position):
        return "cut1" if grid else "rep"
    if isinstance(module, nn.LayerNorm):
        return "rep"
    return "cut0"


def tagged_grads(model: nn.Module, grid: bool) -> dict[str, tuple[str, torch.Tensor]]:
    out = {}
    for mname, mod in model.named_modules():
        for pname, p in mod.named_parameters(recurse=False):
            if p.grad is None:
                continue
            name = f"{mname}.{pname}" if mname else pname
            out[name] = (tag_of(mod, pname, grid), p.grad.clone())
    return out


def assemble(tag: str, pieces: dict, q: int, depth: int) -> torch.Tensor:
    """pieces: {(r, c, k): tensor} from every device of one grid -> the full tensor; replicas must be equal."""
    def same(key_of):
        groups = {}
        for key, t in pieces.items():
            groups.setdefault(key_of(key), []).append(t)
        for key, ts in groups.items():
            for t in ts[1:]:
                assert torch.equal(t, ts[0]), f"replicas of {tag} block {key} differ"
        return {key: ts[0] for key, ts in groups.items()}

    if tag == "rep":
        return same(lambda key: 0)[0]
    if tag == "act":
        return assemble_grid_activation(pieces, q, depth)
    if tag == "grid_w":
        return assemble_grid_weight(same(lambda key: key[:2]), q)
    by_c = same(lambda key: key[1])
    return torch.cat([by_c[c] for c in range(q)], 0 if tag == "cut0" else 1)


def unpermute_qkv(name: str, t: torch.Tensor, heads: int, q: int) -> torch.Tensor:
    """Undo the head-major row order of a fused QKV weight [3h, h] or bias [3h]."""
    if ".qkv." not in f".{name}":
        return t
    order = head_major(heads, t.shape[0] // (3 * heads), q)
    out = torch.empty_like(t)
    out[order] = t
    return out
