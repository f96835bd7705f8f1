"""What each kind of communication carries per microbatch, as the runtime sends it (vp.runtime.executor,
vp.vocab.output; n = tokens of a microbatch, h = hidden size, p = vocabulary shards):
  P2P  activations or their gradients between adjacent stages, [n, h] in the activation dtype
  C0   broadcast of the last stage's output and the loss weights, [n, h + 1] fp32, from the last stage's rank
  C1   all-gather of each shard's softmax statistics [3, n] fp32; in Algorithm 2 also the all-reduce of the
       input gradient [n, h] fp32
  C2   all-reduce of the input gradient [n, h] fp32 (Algorithm 1)
  IF   reduce of the partial embeddings [n, h] fp32 to the first stage's rank
  IB   broadcast of the embedding gradient [n, h] in the activation dtype from the first stage's rank
  S, T of the naive (interlaced) output layer: synchronous all-reduces of the maximum [n] and of (sum of exp,
       target logit) [2, n] in S, of the input gradient [n, h] fp32 in T
"""
from dataclasses import dataclass

from vp.cost.network import ALL_GATHER, ALL_REDUCE, BROADCAST, REDUCE, Op


@dataclass(frozen=True)
class Transfer:
    op: Op | None  # None: a point-to-point message
    nbytes: float


def traffic(tokens: int, hidden: int, shards: int, vocab: str, act_bytes: int) -> dict[str, list[Transfer]]:
    """Kind -> the transfers one microbatch makes of it (vocab: the schedule's vocabulary algorithm)."""
    n, h = tokens, hidden
    grad32 = Transfer(ALL_REDUCE, 4.0 * n * h)
    out = {"P2P": [Transfer(None, float(n * h * act_bytes))]}
    if vocab == "local":
        return out
    out["C0"] = [Transfer(BROADCAST, 4.0 * n * (h + 1))]
    out["IF"] = [Transfer(REDUCE, 4.0 * n * h)]
    out["IB"] = [Transfer(BROADCAST, float(n * h * act_bytes))]
    if vocab == "naive":
        out["S"] = [Transfer(ALL_REDUCE, 4.0 * n), Transfer(ALL_REDUCE, 8.0 * n)]
        out["T"] = [grad32]
        return out
    out["C1"] = [Transfer(ALL_GATHER, 12.0 * n * shards)] + ([grad32] if vocab == "alg2" else [])
    if vocab == "alg1":
        out["C2"] = [grad32]
    return out
