"""Every collective and point-to-point call goes through Comm, which counts calls, payload bytes and barriers
per channel, so that tests can pin "Algorithm 2 has one barrier" and runs can report bytes sent per group.

A channel is a named process group this rank belongs to, cut from the mesh (vp.mesh): each kind of traffic
has its own, so that no two kinds of traffic share an ordered communicator. The pipeline's channels are
groups along the pipeline axis:
  fwd+ fwd-  activations sent to a higher / lower rank      bwd+ bwd-  input gradients likewise
  C0 C1 C2   the output layer's steps                       IF IB      the input layer's steps
  naive      the synchronous all-reduces of the naive (Megatron / interlaced) output layer
  step       end-of-iteration agreement (fp16 overflow check, metrics)
Ranks named in calls (src, dst) are indices in the channel's group, never global ranks.
"""
import contextlib
import queue
import threading
from collections import Counter
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

PIPELINE_CHANNELS = ("fwd+", "fwd-", "bwd+", "bwd-", "C0", "C1", "C2", "IF", "IB", "naive", "step")


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
    """channel -> this rank's Group, creating every slice of every channel in the order given. new_group is
    collective over the world, so every rank must call this with the same slices in the same order."""
    timeout = timedelta(seconds=timeout_s) if timeout_s else None
    out = {}
    for channel, groups in slices.items():
        for ranks in groups:
            pg = dist.new_group(ranks, timeout=timeout) if dist.is_initialized() and len(ranks) > 1 else None
            if rank in ranks:
                assert channel not in out, f"rank {rank} is in two groups of channel {channel}"
                out[channel] = Group(tuple(ranks), ranks.index(rank), pg)
        assert channel in out, f"rank {rank} is in no group of channel {channel}"
    return out


def local_groups(channels, ranks: list[int], me: int) -> dict[str, Group]:
    """Groups over one list of ranks for each channel (tests, one pipeline): me is this rank's index."""
    return make_groups({ch: [list(ranks)] for ch in channels}, ranks[me])

class Handle:
    """The result of a step submitted to a CommStream; wait() returns what the step returned."""

    def __init__(self, channel: str, future=None, event=None, result=None):
        self.channel, self._future, self._event, self._result = channel, future, event, result

    def wait(self, timeout: float | None = None):
        if self._future is not None:
            try:
                return self._future.result(timeout)
            except FutureTimeout:
                raise TimeoutError(f"the {self.channel} communication step gave no result within {timeout} s "
                                   f"(a peer rank died or hangs)") from None
        torch.cuda.current_stream().wait_event(self._event)
        return self._result


class CommStream:
    """Runs communication steps off the compute path, in submission order: a worker thread on CPU (gloo
    blocks the caller), a CUDA stream on GPU (NCCL and the step's small kernels run there; the caller waits
    on an event). The thread is a daemon: a rank that fails never waits for a step stuck on a dead peer."""

    def __init__(self, device: torch.device, channel: str):
        self.device, self.channel = device, channel
        if device.type == "cuda":
            self.stream = torch.cuda.Stream(device)
        else:
            self.steps: queue.SimpleQueue = queue.SimpleQueue()
            self.thread = threading.Thread(target=self._work, name=f"comm-{channel}", daemon=True)
            self.thread.start()

    def _work(self):
        while (item := self.steps.get()) is not None:
            step, future = item
            if future.set_running_or_notify_cancel():
                try:
                    future.set_result(step())
                except BaseException as err:  # noqa: BLE001 - handed to whoever waits for the step
                    future.set_exception(err)

    def submit(self, step) -> Handle:
        if self.device.type == "cuda":
            self.stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(self.stream):
                result = step()
                event = torch.cuda.Event()
                event.record(self.stream)
            return Handle(self.channel, event=event, result=result)
        future = Future()
        self.steps.put((step, future))
        return Handle(self.channel, future=future)

    def close(self, wait: bool = True):
        if self.device.type != "cuda":
            self.steps.put(None)
            if wait:
                self.thread.join()


