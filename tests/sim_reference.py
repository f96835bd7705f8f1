"""What the simulator computed before its event-driven loop, to the bit: the cases, their digest and the fixture.

tests/fixtures/simulator_reference.json was written by `python -m tests.sim_reference --write` from the round-robin
simulator (commit 7ae41d4, before vp/schedule/simulate.py became event-driven) and must change only with a
deliberate change of the execution model (`--write` re-takes the records' timing fields only, and refuses where
anything else changed). tests/fixtures/build_reference.json (`--write-builds`, from commit
1e559fa, before build, validate and the program were rewritten in bulk) holds what build() gives for every method
on a few grids larger than the golden ones: the schedule's text, its simulation in both modes and validate()'s
verdict. Each case is a schedule with costs and a mode; its digest holds the
makespan, per-rank busy and peak activations as float.hex and a hash of every action's start and end (or the
ScheduleError's text). Records are simulated records of the paper grids (backend=sim), compared field by field but
for `env` (times and the code's fingerprint).
"""
import copy
import hashlib
import json
import sys
from dataclasses import replace
from pathlib import Path

from vp.schedule import Schedule, ScheduleError, build, simulate, unit_costs

HERE = Path(__file__).parent
FIXTURE = HERE / "fixtures" / "simulator_reference.json"
BUILDS = HERE / "fixtures" / "build_reference.json"

# pass, stage-weight and communication costs away from the unit defaults: unequal stages, per-pair p2p times,
# every collective kind with its own time, S held in memory
COSTS = {
    "unit": None,
    "uneven": dict(passes={"F": 1.3, "B": 2.1, "W": 0.7, "S": 0.45, "T": 0.35, "IF": 0.05, "IB": 0.15},
                   comm={"C0": 0.21, "C1": 0.13, "C2": 0.17, "IF": 0.03, "IB": 0.07, "S": 0.11, "T": 0.09,
                         "P2P": 0.05, ("P2P", 0, 1): 0.31, ("P2P", 2, 1): 0.02},
                   memory={("S", None): 0.6}),
}


def costs_of(s: Schedule, name: str):
    spec = COSTS[name]
    if spec is None:
        return unit_costs(s)
    weights = [0.5 + 0.37 * ((7 * st) % 5) for st in range(s.n_stages)]
    c = unit_costs(s, spec["passes"], weights, spec["comm"])
    c.memory.update(spec["memory"])
    return c


def digest(s: Schedule, costs, strict: bool) -> dict:
    try:
        res = simulate(s, costs, strict=strict)
    except ScheduleError as err:
        return {"error": str(err)}
    h = hashlib.sha1()
    for r, tl in enumerate(res.timeline):
        for a, t0, t1 in tl:
            h.update(f"{r} {a.text(True)} {t0.hex()} {t1.hex()};".encode())
    return {"makespan": float(res.makespan).hex(), "busy": [float(b).hex() for b in res.busy],
            "peak": [float(p).hex() for p in res.peak_activations], "timeline": h.hexdigest()}


def schedules() -> dict[str, Schedule]:
    """The golden schedules, three that deadlock (crossed collective orders, a lazily created communicator) and one
    with a pass whose input is missing."""
    out = {f"golden/{f.stem}": Schedule.from_text(f.read_text()) for f in sorted((HERE / "golden").glob("*.txt"))}
    out["crossed-fixture"] = Schedule.from_text((HERE / "fixtures" / "vocab-1-crossed-order.txt").read_text())
    s = build("vocab-2", 4, 8)
    acts = list(s.ranks[0])
    i, j = (next(n for n, x in enumerate(acts) if x.text() == t) for t in ("IF4", "C0:0"))
    acts[i], acts[j] = acts[j], acts[i]
    out["crossed-swap"] = replace(s, ranks=[acts] + s.ranks[1:])
    s = build("vocab-2", 2, 4)

    def move(acts, token, after):
        rest = [a for a in acts if a.text() != token]
        k = next(n for n, a in enumerate(rest) if a.text() == after)
        return rest[:k + 1] + [next(a for a in acts if a.text() == token)] + rest[k + 1:]
    out["lazy-communicator"] = replace(s, ranks=[move(s.ranks[0], "C0:0", "IF1"), move(s.ranks[1], "IF2", "C0:0")])
    s = build("vocab-2", 3, 6)
    out["missing-input"] = replace(s, ranks=[s.ranks[0], [a for a in s.ranks[1] if a.text() != "F2"], s.ranks[2]])
    return out


def schedule_digests() -> dict:
    return {f"{name}/{costs}/{'strict' if strict else 'default'}": digest(s, costs_of(s, costs), strict)
            for name, s in schedules().items() for costs in COSTS for strict in (False, True)}


