"""Timeline pictures of a recorded run, drawn by the schedule's one picture function (vp.schedule.picture):

- measured: the first measured iteration of the run's Chrome/Perfetto trace (`<run_id>.trace.json` beside the
  record, written by rank 0), every executed pass where it ran, in seconds;
- replayed: the run's schedule replayed by the simulator with the costs its record implies
  (vp.cost.record_costs: its mean pass times per kind and rank for backend=real, the cost model for
  backend=sim), the prediction to set beside the measurement.
"""
import json
from pathlib import Path

from vp.config import RunConfig
from vp.cost import record_costs
from vp.schedule import build, simulate
from vp.schedule.actions import COMPUTE, Action
from vp.schedule.simulate import SimResult


def _title(record: dict, what: str) -> str:
    cfg = record["config"]
    return (f"{cfg['method']}  pp={cfg['pp']}  V={cfg['vocab_size']}  microbatches={cfg['microbatches']}  "
            f"({record['backend']}, {what})")


def draw_replayed(record: dict, path: Path) -> Path:
    from vp.schedule.picture import draw

    sched, costs = record_costs(record)
    what = "replayed from measured pass times" if record["backend"] == "real" else "simulated"
    return Path(draw(sched, simulate(sched, costs), str(path), _title(record, what), unit="s"))


def read_trace(path: Path, pipeline: list[int], iteration: int = 0) -> SimResult:
    """The actions of one measured iteration of a trace on the global ranks of one pipeline (stage p at
    pipeline[p]; a dp x pp x tp run's other ranks repeat its schedule), per stage, as (Action, start s, end s) on
    that rank's clock (0 = its start of the first measured iteration); ValueError naming the file when it is not
    such a trace."""
    pp = len(pipeline)
    stage = {rank: p for p, rank in enumerate(pipeline)}
    try:
        events = json.loads(Path(path).read_text())["traceEvents"]
        timeline = [[] for _ in range(pp)]
        for e in events:
            if e.get("ph") == "X" and e.get("cat") == "action" and e["args"]["iteration"] == iteration \
                    and int(e["pid"]) in stage:
                p = stage[int(e["pid"])]
                timeline[p].append((Action.parse(p, e["name"]), e["ts"] / 1e6, (e["ts"] + e["dur"]) / 1e6))
    except (OSError, ValueError, KeyError, TypeError, IndexError) as err:
        raise ValueError(f"{path}: not a trace of this run ({type(err).__name__}: {err})") from None
    if not all(timeline):
        raise ValueError(f"{path}: iteration {iteration} has no events on some rank")
    span = max(t1 for tl in timeline for _, _, t1 in tl)
    busy = [sum(t1 - t0 for a, t0, t1 in tl if a.kind in COMPUTE) for tl in timeline]
    return SimResult(span, busy, [0.0] * pp, timeline)


def draw_measured(record: dict, trace: Path, path: Path) -> Path:
    from vp.schedule.picture import draw

    cfg = RunConfig.from_dict(record["config"])
    sched = build(cfg.method, cfg.pp, cfg.microbatches, cfg.n_chunks)
    result = read_trace(trace, cfg.mesh.groups("pp")[0])  # the pipeline of replica 0, tensor offset 0
    return Path(draw(sched, result, str(path), _title(record, "measured, first measured iteration"), unit="s"))


def timeline_images(record: dict, record_path: Path, trace: Path) -> dict[str, Path]:
    """The pictures W&B logs for a record: measured (from its trace, when there) and replayed, as temporary PNGs."""
    out = {"timeline/replayed": draw_replayed(record, Path(record_path).with_suffix(".replayed.png"))}
    if record["backend"] == "real" and trace.exists():
        out["timeline/measured"] = draw_measured(record, trace, Path(record_path).with_suffix(".measured.png"))
    return out
