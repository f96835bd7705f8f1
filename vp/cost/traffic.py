"""What each communicating action sends (payloads: the one source of message sizes, pinned to the runtime's
Comm counts by tests/test_runtime.py and tests/test_mesh_train.py) and the bytes each device sends per
iteration on each channel, the tensor-parallel ones (vp.cost.tensor, from vp.tp.traffic) included."""
from collections import Counter
from operator import itemgetter

from vp.config import RunConfig
from vp.cost.memory import rank_params
from vp.cost.tensor import Split, rank_tp_collectives
from vp.tp.traffic import by_channel
from vp.schedule import Schedule
from vp.schedule.rules import root_of, shapes


def payloads(cfg: RunConfig, sched: Schedule) -> dict[str, list[tuple[str, float]]]:
    """What each communicating action sends, as (operation, bytes of the tensor handed to Comm), in the order
    the runtime issues them: the one source of message sizes for the cost model's times and traffic().

    P2P carries a stage's activation or input gradient in the compute dtype; C0 X and the loss weights in fp32
    ([n, h+1]); C1 the shard statistics [3, n] fp32 (all-gather) and, where S precomputed it (Algorithm 2), grad X
    [n, h] fp32 (all-reduce); C2 grad X; IF the partial embeddings of the fp32 shards; IB the first stage's
    embedding gradient in the compute dtype; the naive algorithm's S the max [n] and (sum, target) [2, n], its
    T grad X. With tensor parallelism each device sends its own part: n is its token block's tokens (a grid
    splits the micro-batch d q ways), and a stage's activation holds its hidden columns (grid: h/q) or, 1-D sequence
    parallel, its positions (s/t)."""
    split = Split.of(cfg)
    n, h = cfg.micro_batch_size * cfg.seq_len // split.blocks, cfg.hidden
    item = 4 if cfg.dtype == "fp32" else 2
    # a stage's activation (sequence parallel: its positions [b, s/t, h]); IB's whole hidden
    act, whole = n // split.sequence_shards * split.hidden_share(h) * item, n * h * item
    grad32 = 4 * n * h
    return {"SF": [("send", act)], "SB": [("send", act)], "C0": [("broadcast", 4 * n * (h + 1))],
            "C1": [("all_gather", 12 * n)] + ([("all_reduce", grad32)] if sched.vocab.grad_x_in_s else []),
            "C2": [("all_reduce", grad32)], "IF": [("reduce", grad32)], "IB": [("broadcast", whole)],
            "S": [("all_reduce", 4 * n), ("all_reduce", 8 * n)] if sched.vocab.synchronous else [],
            "T": [("all_reduce", grad32)] if sched.vocab.synchronous else []}


def traffic(cfg: RunConfig, sched: Schedule) -> list[dict[str, float]]:
    """Bytes one device of each pipeline rank sends per iteration on each channel, counted as the runtime's Comm
    counts them: a send or a collective's tensor on every member, a broadcast on its root only."""
    sizes = payloads(cfg, sched)
    out = []
    for r, counts in enumerate(sched.memo("sends", _sends)):
        sent: dict[str, float] = {}
        for (channel, kind), n in counts.items():
            for op, nbytes in sizes[kind]:
                if op != "broadcast" or root_of(sched, channel) == r:
                    sent[channel] = sent.get(channel, 0.0) + n * nbytes
        for channel, nbytes in by_channel(rank_tp_collectives(cfg, sched, r)).items():
            sent[channel] = sent.get(channel, 0.0) + nbytes
        if cfg.dp > 1:  # the gradient reduction over the replicas (vp.runtime.data_parallel)
            sent["dp"] = dp_bytes(cfg, rank_params(cfg, sched)[r])
        out.append(dict(sorted(sent.items())))
    return out


def _sends(sched: Schedule) -> list[dict[tuple[str, str], int]]:
    """Per rank: how many of its actions of each kind send on each channel (independent of sizes), in the order of
    each (channel, kind)'s first action. Counted per (kind, chunk) in C, then read from the rules' shape of each
    (kind, chunk), whose channel does not depend on the microbatch."""
    out = []
    for r, (acts, shape) in enumerate(zip(sched.ranks, shapes(sched))):
        counts: dict[tuple[str, str], int] = {}
        for (kind, chunk), n in Counter(map(itemgetter(1, 3), acts)).items():  # by first appearance
            sh = shape[(kind, chunk)]
            if kind in ("SF", "SB"):
                channel = ("fwd" if kind == "SF" else "bwd") + ("+" if sh.peer > r else "-")
            elif sh.entry is not None:
                channel = sh.entry.group
            else:
                continue
            counts[(channel, kind)] = counts.get((channel, kind), 0) + n
        out.append(counts)
    return out


def dp_bytes(cfg: RunConfig, params: int) -> float:
    """Bytes one device sends per iteration on the dp channel, as vp.comm counts them: zero 0 all-reduces the fp32
    gradients (counted whole); zero 1 reduce-scatters them (counted whole, padded to a multiple of dp) and
    all-gathers its 1/dp of the weights after the step."""
    if not cfg.zero:
        return 4.0 * params
    padded = -(-params // cfg.dp) * cfg.dp
    return 4.0 * padded + 4.0 * padded / cfg.dp
