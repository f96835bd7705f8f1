"""Pass times: F, B, W of one transformer layer and S, T, IF, IB of one vocabulary shard, timed by CUDA events (the
runtime's ActionTimer) under bf16 autocast at the paper's shapes, against the cost model's prediction with the
h200 profile (conf/hardware/h200.yaml, vp.cost.PROFILES); then a profile fitted to them (vp.cost.fit, the fit
harness.calibrate uses), written to OUT/h200_measured.yaml for backend=sim.

Shapes (micro-batch 1, V 256k over the pipeline's ranks as in the paper's setups): 4b (h 3072, seq 2048, pp 8),
7b (h 4096, seq 2048, pp 16), 30b (h 6144, seq 2048, pp 32). The passes are vhalf-vocab-2's (W split from B;
Algorithm 2: S holds the logits and grad-input GEMMs, T the grad-weight GEMM). Pass on a GPU: every pass timed,
the profile fitted, and F B W S T within 3x of the h200 profile's prediction.
"""
import statistics
from dataclasses import replace
from pathlib import Path

import torch

from vp.config import RunConfig
from vp.cost import PROFILES, Hardware, pass_work, work_seconds
from vp.cost.profiles import write_profile
from vp.cost.fit import fit_speeds, fitted, observation

SHAPES = {"4b": dict(hidden=3072, heads=24, pp=8), "7b": dict(hidden=4096, heads=32, pp=16),
          "30b": dict(hidden=6144, heads=48, pp=32)}
PAPER = dict(seq_len=2048, vocab_size=256000)
TINY = {"tiny-a": dict(hidden=32, heads=2, pp=2, seq_len=16, vocab_size=512),
        "tiny-b": dict(hidden=64, heads=4, pp=2, seq_len=32, vocab_size=1024)}
KINDS = ("F", "B", "W", "S", "T", "IF", "IB")
RATIO_LIMIT = 3.0
METHOD = "vhalf-vocab-2"


def shape_config(shape: dict, device: str) -> RunConfig:
    """One layer per stage (V-Half: two stages per rank), so that pass_work's F/B/W of a stage is one layer's."""
    sizes = {**PAPER, **shape}
    return RunConfig(method=METHOD, layers=2 * sizes["pp"], device=device,
                     dtype="bf16" if device == "cuda" else "fp32", **sizes)


def time_passes(cfg: RunConfig, device: torch.device, reps: int) -> dict:
    """{kind: [seconds]} of `reps` rounds after one warm-up round, each pass timed by the runtime's ActionTimer."""
    from vp.comm import Comm
    from vp.model import Block
    from vp.runtime.loop import ActionTimer
    from vp.schedule.methods import VOCAB
    from vp.vocab import input as vocab_in
    from vp.vocab.output import Shard, c1_step, s_pass, t_pass
    from vp.wgrad import WeightGradStore

    cuda, h, s = device.type == "cuda", cfg.hidden, cfg.seq_len
    cast = torch.autocast("cuda", dtype=torch.bfloat16) if cuda else torch.autocast("cpu", enabled=False)
    algo = VOCAB["alg2"]
    block = Block(h, cfg.heads, cfg.ffn, cfg.layers, cfg.seed, 0).to(device)
    shard = Shard.of(0, cfg.pp, cfg.padded_vocab_size, cfg.vocab_size)
    w_out = torch.nn.Parameter(torch.randn(shard.rows, h, device=device) * 0.02)
    w_in = torch.nn.Parameter(torch.randn(shard.rows, h, device=device) * 0.02)
    ids = torch.randint(0, cfg.vocab_size, (1, s), device=device)
    weights = torch.full((s,), 1.0 / s, device=device)
    x = torch.randn(1, s, h, device=device, dtype=torch.bfloat16 if cuda else torch.float32)
    x_s = x[0].float()  # S reads X in fp32, as C0 delivers it
    comm, timer, times = Comm.local([0], 0, device), ActionTimer(device), {k: [] for k in KINDS}
    try:
        for rep in range(reps + 1):
            timer.begin()
            store, x_in, marks = WeightGradStore(), x.detach().requires_grad_(), {}

            def timed(kind, fn):
                t0 = timer.now()
                result = fn()
                marks[kind] = (t0, timer.now())
                return result

            with cast:
                out = timed("F", lambda: block(x_in, store))
            timed("B", lambda: torch.autograd.backward(out, torch.ones_like(out)))
            timed("W", store.flush)
            with cast:  # C1 runs outside autocast, as on its stream
                state = timed("S", lambda: s_pass(shard, w_out, x_s, ids[0], weights, algo))
            state = c1_step(state, comm, algo)
            with cast:
                timed("T", lambda: t_pass(shard, w_out, state, algo))
            looked_up = timed("IF", lambda: vocab_in.local_lookup(shard, w_in, ids))
            timed("IB", lambda: vocab_in.accumulate_grad(shard, w_in, ids, looked_up))
            for kind, (t0, t1) in marks.items():
                timer.add(kind, t0, t0, t1)
            if rep:  # the first round warms up (cuBLAS heuristics, allocator)
                for kind, _, start, end in timer.collect():
                    times[kind].append(end - start)
            else:
                timer.collect()
            del out, state, looked_up
    finally:
        comm.close()
    return times


