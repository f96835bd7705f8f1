"""Benchmarks that print ratios measured side by side in one run (never asserted in tests).

python -m vp.bench vocab     S+T of one vocabulary shard against the single-device output layer
python -m vp.bench pipeline  real 2-rank CPU runs of a vocabulary-heavy GPT, against baseline and the simulator
python -m vp.bench tp        tensor-parallel grids: bytes per layer measured against the closed form, time
python -m vp.bench peer      the same GPT under torch.distributed.pipelining and under this project (vp/bench/peer.py)
python -m vp.bench sim       the schedule simulator's time and memory over a ladder of sizes (vp/bench/sim.py)
python -m vp.bench plan      the planner's CPU seconds per problem, with its phases (vp/bench/plan.py)
python -m vp.bench overlap   real CPU runs with and without --overlap-grad-reduce, alternated (vp/bench/overlap.py)
python -m vp.bench sequence  real CPU runs of 1-D tp with and without --sequence-parallel (vp/bench/sequence.py)
python -m vp.bench comms     the communicators of a run at any size, without processes (vp/bench/comms.py)
"""
import argparse
import json
import sys
import time

import torch
import torch.nn.functional as F

from vp.bench.overlap import add_parser as add_overlap_parser
from vp.bench.overlap import run as run_overlap
from vp.bench.sequence import add_parser as add_sequence_parser
from vp.bench.sequence import run as run_sequence
from vp.comm import Comm
from vp.renamed import moved, refuse_renamed_flags
from vp.schedule.methods import VOCAB
from vp.vocab.output import Shard, c1_step, c2_step, naive_backward, naive_forward, s_pass, t_pass


