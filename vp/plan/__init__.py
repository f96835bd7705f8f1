"""The planner's core: which method, mesh, micro-batch size and chunks to run a model with on N devices, found by
the one simulator and cost model (no Hydra here; the command is harness/plan.py; docs/planner.md).

  space   the candidates (RunConfigs) and why each that cannot run is rejected
  bounds  safe bounds on the makespan and on held activations, so most candidates need no simulation
  search  the exact search: top-k, best per method, Pareto front of tokens/s against peak memory
"""
from vp.plan.search import MEMORY, Plan, Row, pareto, search
from vp.plan.space import AXES, Problem, Rejection, candidates

__all__ = ["AXES", "MEMORY", "Plan", "Problem", "Rejection", "Row", "candidates", "pareto", "search"]