def predicted(cfg: RunConfig, hw: Hardware) -> tuple[dict, dict]:
    """({kind: seconds} of the cost model with profile hw, {kind: parts}) for one layer and one shard."""
    from vp.schedule import build

    work = pass_work(cfg, hw, build(cfg.method, cfg.pp, cfg.microbatches, cfg.n_chunks))
    parts = {k: work[(k, 0)] if k in ("F", "B", "W") else work[(k, None)] for k in KINDS}
    return {k: work_seconds(hw, p).total(hw) for k, p in parts.items()}, parts


def run(device: torch.device, out: Path) -> dict:
    from vp.metrics import device_peak

    cuda = device.type == "cuda"
    shapes = {name: shape_config(s, device.type) for name, s in (SHAPES if cuda else TINY).items()}
    peak, how = device_peak(device)
    base = PROFILES["h200"]
    skeleton = replace(base, peak_flops=peak, efficiency={}, pass_overhead_s=0.0)
    rows, times, results, ok = [], [], {}, True
    summary = [f"peak {peak / 1e12:.1f} TFLOP/s ({how}); median of 5 rounds after a warm-up, CUDA events" if cuda
               else f"CPU form at tiny shapes; peak {peak / 1e9:.1f} GFLOP/s ({how})", "",
               "| shape | pass | measured ms | h200 model ms | measured / model |", "|---|---|---|---|---|"]
    for name, cfg in shapes.items():
        measured = time_passes(cfg, device, reps=5)
        model, parts = predicted(cfg, base)
        results[name] = {"config": cfg.to_dict(), "seconds": {}, "spread": {}, "h200_model_s": model}
        for kind in KINDS:
            med = statistics.median(measured[kind])
            results[name]["seconds"][kind] = med
            results[name]["spread"][kind] = [min(measured[kind]), max(measured[kind])]
            ratio = med / model[kind] if model[kind] > 0 else float("inf")
            flagged = cuda and kind in ("F", "B", "W", "S", "T") and not 1 / RATIO_LIMIT <= ratio <= RATIO_LIMIT
            ok = ok and med > 0 and not flagged
            summary.append(f"| {name} | {kind} | {med * 1e3:.3f} | {model[kind] * 1e3:.3f} | {ratio:.2f}"
                           f"{' FAILED' if flagged else ''} |")
            rows.append(observation(skeleton, parts[kind]))
            times.append(med)
    result = {"ok": ok, "peak_flops": peak, "peak_source": how, "shapes": results}
    try:
        hw = fitted(skeleton, "h200_measured" if cuda else "cpu_measured", *fit_speeds(rows, times))
        hw = replace(hw, fitted_to=f"vp.gpucheck passes at {', '.join(shapes)}")
        path = write_profile(hw, out / f"{hw.name}.yaml",
                             "Measured by scripts/gpu-check.sh (vp.gpucheck.passes).\n"
                             f"Use it with: copy it to ~/.config/vp-harness/hardware/, then backend=sim hardware={hw.name}")
        result |= {"profile": str(path), "efficiency": hw.efficiency, "pass_overhead_s": hw.pass_overhead_s,
                   "mem_efficiency": hw.mem_efficiency}
        summary += ["", f"fitted profile {path.name}: GEMM speed multipliers "
                    + ", ".join(f"{k} {v:.2f}" for k, v in hw.efficiency.items())
                    + f"; elementwise {hw.mem_efficiency:.2f} of HBM; pass overhead {hw.pass_overhead_s * 1e6:.0f} us"]
    except ValueError as err:  # the pass times fit no positive speeds
        result["fit_error"] = str(err)
        summary += ["", f"no profile fitted: {err}"]
        ok = ok and not cuda
    summary.append(f"pass on a GPU: F B W S T within {RATIO_LIMIT:g}x of the h200 model, and a fitted profile")
    return {**result, "ok": ok, "summary": summary}
