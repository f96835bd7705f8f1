"""What one GPU can show of the numbers' trustworthiness (docs/gpu-path.md): the runtime at world size 1 (vocab-2,
bf16) under torch.profiler, every GEMM's input dtypes (no fp32 matmul of a step), with CUDA's sync debug mode set to
"error" inside every action (no host sync in the microbatch path; the loss report at the iteration's end is
outside); the buffer-lifetime check of the CPU emulation (VP_CHECK_BUFFERS=1, every vocabulary step at pp 1);
the meta-device build of a 4b stage (host and device peak against its parameter bytes, the weights against the
eager build); and the bf16 throughput of the last stage's output-layer GEMMs against the device's peak.
"""
import os
import time
from pathlib import Path

import torch

from vp.config import RunConfig

GEMMS = ("aten::mm", "aten::addmm", "aten::addmm_", "aten::bmm", "aten::baddbmm", "aten::baddbmm_")


def config(device: str, dtype: str) -> RunConfig:
    cuda = device == "cuda"
    return RunConfig(method="vocab-2", pp=1, layers=2, hidden=256 if cuda else 32, heads=4 if cuda else 2,
                     seq_len=256 if cuda else 16, vocab_size=32000 if cuda else 200, microbatches=4, iterations=3,
                     warmup=1, device=device, dtype=dtype, timeout_s=60)


def dtypes_and_syncs(device: torch.device) -> dict:
    """One run at world size 1: fp32 GEMMs seen by the profiler, and syncs inside actions (CUDA: an error raised by
    set_sync_debug_mode("error"); CPU: calls of Tensor.item/nonzero/tolist counted)."""
    from torch.profiler import profile

    from vp.gpucheck.race import fresh_rendezvous
    from vp.gpucheck.syncs import strict_actions
    from vp.run import run_rank

    cuda = device.type == "cuda"
    cfg = config(device.type, "bf16" if cuda else "fp32")
    with strict_actions(cuda) as syncs, fresh_rendezvous() as rendezvous, profile(record_shapes=True) as prof:
        record = run_rank(cfg, 0, 1, rendezvous)
    gemms = [e for e in prof.events() if e.name in GEMMS]
    fp32 = [(e.name, e.input_shapes) for e in gemms if "float" in (getattr(e, "input_dtypes", None) or [])]
    return {"dtype": cfg.dtype, "gemms": len(gemms), "fp32_gemms": fp32[:20], "syncs": syncs[:20],
            "loss": record["metrics"]["loss"], "communicators": record["metrics"].get("communicators"),
            "dtype_ok": (not fp32) if cuda else None, "syncs_ok": not syncs}


def buffer_check() -> dict:
    """The CPU emulation's buffer-lifetime check on every vocabulary step at pp 1 (gloo, world size 1)."""
    from vp.gpucheck.race import fresh_rendezvous
    from vp.run import run_rank

    os.environ["VP_CHECK_BUFFERS"] = "1"
    try:
        with fresh_rendezvous() as rendezvous:
            record = run_rank(config("cpu", "fp32").with_(emulate_nccl="all"), 0, 1, rendezvous)
        return {"ok": True, "loss": record["metrics"]["loss"]}
    except Exception as err:  # noqa: BLE001 - the check's failure is the finding
        return {"ok": False, "error": f"{type(err).__name__}: {err}"[:1000]}
    finally:
        os.environ.pop("VP_CHECK_BUFFERS", None)


def meta_build(device: torch.device) -> dict:
    """A 4b stage (h 3072, 4 layers; CPU: tiny) built on the meta device and materialised on `device`: the host's
    and the device's peak against its parameter bytes; one layer's weights against the eager build."""
    from torch.profiler import profile

    from vp.model import Stage, build_stage

    cuda = device.type == "cuda"
    cfg = RunConfig(method="baseline", pp=3, layers=12, hidden=3072 if cuda else 64, heads=24 if cuda else 2,
                    seq_len=2048 if cuda else 16, vocab_size=1000, microbatches=3)
    if cuda:
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        before = torch.cuda.memory_allocated(device)
    with profile(profile_memory=True) as prof:
        stage = build_stage(cfg, 1, 1, cfg.stage_layers, True, device=device)
    live = host = 0
    for e in sorted((e for e in prof.events() if e.self_cpu_memory_usage), key=lambda e: e.time_range.start):
        live += e.self_cpu_memory_usage
        host = max(host, live)
    params = sum(p.numel() * p.element_size() for p in stage.parameters())
    dev = torch.cuda.max_memory_allocated(device) - before if cuda else host
    small = cfg.with_(hidden=64, heads=2, seq_len=16)
    eager = Stage(small, 1, 4, 4, False, False, True)
    built = build_stage(small, 1, 1, small.stage_layers, True, device=device)
    same = all(torch.equal(a.cpu(), b) for a, b in zip(built.parameters(), eager.parameters()))
    return {"params_bytes": params, "host_peak_bytes": host, "device_peak_bytes": dev, "same_weights": same,
            "ok": same and host < 1.3 * params and dev < 1.3 * params}


def output_gemms(device: torch.device) -> dict:
    """The last stage's output-layer GEMMs at 4b (n 2048, h 3072, V/p 32k: 256k over pp 8) in bf16: logits, grad X,
    grad W, timed by CUDA events (median of 5), TFLOP/s against vp.flops' peak of the device."""
    from vp.metrics import device_peak

    if device.type != "cuda":
        return {"ok": None, "skipped": "needs CUDA"}
    n, h, v = 2048, 3072, 32768
    x, w = torch.randn(n, h, device=device, dtype=torch.bfloat16), torch.randn(v, h, device=device,
                                                                                 dtype=torch.bfloat16)
    gy = torch.randn(n, v, device=device, dtype=torch.bfloat16)
    peak, how = device_peak(device)
    out = {}
    for name, fn in (("logits", lambda: x @ w.t()), ("grad_x", lambda: gy @ w), ("grad_w", lambda: gy.t() @ x)):
        times = []
        for _ in range(6):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            torch.cuda.synchronize(device)
            times.append(start.elapsed_time(end) / 1e3)
        s = sorted(times[1:])[2]
        out[name] = {"seconds": s, "tflops": 2 * n * h * v / s / 1e12, "of_peak": 2 * n * h * v / s / peak}
    return {"ok": all(r["of_peak"] > 0.5 for r in out.values()), "peak_flops": peak, "peak_source": how, **out}


def run(device: torch.device, out: Path) -> dict:
    t0 = time.monotonic()
    parts = {"dtypes_syncs": dtypes_and_syncs(device), "buffer_check": buffer_check(),
             "meta_build": meta_build(device), "output_gemms": output_gemms(device)}
    ds = parts["dtypes_syncs"]
    checks = [ds["dtype_ok"], ds["syncs_ok"], parts["buffer_check"]["ok"], parts["meta_build"]["ok"],
              parts["output_gemms"]["ok"]]
    summary = [f"GEMMs of a {ds['dtype']} step: {ds['gemms']}, in fp32: {len(ds['fp32_gemms'])} "
               f"{ds['fp32_gemms'][:3] or ''}",
               f"host syncs inside actions: {len(ds['syncs'])} {ds['syncs'][:3] or ''}",
               f"buffer check (VP_CHECK_BUFFERS=1, every vocabulary step at pp 1): {parts['buffer_check']}",
               f"meta build: {parts['meta_build']}",
               f"output-layer GEMMs (bf16): {parts['output_gemms']}", f"{time.monotonic() - t0:.0f} s"]
    ok = False if False in checks else True if True in checks else None
    return {"ok": ok, "summary": summary, **parts}
