"""Every collective and point-to-point call goes through Comm, which counts calls, payload bytes and
barriers, so that tests can pin "Algorithm 2 has one barrier" and runs can report bytes sent.

Process groups are sliced from one rank grid, arange(world).view(dp, pp); each channel of traffic gets
its own group over a pipeline row, so that no two kinds of traffic share an ordered communicator:
  fwd+ fwd-  activations sent to a higher / lower rank      bwd+ bwd-  input gradients likewise
  C0 C1 C2   the output layer's steps                       IF IB      the input layer's steps
  naive      the synchronous all-reduces of the naive (Megatron / interlaced) output layer
  step       end-of-iteration agreement (fp16 overflow check, metrics)
Ranks in a Comm are pipeline ranks 0..pp-1; it maps them to global ranks.
"""
import contextlib
import queue
import threading
from collections import Counter
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from datetime import timedelta

import torch
import torch.distributed as dist

CHANNELS = ("fwd+", "fwd-", "bwd+", "bwd-", "C0", "C1", "C2", "IF", "IB", "naive", "step")


def rank_grid(world: int, pp: int) -> torch.Tensor:
    """[dp, pp] grid of global ranks; row d is one pipeline."""
    if world % pp:
        raise ValueError(f"world size {world} is not a multiple of pp={pp}; launch pp x dp processes")
    return torch.arange(world).view(world // pp, pp)


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
    def __init__(self, pp_ranks: list[int], me: int, device: torch.device, timeout_s: float | None = None):
        """pp_ranks: global ranks of this pipeline; me: this process's pipeline rank. Every process of the
        world must construct its Comm at the same time (new_group is collective). An operation that waits
        longer than timeout_s fails (the rest of the run then fails with it)."""
        self.ranks, self.me, self.size, self.device = list(pp_ranks), me, len(pp_ranks), device
        timeout = timedelta(seconds=timeout_s) if timeout_s else None
        self.groups = ({ch: dist.new_group(self.ranks, timeout=timeout) for ch in CHANNELS}
                       if dist.is_initialized() else {})
        self.calls, self.bytes_sent, self.barriers = Counter(), Counter(), Counter()
        self._streams: dict[str, CommStream] = {}

    # -- bookkeeping --------------------------------------------------------------------------------
    def _count(self, op: str, t: torch.Tensor, sends: bool = True):
        self.calls[op] += 1
        if sends:
            self.bytes_sent[op] += t.numel() * t.element_size()

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

    # -- point to point -----------------------------------------------------------------------------
    def isend(self, t: torch.Tensor, dst: int, channel: str):
        self._count("send", t)
        return dist.isend(t.contiguous(), group=self.groups[channel], group_dst=dst)

    def irecv(self, t: torch.Tensor, src: int, channel: str):
        self._count("recv", t, sends=False)
        return dist.irecv(t, group=self.groups[channel], group_src=src)

    # -- collectives (blocking for the caller: run them on a CommStream to overlap) ----------------
    def all_reduce(self, t: torch.Tensor, channel: str, op=dist.ReduceOp.SUM) -> torch.Tensor:
        self._count("all_reduce", t)
        if self.size > 1:
            dist.all_reduce(t, op=op, group=self.groups[channel])
        return t

    def all_gather(self, t: torch.Tensor, channel: str) -> torch.Tensor:
        """[*] -> [size, *]"""
        self._count("all_gather", t)
        out = torch.empty((self.size, *t.shape), dtype=t.dtype, device=t.device)
        if self.size > 1:
            dist.all_gather(list(out.unbind(0)), t.contiguous(), group=self.groups[channel])
        else:
            out[0] = t
        return out

    def broadcast(self, t: torch.Tensor, src: int, channel: str) -> torch.Tensor:
        self._count("broadcast", t, sends=self.me == src)
        if self.size > 1:
            dist.broadcast(t, group=self.groups[channel], group_src=src)
        return t

    def reduce(self, t: torch.Tensor, dst: int, channel: str) -> torch.Tensor:
        self._count("reduce", t)
        if self.size > 1:
            dist.reduce(t, group=self.groups[channel], group_dst=dst)
        return t

    def close(self, failed: bool = False):
        """Release streams and groups; after a failure, without waiting on steps that may never end."""
        for s in self._streams.values():
            s.close(wait=not failed)
        if not failed:
            for g in self.groups.values():
                dist.destroy_process_group(g)
        self.groups = {}
