"""Memory per device: parameters, gradients and optimizer state (bytes_per_param per parameter, plus a fixed
overhead), and the activations a pass holds until the pass that frees it, on one device of a stage's
tensor-parallel group (vp.cost.tensor.Split; tp = 1: the whole stage). Lists are per pipeline rank: every device
of a stage's group holds the same amount.

Sharding per mode: 1-D splits the column-parallel weights and biases (qkv, fc1) and the row-parallel weights
(proj, fc2) t ways and replicates the row-parallel biases and the LayerNorms (and the position embedding);
a grid holds q x q weight blocks and 1/q of every vector (biases, LayerNorms, position embedding), replicated
over rows and depth. Vocabulary rows: 1/columns of each matrix in the tensor-parallel group, 1/(pp columns)
as vocabulary-parallel shards."""

from vp.channels import Communicators
from vp.config import RunConfig
from vp.cost.profiles import Hardware
from vp.cost.tensor import Split
from vp.schedule import Schedule


def layer_params(cfg: RunConfig) -> int:
    h, f = cfg.hidden, cfg.ffn
    return 4 * h * h + 2 * h * f + 9 * h + f  # qkv, out, fc1, fc2 (with biases) and two LayerNorms


def device_layer_params(cfg: RunConfig, split: Split) -> int:
    """One device's parameters of a layer (tp = 1: layer_params)."""
    h, f = cfg.hidden, cfg.ffn
    if split.mode.grid:
        return (4 * h * h + 2 * h * f) // split.q**2 + (9 * h + f) // split.q
    return (4 * h * h + 2 * h * f + 3 * h + f) // split.tp + 6 * h  # proj and fc2 biases, two LayerNorms whole


# A layer's saved activations per token (Korthikanti et al. 2022, flash attention, no sequence parallelism): 16 h
# elements of the compute type, 12 h of them split t ways in 1-D (q, k, v, the attention output, fc1's output and
# GeLU's) and 4 h whole (the two LayerNorm inputs, the qkv and fc1 inputs; t ways too with sequence parallelism:
# 34 s b h / t), and Megatron's two dropout masks of
# 1 byte per element (2 h bytes, whole in 1-D): 34 s b h bytes in bf16. vp.model has no dropout, so on its fp32 CPU
# runs the masks are 2 of 66 bytes the accounting does not see (3 %).
SPLIT_ELEMENTS, WHOLE_ELEMENTS, MASK_BYTES = 12, 4, 2


def _layer_bytes_per_token_h(split: Split, act_bytes: int) -> float:
    """Bytes per token and hidden unit one device saves of a layer without recomputation: 34 x share in bf16 (the
    figure the paper reproductions are pinned to, computed as before), plus the elements' extra bytes at a wider
    activation type."""
    return (WHOLE_ELEMENTS + SPLIT_ELEMENTS + MASK_BYTES / 2) * 2 * split.activation_share() + (act_bytes - 2) * \
        _elements(split)


def _elements(split: Split) -> float:
    """Elements per token and hidden unit one device saves of a layer (no masks)."""
    if split.mode.grid or split.sequence_parallel:
        return 16 / split.tp
    return WHOLE_ELEMENTS + SPLIT_ELEMENTS / split.tp


def layer_activation_bytes(cfg: RunConfig, hw: Hardware) -> float:
    """Saved activations of one layer for one microbatch on one device (above; with tensor parallelism the device's
    share: grid 1/tp, 1-D (10 + 24/t)/34 in bf16, 1-D with sequence parallelism 1/t: Split). Recomputation
    (vp.recompute): full keeps the layer's input alone (s b h elements, whole on a plain 1-D device, 1/tp of it on a
    grid or sequence parallel); selective keeps what none keeps here, since
    the 34 s b h already leaves out the attention core's s^2 probabilities (flash attention), which is what
    selective recomputation saves on a device without it."""
    split = Split.of(cfg)
    sbh = cfg.seq_len * cfg.micro_batch_size * cfg.hidden
    if cfg.recompute == "full":
        sharded = split.mode.grid or split.sequence_parallel
        return sbh * hw.act_bytes * (split.activation_share() if sharded else 1.0)
    return sbh * _layer_bytes_per_token_h(split, hw.act_bytes)


def edge_bytes(cfg: RunConfig, hw: Hardware, stage: int, local_vocab: bool) -> float:
    """Under full recomputation, what a stage's edges keep beside its layers' inputs, per microbatch on one device:
    the first stage's int64 token ids (with the input embedding local) and the last stage's final LayerNorm input
    with its fp32 mean and 1/std. (Without recomputation the 34 s b h per layer, to which the paper reproductions
    are pinned, leaves them out: 1 / (17 layers) of a stage in bf16.)"""
    if cfg.recompute != "full":
        return 0.0
    split = Split.of(cfg)
    n = cfg.micro_batch_size * cfg.seq_len // split.blocks
    vector = cfg.hidden // split.q if split.mode.grid else cfg.hidden
    out = 8.0 * n if stage == 0 and local_vocab else 0.0
    if stage == len(cfg.stage_layers) - 1:  # sequence parallel: this device's positions of it
        out += n // split.sequence_shards * (vector * hw.act_bytes + 8)
    return out


