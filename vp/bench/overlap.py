"""python -m vp.bench overlap: does --overlap-grad-reduce shorten a real CPU run's iteration where the dp reduction
is large? Real gloo runs (vp.launch.launch_local) of one config with and without the overlap, alternated round by
round (which goes first alternates too) so that the machine's load falls on both alike; per round the ratio of the
median iteration times (overlapped / not) and each run's longest tail (after the last pipeline action: the wait for
the reduction, the step); then the median ratio and its spread over the rounds.

Over loopback on a CPU, gloo's sums and copies run on the cores the backward needs, so the "background" reduction
competes with the passes it should hide behind. --link-gbit G makes the reduction network-bound instead, as between
nodes: each replica's ranks run in a network namespace of their own, joined by links of G Gbit/s (vp.bench.netns;
root only), and only the dp group's traffic crosses them."""
import contextlib
import functools
import statistics

from vp.bench.netns import Link, rank_in_namespace
from vp.config import RunConfig, check_config
from vp.launch import launch_local


def run(args) -> list[dict]:
    base = check_config(RunConfig(method=args.method, dp=args.dp, pp=args.pp, layers=args.layers, hidden=args.hidden,
                                  heads=args.heads, seq_len=args.seq_len,
                                  micro_batch_size=args.micro_batch_size, vocab_size=args.vocab_size,
                                  microbatches=args.microbatches, iterations=args.iterations, warmup=args.warmup,
                                  zero=args.zero, bucket_mb=args.bucket_mb))
    over = check_config(base.with_(overlap_grad_reduce=True))
    with Link(base.dp, args.link_gbit) if args.link_gbit is not None else contextlib.nullcontext() as link:
        rank_fn = functools.partial(rank_in_namespace, link.namespaces) if link else None
        return _rounds(args, base, over, rank_fn)


def _rounds(args, base: RunConfig, over: RunConfig, rank_fn) -> list[dict]:
    link = f", replicas joined by {args.link_gbit} Gbit/s links" if args.link_gbit is not None else ", loopback"
    rows = []
    for i in range(args.rounds):
        pair = [(cfg, launch_local(cfg, rank_fn=rank_fn)["metrics"])
                for cfg in ((base, over) if i % 2 == 0 else (over, base))]
        by = {cfg.overlap_grad_reduce: m for cfg, m in pair}
        row = {"round": i, "plain_s": by[False]["iteration_time_s"], "overlap_s": by[True]["iteration_time_s"],
               "plain_tail_s": max(by[False]["tail_s"]), "overlap_tail_s": max(by[True]["tail_s"])}
        row["ratio"] = row["overlap_s"] / row["plain_s"]
        rows.append(row)
        print(f"round {i}: plain {row['plain_s']:.3f} s (tail {row['plain_tail_s']:.3f})  overlapped "
              f"{row['overlap_s']:.3f} s (tail {row['overlap_tail_s']:.3f})  ratio {row['ratio']:.3f}", flush=True)
    ratios = [r["ratio"] for r in rows]
    print(f"{base.method} {base.mesh.describe()} zero {base.zero}, bucket {base.bucket_mb} MiB{link}: overlapped / "
          f"plain iteration time, median {statistics.median(ratios):.3f} over {len(ratios)} rounds "
          f"(min {min(ratios):.3f}, max {max(ratios):.3f})")
    return rows


def add_parser(sub):
    o = sub.add_parser("overlap", help="real CPU runs with and without --overlap-grad-reduce, alternated")
    o.add_argument("--method", default="baseline")
    o.add_argument("--dp", type=int, default=2)
    o.add_argument("--pp", type=int, default=2)
    o.add_argument("--layers", type=int, default=4)
    o.add_argument("--hidden", type=int, default=512)
    o.add_argument("--heads", type=int, default=8)
    o.add_argument("--seq-len", type=int, default=16)
    o.add_argument("--micro-batch-size", type=int, default=1)
    o.add_argument("--vocab-size", type=int, default=8000)
    o.add_argument("--microbatches", type=int, default=4)
    o.add_argument("--iterations", type=int, default=5)
    o.add_argument("--warmup", type=int, default=2)
    o.add_argument("--zero", type=int, default=0)
    o.add_argument("--bucket-mb", type=float, default=4.0)
    o.add_argument("--rounds", type=int, default=5)
    o.add_argument("--link-gbit", type=float, default=None,
                   help="each dp replica in its own network namespace, joined by links of this many Gbit/s (root)")
