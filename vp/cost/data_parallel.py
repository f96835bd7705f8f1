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
from functools import cache

from vp.config import RunConfig
from vp.cost.memory import rank_params, stage_params
from vp.cost.network import ALL_GATHER, ALL_REDUCE, REDUCE_SCATTER, Network, group_index, groups, span
from vp.cost.profiles import Hardware
from vp.mesh import Mesh
from vp.schedule import Schedule


def _dp_collective(cfg: RunConfig, hw: Hardware):
    """(p, params, op) -> seconds of that collective over pipeline rank p's dp group, the network and the groups
    looked up once (reduce_buckets asks it for every bucket size of every rank)."""
    net = Network.of(hw, cfg.world)
    spans = _dp_spans(cfg.mesh, net.gpus_per_node)
    known: dict = {}  # (op, p's span, nbytes) -> seconds: a rank's buckets are alike, and so are most ranks'

    def seconds(p: int, params: float, op) -> float:
        nbytes = 4.0 * params / (cfg.dp if op is ALL_GATHER else 1)
        key = (op.name, spans[p], nbytes)
        got = known.get(key)
        if got is None:
            got = known[key] = net.collective_on(op, *spans[p], nbytes)  # 0 for a group of one (as collective())
        return got
    return seconds


@cache
def _dp_spans(mesh: Mesh, gpus_per_node: int) -> tuple:
    """Per pipeline rank p, (ranks, nodes) of the dp group of replica 0's rank of stage p: all a collective's
    seconds read of the group (vp.cost.network.span)."""
    index = group_index(mesh, "dp")
    return tuple(span(index[r], gpus_per_node) for r in groups(mesh, "pp")[0])


def _reduce(cfg: RunConfig, hw: Hardware):
    """(p, params) -> reduce_s(cfg, hw, p, params), the network and the groups looked up once."""
    collective, op = _dp_collective(cfg, hw), REDUCE_SCATTER if cfg.zero else ALL_REDUCE

    def reduce(p: int, params: float) -> float:
        return collective(p, params, op) if cfg.dp >= 2 and params > 0 else 0.0
    return reduce


def reduce_s(cfg: RunConfig, hw: Hardware, p: int, params: float) -> float:
    """Seconds to reduce `params` fp32 gradients of pipeline rank p over its dp group (0 without replicas)."""
    return _reduce(cfg, hw)(p, params)


def reduce_per_rank(cfg: RunConfig, hw: Hardware, sched: Schedule) -> list[float]:
    """Per pipeline rank: the reduction of a device's fp32 gradients over its replicas' group, not overlapped (zero
    1: the reduce-scatter)."""
    reduce = _reduce(cfg, hw)
    return [reduce(p, n) for p, n in enumerate(rank_params(cfg, sched))]


def gather_per_rank(cfg: RunConfig, hw: Hardware, sched: Schedule) -> list[float]:
    """Zero 1, per pipeline rank: the all-gather of the updated weights after the step (0 under zero 0)."""
    if cfg.dp < 2 or not cfg.zero:
        return [0.0] * cfg.pp
    collective = _dp_collective(cfg, hw)
    return [collective(p, n, ALL_GATHER) for p, n in enumerate(rank_params(cfg, sched))]


