"""NCCL's rules, emulated on gloo so that a CPU run fails where a GPU run would (--emulate-nccl).

gloo forgives what NCCL does not. The emulation takes those liberties away from a CPU run:
  lazy   a communicator not created eagerly is created at its first use, and creation blocks the calling
         thread until every member has reached its own first use (NCCL without `device_id`: ncclCommInitRank
         in the thread that issues the first collective, or the first send/receive of a pair);
  queue  every collective of a rank, on every channel, runs on one ordered queue: one completes before the
         next starts (NCCL kernels serialised: CUDA_DEVICE_MAX_CONNECTIONS=1, too few free SMs, or a device
         synchronisation such as the allocator's retry after an out-of-memory);
  p2p    each communicator runs its point-to-point transfers and its collectives in one order (one ordered queue
         per communicator), and a send completes only when its receiver has taken it (NCCL with device_id: an
         unbatched isend/irecv runs on the group's own communicator, serialised with all its other operations,
         and a send larger than NCCL's buffers waits for the receiver);
  both   lazy and queue;
  all    every rule at once: lazy, queue and p2p.
In every form a wait has no timeout of its own: only the watchdog ends it, after the communicator timeout,
naming the rank, the action it was at and each communication it waited for (NCCL's watchdog, which then takes
the process down).
"""
import threading
import time
from dataclasses import dataclass
from typing import Callable

import torch
import torch.distributed as dist

from vp.channels import link_channel, parse_link
from vp.cost.profiles import LINK_MAX_CTAS

FORMS = ("lazy", "queue", "p2p", "both", "all")
ACK_TAG = 1  # the tag of the p2p form's acknowledgements (data travels with tag 0)


@dataclass(frozen=True)
class Emulation:
    lazy: bool = False
    queue: bool = False
    p2p: bool = False

    @classmethod
    def of(cls, form: str | None) -> "Emulation | None":
        """The emulation of a run config's `emulate_nccl` (None: off)."""
        if form is None:
            return None
        if form not in FORMS:
            raise ValueError(f"emulate_nccl={form!r} is unknown; use one of {', '.join(FORMS)} (or leave it unset)")
        return cls(lazy=form in ("lazy", "both", "all"), queue=form in ("queue", "both", "all"),
                   p2p=form in ("p2p", "all"))


class WatchdogTimeout(RuntimeError):
    pass


class Watchdog:
    """The one timeout of an emulated rank. Every wait registers what it waits for; a wait that outlives
    timeout_s fires the watchdog, which makes every wait of the rank raise WatchdogTimeout with one report."""

    def __init__(self, rank: int, timeout_s: float, poll_s: float = 0.2):
        self.rank, self.timeout_s, self.poll_s = rank, timeout_s, poll_s
        self.where = "setting up"  # what the rank is doing (the runtime names iteration, step and action)
        self._waits: dict[int, tuple[str, float]] = {}
        self._lock = threading.Lock()
        self._next = 0
        self.report: str | None = None

    def wait(self, what: str, work):
        """Wait for a torch Work or a concurrent Future and return its result; raise WatchdogTimeout when this or
        any other wait of the rank timed out."""
        done, result = completion(work)
        with self._lock:
            key, self._next = self._next, self._next + 1
            self._waits[key] = (what, time.monotonic())
        try:
            while not done.wait(self.poll_s):
                if self.report is None and time.monotonic() - self._waits[key][1] > self.timeout_s:
                    self._fire(what)
                if self.report is not None:
                    raise WatchdogTimeout(self.report)
        finally:
            with self._lock:
                del self._waits[key]
        return result()

    def _fire(self, what: str):
        now = time.monotonic()
        with self._lock:
            if self.report is not None:
                return
            waits = "; ".join(f"{w} ({now - t0:.1f} s)" for w, t0 in sorted(self._waits.values(), key=lambda x: x[1]))
            self.report = (f"[Rank {self.rank}] Watchdog caught collective operation timeout: {what} ran for "
                           f"{self.timeout_s * 1e3:.0f} milliseconds before timing out; rank {self.rank} is at "
                           f"{self.where}, waiting for: {waits}")


class Pending:
    """A point-to-point Work of an emulating Comm: wait() goes through the watchdog."""

    def __init__(self, comm, work, what: str):
        self.comm, self.work, self.what = comm, work, what

    def wait(self):
        self.comm.block(self.what, self.work)


def completion(work) -> tuple[threading.Event, Callable[[], object]]:
    """(an Event set when a torch Work or a concurrent Future ends, a call that returns its result or raises its
    error). gloo's send and receive Works have no future and must be waited for exactly once (a second wait waits
    for another message): a daemon thread does that one wait."""
    done = threading.Event()
    if not hasattr(work, "get_future"):  # a concurrent.futures.Future
        work.add_done_callback(lambda _: done.set())
        return done, work.result
    try:
        work.get_future().add_done_callback(lambda _: done.set())
        return done, work.wait
    except RuntimeError:  # Work::getFuture not implemented
        errors = []

        def wait():
            try:
                work.wait()
            except BaseException as err:  # noqa: BLE001 - raised in the thread that waits through the watchdog
                errors.append(err)
            finally:
                done.set()

        def result():
            if errors:
                raise errors[0]

        threading.Thread(target=wait, name="wait-p2p", daemon=True).start()
        return done, result


