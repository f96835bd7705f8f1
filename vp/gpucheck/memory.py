"""Memory: rank 0 of 4b at pp 8 (vocab-2, 16 microbatches, bf16) replayed alone through its own schedule by the
real runtime (vp.runtime.loop.Runtime: its layers, its vocabulary shards, AdamW), its peers replaced by a loopback
(collectives over groups of one, sends dropped, receives filled locally), against the memory model
(vp.cost.memory: 18 bytes per parameter, 34 s b h bytes per layer and microbatch, the output layer's fp32 softmax
of its shard) and the simulator's peak of held activations on that rank.

Measured on CUDA: the allocator's allocated bytes after the second iteration (parameters, gradients, AdamW state,
bf16 weight copies) and its peak during it; on CPU, the runtime's own accounting (16 bytes per parameter in fp32
and the saved activations it tracks). Pass: static within 10 % of the model, peak within 1.5x.
"""
from dataclasses import replace
from pathlib import Path

import torch

from vp.channels import PIPELINE_CHANNELS
from vp.comm import Comm, local_groups
from vp.config import RunConfig

STATIC_TOL, PEAK_FACTOR = 0.10, 1.5


class _Done:
    def wait(self, timeout=None):
        return None


class Loopback(Comm):
    """A rank replaying its schedule alone: every channel a group of one (collectives change nothing), sends
    dropped, receives filled with small values of the right shape."""

    def isend(self, t: torch.Tensor, dst: int, channel: str):
        self._count(channel, "send", t)
        return _Done()

    def irecv(self, t: torch.Tensor, src: int, channel: str):
        self._count(channel, "recv", t, sends=False)
        t.normal_(0.0, 1e-3)
        return _Done()


def replay_config(device: str) -> RunConfig:
    if device == "cuda":
        return RunConfig(method="vocab-2", pp=8, layers=32, hidden=3072, heads=24, seq_len=2048, vocab_size=256000,
                         microbatches=16, iterations=2, warmup=1, device="cuda", dtype="bf16")
    return RunConfig(method="vocab-2", pp=4, layers=8, hidden=32, heads=2, seq_len=16, vocab_size=512,
                     microbatches=8, iterations=2, warmup=1)


def model_figures(cfg: RunConfig, sched, cuda: bool) -> dict:
    """Rank 0's static bytes (without the profile's fixed overhead) and the simulator's peak held activations."""
    from vp.cost import PROFILES, pass_costs
    from vp.cost.memory import rank_params
    from vp.schedule.simulate import simulate

    hw = PROFILES["h200"] if cuda else replace(PROFILES["h200"], bytes_per_param=16.0, act_bytes=4)
    params = rank_params(cfg, sched)[0]
    held = simulate(sched, pass_costs(cfg, hw, sched)).peak_activations[0]
    return {"parameters": params, "static": params * hw.bytes_per_param, "activations": held,
            "peak": params * hw.bytes_per_param + held}


def run(device: torch.device, out: Path) -> dict:
    from vp.run import build_rank_model
    from vp.runtime.loop import Runtime
    from vp.schedule import build

    cuda = device.type == "cuda"
    cfg = replay_config(device.type)
    sched = build(cfg.method, cfg.pp, cfg.microbatches, cfg.n_chunks)
    model = build_rank_model(cfg, sched, 0, device)
    comm = Loopback(local_groups(PIPELINE_CHANNELS, [0], 0), device)
    runtime = Runtime(cfg, sched, 0, model, comm, device)
    try:
        runtime.iteration(0)  # creates the AdamW state and the bf16 weight copies
        if cuda:
            torch.cuda.synchronize(device)
            torch.cuda.reset_peak_memory_stats(device)
        runtime.meter.peak = 0
        runtime.iteration(1)
    finally:
        comm.close()
    params = model.parameters()
    n_params = sum(p.numel() for p in params)
    if cuda:
        static = torch.cuda.memory_allocated(device)
        measured = {"static": static, "peak": torch.cuda.max_memory_allocated(device),
                    "reserved_peak": torch.cuda.max_memory_reserved(device), "activations": runtime.meter.peak}
    else:
        state = [t for s in runtime.optimizer.state.values() for t in s.values() if torch.is_tensor(t) and t.dim()]
        static = sum(t.nbytes for t in params + [p.grad for p in params if p.grad is not None] + state)
        measured = {"static": static, "peak": static + runtime.meter.peak, "activations": runtime.meter.peak}
    model_ = model_figures(cfg, sched, cuda)
    ratios = {k: measured[k] / model_[k] for k in ("static", "peak", "activations")}
    ok = n_params == model_["parameters"] and abs(ratios["static"] - 1) <= STATIC_TOL and \
        1 / PEAK_FACTOR <= ratios["peak"] <= PEAK_FACTOR
    unit, scale = ("GiB", 2**30) if model_["peak"] > 2**30 else ("MiB", 2**20)
    summary = [f"rank 0 of {cfg.method}, pp {cfg.pp}, {cfg.microbatches} microbatches, h {cfg.hidden}, seq "
               f"{cfg.seq_len}, V {cfg.vocab_size}: {cfg.stage_layers[0]} layers + 2 vocabulary shards = "
               f"{n_params:,} parameters (memory model: {model_['parameters']:,})", "",
               f"| bytes | measured {unit} | model {unit} | measured / model |", "|---|---|---|---|"]
    summary += [f"| {k} | {measured[k] / scale:.3f} | {model_[k] / scale:.3f} | {ratios[k]:.2f} |"
                for k in ("static", "activations", "peak")]
    summary += ["", ("static: the allocator after iteration 2; peak: its maximum during iteration 2; activations: "
                     "the runtime's accounted saved tensors (model: the simulator's peak held)") if cuda else
                "CPU: static counted from the parameter, gradient and AdamW tensors; activations as the runtime "
                "accounts them (fp32: 16 bytes per parameter, 4 per activation element in the model)",
                f"pass: parameters equal, static within {STATIC_TOL:.0%}, peak within {PEAK_FACTOR}x"]
    return {"ok": ok, "summary": summary, "config": cfg.to_dict(), "measured": measured, "model": model_,
            "ratios": ratios}
