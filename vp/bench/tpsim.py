"""python -m vp.bench tpsim [--json]: the cost model's 1-D, 2-D and 2.5-D tensor parallelism at the 2.5-D paper's
scale (arXiv 2105.14500), simulated on the a100_80g and h100 profiles; printed, never asserted.

One stage (pp 1, dp 1, baseline), sequence 512, micro-batch 16, 4 microbatches, 16 layers, vocabulary 32k.
Weak scaling: hidden h = 2048 sqrt(P/4) (P = 8: 2816, a multiple of 256 near 2896), heads h/128, ffn 4h.
Strong scaling: h 4096 with 64 heads on 16 and 64 devices. Throughput per device = model FLOP/s per device
(MFU x peak); the ratios compare it between two configurations of the same P.
"""
import json

from vp.config import RunConfig, check_config
from vp.cost import PROFILES

BASE = dict(method="baseline", pp=1, dp=1, layers=16, seq_len=512, micro_batch_size=16, microbatches=4,
            vocab_size=32000, device="cuda", dtype="bf16")
WEAK_HIDDEN = {4: 2048, 8: 2816, 16: 4096, 64: 8192}
WEAK = [(4, "1d", 1), (4, "2d", 1), (8, "2.5d", 2), (16, "1d", 1), (16, "2d", 1), (16, "2.5d", 4), (64, "1d", 1),
        (64, "2d", 1), (64, "2.5d", 4)]
STRONG = [(16, "1d", 1), (16, "2d", 1), (16, "2.5d", 4), (64, "1d", 1), (64, "2d", 1), (64, "2.5d", 4)]
CLAIMS = [("weak", 64, ("2.5d", 4), ("2d", 1), 1.45), ("weak", 64, ("2.5d", 4), ("1d", 1), None),
          ("strong", 64, ("2.5d", 4), ("1d", 1), 1.38), ("strong", 64, ("2.5d", 4), ("2d", 1), 1.53)]


def grid_name(cfg: RunConfig) -> str:
    m = cfg.mesh
    return f"[{m.q},{m.q},{m.depth}]" if m.grid else f"1d({cfg.tp})"


def row(scaling: str, hw_name: str, tp: int, mode: str, depth: int) -> dict:
    from harness.sim import simulate_job

    hidden = WEAK_HIDDEN[tp] if scaling == "weak" else 4096
    heads = hidden // 128 if scaling == "weak" else 64
    cfg = check_config(RunConfig(tp=tp, tp_mode=mode, tp_depth=depth, hidden=hidden, heads=heads, **BASE))
    hw = PROFILES[hw_name]
    m = simulate_job(cfg, hw, "tpsim", {})["metrics"]
    return {"scaling": scaling, "hardware": hw_name, "devices": tp, "mode": mode, "depth": depth,
            "grid": grid_name(cfg), "hidden": hidden, "iteration_time_s": m["iteration_time_s"], "mfu": m["mfu"],
            "tflops_per_device": m["mfu"] * hw.peak_flops / 1e12, "tail_s": m["tail_s"][0],
            "memory_gib_per_device": max(m["peak_memory_bytes"]) / 2**30}


def rows() -> list[dict]:
    return [row(s, hw, *c) for hw in ("a100_80g", "h100") for s, cs in (("weak", WEAK), ("strong", STRONG))
            for c in cs]


def ratios(table: list[dict]) -> list[dict]:
    def find(hw, scaling, devices, mode, depth):
        return next(r for r in table if (r["hardware"], r["scaling"], r["devices"], r["mode"], r["depth"])
                    == (hw, scaling, devices, mode, depth))

    out = []
    for hw in ("a100_80g", "h100"):
        for scaling, devices, a, b, claim in CLAIMS:
            ra, rb = find(hw, scaling, devices, *a), find(hw, scaling, devices, *b)
            out.append({"hardware": hw, "scaling": scaling, "ratio": f"{ra['grid']} / {rb['grid']}",
                        "simulated": ra["tflops_per_device"] / rb["tflops_per_device"], "paper": claim})
    return out


def run(as_json: bool = False) -> None:
    table = rows()
    if as_json:
        print(json.dumps({"rows": table, "ratios": ratios(table)}, indent=1))
        return
    print(f"{'hw':>8} {'scaling':>7} {'P':>3} {'grid':>9} {'h':>5} {'iter ms':>8} {'MFU':>6} {'TF/dev':>7} "
          f"{'tail ms':>8} {'GiB/dev':>8}")
    for r in table:
        print(f"{r['hardware']:>8} {r['scaling']:>7} {r['devices']:>3} {r['grid']:>9} {r['hidden']:>5} "
              f"{1e3 * r['iteration_time_s']:8.2f} {r['mfu']:6.3f} {r['tflops_per_device']:7.1f} "
              f"{1e3 * r['tail_s']:8.3f} {r['memory_gib_per_device']:8.2f}")
    print("\nthroughput per device, simulated against the paper's claim")
    for r in ratios(table):
        paper = f"{r['paper']:.2f}x" if r["paper"] else "-"
        print(f"{r['hardware']:>8} {r['scaling']:>7} {r['ratio']:>20} {r['simulated']:6.2f}x  paper {paper}")