def acked_send(comm, t: torch.Tensor, dst: int, channel: str, what: str):
    """The p2p form, on the queue of the channel's communicator: a send that ends only when the receiver has taken
    it (the receiver's acknowledgement, under ACK_TAG on the same group). dst: an index in the channel's group."""
    pg = comm.groups[channel].pg
    comm.block(what, dist.isend(t, group=pg, group_dst=dst))
    comm.block(f"{what} (until taken)", dist.irecv(torch.zeros(1), group=pg, group_src=dst, tag=ACK_TAG))


def acked_recv(comm, t: torch.Tensor, src: int, channel: str, what: str):
    pg = comm.groups[channel].pg
    comm.block(what, dist.irecv(t, group=pg, group_src=src))
    comm.block(f"{what} (taking it)", dist.isend(torch.zeros(1), group=pg, group_dst=src, tag=ACK_TAG))




def splitting():
    """torch.distributed.split_group where communicators can be made by splitting the world's (NCCL with the default
    group bound to a device: init_process_group(device_id=...)); None elsewhere (gloo; a torch older than
    split_group, which the floor 2.6 may be: vp.comm.make_groups then calls new_group per group)."""
    split = getattr(dist, "split_group", None)
    if split is None or not dist.is_initialized() or dist.get_backend() != "nccl":
        return None
    return split if getattr(dist.group.WORLD, "bound_device_id", None) is not None else None


def nccl_options(link: bool):
    """ProcessGroupNCCL's options for a new communicator, None off NCCL. Every communicator's internal streams get
    high priority (communication kernels start ahead of queued GEMMs, the GEMMs keep the rest of the SMs); a link's
    (point-to-point only) uses at most LINK_MAX_CTAS channels, which also caps its buffers: NCCL allocates them per
    channel and peer (vp.cost.memory.link_buffer_bytes)."""
    pg_nccl = getattr(dist, "ProcessGroupNCCL", None)
    if pg_nccl is None or not dist.is_initialized() or dist.get_backend() != "nccl":
        return None
    options = pg_nccl.Options()
    options.is_high_priority_stream = True
    if link and hasattr(options, "config") and hasattr(options.config, "max_ctas"):
        options.config.max_ctas = LINK_MAX_CTAS
        options.config.min_ctas = 1
    return options


def connect(comm, links=()):
    """Create every communicator of `comm` (a vp.comm.Comm) eagerly, in one order shared by all ranks: each
    channel's group in make_groups' order (a point-to-point link's own group among them), then a token through each
    point-to-point pair: (channel, sender, receiver) of `links` in pipeline indices, the same list on every rank; a
    link with its own group warms up that group's one pair, any other the pair on the channel's group. Pairs go
    sorted by channel, then pair. A creation blocks until every member has arrived; as each rank takes its creations
    in that one global order, the first unfinished creation always has all its members waiting in it, so every
    creation finishes (docs/gpu-path.md)."""
    order = {ch: i for i, ch in enumerate(comm.groups)}
    for channel in comm.groups:
        create(comm, ("group", channel))
    pairs = set()
    for channel, sender, receiver in links:
        link = link_channel(channel, sender, receiver)
        if link in comm.groups:
            pairs.add((link, 0, 1))
        elif channel in comm.groups:  # a layout without per-link groups (the old whole-pipeline one)
            pairs.add((channel, min(sender, receiver), max(sender, receiver)))
    for channel, a, b in sorted(pairs, key=lambda pair: (order[pair[0]], pair[1], pair[2])):
        if comm.index(channel) in (a, b):
            create(comm, ("pair", channel, a, b))
    if comm.device.type == "cuda":
        torch.cuda.synchronize(comm.device)


def create(comm, key: tuple):
    """Make one communicator, key ("group", channel) or ("pair", channel, a, b): a token through the whole group,
    or both ways between a pair (the lower index sends first), blocking until its members are all there. NCCL
    creates the communicator right here; gloo made it with the group, and the token only meets the members.
    A link's group (two ranks, point-to-point only) is met by a token both ways, never by a collective, whose ring
    buffers NCCL would allocate on first use and keep for the communicator's life; its pair (NCCL's point-to-point
    connection) stays a creation of its own, which connect warms up."""
    if key in comm.created:
        return
    channel = key[1]
    if comm.size(channel) > 1:
        token = torch.zeros(1, device=comm.device)
        pg = comm.groups[channel].pg
        link = key[0] == "group" and parse_link(channel) is not None and comm.size(channel) == 2
        if key[0] == "group" and not link:
            comm.block(f"creation of the {channel} communicator", dist.all_reduce(token, group=pg, async_op=True))
        else:
            a, b = (0, 1) if link else key[2:]
            me = comm.index(channel)
            peer = b if me == a else a
            steps = [lambda: dist.isend(token, group=pg, group_dst=peer),
                     lambda: dist.irecv(token, group=pg, group_src=peer)]
            for step in steps if me == a else steps[::-1]:
                comm.block(f"creation of the {channel} communicator with rank {peer}", step())
    comm.created.add(key)
