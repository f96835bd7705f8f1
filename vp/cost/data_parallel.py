"""The data-parallel gradient reduction's time (vp.runtime.data_parallel): what of it a device waits for after the
pipeline's flush.

Zero 0 all-reduces a device's fp32 gradients over its dp group; zero 1 reduce-scatters them and, after the
optimizer step over its 1/dp shard, all-gathers the weights (the all-gather always follows the step: exposed).
Without overlap the reduction starts at the flush. With overlap_grad_reduce, a bucket can start only when its last
gradient is made, and the dp stream reduces them one after another: a stage's (a chunk's) layers become final
during its last B or W (the pass that makes its weight gradients), bucket by bucket evenly over the pass as
backward walks the layers in reverse; a rank's vocabulary-parallel shards at the end of its last T and IB; what
the stream has left when the rank's pipeline flushes is exposed. Each bucket is one collective (its own latency),
in the order the buckets become final (the runtime launches them in buffer order, which backward follows)."""
from vp.config import RunConfig
from vp.cost.memory import rank_params, stage_params
from vp.cost.network import ALL_GATHER, ALL_REDUCE, REDUCE_SCATTER, Network, group_index, groups
from vp.cost.profiles import Hardware
from vp.schedule import Schedule


def _seconds(cfg: RunConfig, hw: Hardware, p: int, params: float, op) -> float:
    net = Network.of(hw, cfg.world)
    nbytes = 4.0 * params / (cfg.dp if op is ALL_GATHER else 1)
    return net.collective(op, group_index(cfg.mesh, "dp")[groups(cfg.mesh, "pp")[0][p]], nbytes)  # replica 0's


def reduce_s(cfg: RunConfig, hw: Hardware, p: int, params: float) -> float:
    """Seconds to reduce `params` fp32 gradients of pipeline rank p over its dp group (0 without replicas)."""
    if cfg.dp < 2 or params <= 0:
        return 0.0
    return _seconds(cfg, hw, p, params, REDUCE_SCATTER if cfg.zero else ALL_REDUCE)


def gather_per_rank(cfg: RunConfig, hw: Hardware, sched: Schedule) -> list[float]:
    """Zero 1, per pipeline rank: the all-gather of the updated weights after the step (0 under zero 0)."""
    if cfg.dp < 2 or not cfg.zero:
        return [0.0] * cfg.pp
    return [_seconds(cfg, hw, p, n, ALL_GATHER) for p, n in enumerate(rank_params(cfg, sched))]


def exposed_reduce_per_rank(cfg: RunConfig, hw: Hardware, sched: Schedule, result=None,
                            final: list | None = None) -> list[float]:
    """Per pipeline rank, seconds of the gradient reduction after the flush: all of it, or with overlap_grad_reduce
    and a simulated iteration (vp.schedule.SimResult, or what finals() reads of it) what remains of the dp stream at
    the rank's last action."""
    params = rank_params(cfg, sched)
    if not cfg.overlap_grad_reduce or (result is None and final is None):
        return [reduce_s(cfg, hw, p, n) for p, n in enumerate(params)]
    final = finals(result, sched) if final is None else final
    per_stage, shards = stage_params(cfg, sched)
    bucket = max(1, int(cfg.bucket_mb * 2**20 / 4))
    out = []
    for p, (last, flush) in enumerate(final):
        seconds = {}  # bucket elements -> its reduction's seconds: the full buckets share one size

        def reduce(n):
            if n not in seconds:
                seconds[n] = reduce_s(cfg, hw, p, n)
            return seconds[n]

        runs = []  # (first ready, last ready, buckets, seconds of each but the last, of the last): one per pass
        for c in range(sched.chunks):  # backward walks the layers in reverse: buckets final evenly over the pass
            start, end = last.get(("stage", c), (0.0, 0.0))
            n = per_stage[sched.stage(p, c)]
            k = -(-n // bucket)
            if k:
                runs.append((start + 1 / k * (end - start), start + k / k * (end - start), k,
                             reduce(min(bucket, n)), reduce(n - (k - 1) * bucket)))
        if shards[p]:
            at = last.get("shards", (0.0, 0.0))[1]
            runs.append((at, at, 1, 0.0, reduce(shards[p])))
        stream = 0.0
        for first, after, k, each, tail in sorted(runs):
            rest = (k - 1) * each + tail  # what the run's first bucket and all after it take on the stream
            stream = max(stream + rest, first + rest, after + tail)
        out.append(max(0.0, stream - flush))
    return out


def finals(result, sched: Schedule) -> list[tuple[dict, float]]:
    """Per pipeline rank of a simulated iteration, what the overlapped reduction reads of it: what becomes final ->
    (start, end) of the pass that makes it final (("stage", chunk): its last B or W; "shards": its last T or IB), and
    the rank's flush (the end of its last action). A rank runs its actions one after another, so ends never
    decrease along its order and the last such pass in the order is the one that ends last: found from the end,
    stopping once all are found."""
    want = sched.chunks + bool(sched.vocab_parallel)
    out = []
    for actions, starts, ends in result.spans:
        last: dict = {}
        for i in range(len(actions) - 1, -1, -1):
            _, kind, _, chunk = actions[i]
            key = ("stage", chunk) if kind in ("B", "W") else "shards" if kind in ("T", "IB") else None
            if key is not None and key not in last:
                last[key] = (starts[i], ends[i])
                if len(last) == want:
                    break
        out.append((last, ends[-1] if ends else 0.0))
    return out
