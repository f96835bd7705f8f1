"""The one place that knows rank order: world = dp x pp x tp, and the [q, q, d] grid inside a tensor-parallel group.

Global rank = (d * pp + p) * tp + t, the order of arange(world).view(dp, pp, tp):
- t innermost: the tensor-parallel ranks of one stage are consecutive, so a node holds whole stages; they
  exchange activations in every layer, the heaviest and most latency-bound traffic;
- p next: one replica's pipeline is one contiguous block, so a pipeline hop crosses at most one node boundary;
- d outermost: replicas meet once per iteration (the gradient all-reduce), the traffic that best tolerates the
  slower inter-node links.
Inside a 2-D or 2.5-D tensor-parallel group of q*q*depth devices, t = (k * q + r) * q + c for device P[r, c, k]
(row r, column c, depth layer k), so one grid row of one depth layer is consecutive. A 1-D group is one row of
tp columns (q and depth unused by its layers; the vocabulary layers see its ranks as columns).

Groups, each a list of global ranks in the order of its varying index (mesh.groups(axis)):
  pp     one pipeline: the stages at one (d, t)
  dp     the replicas of one (p, t)
  tp     the tensor-parallel group of one stage
  row    ROW(r, k): the q devices of one grid row (c varies)
  col    COL(c, k): the q devices of one grid column (r varies)
  dep    DEP(r, c): the depth layers at one (r, c) (k varies)
  batch  XZ(c): the q*depth devices of one grid column over all depth layers ((k, r) varies): the batch split
  vocab  the vocabulary shards of one token block: pipeline ranks x grid columns at one (d, k, r);
         shard index = p * columns + c (1-D: p * tp + t, as the official vocabulary-parallel code orders them)
  replica  the pp * tp ranks of one replica
Pure Python: no torch, no process groups (vp.comm builds those from these lists).
"""
import math
from dataclasses import dataclass
from functools import cached_property, lru_cache
from typing import NamedTuple

from vp.tp.modes import MODES, TensorMode, get_mode

TP_MODES = tuple(MODES)
AXES = ("pp", "dp", "tp", "row", "col", "dep", "batch", "vocab", "replica")


class Coords(NamedTuple):
    d: int  # data-parallel replica
    p: int  # pipeline rank
    t: int  # index in the stage's tensor-parallel group
    r: int  # grid row (0 in 1-D)
    c: int  # grid column (t in 1-D)
    k: int  # depth layer (0 in 1-D and 2-D)


