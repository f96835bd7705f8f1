"""How tight the planner's bounds are (docs/planner.md, bounds A-D and T): plan a problem as harness.plan does and,
for every simulated candidate, compare the simulated makespan with its lower bound, and the iteration (makespan plus
tail) with the makespan plus the tail's bound (bound T); print per method the median (p10-p90) of actual / bound,
and the search's simulated count and CPU seconds; and, for the candidates the search visits with the whole cost model,
how far above their whole bound the bound they entered the order with stood (docs/planner.md, step 1: the fewer
visited, the less of the whole cost model is worked out).
A ratio below 1 would be a bound above the simulation: the script says so and exits 1.

    .venv/bin/python scripts/plan-bound-tightness.py [model] [vocab] [gpus] [global_batch] [seq_len]
    (default: 30b 256k 1024 1024 4096 on the h100 profile, the problem of docs/benchmarks.md)
"""
import importlib
import statistics
import sys
from collections import defaultdict

from harness.plan import compose_plan, problem_of
from vp.plan.bounds import makespan_lower_bound

search_module = importlib.import_module("vp.plan.search")  # the module (vp.plan exports the function as search)


def main(model="30b", vocab="256k", gpus="1024", batch="1024", seq="4096") -> int:
    problem, hw = problem_of(*compose_plan([f"model={model}", f"vocab={vocab}", "hardware=h100", f"plan.gpus={gpus}",
                                            f"plan.global_batch={batch}", f"run.seq_len={seq}"]))
    seen, predict = defaultdict(list), search_module.predict

    def recorded(c, hw, cache, built, *paths):
        row = predict(c, hw, cache, built, *paths)
        span = makespan_lower_bound(c.skeleton, c.costs)
        result = cache[(c.run.method, c.run.pp, c.run.microbatches, c.run.n_chunks, search_module._costs_key(c.costs))]
        seen[c.run.method].append((result.makespan / span, row.iteration_s / (result.makespan + c.tail)))
        return row

    first, price = {}, search_module.price

    def priced(run, *args, **kwargs):  # the bound each candidate enters the order with (its own, not borrowed)
        p = price(run, *args, **kwargs)
        if not isinstance(p, search_module.Rejection) and not p.borrowed:
            first[id(p)] = (p, p.bound)
        return p

    search_module.predict, search_module.price = recorded, priced
    plan = search_module.search(problem, hw)
    print(f"simulated {plan.simulated} of {plan.feasible} feasible, {plan.cpu_seconds:.1f} CPU-s (plan.cpu_seconds)")
    entered = sorted(bound / p.bound for p, bound in first.values() if p.full)
    if entered:
        q = lambda xs, f: xs[int(f * (len(xs) - 1))]  # noqa: E731
        print(f"visited with the whole cost model: {plan.memo['full'][0]}; of those priced with their own bound "
              f"({len(entered)}), that bound over their whole bound: median {statistics.median(entered):.3f} "
              f"({q(entered, .1):.3f}-{q(entered, .9):.3f})")
    print(f"{'method':22s} {'sims':>5s}  makespan/bound med (p10-p90)   with the tail's bound med (p90)")
    low = 1.0
    for method, pairs in sorted(seen.items()):
        span, tail = sorted(p[0] for p in pairs), sorted(p[1] for p in pairs)
        low = min(low, span[0] * (1 + 1e-9), tail[0] * (1 + 1e-9))
        q = lambda xs, f: xs[int(f * (len(xs) - 1))]  # noqa: E731
        print(f"{method:22s} {len(pairs):5d}  {statistics.median(span):.3f} ({q(span, .1):.3f}-{q(span, .9):.3f})"
              f"            {statistics.median(tail):.3f} ({q(tail, .9):.3f})")
    if low < 1.0:
        print("a bound exceeds its simulated figure")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
