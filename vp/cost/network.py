"""A two-level network: gpus_per_node devices on NVLink, nodes on InfiniBand; global ranks sit on nodes in
vp.mesh's rank order (node = global rank // gpus_per_node), so a pipeline is placed as the mesh places it.

Collectives follow NCCL's own cost model (src/graph/tuning.cc, Simple protocol): a fixed latency per call, a
latency per ring step (the inter-node steps at the network's latency), and the bytes each rank puts on the
wire over the slowest link the group crosses (InfiniBand as soon as it spans two nodes); the payload is the
tensor each rank hands to the collective (vp.cost.traffic.payloads):
  ring all-reduce  2(n-1) steps, 2(n-1)/n of the payload;  all-gather (n-1) steps, (n-1) payloads;
  broadcast/reduce (n-1) pipelined steps, the payload once;  reduce-scatter (n-1) steps, (n-1)/n of its input;
  tree all-reduce  2((n/nodes - 1) intra + log2(nodes) inter) steps, twice the payload; the faster of ring and
                   tree is taken, as NCCL does.
A point-to-point message takes one step's latency plus bytes over its link.
A measured profile answers for a group inside one node from its table of the same operation and group size,
measured with as many of the node's processes at work as the run has (Network.busy; vp.cost.tables.collective_s);
this model answers elsewhere.
"""
import math
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache

import numpy as np

from vp.cost.profiles import Hardware
from vp.cost.tables import Tables
from vp.mesh import Mesh


@dataclass(frozen=True)
class Op:
    name: str
    steps: Callable[[int], int]  # ring steps among n participants
    wire: Callable[[int], float]  # bytes each rank sends on the slowest link, per byte of payload
    tree: bool  # NCCL may run it as a tree


ALL_REDUCE = Op("all_reduce", lambda n: 2 * (n - 1), lambda n: 2 * (n - 1) / n, True)
ALL_GATHER = Op("all_gather", lambda n: n - 1, lambda n: n - 1.0, False)
BROADCAST = Op("broadcast", lambda n: n - 1, lambda n: 1.0, False)
REDUCE = Op("reduce", lambda n: n - 1, lambda n: 1.0, False)
REDUCE_SCATTER = Op("reduce_scatter", lambda n: n - 1, lambda n: (n - 1) / n, False)  # payload: the whole input
OPS = {op.name: op for op in (ALL_REDUCE, ALL_GATHER, BROADCAST, REDUCE, REDUCE_SCATTER)}  # by the names payloads() uses


@dataclass(frozen=True)
class Network:
    gpus_per_node: int
    link_bandwidth: float
    link_latency: float
    ib_bandwidth: float
    ib_latency: float
    collective_latency: float
    tables: Tables = Tables()
    busy: int = 0  # ranks of a node that communicate at once (a measured table's world; 0: each group alone)

    @classmethod
    def of(cls, hw: Hardware, world: int = 0) -> "Network":
        """The network of a profile, for a run of `world` ranks (0: each group priced as if alone on its node)."""
        return cls(hw.gpus_per_node, hw.link_bandwidth, hw.link_latency, hw.ib_bandwidth, hw.ib_latency,
                   hw.collective_latency, hw.tables, min(world, hw.gpus_per_node))

    def node(self, rank: int) -> int:
        return rank // self.gpus_per_node

    def p2p(self, src: int, dst: int, nbytes: float) -> float:
        if self.node(src) == self.node(dst):
            measured = self.tables.collective_s("p2p", 2, nbytes, self.busy)
            if measured is not None:
                return measured
            return self.link_latency + nbytes / self.link_bandwidth
        return self.ib_latency + nbytes / self.ib_bandwidth

    def span(self, ranks) -> tuple[int, int]:
        return span(ranks, self.gpus_per_node)

    def collective(self, op: Op, ranks, nbytes: float) -> float:
        """Seconds of one collective over `ranks` (global ranks) with a payload of nbytes."""
        if len(ranks) < 2:
            return 0.0
        return self.collective_on(op, *self.span(ranks), nbytes)

    def collective_on(self, op: Op, n: int, nodes: int, nbytes: float) -> float:
        """Seconds of one collective over n ranks on `nodes` nodes (Network.span) with a payload of nbytes."""
        if n < 2:
            return 0.0
        measured = self.tables.collective_s(op.name, n, nbytes, self.busy) if nodes == 1 else None
        if measured is not None:
            return measured
        bandwidth = self.ib_bandwidth if nodes > 1 else self.link_bandwidth
        inter = op.steps(nodes)
        ring = (self.collective_latency + (op.steps(n) - inter) * self.link_latency + inter * self.ib_latency
                + nbytes * op.wire(n) / bandwidth)
        if not op.tree:
            return ring
        per_node = n // nodes
        tree = (self.collective_latency
                + 2 * ((per_node - 1) * self.link_latency + math.ceil(math.log2(nodes)) * self.ib_latency)
                + 2 * nbytes / bandwidth)
        return min(ring, tree)

    def collective_cpu(self, op: Op, ranks, nbytes: float) -> float:
        """CPU seconds one collective over `ranks` costs each member where the profile measured it (a CPU node,
        vp.cost.tables.Tables.collective_cpu_s), else 0: a GPU's collectives run on the network and copy engines
        beside the compute, and across nodes nothing was measured."""
        n = len(ranks)
        if n < 2 or len({self.node(r) for r in ranks}) > 1:
            return 0.0
        return self.tables.collective_cpu_s(op.name, n, nbytes, self.busy) or 0.0


def span(ranks, gpus_per_node: int) -> tuple[int, int]:
    """(ranks, nodes) of a group of global ranks: all of it that a collective's seconds read (collective_on)."""
    return len(ranks), len({r // gpus_per_node for r in ranks})


@cache
def groups(mesh: Mesh, axis: str) -> tuple[tuple[int, ...], ...]:
    """The mesh's groups along an axis, as global ranks (vp.mesh: rank = (d * pp + p) * tp + t)."""
    return tuple(tuple(g) for g in mesh.groups(axis))


def group_index(mesh: Mesh, axis: str) -> dict[int, tuple[int, ...]]:
    """Each global rank's group along an axis (the groups of one axis partition the ranks; vp.mesh.Mesh.group_index,
    worked out once per mesh)."""
    return mesh.group_index(axis)


def fit_link(points: list[list[float]]) -> tuple[float, float]:
    """(latency s, bandwidth bytes/s) from [bytes, seconds] points, by least squares."""
    pts = np.array(points, dtype=float)
    a = np.stack([np.ones(len(pts)), pts[:, 0]], axis=1)
    (latency, inv_bw), *_ = np.linalg.lstsq(a, pts[:, 1], rcond=None)
    return max(0.0, float(latency)), 1.0 / max(float(inv_bw), 1e-15)
