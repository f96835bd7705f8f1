"""Knob variants of one configuration (vp.plan.space.KNOBS: zero, overlap_grad_reduce, recompute, sequence
parallelism): their order, and when one is known, from its costs alone, to be as fast as another with no more
memory, so that the other need not be simulated (docs/planner.md, "Knobs").

What the variants share follows from the cost model and is worked out once per search by vp.plan.memo (each figure
keyed on the RunConfig fields it reads): parameters, optimizer state and NCCL's buffers depend on zero but not on
recompute or overlap_grad_reduce; the passes' times, transfers and held activations on recompute (and sequence
parallelism) but not on zero or overlap_grad_reduce; the tail after the flush on zero and overlap_grad_reduce but
not on recompute.
"""
from vp.config import RunConfig
from vp.plan.space import KNOBS

def knob_index(run: RunConfig) -> tuple:
    """The run's knobs as positions in their value lists: (0, ...) is every knob off. Ties between variants of one
    configuration go to the lower index (vp.plan.search's ranking)."""
    return tuple(values.index(getattr(run, k)) for k, (values, _) in KNOBS.items())


def dominates(y, x) -> bool:
    """Whether priced candidate y (vp.plan.search._Priced, with its full pass_costs) is, by its costs alone, as fast
    as x with no more peak memory, and is listed before x on a tie: the same schedule (one configuration), no pass,
    transfer or collective of y longer than x's, nothing y holds larger (F, W and S parts), static bytes and tail no
    larger, and y's knobs first. The simulator is a max-plus system over a fixed order of actions (every start and
    end a maximum of sums of durations), so each end time of y is at most x's, and each rank's held bytes at every
    point of its order are too. Not where devices share cores (processor sharing: a longer pass can let another
    rank's pass run alone, faster) nor with overlap_grad_reduce (its tail follows the simulated spans)."""
    if x.run.overlap_grad_reduce or y.run.overlap_grad_reduce or knob_index(y.run) >= knob_index(x.run):
        return False
    cx, cy = x.costs, y.costs
    if cx.sharing is not None or cy.sharing is not None:
        return False
    for a, b in ((cx.compute, cy.compute), (cx.comm, cy.comm), (cx.memory, cy.memory)):
        if a.keys() != b.keys():
            return False
    if any(cy.compute[k] > v for k, v in cx.compute.items()) or any(cy.comm[k] > v for k, v in cx.comm.items()):
        return False
    for kind, st in cx.memory:
        for held in (("F", "W") if kind in ("F", "B") else (kind,)):
            if cy.mem(held, st) > cx.mem(held, st):
                return False
    return all(b <= a for a, b in zip(x.static, y.static)) and y.tail <= x.tail