@dataclass(frozen=True)
class Mesh:
    dp: int = 1
    pp: int = 1
    tp: int = 1
    tp_mode: str = "1d"
    tp_depth: int = 1

    def __post_init__(self):
        check_mesh(self.dp, self.pp, self.tp, self.tp_mode, self.tp_depth)

    @property
    def world(self) -> int:
        return self.dp * self.pp * self.tp

    # derived from the frozen fields, each worked out once per mesh (rank arithmetic asks for them per rank)
    @cached_property
    def mode(self) -> TensorMode:
        return get_mode(self.tp_mode)

    @cached_property
    def grid(self) -> bool:
        """A 2-D or 2.5-D (SUMMA) tensor-parallel group, as opposed to 1-D (Megatron)."""
        return self.mode.grid

    @cached_property
    def q(self) -> int:
        """Side of the grid: tp = q * q * depth (1-D: the group is one row of tp columns)."""
        return self.mode.side(self.tp, self.tp_depth)

    @cached_property
    def depth(self) -> int:
        return self.mode.depth(self.tp_depth)

    @cached_property
    def rows(self) -> int:
        return self.q if self.grid else 1

    @cached_property
    def columns(self) -> int:
        """Grid columns: the tensor-parallel share of the vocabulary shards."""
        return self.q if self.grid else self.tp

    @property
    def batch_blocks(self) -> int:
        """How many ways a stage's micro-batch is split over its tensor-parallel group (d * q; 1-D: 1)."""
        return self.depth * self.rows

    @property
    def vocab_shards(self) -> int:
        return self.pp * self.columns

    def describe(self) -> str:
        """'dp 2 x pp 4 x tp 8 (2.5d [2,2,2])'."""
        grid = f" ({self.tp_mode} [{self.q},{self.q},{self.depth}])" if self.grid else (
            " (1d)" if self.tp > 1 else "")
        return f"dp {self.dp} x pp {self.pp} x tp {self.tp}{grid}"

    # -- rank <-> coordinates ---------------------------------------------------------------------------
    def rank(self, d: int, p: int, t: int) -> int:
        return (d * self.pp + p) * self.tp + t

    def tp_index(self, r: int, c: int, k: int) -> int:
        return (k * self.rows + r) * self.columns + c

    def coords(self, rank: int) -> Coords:
        assert 0 <= rank < self.world, f"rank {rank} outside a world of {self.world}"
        rest, t = divmod(rank, self.tp)
        d, p = divmod(rest, self.pp)
        kr, c = divmod(t, self.columns)
        k, r = divmod(kr, self.rows)
        return Coords(d, p, t, r, c, k)

    def token_block(self, rank: int) -> int:
        """Which of the batch_blocks parts of a micro-batch this rank's stage work holds (k * q + r)."""
        co = self.coords(rank)
        return co.k * self.rows + co.r

    def vocab_shard(self, rank: int) -> int:
        co = self.coords(rank)
        return co.p * self.columns + co.c

    # -- groups --------------------------------------------------------------------------------------
    def groups(self, axis: str) -> list[list[int]]:
        """Every group along `axis`, each in the order of its varying index; together they cover the world. Worked
        out once per mesh and axis (_groups: the mesh is frozen; a planner asks for the same few meshes thousands of
        times), handed out as fresh lists."""
        if axis not in AXES:
            raise ValueError(f"unknown mesh axis {axis!r}; axes: {', '.join(AXES)}")
        return [list(g) for g in _groups(self, axis)]

    def _groups(self, axis: str) -> list[list[int]]:
        R, C, K = range(self.rows), range(self.columns), range(self.depth)
        D, P, T = range(self.dp), range(self.pp), range(self.tp)
        rk, ti = self.rank, self.tp_index
        if axis == "pp":
            return [[rk(d, p, t) for p in P] for d in D for t in T]
        if axis == "dp":
            return [[rk(d, p, t) for d in D] for p in P for t in T]
        if axis == "tp":
            return [[rk(d, p, t) for t in T] for d in D for p in P]
        if axis == "replica":
            return [[rk(d, p, t) for p in P for t in T] for d in D]
        if axis == "row":
            return [[rk(d, p, ti(r, c, k)) for c in C] for d in D for p in P for k in K for r in R]
        if axis == "col":
            return [[rk(d, p, ti(r, c, k)) for r in R] for d in D for p in P for k in K for c in C]
        if axis == "dep":
            return [[rk(d, p, ti(r, c, k)) for k in K] for d in D for p in P for r in R for c in C]
        if axis == "batch":
            return [[rk(d, p, ti(r, c, k)) for k in K for r in R] for d in D for p in P for c in C]
        return [[rk(d, p, ti(r, c, k)) for p in P for c in C] for d in D for k in K for r in R]  # vocab

    def group_of(self, axis: str, rank: int) -> list[int]:
        return list(self.group_index(axis)[rank])

    def group_index(self, axis: str) -> dict[int, tuple[int, ...]]:
        """Each global rank's group along `axis` (the groups of one axis partition the world), worked out once per
        mesh and axis; not to be changed."""
        if axis not in AXES:
            raise ValueError(f"unknown mesh axis {axis!r}; axes: {', '.join(AXES)}")
        return _group_index(self, axis)


@lru_cache(maxsize=512)
def _groups(mesh: Mesh, axis: str) -> tuple[tuple[int, ...], ...]:
    return tuple(map(tuple, mesh._groups(axis)))


@lru_cache(maxsize=512)
def _group_index(mesh: Mesh, axis: str) -> dict[int, tuple[int, ...]]:
    return {r: g for g in _groups(mesh, axis) for r in g}


def check_mesh(dp: int, pp: int, tp: int, tp_mode: str, tp_depth: int) -> None:
    """Refuse a mesh that cannot be built, naming the field and the fix."""
    for name, value in (("dp", dp), ("pp", pp), ("tp", tp), ("tp_depth", tp_depth)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"{name}={value!r} must be a positive integer")
    mode = get_mode(tp_mode)
    if not mode.has_depth and tp_depth != 1:
        deep = next(m.name for m in MODES.values() if m.has_depth)
        raise ValueError(f"tp_depth={tp_depth} needs tp_mode={deep} (depth of a [q, q, d] grid); "
                         f"drop tp_depth or set tp_mode={deep}")
    if mode.grid:
        depth = mode.depth(tp_depth)
        q = math.isqrt(tp // depth) if tp % depth == 0 else 0
        if q * q * depth != tp:
            hint = _grid_hint(tp, depth)
            raise ValueError(f"tp={tp} is not q*q*{depth} for tp_mode={tp_mode}"
                             + (f" with tp_depth={depth}" if mode.has_depth else "")
                             + f"; a [q, q, {depth}] grid needs tp = q*q*{depth}, e.g. {hint}")


def _grid_hint(tp: int, depth: int) -> str:
    """'4 or 9': the grid sizes q*q*depth nearest to tp."""
    q = math.isqrt(max(1, tp // depth))
    below, above = q * q * depth, (q + 1) * (q + 1) * depth
    return f"{below} or {above}" if below != tp else f"{above}"
