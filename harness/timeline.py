"""The schedule timeline of a recorded run: its method's schedule, simulated with the pass times the
record holds (measured for backend=real, from the cost model for backend=sim), drawn as in the paper."""
import statistics
from pathlib import Path

from vp.config import RunConfig
from vp.schedule import Schedule, build, simulate
from vp.schedule.simulate import Costs, SimResult


def record_costs(record: dict) -> tuple[Schedule, Costs]:
    cfg = RunConfig.from_dict(record["config"])
    sched = build(cfg.method, cfg.pp, cfg.microbatches, cfg.n_chunks)
    pass_s = record["metrics"].get("pass_time_s") or {}
    compute = {}
    for st in range(sched.n_stages):
        rank = sched.where(st)[0]
        for kind in ("F", "B", "W"):
            per_rank = pass_s.get(kind) or []
            if rank < len(per_rank) and per_rank[rank] is not None:
                compute[(kind, st)] = per_rank[rank]
    for kind in ("S", "T", "IF", "IB"):
        values = [t for t in pass_s.get(kind) or [] if t is not None]
        if values:
            compute[(kind, None)] = statistics.mean(values)
    return sched, Costs(compute)


def replay(record: dict) -> tuple[Schedule, SimResult]:
    sched, costs = record_costs(record)
    return sched, simulate(sched, costs)


def draw_timeline(record: dict, path: Path) -> Path:
    from vp.schedule.picture import draw

    sched, result = replay(record)
    cfg = record["config"]
    title = (f"{cfg['method']}  pp={cfg['pp']}  V={cfg['vocab_size']}  microbatches={cfg['microbatches']}  "
             f"({record['backend']}, pass times from the record)")
    return Path(draw(sched, result, str(path), title))
