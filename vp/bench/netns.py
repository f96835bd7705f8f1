"""A network between data-parallel replicas on one machine, for python -m vp.bench overlap --link-gbit: each replica's
ranks in a network namespace of their own, every namespace joined to a bridge in a hub namespace by a veth pair
whose two ends are rate-limited by tc's token bucket filter (tbf), as nodes are joined through a switch by NICs of one
speed. Ranks bind gloo to their namespace's veth (GLOO_SOCKET_IFNAME) and meet through the run's file:// store:
a replica's own traffic (pipeline, vocabulary, tensor-parallel) stays on its namespace's loopback, the dp group's
crosses the limited links, so the gradient reduction waits on the network, not on the cores the backward needs.

Why namespaces and not a tc rule on the shared loopback: a rule on `lo` would slow every process of the machine and
could not tell dp traffic from the rest. (netem, which would add a delay, is not in every kernel: tbf is a rate
alone.) Needs root and iproute2's `ip` and `tc`. Namespaces are named vpdp<pid>-<n>: removed on every exit path of
the context manager, and a later Link removes those of a process that no longer exists (one killed outright)."""
import ctypes
import os
import re
import shutil
import signal
import subprocess

from vp.config import RunConfig

PREFIX = "vpdp"
IFNAME = "vpdp"  # the veth end inside each replica's namespace (names are per namespace)
CLONE_NEWNET = 0x40000000


def check_available() -> None:
    """ValueError naming what is missing: root, `ip`, `tc`."""
    if os.geteuid() != 0:
        raise ValueError("--link-gbit makes network namespaces and tc rules: run as root, or leave out --link-gbit "
                         "(the replicas then reduce over loopback)")
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            raise ValueError(f"--link-gbit needs iproute2's `{tool}` on PATH; install iproute2 or leave out "
                             f"--link-gbit")


def _sh(*args: str) -> None:
    out = subprocess.run(args, capture_output=True, text=True)
    if out.returncode:
        raise RuntimeError(f"{' '.join(args)}: {out.stderr.strip()}")


def _ns(name: str, *args: str) -> None:
    _sh("ip", "netns", "exec", name, *args)


def remove_stale() -> list[str]:
    """Remove the namespaces of this module whose process is gone; -> their names."""
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    gone = []
    for name in re.findall(rf"^({PREFIX}(\d+)-\w+)", out, flags=re.M):
        pid = int(name[1])
        if not os.path.exists(f"/proc/{pid}"):
            subprocess.run(["ip", "netns", "del", name[0]], capture_output=True)
            gone.append(name[0])
    return gone


class Link:
    """with Link(replicas, gbit) as link: link.namespaces[d] is replica d's namespace (10.213.0.<d+1>/24 on its
    veth `vpdp`); both ends of each replica's veth send at most `gbit` Gbit/s."""

    def __init__(self, replicas: int, gbit: float):
        if not gbit > 0:
            raise ValueError(f"--link-gbit {gbit} must be a positive rate in Gbit/s (e.g. 1)")
        check_available()
        self.replicas, self.gbit = replicas, gbit
        tag = f"{PREFIX}{os.getpid()}"
        self.hub = f"{tag}-hub"
        self.namespaces = [f"{tag}-{d}" for d in range(replicas)]
        self._made: list[str] = []

    def _tbf(self, ns: str, dev: str) -> None:
        rate = self.gbit * 1e9 / 8  # bytes/s
        burst = max(64 * 1024, int(rate / 250))  # at least a timer tick's worth at HZ 250
        _ns(ns, "tc", "qdisc", "add", "dev", dev, "root", "tbf", "rate", f"{self.gbit}gbit", "burst", str(burst),
            "latency", "100ms")

    def __enter__(self) -> "Link":
        remove_stale()
        self._old_term = signal.signal(signal.SIGTERM, _raise_exit)  # a plain kill still removes the namespaces
        try:
            for ns in [self.hub, *self.namespaces]:
                _sh("ip", "netns", "add", ns)
                self._made.append(ns)
                _ns(ns, "ip", "link", "set", "lo", "up")
            _ns(self.hub, "ip", "link", "add", "name", "br0", "type", "bridge")
            _ns(self.hub, "ip", "link", "set", "br0", "up")
            for d, ns in enumerate(self.namespaces):
                port = f"r{d}"
                _ns(self.hub, "ip", "link", "add", "name", port, "type", "veth", "peer", "name", IFNAME, "netns", ns)
                _ns(self.hub, "ip", "link", "set", port, "master", "br0")
                _ns(self.hub, "ip", "link", "set", port, "up")
                _ns(ns, "ip", "addr", "add", f"10.213.0.{d + 1}/24", "dev", IFNAME)
                _ns(ns, "ip", "link", "set", IFNAME, "up")
                self._tbf(ns, IFNAME)  # what the replica sends
                self._tbf(self.hub, port)  # what it receives
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, *exc) -> None:
        for ns in reversed(self._made):  # deleting a namespace deletes its veth ends and their qdiscs
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        self._made.clear()
        signal.signal(signal.SIGTERM, self._old_term)


def _raise_exit(signum, frame):
    raise SystemExit(128 + signum)


def _setns(name: str) -> None:
    """Move this thread (the rank's main thread, before it starts any other) into network namespace `name`."""
    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(f"/run/netns/{name}", os.O_RDONLY)
    try:
        if libc.setns(fd, CLONE_NEWNET) != 0:
            raise OSError(ctypes.get_errno(), f"setns into network namespace {name}")
    finally:
        os.close(fd)


def rank_in_namespace(namespaces: list[str], cfg: RunConfig, rank: int, world: int, init_method: str, **kw):
    """vp.launch.launch_local's rank_fn (through functools.partial): this rank in its replica's namespace, gloo on
    its veth, then vp.run.run_rank as a local run's rank."""
    from vp.run import run_rank

    _setns(namespaces[cfg.mesh.coords(rank).d])
    os.environ["GLOO_SOCKET_IFNAME"] = IFNAME  # read when this rank's gloo groups are made
    return run_rank(cfg, rank, world, init_method, local_world=world, **kw)
