"""The tensor-parallel modes as a table of frozen rows, read by the mesh, the config checks, the layers and the
closed forms (never a string compared in several files). Pure Python: no torch.

A mode says how a stage's tp devices are arranged and which sizes must divide evenly:
  1d    Megatron: one row of t devices; column- then row-parallel linears, heads and ffn split t ways, the
        batch whole on every device, the vocabulary split t ways.
  2d    SUMMA on a [q, q, 1] grid: activations and weights in q x q blocks, the batch split q ways.
  2.5d  SUMMA on a [q, q, d] grid: q x q weight blocks replicated over d depth layers, the batch split d*q ways.
"""
import math
from dataclasses import dataclass


@dataclass(frozen=True)
class TensorMode:
    name: str
    grid: bool  # SUMMA on a [q, q, d] grid (activations split over batch and hidden), else Megatron 1-D
    has_depth: bool  # tp_depth may exceed 1

    def depth(self, tp_depth: int) -> int:
        return tp_depth if self.has_depth else 1

    def side(self, tp: int, tp_depth: int) -> int:
        """q: the grid side (1-D: the number of devices, which split heads, ffn and vocabulary)."""
        return math.isqrt(tp // self.depth(tp_depth)) if self.grid else tp

    def batch_blocks(self, tp: int, tp_depth: int) -> int:
        """How many ways a micro-batch's sequences are split (d * q on a grid, 1 in 1-D)."""
        return self.depth(tp_depth) * self.side(tp, tp_depth) if self.grid else 1


MODES = {m.name: m for m in [
    TensorMode("1d", grid=False, has_depth=False),
    TensorMode("2d", grid=True, has_depth=False),
    TensorMode("2.5d", grid=True, has_depth=True),
]}


def get_mode(name: str) -> TensorMode:
    if name not in MODES:
        raise ValueError(f"tp_mode={name!r} is unknown; use one of {', '.join(MODES)}")
    return MODES[name]


def check_sizes(mode: TensorMode, tp: int, tp_depth: int, hidden: int, heads: int, ffn: int,
                micro_batch_size: int) -> None:
    """Refuse model sizes the tensor-parallel layout cannot split evenly, naming the field and the fix.
    The grid shape itself (tp = q*q*d) is checked by vp.mesh.check_mesh."""
    q = mode.side(tp, tp_depth)
    what = f"the {q} grid columns of tp_mode={mode.name}" if mode.grid else f"tp={tp} (tp_mode=1d)"
    for name, value in (("hidden", hidden), ("heads", heads), ("ffn_hidden", ffn)):
        if value % q:
            raise ValueError(f"{name}={value} is not divisible by {what}; use a multiple of {q} "
                             f"such as {near(value, q)}")
    blocks = mode.batch_blocks(tp, tp_depth)
    if micro_batch_size % blocks:
        raise ValueError(f"micro_batch_size={micro_batch_size} is not divisible by d*q={blocks} of tp_mode={mode.name} "
                         f"(each device holds whole sequences of its token block); use a multiple of {blocks} "
                         f"such as {near(micro_batch_size, blocks)}")


def near(value: int, multiple: int) -> str:
    below = (value // multiple) * multiple
    above = below + multiple
    return f"{below} or {above}" if below else f"{above}"