def build_digests() -> dict:
    """Every method at two sizes (and 3 chunks for the interleaved ones): its schedule's text, unit costs in the
    default mode, the uneven costs in the strict mode, and what validate() says."""
    from vp.schedule import validate
    from vp.schedule.methods import METHODS

    out = {}
    for method, spec in METHODS.items():
        for pp, m in ((5, 10), (8, 24)):
            for chunks in ((None, 3) if spec.family.chunks == 0 else (None,)):
                s = build(method, pp, m, chunks)
                try:
                    verdict = validate(s) is s
                except ScheduleError as err:
                    verdict = str(err)
                out[f"{method}/{pp}x{m}" + (f"/v{chunks}" if chunks else "")] = {
                    "text": hashlib.sha1(s.to_text().encode()).hexdigest(), "validate": verdict,
                    "unit": digest(s, costs_of(s, "unit"), False), "uneven": digest(s, costs_of(s, "uneven"), True)}
    return out


def record_digest(case: dict) -> dict:
    """A simulated record of case["record"]'s run on case["hardware"], but for env."""
    from harness.sim import simulate_job
    from vp.config import RunConfig
    from vp.cost import Hardware

    record = case["record"]
    rec = simulate_job(RunConfig.from_dict(record["config"]), Hardware.from_dict(case["hardware"]),
                       record["experiment"], record.get("labels") or {})
    rec = json.loads(json.dumps({k: v for k, v in rec.items() if k not in ("env", "run_id")}))
    return {"hardware": case["hardware"], "record": without_prod_features(without_nccl_buffers(rec), case["hardware"])}


def without_prod_features(rec: dict, hardware: dict) -> dict:
    """The record as it was before the production knobs (issue 42): their config fields, at their defaults (zero 0,
    no overlap: the paper grids' runs), taken out, and the memory_breakdown taken out after checking that its
    parameters, gradients and optimizer states are the static bytes less the profile's fixed overhead, and its
    activations the peak activations."""
    from vp.record import OMITTED_AT_DEFAULT

    for name in ("zero", "overlap_grad_reduce", "bucket_mb", "recompute", "sequence_parallel"):
        assert rec["config"].pop(name) == OMITTED_AT_DEFAULT[name]
    m = rec["metrics"]
    overhead = hardware.get("overhead_bytes", 2 * 2**30)
    for parts, detail in zip(m.pop("memory_breakdown"), m["memory_detail"]):
        static = parts["parameters"] + parts["gradients"] + parts["optimizer_states"] + overhead
        assert abs(static - detail["static"]) <= 1e-6 * detail["static"] and parts["activations"] == \
            detail["activations"], (parts, detail)
    return rec


def without_nccl_buffers(rec: dict) -> dict:
    """The record as it was before NCCL's buffers entered the memory model (docs/gpu-path.md; not the simulator's
    doing): their fields taken out, the peak as static plus activations, after checking that it is their sum plus
    the buffers. The run id is left out too: it hashes the config's schema, which grew with the NCCL forms."""
    m = rec["metrics"]
    detail = m["memory_detail"]
    if "comm_buffer_bytes" in m:
        assert m["peak_memory_bytes"] == [d["static"] + d["activations"] + d["comm_buffers"] for d in detail]
        m["peak_memory_bytes"] = [d["static"] + d["activations"] for d in detail]
        for d in detail:
            del d["comm_buffers"]
        del m["comm_buffer_bytes"]
    m.pop("communicators", None)
    if rec["status"] == "oom":  # its message names the peak, buffers included on the new side
        assert rec["error"].startswith("simulated peak memory ")
        rec["error"] = "simulated peak memory ..."
    return rec


if __name__ == "__main__" and sys.argv[1:] == ["--write-builds"]:
    BUILDS.write_text(json.dumps(build_digests(), indent=1, sort_keys=True) + "\n")
    print(f"wrote {BUILDS}")

TIMING = ("bubble_fraction", "bubble_rate", "iteration_time_s", "iteration_times_s", "mfu", "pass_time_s", "tail_s",
          "tokens_per_s")


def retaken(case: dict) -> dict:
    """A fixture record as the simulator computes it now, in the fixture's own form (its run id and NCCL fields
    kept, which record_digest leaves out): only timing fields may change; anything else (memory, config, status)
    is refused, to be looked at and re-taken by hand."""
    want = copy.deepcopy(case)
    del want["record"]["run_id"]
    without_nccl_buffers(want["record"])
    got = record_digest(case)
    if got == want:
        return case
    rest = [k for k in got["record"] if k != "metrics" and got["record"][k] != want["record"][k]]
    new, old = got["record"]["metrics"], want["record"]["metrics"]
    changed = {k for k in new.keys() | old.keys() if new.get(k) != old.get(k)}
    if rest or not changed <= set(TIMING):
        raise SystemExit(f"{case['record']['run_id']}: {sorted(rest) + sorted(changed - set(TIMING))} changed; "
                         f"only timing fields are re-taken here")
    out = copy.deepcopy(case)
    out["record"]["metrics"].update({k: new[k] for k in changed})
    return out


if __name__ == "__main__" and sys.argv[1:] == ["--write"]:
    records = json.loads(FIXTURE.read_text())["records"] if FIXTURE.exists() else []
    FIXTURE.write_text(json.dumps({"schedules": schedule_digests(), "records": [retaken(r) for r in records]},
                                  indent=1, sort_keys=True) + "\n")
    print(f"wrote {FIXTURE}")
