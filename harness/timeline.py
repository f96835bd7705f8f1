"""The schedule timeline of a recorded run: its method's schedule replayed with the costs its record implies
(vp.cost.record_costs: measured pass times for backend=real, the cost model for backend=sim), drawn as in
the paper."""
from pathlib import Path

from vp.cost import record_costs
from vp.schedule import simulate


def draw_timeline(record: dict, path: Path) -> Path:
    from vp.schedule.picture import draw

    sched, costs = record_costs(record)
    cfg = record["config"]
    title = (f"{cfg['method']}  pp={cfg['pp']}  V={cfg['vocab_size']}  microbatches={cfg['microbatches']}  "
             f"({record['backend']}, costs from the record)")
    return Path(draw(sched, simulate(sched, costs), str(path), title))
