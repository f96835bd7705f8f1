"""python -m vp.bench sequence: what --sequence-parallel changes in a real CPU run of 1-D tensor parallelism. Real
gloo runs (vp.launch.launch_local) of one config with and without sequence parallelism, alternated round by round;
per rank the activation bytes the memory meter held (vp.runtime.memory) against the memory model's peak
(vp.cost.memory through the simulator, an fp32 profile), the sequence-parallel / plain ratio of each, the
tensor-parallel bytes on the wire per iteration (ring algorithms, vp.tp.traffic's closed form, whose counted bytes the
tests pin to what vp.comm counts), and the iteration time's ratio with its spread."""
import statistics

from vp.config import RunConfig, check_config
from vp.cost import Hardware, pass_costs
from vp.cost.tensor import rank_tp_collectives
from vp.launch import launch_local
from vp.schedule import build, simulate
from vp.tp.traffic import wire_bytes

FP32 = Hardware("fp32", 1.0, bytes_per_param=16.0, act_bytes=4)  # CPU runs: fp32 weights, gradients, activations


def modelled_activations(cfg: RunConfig) -> list[float]:
    """Peak activation bytes per pipeline rank, as the simulator places the memory model's passes."""
    sched = build(cfg.method, cfg.pp, cfg.microbatches, cfg.n_chunks)
    return simulate(sched, pass_costs(cfg, FP32, sched)).peak_activations


def tp_wire_bytes(cfg: RunConfig) -> list[float]:
    """Bytes one device of each pipeline rank puts on the wire per iteration on tensor-parallel channels."""
    sched = build(cfg.method, cfg.pp, cfg.microbatches, cfg.n_chunks)
    return [wire_bytes(rank_tp_collectives(cfg, sched, p)) for p in range(cfg.pp)]


def run(args) -> list[dict]:
    plain = check_config(RunConfig(method=args.method, pp=args.pp, tp=args.tp, layers=args.layers, hidden=args.hidden,
                                   heads=args.heads, seq_len=args.seq_len, vocab_size=args.vocab_size,
                                   microbatches=args.microbatches, iterations=args.iterations, warmup=args.warmup))
    sp = check_config(plain.with_(sequence_parallel=True))
    model = {c.sequence_parallel: modelled_activations(c) for c in (plain, sp)}
    wire = {c.sequence_parallel: tp_wire_bytes(c) for c in (plain, sp)}
    rows, times = [], []
    for i in range(args.rounds):
        got = {c.sequence_parallel: launch_local(c)["metrics"] for c in ((plain, sp) if i % 2 == 0 else (sp, plain))}
        times.append(got[True]["iteration_time_s"] / got[False]["iteration_time_s"])
        print(f"round {i}: plain {got[False]['iteration_time_s']:.3f} s, sequence parallel "
              f"{got[True]['iteration_time_s']:.3f} s, ratio {times[-1]:.3f}", flush=True)
    for rank in range(plain.world):
        p = plain.mesh.coords(rank).p
        measured = {k: got[k]["memory_breakdown"][rank]["activations"] for k in got}
        row = {"rank": rank, "plain": measured[False], "sp": measured[True], "plain_model": model[False][p],
               "sp_model": model[True][p], "plain_wire": wire[False][p], "sp_wire": wire[True][p]}
        rows.append(row)
        print(f"rank {rank}: activations plain {row['plain']} B (model {row['plain_model']:.0f}, measured/model "
              f"{row['plain'] / row['plain_model']:.3f}), sequence parallel {row['sp']} B "
              f"(model {row['sp_model']:.0f}, {row['sp'] / row['sp_model']:.3f}); sp / plain measured "
              f"{row['sp'] / row['plain']:.3f}, modelled {row['sp_model'] / row['plain_model']:.3f}; tp bytes on the wire per iteration plain "
              f"{row['plain_wire']:.0f}, sequence parallel {row['sp_wire']:.0f}")
    print(f"{plain.method} {plain.mesh.describe()}: sequence parallel / plain iteration time, median "
          f"{statistics.median(times):.3f} over {len(times)} rounds (min {min(times):.3f}, max {max(times):.3f})")
    return rows


def add_parser(sub):
    o = sub.add_parser("sequence", help="real CPU runs of 1-D tp with and without --sequence-parallel, alternated")
    o.add_argument("--method", default="baseline")
    o.add_argument("--pp", type=int, default=2)
    o.add_argument("--tp", type=int, default=2)
    o.add_argument("--layers", type=int, default=4)
    o.add_argument("--hidden", type=int, default=64)
    o.add_argument("--heads", type=int, default=4)
    o.add_argument("--seq-len", type=int, default=32)
    o.add_argument("--vocab-size", type=int, default=1000)
    o.add_argument("--microbatches", type=int, default=4)
    o.add_argument("--iterations", type=int, default=3)
    o.add_argument("--warmup", type=int, default=1)
    o.add_argument("--rounds", type=int, default=3)
