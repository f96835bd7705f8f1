"""The process groups of one rank, by channel (vp.channels names them): made once, in one order on every rank, and
handed to vp.comm.Comm, which runs each channel's traffic on its group."""
from dataclasses import dataclass
from datetime import timedelta

import torch.distributed as dist

from vp.channels import creation_splits, parse_link
from vp.nccl import nccl_options, splitting


@dataclass(frozen=True)
class Group:
    """One process group of this rank: the global ranks in group order and this rank's index among them."""
    ranks: tuple[int, ...]
    index: int
    pg: object = None  # the torch ProcessGroup; None for a group of one (or without torch.distributed)

    @property
    def size(self) -> int:
        return len(self.ranks)


def make_groups(slices: dict[str, list[list[int]]], rank: int, timeout_s: float | None = None) -> dict[str, Group]:
    """channel -> this rank's Group, creating every slice of every channel in the order given; every rank must call
    this with the same slices in the same order. Where NCCL can split (vp.nccl.splitting), one world-wide
    `split_group` per creation split (vp.channels.creation_splits: a channel's groups, or links packed so that no rank
    is twice in one split), each an ncclCommSplit of the world's communicator: the count of world-wide calls does not
    grow with the world. Elsewhere (gloo; a torch without split_group) one `new_group` per slice, collective over the
    world. A point-to-point link's channel (link_channel) has a group per pipeline; a rank off the link is in none."""
    timeout = timedelta(seconds=timeout_s) if timeout_s else None
    pgs: dict[tuple[str, tuple[int, ...]], object] = {}  # (channel, ranks) -> this rank's group
    if dist.is_initialized() and (split := splitting()):
        for name, members in creation_splits(slices):
            mine = next(((ch, tuple(g)) for ch, g in members if rank in g), None)
            pg = split(split_ranks=[g for _, g in members], timeout=timeout,
                       pg_options=nccl_options(link=name.startswith("links/")), group_desc=name)
            if mine is not None:
                pgs[mine] = pg
    out = {}
    for channel, groups in slices.items():
        for ranks in groups:
            key = (channel, tuple(ranks))
            if key not in pgs and dist.is_initialized() and len(ranks) > 1:
                pgs[key] = dist.new_group(ranks, timeout=timeout, pg_options=nccl_options(bool(parse_link(channel))))
            if rank in ranks:
                assert channel not in out, f"rank {rank} is in two groups of channel {channel}"
                out[channel] = Group(tuple(ranks), ranks.index(rank), pgs.get(key))
        assert channel in out or parse_link(channel), f"rank {rank} is in no group of channel {channel}"
    return out


def local_groups(channels, ranks: list[int], me: int) -> dict[str, Group]:
    """Groups over one list of ranks for each channel (tests, one pipeline): me is this rank's index."""
    return make_groups({ch: [list(ranks)] for ch in channels}, ranks[me])