def exposed_reduce_per_rank(cfg: RunConfig, hw: Hardware, sched: Schedule, result=None,
                            final: list | None = None, buckets: tuple | None = None) -> list[float]:
    """Per pipeline rank, seconds of the gradient reduction after the flush: all of it, or with overlap_grad_reduce
    and a simulated iteration (vp.schedule.SimResult, or what finals() reads of it) what remains of the dp stream at
    the rank's last action. buckets: reduce_buckets() of cfg, where the caller has it already."""
    if not cfg.overlap_grad_reduce or (result is None and final is None):
        return reduce_per_rank(cfg, hw, sched)
    final = finals(result, sched) if final is None else final
    stage, shards = reduce_buckets(cfg, hw, sched) if buckets is None else buckets
    out = []
    for p, (last, flush) in enumerate(final):
        runs = []  # (first ready, last ready, buckets, seconds of each but the last, of the last): one per pass
        for c, (k, each, tail) in enumerate(stage[p]):  # backward walks the layers in reverse: buckets final
            if k:                                        # evenly over the pass
                start, end = last.get(("stage", c), (0.0, 0.0))
                runs.append((start + 1 / k * (end - start), start + k / k * (end - start), k, each, tail))
        if shards[p]:
            at = last.get("shards", (0.0, 0.0))[1]
            runs.append((at, at, 1, 0.0, shards[p]))
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
    for actions, starts, ends in result.rank_spans():
        last: dict = {}
        for i in range(len(actions) - 1, -1, -1):
            _, kind, _, chunk = actions[i]
            key = ("stage", chunk) if kind in ("B", "W") else "shards" if kind in ("T", "IB") else None
            if key is not None and key not in last:
                last[key] = (float(starts[i]), float(ends[i]))
                if len(last) == want:
                    break
        out.append((last, float(ends[-1]) if len(ends) else 0.0))
    return out


def reduce_buckets(cfg: RunConfig, hw: Hardware, sched: Schedule) -> tuple[tuple, tuple]:
    """The buckets of the overlapped reduction as exposed_reduce_per_rank cuts them, with their seconds: per
    pipeline rank, per chunk (how many buckets, seconds of a full one, seconds of the last, which holds the rest),
    and the seconds of the rank's vocabulary-parallel shards (0 where it has none). Costs of no pass: what
    unhidden_reduce needs besides the rank's last pass."""
    per_stage, shards = stage_params(cfg, sched)
    bucket = max(1, int(cfg.bucket_mb * 2**20 / 4))
    reduce = _reduce(cfg, hw)
    stage = []
    for p in range(cfg.pp):
        chunks = []
        for c in range(sched.chunks):
            n = per_stage[sched.stage(p, c)]
            k = -(-n // bucket)
            chunks.append((k, reduce(p, bucket) if k > 1 else 0.0, reduce(p, n - (k - 1) * bucket) if k else 0.0))
        stage.append(tuple(chunks))
    return tuple(stage), tuple(reduce(p, n) for p, n in enumerate(shards))


def unhidden_reduce(buckets: tuple[tuple, tuple], last: list, seconds: list) -> list[float]:
    """Per pipeline rank, seconds of the overlapped reduction (overlap_grad_reduce) that no iteration can hide: a
    lower bound on exposed_reduce_per_rank with any simulated iteration of the schedule (docs/planner.md, "The
    tail bound"). buckets: reduce_buckets(); last[p]: (kind, chunk) of rank p's last action (None: not known);
    seconds[p]: that action's duration in the simulation, or None where it is not known exactly (processor
    sharing lengthens a pass).

    The buckets that become final in the rank's last action are ready at its end, the flush, less part of it: the
    last bucket at the flush, the (k-1-i)-th before it (k - 1 - i) / k of the pass earlier. The stream reduces
    buckets one at a time in the order they are ready, so it ends no earlier than the first-ready bucket of a set
    plus the seconds of the set: with the buckets i..k-1 (i full ones but the last), the flush + last +
    (k-1-i) (full - d / k), largest at i = 0 or i = k - 1. The shards are final at the end of a rank's last T or IB
    (one bucket)."""
    stage, shards = buckets
    out = []
    for p, (at, d) in enumerate(zip(last, seconds)):
        if at is None:
            out.append(0.0)
        elif at[0] in ("B", "W"):
            k, full, rest = stage[p][at[1]]
            out.append(rest + (k - 1) * max(0.0, full - d / k) if d is not None else rest)
        elif at[0] in ("T", "IB"):
            out.append(shards[p])
        else:
            out.append(0.0)
    return out
