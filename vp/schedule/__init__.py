"""Pipeline schedules as data: generate, validate, simulate (pure Python, no torch.distributed)."""
from vp.schedule.actions import Action, Schedule
from vp.schedule.build import build, lower
from vp.schedule.costs import Costs, unit_costs
from vp.schedule.simulate import ScheduleError, SimResult, simulate
from vp.schedule.validate import validate

__all__ = ["Action", "Costs", "Schedule", "ScheduleError", "SimResult", "build", "lower", "simulate",
           "unit_costs", "validate"]