def _best(fn, reps: int) -> float:
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def bench_vocab(hidden: int, vocabs: list[int], tokens: int, reps: int):
    """One process: the passes of one shard of V/p rows (communication excluded, group of one)."""
    torch.manual_seed(0)
    comm = Comm.local([0], 0, torch.device("cpu"))
    x = torch.randn(tokens, hidden)
    weights = torch.full((tokens,), 1.0 / tokens)
    print(f"S+T of one vocabulary shard vs the single-device output layer (h={hidden}, {tokens} tokens, "
          f"{torch.get_num_threads()} threads, best of {reps}); ideal ratio = 1/p")
    print(f"{'V':>7} {'algorithm':>9} {'p':>2} {'shard ms':>9} {'ratio':>6}")
    for vocab in vocabs:
        w_full = torch.randn(vocab, hidden) * 0.02
        targets = torch.randint(0, vocab, (tokens,))

        def single():
            xr, wr = x.clone().requires_grad_(), w_full.clone().requires_grad_()
            (weights * F.cross_entropy(xr @ wr.t(), targets, reduction="none")).sum().backward()

        ref = _best(single, reps)
        print(f"{vocab:>7} {'single':>9} {1:>2} {ref * 1e3:>9.1f} {1.0:>6.2f}")
        for algo in (v for v in VOCAB.values() if v.parallel):
            for p in (1, 2, 4):
                shard = Shard(0, p, vocab // p, vocab)
                w = torch.nn.Parameter(w_full[: shard.rows].clone())

                def passes():
                    if algo.synchronous:
                        naive_backward(shard, w, naive_forward(shard, w, x, targets, weights, comm), comm)
                        return
                    state = c1_step(s_pass(shard, w, x, targets, weights, algo), comm, algo)
                    state = t_pass(shard, w, state, algo)
                    if algo.after_t:
                        c2_step(state, comm)

                t = _best(passes, reps)
                print(f"{vocab:>7} {algo.name:>9} {p:>2} {t * 1e3:>9.1f} {t / ref:>6.2f}")


def check_vocab_sizes(args) -> None:
    """Every size of `vp.bench vocab` positive, and the largest logits [tokens, vocabulary] within what this
    machine has available (each is held several times: logits, softmax, gradients)."""
    from vp.checks import MAX_BENCH_TOKENS, available_bytes

    for flag, values in (("--hidden", [args.hidden]), ("--vocab-size", args.vocab_size), ("--tokens", [args.tokens]),
                         ("--rounds", [args.rounds])):
        bad = [v for v in values if v < 1]
        if bad:
            raise ValueError(f"{flag} {bad[0]} must be a positive integer")
    if args.tokens > MAX_BENCH_TOKENS:
        raise ValueError(f"--tokens {args.tokens} is above the limit of {MAX_BENCH_TOKENS}; use fewer tokens")
    vocab = max(args.vocab_size)  # fp32 logits, weights and their gradients, held about four times over at the peak
    need = 4 * 4 * (args.tokens * vocab + vocab * args.hidden + args.tokens * args.hidden)
    have = available_bytes()
    if have is not None and need > have:
        raise ValueError(f"--tokens {args.tokens}, --vocab-size {vocab} and --hidden {args.hidden} need about "
                         f"{need / 2**30:.1f} GiB but {have / 2**30:.1f} GiB are available; use fewer --tokens or a "
                         "smaller --vocab-size")


def predict_iteration(result, tail_s: list[float]) -> float:
    """An iteration as the runtime times it: each rank's schedule (simulated), then what it measured after its
    last action (the optimizer step; the simulator schedules passes, not the optimizer)."""
    ends = [max((end for _, _, end in actions), default=0.0) for actions in result.timeline]
    return max(end + tail for end, tail in zip(ends, tail_s, strict=True))


def bench_pipeline(methods: list[str], args):
    from vp.config import RunConfig, check_config
    from vp.cost import record_costs
    from vp.launch import launch_local
    from vp.schedule import simulate

    rows = []
    for method in methods:
        cfg = check_config(RunConfig(method=method, pp=2, layers=args.layers, hidden=args.hidden, heads=args.heads,
                                 seq_len=args.seq_len, vocab_size=args.vocab_size, microbatches=args.microbatches,
                                 iterations=args.iterations, warmup=1, timeout_s=900))
        rec = launch_local(cfg)
        m = rec["metrics"]
        sched, costs = record_costs(rec)  # measured pass times, communication from the run's link probe
        predicted = predict_iteration(simulate(sched, costs), m["tail_s"])
        rows.append((method, m["iteration_time_s"], m["tokens_per_s"], predicted, m["peak_memory_bytes"]))
        print(f"  ran {method}: {m['iteration_time_s']:.3f} s/iteration", file=sys.stderr, flush=True)
    base = next(r for r in rows if r[0] == "baseline")
    print(f"2 CPU ranks, h={args.hidden}, {args.layers} layers, seq {args.seq_len}, V={args.vocab_size}, "
          f"{args.microbatches} microbatches; prediction = simulator on the pass times measured in the same run "
          f"plus communication from the link probe of the same run, then each rank's measured optimizer step (tail_s)")
    print(f"{'method':>12} {'s/iter':>8} {'tokens/s':>9} {'vs baseline':>11} {'predicted s':>11} "
          f"{'measured/pred':>13} {'peak MiB per rank':>18}")
    for method, t, tps, pred, mem in rows:
        print(f"{method:>12} {t:>8.3f} {tps:>9.0f} {base[1] / t:>10.2f}x {pred:>11.3f} {t / pred:>13.2f} "
              f"{' '.join(f'{b / 2**20:.0f}' for b in mem):>18}")


def peer_main(args) -> int:
    from vp.bench.peer import bench_peer, print_table
    from vp.config import RunConfig

    if args.rounds < 1:
        print(f"error: rounds={args.rounds} must be a positive integer", file=sys.stderr)
        return 2
    cfg = RunConfig(pp=2, layers=args.layers, hidden=args.hidden, heads=args.heads, seq_len=args.seq_len,
                    vocab_size=args.vocab_size, microbatches=args.microbatches, iterations=args.iterations,
                    warmup=args.warmup, timeout_s=900)
    try:
        rows, fair = bench_peer(cfg, args.rounds)
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(rows))
    else:
        print_table(cfg, rows, args.rounds, fair)
    return 0 if fair else 1


def sim_main(args) -> int:
    from vp.bench import sim
    from vp.config import RunConfig, check_config

    try:
        sizes = [sim.parse_size(x) for x in args.sizes] if args.sizes else list(sim.LADDER)
        methods = args.methods or list(sim.METHODS)
        if args.rounds < 1:
            raise ValueError(f"--rounds {args.rounds} must be a positive integer")
        for method in methods:
            for pp, m in sizes:
                check_config(RunConfig(method=method, pp=pp, microbatches=m, layers=pp * 2, vocab_size=max(1000, pp)))
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    sim.run(methods, sizes, args.rounds, args.json)
    return 0


