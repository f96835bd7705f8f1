"""python -m vp.bench tp [--json]: tensor-parallel grids that fit this machine, on one tiny GPT (one stage).

Per device: bytes sent per transformer layer per iteration as vp.comm.Comm counted them (a run with 2 layers minus
the same run with 1), the closed form (vp.tp.traffic, Comm's counting), their ratio, the wire bytes of the closed
form under ring algorithms, and the iteration time of the 2-layer run. Then the closed form alone at paper scale.
"""
import json
import statistics
import sys

from vp.config import RunConfig, check_config
from vp.tp.modes import get_mode
from vp.tp.traffic import Shape, counted_bytes, layer_collectives, stage_collectives, wire_bytes

GRIDS = [(4, "1d", 1), (8, "1d", 1), (4, "2d", 1), (8, "2.5d", 2)]  # (tp, mode, depth)
TINY = dict(method="baseline", pp=1, hidden=64, heads=8, seq_len=32, vocab_size=2048, microbatches=2,
            micro_batch_size=8, iterations=4, warmup=1, timeout_s=900)
PAPER = dict(hidden=4096, ffn=16384, seq_len=2048, micro_batch_size=16, microbatches=1, padded_vocab_size=32768)
PAPER_GRIDS = [(64, "1d", 1), (64, "2d", 1), (64, "2.5d", 4)]


def shape_of(cfg: RunConfig) -> Shape:
    return Shape(get_mode(cfg.tp_mode), cfg.tp, cfg.tp_depth, cfg.hidden, cfg.ffn, cfg.seq_len,
                 cfg.micro_batch_size, cfg.microbatches, cfg.padded_vocab_size)


def grid_name(tp: int, mode: str, depth: int) -> str:
    m = get_mode(mode)
    q = m.side(tp, depth)
    return f"[{q},{q},{m.depth(depth)}]" if m.grid else f"1d({tp})"


def compare(cfg: RunConfig, one_layer: list[float], two_layers: list[float], seconds: float | None) -> dict:
    """One row: per-device bytes per iteration of a 1-layer and a 2-layer run (cfg: the 2-layer one)."""
    shape = shape_of(cfg)
    per_layer = [b - a for a, b in zip(one_layer, two_layers)]
    formula = counted_bytes(layer_collectives(shape))
    total = counted_bytes(layer_collectives(shape)) + counted_bytes(stage_collectives(shape))
    measured = statistics.fmean(per_layer)
    return {"mode": cfg.tp_mode, "grid": grid_name(cfg.tp, cfg.tp_mode, cfg.tp_depth), "devices": cfg.tp,
            "bytes_per_layer_measured": measured, "bytes_per_layer_formula": formula,
            "ratio": measured / formula, "bytes_per_layer_spread": max(per_layer) - min(per_layer),
            "bytes_one_layer_run_measured": statistics.fmean(one_layer), "bytes_one_layer_run_formula": total,
            "bytes_per_layer_wire": wire_bytes(layer_collectives(shape)), "iteration_time_s": seconds}


def measure(tp: int, mode: str, depth: int, sizes: dict) -> dict:
    from vp.launch import launch_local

    runs = []
    for layers in (1, 2):
        cfg = check_config(RunConfig(tp=tp, tp_mode=mode, tp_depth=depth, layers=layers, **sizes))
        runs.append(launch_local(cfg))
        print(f"  ran {grid_name(tp, mode, depth)} with {layers} layer(s)", file=sys.stderr, flush=True)
    return compare(cfg, runs[0]["metrics"]["bytes_sent"], runs[1]["metrics"]["bytes_sent"],
                   runs[1]["metrics"]["iteration_time_s"])


def paper_rows(sizes: dict = PAPER) -> list[dict]:
    rows = []
    for tp, mode, depth in PAPER_GRIDS:
        shape = Shape(get_mode(mode), tp, depth, **sizes)
        cols = layer_collectives(shape)
        rows.append({"mode": mode, "grid": grid_name(tp, mode, depth), "devices": tp,
                     "bytes_per_layer_formula": counted_bytes(cols), "bytes_per_layer_wire": wire_bytes(cols)})
    return rows


def run(as_json: bool, grids=GRIDS, sizes: dict = TINY) -> list[dict]:
    rows = [measure(tp, mode, depth, sizes) for tp, mode, depth in grids]
    paper = paper_rows()
    if as_json:
        print(json.dumps(rows + [dict(r, scale="paper") for r in paper]))
        return rows
    print(f"tiny GPT, one stage: h={sizes['hidden']}, heads={sizes['heads']}, seq {sizes['seq_len']}, "
          f"micro-batch {sizes['micro_batch_size']} x {sizes['microbatches']}, V={sizes['vocab_size']}, fp32; per "
          f"device per iteration (KiB); measured = Comm's count of a 2-layer run minus a 1-layer run")
    print(f"{'grid':>8} {'devices':>7} {'measured':>10} {'formula':>10} {'ratio':>6} {'wire':>10} "
          f"{'1-layer run meas/formula':>25} {'s/iter':>7}")
    for r in rows:
        run_ratio = r["bytes_one_layer_run_measured"] / r["bytes_one_layer_run_formula"]
        print(f"{r['grid']:>8} {r['devices']:>7} {r['bytes_per_layer_measured'] / 1024:>10.1f} "
              f"{r['bytes_per_layer_formula'] / 1024:>10.1f} {r['ratio']:>6.3f} {r['bytes_per_layer_wire'] / 1024:>10.1f} "
              f"{run_ratio:>25.3f} {r['iteration_time_s']:>7.3f}")
    p = PAPER
    print(f"\nclosed form at paper scale (no processes): h={p['hidden']}, ffn={p['ffn']}, seq {p['seq_len']}, "
          f"micro-batch {p['micro_batch_size']} x {p['microbatches']}, fp32, 64 devices; per device per layer (MiB)")
    print(f"{'grid':>8} {'counted':>10} {'wire':>10}")
    for r in paper:
        print(f"{r['grid']:>8} {r['bytes_per_layer_formula'] / 2**20:>10.1f} {r['bytes_per_layer_wire'] / 2**20:>10.1f}")
    return rows
