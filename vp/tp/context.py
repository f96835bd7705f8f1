"""One rank's place in its stage's tensor-parallel group: the mode, its grid coordinates, and the channels
(process groups cut from vp.mesh) that the layers communicate on.

Channels (each its own process group, so tensor-parallel traffic never shares one with the pipeline's):
  1-D   tp     the stage's t devices: Megatron's all-reduces (sequence parallel: its all-gathers and
               reduce-scatters, and the gradient sum of the parameters applied to sequence shards)
        row    the same devices, for the vocabulary layers (statistics, input gradient)
  grid  row    ROW(r, k), ordered by column c: SUMMA broadcasts/reduces of X-blocks, LayerNorm statistics,
               the vocabulary layers
        col    COL(c, k), ordered by row r: SUMMA broadcasts/reduces of W-blocks
        dep    DEP(r, c), ordered by depth k: the gradient all-reduce of depth-replicated weights
        batch  XZ(c), ordered by token block k*q + r: gradients of parameters replicated over rows and depth
Sources and destinations are indices in a channel's group; the mesh orders every group by its varying index,
which __post_init__ checks against this rank's coordinates. A group of one sends nothing: the helpers below
skip it, so Comm's counters hold only real traffic.
"""
from dataclasses import dataclass

import torch
import torch.distributed as dist

from vp.channels import GRID_CHANNELS, MEGATRON_CHANNELS
from vp.comm import Comm
from vp.mesh import Mesh
from vp.tp.modes import TensorMode

@dataclass(frozen=True)
class TensorParallel:
    mode: TensorMode
    q: int  # grid side; 1-D: the number of devices
    depth: int
    r: int
    c: int  # grid column; 1-D: the device index t
    k: int
    comm: Comm
    sequence_parallel: bool = False  # 1-D: activations between the tp regions split along the sequence (vp.tp.sequence)

    @classmethod
    def of(cls, mesh: Mesh, rank: int, comm: Comm, sequence_parallel: bool = False) -> "TensorParallel":
        co = mesh.coords(rank)
        return cls(mesh.mode, mesh.q, mesh.depth, co.r, co.c, co.k, comm, sequence_parallel)

    def __post_init__(self):
        where = {"tp": self.c, "row": self.c, "col": self.r, "dep": self.k, "batch": self.token_block}
        for ch in (GRID_CHANNELS if self.mode.grid else MEGATRON_CHANNELS):
            assert self.comm.index(ch) == where[ch], f"channel {ch} is not ordered by its varying coordinate"

    @property
    def batch_blocks(self) -> int:
        return self.depth * self.q if self.mode.grid else 1

    @property
    def token_block(self) -> int:
        return self.k * self.q + self.r if self.mode.grid else 0

    @property
    def columns(self) -> int:
        return self.q

    def size(self, channel: str) -> int:
        return self.comm.size(channel) if channel in self.comm.groups else 1

    # -- communication that skips groups of one ---------------------------------------------------------
    def all_reduce(self, t: torch.Tensor, channel: str, op=dist.ReduceOp.SUM) -> torch.Tensor:
        return self.comm.all_reduce(t, channel, op) if self.size(channel) > 1 else t

    def all_gather(self, t: torch.Tensor, channel: str) -> torch.Tensor:
        """[*] -> [size, *]"""
        return self.comm.all_gather(t, channel) if self.size(channel) > 1 else t.unsqueeze(0)

    def reduce_scatter(self, t: torch.Tensor, channel: str) -> torch.Tensor:
        """[size, *] summed over the group -> this rank's [*]"""
        return self.comm.reduce_scatter(t, channel) if self.size(channel) > 1 else t[0]

    def broadcast_async(self, t: torch.Tensor, src: int, channel: str):
        return self.comm.ibroadcast(t, src, channel) if self.size(channel) > 1 else DONE

    def reduce_async(self, t: torch.Tensor, dst: int, channel: str):
        return self.comm.ireduce(t, dst, channel) if self.size(channel) > 1 else DONE


class _Done:
    def wait(self):
        return True


DONE = _Done()