def plan_main(args) -> int:
    from vp.bench import plan

    try:
        if args.rounds < 1:
            raise ValueError(f"--rounds {args.rounds} must be a positive integer")
        problems = [plan.parse_problem(x) for x in args.problems]
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    plan.run(problems, args.rounds, args.json)
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m vp.bench", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="what", required=True)
    v = sub.add_parser("vocab")
    v.add_argument("--hidden", type=int, default=1024)
    v.add_argument("--vocab-size", type=int, nargs="+", default=[32000, 128000], metavar="V")
    v.add_argument("--tokens", type=int, default=256)
    v.add_argument("--rounds", type=int, default=3, help="timings of every row; the best is reported")
    p = sub.add_parser("pipeline")
    p.add_argument("--methods", nargs="+", default=["baseline", "redis", "interlaced", "vocab-1", "vocab-2"])
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--seq-len", type=int, default=256)
    p.add_argument("--vocab-size", type=int, default=64000)
    p.add_argument("--microbatches", type=int, default=8)
    p.add_argument("--iterations", type=int, default=3)
    q = sub.add_parser("peer", help="torch.distributed.pipelining against this project, same model and data")
    q.add_argument("--hidden", type=int, default=256)
    q.add_argument("--heads", type=int, default=4)
    q.add_argument("--layers", type=int, default=4)
    q.add_argument("--seq-len", type=int, default=256)
    q.add_argument("--vocab-size", type=int, default=64000)
    q.add_argument("--microbatches", type=int, default=8)
    q.add_argument("--iterations", type=int, default=4)
    q.add_argument("--warmup", type=int, default=1)
    q.add_argument("--rounds", type=int, default=1, help="runs of every runner, round-robin; the best is reported")
    q.add_argument("--json", action="store_true", help="print a list of one object per runner")
    t = sub.add_parser("tp")
    t.add_argument("--json", action="store_true", help="print a list of row objects")
    sm = sub.add_parser("sim", help="build + validate + simulate time and peak memory, 32x128 up to 256x1024")
    sm.add_argument("--json", action="store_true", help="print a list of row objects")
    sm.add_argument("--methods", nargs="+", default=None, help="default: vocab-2 vhalf-vocab-2 interleaved-vocab-2")
    sm.add_argument("--sizes", nargs="+", default=None, help="PPxMICROBATCHES, default: 32x128 64x256 128x512 256x1024")
    sm.add_argument("--rounds", type=int, default=1, help="rounds over all rows; the fastest is shown with the spread")
    pl = sub.add_parser("plan", help="python -m harness.plan's CPU seconds per problem, by phase")
    pl.add_argument("--json", action="store_true", help="print a list of row objects")
    pl.add_argument("--problems", nargs="+", default=["30b", "70b"],
                    help="30b, 70b (the issue's problems) or NAME=KEY=VALUE,KEY=VALUE,... (harness.plan overrides)")
    pl.add_argument("--rounds", type=int, default=1,
                    help="rounds over all problems: the first with an empty disk cache, the least CPU time of the others "
                         "shown")
    add_overlap_parser(sub)
    add_sequence_parser(sub)
    c = sub.add_parser("comms", help="groups, world-wide creation calls and NCCL buffers per rank, no processes")
    for name, default in (("--dp", 1), ("--pp", 1), ("--tp", 1), ("--tp-depth", 1), ("--rank", 0)):
        c.add_argument(name, type=int, default=default)
    c.add_argument("--tp-mode", default="1d")
    c.add_argument("--method", default="vocab-2")
    c.add_argument("--hardware", default="h100", help="the profile whose NCCL buffer sizes count")
    c.add_argument("--json", action="store_true")
    for parser in (ap, v, p, q, t, sm, pl, c):
        refuse_renamed_flags(parser)
    if argv is None:
        argv = sys.argv[1:]
    if argv[:1] == ["tpsim"]:  # merged into experiment=tp_scaling
        ap.error(moved("vp.bench tpsim"))
    args = ap.parse_args(argv)
    if args.what == "overlap":
        try:
            run_overlap(args)
        except ValueError as err:  # a refused config or --link-gbit where it cannot run
            print(f"error: {err}", file=sys.stderr)
            return 2
        return 0
    if args.what == "sequence":
        run_sequence(args)
        return 0
    if args.what == "comms":
        from vp.bench.comms import run as run_comms

        try:
            return run_comms(args.method, args.dp, args.pp, args.tp, args.tp_mode, args.tp_depth, args.rank,
                             args.hardware, args.json)
        except ValueError as err:
            print(f"error: {err}", file=sys.stderr)
            return 2
    if args.what == "sim":
        return sim_main(args)
    if args.what == "plan":
        return plan_main(args)
    if args.what == "tp":
        from vp.bench.tp import run

        run(args.json)
    elif args.what == "vocab":
        try:
            check_vocab_sizes(args)
        except ValueError as err:
            print(f"error: {err}", file=sys.stderr)
            return 2
        bench_vocab(args.hidden, args.vocab_size, args.tokens, args.rounds)
    elif args.what == "peer":
        return peer_main(args)
    else:
        if "baseline" not in args.methods:
            args.methods.insert(0, "baseline")
        bench_pipeline(args.methods, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
