"""Metrics of DESIGN.md: MFU from the paper's model FLOPs, device peaks, and the per-rank figures."""
import statistics
import time

import torch

from vp.flops import model_flops

# dense bf16/fp16 peak FLOP/s by device name (DESIGN.md); fp32 runs on these use the same figure
GPU_PEAKS = {"A100": 312e12, "H100": 989e12, "H200": 989e12}


def device_peak(device: torch.device) -> tuple[float, str]:
    """(peak FLOP/s, how it was found): the table for known GPUs, a matmul probe otherwise."""
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        for key, peak in GPU_PEAKS.items():
            if key in name:
                return peak, f"table:{key}"
    return probe_peak(device), "probe:matmul"


def probe_peak(device: torch.device, n: int = 512, reps: int = 8) -> float:
    """FLOP/s of the best of a few n x n fp32 matmuls on this process's threads."""
    a = torch.randn(n, n, device=device)
    b = torch.randn(n, n, device=device)
    best = float("inf")
    for _ in range(reps):
        if device.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        a @ b
        if device.type == "cuda":
            torch.cuda.synchronize()
        best = min(best, time.perf_counter() - t0)
    return 2 * n**3 / best


def summarize(cfg, per_rank: list[dict], peak_flops: float) -> dict:
    """Combine the per-rank measurements of the measured iterations (after warm-up) into run metrics."""
    measured = range(cfg.warmup, cfg.iterations)
    iter_s = [max(r["seconds"][i] for r in per_rank) for i in measured]
    t = statistics.median(iter_s)
    losses = next((r["losses"] for r in per_rank if all(x is not None for x in r["losses"])), None)
    sequences = cfg.microbatches * cfg.micro_batch_size
    flops = model_flops(sequences, cfg.seq_len, cfg.hidden, cfg.ffn, cfg.layers, cfg.vocab_size)
    kinds = sorted({k for r in per_rank for k in r["pass_s"]})
    return {
        "loss": losses,
        "iteration_time_s": t,
        "iteration_times_s": iter_s,
        "tokens_per_s": sequences * cfg.seq_len / t,
        "mfu": flops / (t * cfg.pp * peak_flops),
        "model_flops": flops,
        "peak_flops": peak_flops,
        "peak_memory_bytes": [r["peak_memory_bytes"] for r in per_rank],
        "memory_detail": [r["memory_detail"] for r in per_rank],
        "pass_time_s": {k: [r["pass_s"].get(k) for r in per_rank] for k in kinds},
        "pass_count": {k: [r["pass_n"].get(k, 0) for r in per_rank] for k in kinds},
        "optimizer_step_s": [r["optimizer_s"] for r in per_rank],  # mean per iteration, after the schedule
        "bubble_fraction": [r["idle"] for r in per_rank],
        "bytes_sent": [r["bytes_sent"] for r in per_rank],
        "collectives": [r["collectives"] for r in per_rank],
        "barriers_per_microbatch": [r["barriers"] for r in per_rank],
    }