def stage_params(cfg: RunConfig, sched: Schedule) -> tuple[list[int], list[int]]:
    """(parameters one device holds of each global stage: its layers and, where the vocabulary is local, its part
    of the vocabulary layers; per pipeline rank, those of its vocabulary-parallel shards, else 0)."""
    v, h, split = cfg.padded_vocab_size, cfg.hidden, Split.of(cfg)
    vector = h // split.q if split.mode.grid else h  # the hidden columns of a vector parameter on one device
    per_layer = device_layer_params(cfg, split)
    per_stage = [n * per_layer for n in cfg.stage_layers]
    per_stage[0] += cfg.seq_len * vector
    per_stage[-1] += 2 * vector
    if not sched.vocab_parallel:
        per_stage[0] += split.vocab_rows(v) * h
        per_stage[-1] += split.vocab_rows(v) * h
    return per_stage, [2 * split.vocab_rows(v, cfg.pp) * h if sched.vocab_parallel else 0] * cfg.pp


def rank_params(cfg: RunConfig, sched: Schedule) -> list[int]:
    """Parameters held by one device of each pipeline rank: its layers, its vocabulary shard(s) or its part of
    the vocabulary layers."""
    per_stage, out = stage_params(cfg, sched)
    out = list(out)
    for rank, n in zip(sched.stage_ranks, per_stage):
        out[rank] += n
    return out


def static_bytes(cfg: RunConfig, hw: Hardware, sched: Schedule) -> list[float]:
    """Parameters, gradients and optimizer state per rank, plus the fixed overhead."""
    sharded = (hw.bytes_per_param - hw.act_bytes - GRAD_BYTES) * (1 - 1 / cfg.dp) if cfg.zero else 0.0
    return [n * (hw.bytes_per_param - sharded) + hw.overhead_bytes for n in rank_params(cfg, sched)]


GRAD_BYTES = 4  # fp32 gradients (the runs accumulate into fp32 .grad; Megatron's fp32 gradient buffer)


def static_breakdown(cfg: RunConfig, hw: Hardware, sched: Schedule) -> list[dict]:
    """Per pipeline rank, one device's bytes of `parameters` (the weights in the compute type: act_bytes each),
    `gradients` (fp32) and `optimizer_states` (the rest of bytes_per_param: fp32 master weights where the weights
    are not fp32, and AdamW's two moments), the last sharded over the dp group under zero 1 (the distributed
    optimizer, vp.runtime.data_parallel; its padding to a multiple of dp, under dp elements, is not counted)."""
    states = hw.bytes_per_param - hw.act_bytes - GRAD_BYTES
    share = 1 / cfg.dp if cfg.zero else 1.0
    return [{"parameters": n * hw.act_bytes, "gradients": n * GRAD_BYTES, "optimizer_states": n * states * share}
            for n in rank_params(cfg, sched)]


def comm_buffer_bytes(held: Communicators, hw: Hardware) -> float:
    """NCCL's buffers on one rank (the record's metrics.comm_buffer_bytes, real and simulated): memory the CUDA
    allocator does not see, so neither max_memory_allocated nor the activations count it."""
    return held.groups * hw.comm_bytes + held.links * hw.link_comm_bytes


def held_bytes(cfg: RunConfig, hw: Hardware, sched: Schedule) -> dict:
    """What F of each stage (and S) holds per microbatch until its B or W (or T) frees it, on one device: the
    output layer's fp32 softmax of its rows for its token block, and that block's whole-hidden input.

    Where W is split (V-Half), B frees ("B", stage) of it and W the rest: W computes each linear's weight gradient
    from the linear's saved input and the output gradient B made (the official WeightGradStore keeps exactly
    those two), so a transformer layer keeps as much as it saved (the linears' inputs, 7h of the 16h elements per
    token a layer saves, plus the 9h output gradients B adds) and is counted whole until W, while the last
    stage's output layer frees its fp32 softmax at B and keeps the logits' gradient (in the activation type, the
    output linear's output gradient) and its input until W. Under full recomputation F keeps each layer's input
    (and the stage's edges: edge_bytes) and a split B, which makes the layer's tensors again, leaves W what it
    needs, as many elements as the layer saves without recomputation (the masks aside): B frees a negative amount.
    """
    split = Split.of(cfg)
    n, h, v = cfg.micro_batch_size * cfg.seq_len // split.blocks, cfg.hidden, cfg.padded_vocab_size
    memory, per_layer, last = {}, layer_activation_bytes(cfg, hw), sched.n_stages - 1
    parallel = sched.vocab_parallel
    edges = {st: edge_bytes(cfg, hw, st, not parallel) for st in (0, last)}  # the others keep none
    kept = None  # under full recomputation with W split: what W needs of a layer, made again by B
    if sched.split_w and cfg.recompute == "full":
        kept = cfg.seq_len * cfg.micro_batch_size * cfg.hidden * _elements(split) * hw.act_bytes
    for st, layers in enumerate(cfg.stage_layers):
        held = layers * per_layer + edges.get(st, 0.0)
        if kept is not None:
            memory[("B", st)] = layers * (per_layer - kept)
        if not parallel and st == last:
            rows = split.vocab_rows(v)
            held += n * rows * 4 + n * h * hw.act_bytes  # fp32 softmax of its rows, the input
            if sched.split_w:  # B frees the softmax; W needs the logits' gradient (act_bytes) and the input
                memory[("B", st)] = memory.get(("B", st), 0.0) + n * rows * (4 - hw.act_bytes)
        memory[("F", st)] = held
    if parallel:
        memory[("S", None)] = n * split.vocab_rows(v, cfg.pp) * 4 + n * h * hw.act_bytes
    return memory
