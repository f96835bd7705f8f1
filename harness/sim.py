"""backend=sim: a job's record from the schedule simulator and the cost model, without processes.

The schedule is the one the runtime would execute; pass times, communication and memory come from
vp.cost with the job's hardware profile. A run whose peak memory exceeds the device is recorded as oom.
"""
from functools import lru_cache

from vp.cost import pass_costs, static_bytes
from vp.flops import model_flops
from vp.record import make_record, now
from vp.schedule import build, simulate
from vp.schedule.actions import COMPUTE


@lru_cache(maxsize=64)
def _schedule(method: str, pp: int, microbatches: int, chunks: int):
    return build(method, pp, microbatches, chunks)


def simulate_job(run, hw, experiment: str, labels: dict) -> dict:
    started = now()
    sched = _schedule(run.method, run.pp, run.microbatches, run.n_chunks)
    costs = pass_costs(run, hw, sched)
    result = simulate(sched, costs)
    t = result.makespan
    sequences = run.microbatches * run.micro_batch_size
    flops = model_flops(sequences, run.seq_len, run.hidden, run.ffn, run.layers, run.vocab_size)
    static = static_bytes(run, hw, sched)
    peak = [s + a for s, a in zip(static, result.peak_activations)]
    sums = {}  # (kind, rank) -> [total seconds, passes], in one walk over the timeline
    for r, timeline in enumerate(result.timeline):
        for a, t0, t1 in timeline:
            if a.kind in COMPUTE:
                acc = sums.setdefault((a.kind, r), [0.0, 0])
                acc[0] += t1 - t0
                acc[1] += 1
    pass_time = {kind: [sums[(kind, r)][0] / sums[(kind, r)][1] if (kind, r) in sums else None
                        for r in range(run.pp)]
                 for kind in COMPUTE if any((kind, r) in sums for r in range(run.pp))}
    metrics = {"loss": None, "iteration_time_s": t, "iteration_times_s": [t], "tokens_per_s": sequences * run.seq_len / t,
               "mfu": flops / (t * run.pp * hw.peak_flops), "model_flops": flops, "peak_flops": hw.peak_flops,
               "peak_memory_bytes": peak,
               "memory_detail": [{"static": s, "activations": a} for s, a in zip(static, result.peak_activations)],
               "pass_time_s": pass_time, "bubble_fraction": result.idle_fraction, "bubble_rate": result.bubble_rate,
               "device_memory_bytes": hw.memory_bytes}
    over = [r for r, b in enumerate(peak) if b > hw.memory_bytes]
    status, error = "ok", None
    if over:
        status = "oom"
        error = (f"simulated peak memory {max(peak) / 2**30:.1f} GiB on rank(s) {over} exceeds the "
                 f"{hw.memory_bytes / 2**30:.0f} GiB of {hw.name}")
    env = {"simulator": "vp.schedule.simulate", "hardware": hw.to_dict(), "start": started, "end": now()}
    rec = make_record(run.to_dict(), metrics, env, status=status, error=error, experiment=experiment,
                      backend="sim", hardware=hw.to_dict())
    rec["labels"] = labels
    return rec