class Comm:
    def __init__(self, groups: dict[str, Group], device: torch.device):
        """groups: channel -> this rank's Group (make_groups). Every collective and send on a channel runs on
        that channel's group; an operation that waits longer than the groups' timeout fails."""
        self.groups, self.device = dict(groups), device
        self.calls, self.bytes_sent, self.barriers = Counter(), Counter(), Counter()  # keyed (channel, op)
        self._streams: dict[str, CommStream] = {}

    @classmethod
    def local(cls, ranks: list[int], me: int, device: torch.device, channels=PIPELINE_CHANNELS) -> "Comm":
        """A Comm whose channels all span `ranks` (one pipeline, or a test's whole world)."""
        return cls(local_groups(channels, ranks, me), device)

    def index(self, channel: str) -> int:
        """This rank's index in the channel's group."""
        return self.groups[channel].index

    def size(self, channel: str) -> int:
        return self.groups[channel].size

    # -- bookkeeping --------------------------------------------------------------------------------
    def _count(self, channel: str, op: str, t: torch.Tensor, sends: bool = True):
        self.calls[(channel, op)] += 1
        if sends:
            self.bytes_sent[(channel, op)] += t.numel() * t.element_size()

    def by_op(self, counter: Counter) -> dict[str, float]:
        out = Counter()
        for (_, op), n in counter.items():
            out[op] += n
        return dict(sorted(out.items()))

    def by_channel(self, counter: Counter) -> dict[str, float]:
        out = Counter()
        for (channel, _), n in counter.items():
            out[channel] += n
        return dict(sorted(out.items()))

    def reset_counts(self):
        self.calls.clear()
        self.bytes_sent.clear()
        self.barriers.clear()

    @contextlib.contextmanager
    def barrier(self, name: str):
        """Marks one communication barrier: a point where compute waits for a collective's result."""
        self.barriers[name] += 1
        yield

    def stream(self, channel: str) -> CommStream:
        if channel not in self._streams:
            self._streams[channel] = CommStream(self.device, channel)
        return self._streams[channel]

    def submit(self, channel: str, step) -> Handle:
        return self.stream(channel).submit(step)

    def _pg(self, channel: str):
        return self.groups[channel].pg

    # -- point to point -----------------------------------------------------------------------------
    def isend(self, t: torch.Tensor, dst: int, channel: str):
        self._count(channel, "send", t)
        return dist.isend(t.contiguous(), group=self._pg(channel), group_dst=dst)

    def irecv(self, t: torch.Tensor, src: int, channel: str):
        self._count(channel, "recv", t, sends=False)
        return dist.irecv(t, group=self._pg(channel), group_src=src)

    # -- collectives (blocking for the caller: run them on a CommStream to overlap) ----------------
    def all_reduce(self, t: torch.Tensor, channel: str, op=dist.ReduceOp.SUM) -> torch.Tensor:
        self._count(channel, "all_reduce", t)
        if self.size(channel) > 1:
            dist.all_reduce(t, op=op, group=self._pg(channel))
        return t

    def all_gather(self, t: torch.Tensor, channel: str) -> torch.Tensor:
        """[*] -> [size, *]"""
        self._count(channel, "all_gather", t)
        out = torch.empty((self.size(channel), *t.shape), dtype=t.dtype, device=t.device)
        if self.size(channel) > 1:
            dist.all_gather(list(out.unbind(0)), t.contiguous(), group=self._pg(channel))
        else:
            out[0] = t
        return out

    def broadcast(self, t: torch.Tensor, src: int, channel: str) -> torch.Tensor:
        self._count(channel, "broadcast", t, sends=self.index(channel) == src)
        if self.size(channel) > 1:
            dist.broadcast(t, group=self._pg(channel), group_src=src)
        return t

    def reduce(self, t: torch.Tensor, dst: int, channel: str) -> torch.Tensor:
        self._count(channel, "reduce", t)
        if self.size(channel) > 1:
            dist.reduce(t, group=self._pg(channel), group_dst=dst)
        return t

    def reduce_scatter(self, t: torch.Tensor, channel: str) -> torch.Tensor:
        """[size, *] summed over the group -> this rank's [*] (counts the whole input, as all_reduce does)."""
        self._count(channel, "reduce_scatter", t)
        if self.size(channel) == 1:
            return t[0].clone()
        out = torch.empty(t.shape[1:], dtype=t.dtype, device=t.device)
        # [size * a, *rest] -> [a, *rest]: the collective splits its input along the first dimension
        dist.reduce_scatter_single(out.view(-1, *t.shape[2:]) if t.dim() > 1 else out.view(1),
                                   t.reshape(-1, *t.shape[2:]) if t.dim() > 1 else t, group=self._pg(channel))
        return out

    # -- asynchronous collectives: the caller waits on the returned work (overlap with its next GEMM) ----
    def ibroadcast(self, t: torch.Tensor, src: int, channel: str):
        """Counted as broadcast; t must be contiguous and stay untouched until wait()."""
        self._count(channel, "broadcast", t, sends=self.index(channel) == src)
        return dist.broadcast(t, group=self._pg(channel), group_src=src, async_op=True)

    def ireduce(self, t: torch.Tensor, dst: int, channel: str):
        """Counted as reduce; the sum lands in t on dst after wait()."""
        self._count(channel, "reduce", t)
        return dist.reduce(t, group=self._pg(channel), group_dst=dst, async_op=True)

    def close(self, failed: bool = False):
        """Release streams and groups; after a failure, without waiting on steps that may never end."""
        for s in self._streams.values():
            s.close(wait=not failed)
        if not failed:
            for g in self.groups.values():
                if g.pg is not None:
                    dist.destroy_process_group(g.pg)
        self.groups = {}
