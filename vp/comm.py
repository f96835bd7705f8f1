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
A point-to-point transfer runs on its link's own group when one was made (`link_channel`: one channel, one sender,
one receiver; vp.channels.channels makes one for every link the schedule uses), so that no send waits behind another
transfer of its communicator (docs/gpu-path.md); else on the channel's group.
Communicators are created eagerly in one global order (connect); with `emulate`, gloo keeps NCCL's rules (vp.nccl).
Steps run off the compute path on a channel's CommStream (vp.comm_stream).
"""
import threading
import warnings

import torch
import torch.distributed as dist

from vp.channels import PIPELINE_CHANNELS, parse_link
from vp.comm_counts import TrafficCounts
from vp.comm_groups import Group, local_groups, make_groups  # noqa: F401 - make_groups, Group: vp.comm's interface
from vp.cost.memory import Communicators
from vp.comm_stream import CommStream, Handle
from vp.failure import Progress
from vp.nccl import Emulation, Pending, Watchdog, acked_recv, acked_send, connect, create

# torch 2.13 deprecates reduce_scatter_tensor for reduce_scatter_single, which torch 2.11 and older (pyproject's
# floor among them) lack: every rank of a grid run would print the warning once
warnings.filterwarnings("ignore", r"`torch\.distributed\.reduce_scatter_tensor` is deprecated", FutureWarning)
# the flat (single-tensor) collectives under their current names, the older ones where torch predates them
_REDUCE_SCATTER = getattr(dist, "reduce_scatter_single", dist.reduce_scatter_tensor)
_ALL_GATHER = getattr(dist, "all_gather_single", dist.all_gather_into_tensor)


class Comm(TrafficCounts):
    def __init__(self, groups: dict[str, Group], device: torch.device, emulate: Emulation | None = None,
                 timeout_s: float = 300.0, rank: int = 0):
        """groups: channel -> this rank's Group (make_groups). Every collective and send on a channel runs on
        that channel's group; an operation that waits longer than the groups' timeout fails. `emulate` applies
        NCCL's rules on gloo (vp.nccl), with a watchdog of timeout_s as the only timeout."""
        self.groups, self.device, self.emulate = dict(groups), device, emulate
        self.watchdog = Watchdog(rank, timeout_s) if emulate else None
        self.progress = Progress.from_env()  # the launcher's note of what this rank does (vp.failure)
        TrafficCounts.__init__(self)
        self._streams: dict[str, CommStream] = {}
        self._fifos: dict[str, CommStream] = {}  # emulated p2p form: one ordered queue per communicator
        # (channel, "send" | "recv", peer's pipeline index) -> the link's own group, for the links this rank is on
        self.links: dict[tuple[str, str, int], str] = {}
        for name, group in self.groups.items():
            if link := parse_link(name):
                channel, sender, receiver = link  # the group's two ranks in global order, as the pipeline's
                sends = group.index == (0 if sender < receiver else 1)
                self.links[(channel, "send", receiver) if sends else (channel, "recv", sender)] = name
        self.created: set[tuple] = set()  # communicators: ("group", channel) or ("pair", channel, a, b), a < b
        self.lazily: list[tuple] = []  # those created at their first use, in order (never, once connect() ran)

    @classmethod
    def local(cls, ranks: list[int], me: int, device: torch.device, channels=PIPELINE_CHANNELS,
              emulate: Emulation | None = None, timeout_s: float = 300.0) -> "Comm":
        """A Comm whose channels all span `ranks` (one pipeline, or a test's whole world)."""
        return cls(local_groups(channels, ranks, me), device, emulate, timeout_s, ranks[me])

    def index(self, channel: str) -> int:
        """This rank's index in the channel's group."""
        return self.groups[channel].index

    def size(self, channel: str) -> int:
        return self.groups[channel].size

    # -- communicators ------------------------------------------------------------------------------
    def connect(self, links=()):
        """Create every communicator this rank uses, eagerly, in one order shared by all ranks (vp.nccl.connect)."""
        connect(self, links)

    def communicators(self) -> int:
        """NCCL communicators this rank holds: the world's and one per group of two or more ranks (with device_id,
        torch runs a group's point-to-point transfers on the group's own communicator, so pairs add none)."""
        return 1 + sum(1 for key in self.created if key[0] == "group" and self.size(key[1]) > 1)

    def held(self) -> Communicators:
        """The communicators() by kind: point-to-point links of two ranks, and the rest (vp.cost.memory)."""
        links = sum(1 for key in self.created if key[0] == "group" and parse_link(key[1]) and self.size(key[1]) > 1)
        return Communicators(self.communicators() - links, links)

    def _first_use(self, key: tuple):
        """Emulated NCCL without eager creation: the first use creates the communicator, blocking this thread."""
        if key in self.created:
            return
        if self.emulate and self.emulate.lazy:
            self.lazily.append(key)
            create(self, key)
        else:  # gloo connected the group when it was made; NCCL would connect here
            self.created.add(key)

    def block(self, what: str, work):
        """Wait for a Work to complete: through the watchdog when emulating NCCL, else the backend's own wait."""
        if self.watchdog is not None:
            self.watchdog.wait(what, work)
        else:
            work.wait()

    def doing(self, where: str):
        """What this rank does now (iteration, step, action), for the watchdog's report."""
        if self.watchdog is not None:
            self.watchdog.where = where
        if self.progress is not None:
            self.progress.note(where)

    def stream(self, channel: str) -> CommStream:
        """The channel's CommStream; in the emulated queue form, the one queue of every channel."""
        name = "queue" if self.emulate and self.emulate.queue else channel
        if name not in self._streams:
            self._streams[name] = CommStream(self.device, name, self.watchdog)
        return self._streams[name]

    def submit(self, channel: str, step, what: str | None = None, reads=()) -> Handle:
        """Run a step of collectives on `channel` off the compute path; `what` names it in failure reports; `reads`:
        the compute stream's tensors it reads (CommStream.submit)."""
        self._first_use(("group", channel))
        return self.stream(channel).submit(step, what or channel, reads)

    def _collective(self, channel: str, op: str, start):
        """Run one collective to its end; `start` issues it asynchronously. In the emulated queue form, a call
        from outside the queue goes through it, behind every step issued before."""
        self._first_use(("group", channel))
        queue = self._streams.get("queue")
        if self.emulate and self.emulate.queue and (queue is None or threading.current_thread() is not queue.thread):
            return self.submit(channel, lambda: self._collective(channel, op, start), f"{op} on {channel}").wait()
        if fifo := self._fifo(channel):  # behind every earlier transfer and collective of its communicator
            return fifo.submit(lambda: self.block(f"{op} on {channel}", start()), f"{op} on {channel}").wait()
        self.block(f"{op} on {channel}", start())

    def _pg(self, channel: str):
        return self.groups[channel].pg

    def _fifo(self, channel: str) -> CommStream | None:
        """Emulated p2p form: the ordered queue of the channel's communicator, unless already running on it."""
        if not (self.emulate and self.emulate.p2p):
            return None
        if channel not in self._fifos:
            self._fifos[channel] = CommStream(self.device, f"nccl-{channel}", self.watchdog)
        fifo = self._fifos[channel]
        return None if threading.current_thread() is fifo.thread else fifo

    # -- point to point -----------------------------------------------------------------------------
    def _pair(self, channel: str, peer: int) -> tuple:
        me = self.index(channel)
        return ("pair", channel, min(me, peer), max(me, peer))

    def route(self, channel: str, peer: int, send: bool) -> tuple[str, int]:
        """(the channel whose communicator carries a transfer to or from pipeline index `peer`, the peer's index in
        it): the link's own group when this rank has one, else the channel's group."""
        link = self.links.get((channel, "send" if send else "recv", peer))
        return (link, 1 - self.index(link)) if link else (channel, peer)

    def isend(self, t: torch.Tensor, dst: int, channel: str):
        self._count(channel, "send", t)
        what = f"send to rank {dst} on {channel}"
        via, dst = self.route(channel, dst, send=True)
        self._first_use(self._pair(via, dst))
        t = t.contiguous()
        if fifo := self._fifo(via):
            return fifo.submit(lambda: acked_send(self, t, dst, via, what), what)
        work = dist.isend(t, group=self._pg(via), group_dst=dst)
        return Pending(self, work, what) if self.watchdog else work

    def irecv(self, t: torch.Tensor, src: int, channel: str):
        self._count(channel, "recv", t, sends=False)
        what = f"receive from rank {src} on {channel}"
        via, src = self.route(channel, src, send=False)
        self._first_use(self._pair(via, src))
        if fifo := self._fifo(via):
            return fifo.submit(lambda: acked_recv(self, t, src, via, what), what)
        work = dist.irecv(t, group=self._pg(via), group_src=src)
        return Pending(self, work, what) if self.watchdog else work

    # -- collectives (blocking for the caller: run them on a CommStream to overlap) ----------------
    def all_reduce(self, t: torch.Tensor, channel: str, op=dist.ReduceOp.SUM) -> torch.Tensor:
        self._count(channel, "all_reduce", t)
        if self.size(channel) > 1:
            self._collective(channel, "all_reduce",
                             lambda: dist.all_reduce(t, op=op, group=self._pg(channel), async_op=True))
        return t

    def all_gather(self, t: torch.Tensor, channel: str) -> torch.Tensor:
        """[*] -> [size, *]"""
        self._count(channel, "all_gather", t)
        out = torch.empty((self.size(channel), *t.shape), dtype=t.dtype, device=t.device)
        if self.size(channel) > 1:  # gloo takes the concatenated (flat) form of the output only
            t = t.contiguous()
            self._collective(channel, "all_gather",
                             lambda: _ALL_GATHER(out.view(-1), t.view(-1), group=self._pg(channel), async_op=True))
        else:
            out[0] = t
        return out

    def broadcast(self, t: torch.Tensor, src: int, channel: str) -> torch.Tensor:
        self._count(channel, "broadcast", t, sends=self.index(channel) == src)
        if self.size(channel) > 1:
            self._collective(channel, "broadcast",
                             lambda: dist.broadcast(t, group=self._pg(channel), group_src=src, async_op=True))
        return t

    def reduce(self, t: torch.Tensor, dst: int, channel: str) -> torch.Tensor:
        self._count(channel, "reduce", t)
        if self.size(channel) > 1:
            self._collective(channel, "reduce",
                             lambda: dist.reduce(t, group=self._pg(channel), group_dst=dst, async_op=True))
        return t

    def reduce_scatter(self, t: torch.Tensor, channel: str) -> torch.Tensor:
        """[size, *] summed over the group -> this rank's [*] (counts the whole input, as all_reduce does)."""
        self._count(channel, "reduce_scatter", t)
        if self.size(channel) == 1:
            return t[0].clone()
        out = torch.empty(t.shape[1:], dtype=t.dtype, device=t.device)
        # [size * a, *rest] -> [a, *rest]: the collective splits its input along the first dimension
        self._collective(channel, "reduce_scatter", lambda: dist.reduce_scatter_tensor(
            out.view(-1, *t.shape[2:]) if t.dim() > 1 else out.view(1), t.reshape(-1, *t.shape[2:]) if t.dim() > 1
            else t, group=self._pg(channel), async_op=True))
        return out

    def reduce_scatter_flat(self, t: torch.Tensor, channel: str) -> torch.Tensor:
        """In place: a flat [size * n] buffer summed over the group, this rank's [n] slice of the sum written into
        its own slice (the other slices keep what they held); returns that slice. Counts the whole input."""
        self._count(channel, "reduce_scatter", t)
        n = t.numel() // self.size(channel)
        mine = t[self.index(channel) * n:(self.index(channel) + 1) * n]
        if self.size(channel) > 1:
            self._collective(channel, "reduce_scatter", lambda: _REDUCE_SCATTER(mine, t, group=self._pg(channel),
                                                                                async_op=True))
        return mine

    def all_gather_flat(self, t: torch.Tensor, channel: str) -> torch.Tensor:
        """In place: every rank's [n] slice of a flat [size * n] buffer (its own slice at its index) to every rank.
        Counts the slice sent."""
        n = t.numel() // self.size(channel)
        mine = t[self.index(channel) * n:(self.index(channel) + 1) * n]
        self._count(channel, "all_gather", mine)
        if self.size(channel) > 1:
            self._collective(channel, "all_gather", lambda: _ALL_GATHER(t, mine, group=self._pg(channel),
                                                                        async_op=True))
        return t

    # -- asynchronous collectives: the caller waits on the returned work (overlap with its next GEMM) ----
    def ibroadcast(self, t: torch.Tensor, src: int, channel: str):
        """Counted as broadcast; t must be contiguous and stay untouched until wait()."""
        self._count(channel, "broadcast", t, sends=self.index(channel) == src)
        return self._started(channel, "broadcast",
                             lambda: dist.broadcast(t, group=self._pg(channel), group_src=src, async_op=True))

    def ireduce(self, t: torch.Tensor, dst: int, channel: str):
        """Counted as reduce; the sum lands in t on dst after wait()."""
        self._count(channel, "reduce", t)
        return self._started(channel, "reduce",
                             lambda: dist.reduce(t, group=self._pg(channel), group_dst=dst, async_op=True))

    def _started(self, channel: str, op: str, start):
        """An asynchronous collective, started; wait() on the result. Emulating NCCL, it is created lazily like
        any other, waits through the watchdog, and in the queue form runs in the rank's one queue."""
        if self.watchdog is None:
            return start()
        self._first_use(("group", channel))
        what = f"{op} on {channel}"
        if self.emulate.queue:  # the queue's step goes through the communicator's own queue too (_collective)
            return self.submit(channel, lambda: self._collective(channel, op, start), what)
        if fifo := self._fifo(channel):
            return fifo.submit(lambda: self.block(what, start()), what)
        return Pending(self, start(), what)

    def close(self, failed: bool = False):
        """Release streams and groups; after a failure, without waiting on steps that may never end (the process
        then aborts its communicators: abort_all)."""
        for s in [*self._streams.values(), *self._fifos.values()]:
            s.close(wait=not failed)
        if not failed:
            for g in self.groups.values():
                if g.pg is not None:
                    dist.destroy_process_group(g.pg)
        self.groups = {}


def abort_all():
    """After a failure: abort every communicator of this process at once (NCCL's group abort: aborting them one
    by one can deadlock), without waiting for pending work, so that peers blocked with this rank fail now."""
    from torch.distributed.distributed_c10d import _abort_process_group

    if dist.is_initialized():
        _abort_process_group()
