"""What a schedule's actions cost: durations and memory (Costs), and the unit costs of tests and pictures. Data at
the bottom of vp.schedule, beside the actions: generators (vhalf_vocab) time their passes with it, the simulator
(simulate.py) reads it.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from vp.schedule.actions import Schedule

if TYPE_CHECKING:  # an annotation only: the simulator's sharing model sits above this module
    from vp.schedule.sharing import Sharing


@dataclass(frozen=True)
class Costs:
    """Durations and memory of actions.

    compute[(kind, stage)] for F/B/W and compute[(kind, None)] for S/T/IF/IB (per rank), and for a collective
    action (C0, C1, C2) what launching its instance keeps its rank busy (0 by default: done at once);
    comm[kind] for the collective instances (C0, C1, C2, IF, IB, and S/T of the naive algorithm),
    comm[("P2P", src, dst)] per transfer between two ranks and 'P2P' for any pair not named;
    memory[(kind, stage)] is what F (or S) holds until its B or W (or T) releases it; where W is split,
    memory[("B", stage)] is the part of F's that B releases (what only the input gradient needed) and W releases
    the rest (what the weight gradient needs: 0 for B by default, so W releases all).
    sharing: where devices share a node's cores (CPU runs), how (vp.schedule.sharing); None: each computes alone.
    """
    compute: dict = field(default_factory=dict)
    comm: dict = field(default_factory=dict)
    memory: dict = field(default_factory=dict)
    sharing: Sharing | None = None

    def time(self, kind: str, stage: int | None) -> float:
        return self.compute.get((kind, stage), self.compute.get((kind, None), 0.0))

    def times(self, kind: str, stages) -> list[float]:
        """time(kind, stage) of each of stages, at once."""
        get, default = self.compute.get, self.compute.get((kind, None), 0.0)
        return [get((kind, st), default) for st in stages]

    def p2p(self, src: int, dst: int) -> float:
        return self.comm.get(("P2P", src, dst), self.comm.get("P2P", 0.0))

    def mem(self, kind: str, stage: int | None) -> float:
        if kind == "W":  # W releases what F holds and B did not release
            return self.mem("F", stage) - self.mem("B", stage)
        return self.memory.get((kind, stage), self.memory.get((kind, None), 0.0))

    def mems(self, kind: str, stages) -> list[float]:
        """mem(kind, stage) of each of stages, at once."""
        if kind == "W":
            return [f - b for f, b in zip(self.mems("F", stages), self.mems("B", stages))]
        get, default = self.memory.get, self.memory.get((kind, None), 0.0)
        return [get((kind, st), default) for st in stages]


def unit_costs(s: Schedule, passes: dict | None = None, stage_weights: list[float] | None = None,
               comm: dict | None = None) -> Costs:
    """Costs from per-pass costs of one rank's full share of layers; a stage pass costs its share.

    Defaults: F=1, B=2 (B=1 and W=1 where W is split), everything else 0; a stage's weight is its share
    of one rank's layers (1/chunks for an even split), which is also its activation memory.
    """
    p = {"F": 1.0, "B": 1.0 if s.split_w else 2.0, "W": 1.0 if s.split_w else 0.0,
         "S": 0.0, "T": 0.0, "IF": 0.0, "IB": 0.0}
    p.update(passes or {})
    weights = stage_weights or [1.0 / s.chunks] * s.n_stages
    compute = {(k, st): p[k] * weights[st] for k in ("F", "B", "W") for st in range(s.n_stages)}
    compute.update({(k, None): p[k] for k in ("S", "T", "IF", "IB")})
    memory = {("F", st): weights[st] for st in range(s.n_stages)}
    return Costs(compute, dict(comm or {}), memory)
