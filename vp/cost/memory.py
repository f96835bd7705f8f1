"""Memory per rank: parameters, gradients and optimizer state (bytes_per_param per parameter, plus a fixed
overhead), and the activations a pass holds until the pass that frees it."""
from vp.config import RunConfig
from vp.cost.profiles import Hardware
from vp.schedule import Schedule


def layer_params(cfg: RunConfig) -> int:
    h, f = cfg.hidden, cfg.ffn
    return 4 * h * h + 2 * h * f + 9 * h + f  # qkv, out, fc1, fc2 (with biases) and two LayerNorms


def layer_activation_bytes(cfg: RunConfig, hw: Hardware) -> float:
    """Saved activations of one layer for one microbatch: 34 s b h bytes at 2 bytes/element (Korthikanti
    et al., no recomputation, with flash attention so no s^2 term), scaled to the profile's element size."""
    return 34 * cfg.seq_len * cfg.micro_batch_size * cfg.hidden * hw.act_bytes / 2


def rank_params(cfg: RunConfig, sched: Schedule) -> list[int]:
    """Parameters held by each rank: its layers, its vocabulary shard(s) or whole vocabulary layers."""
    v, h = cfg.padded_vocab_size, cfg.hidden
    per_stage = [n * layer_params(cfg) for n in cfg.stage_layers]
    per_stage[0] += cfg.seq_len * h
    per_stage[-1] += 2 * h
    if not sched.vocab_parallel:
        per_stage[0] += v * h
        per_stage[-1] += v * h
    out = [2 * (v // cfg.pp) * h if sched.vocab_parallel else 0 for _ in range(cfg.pp)]
    for st, n in enumerate(per_stage):
        out[sched.where(st)[0]] += n
    return out


def static_bytes(cfg: RunConfig, hw: Hardware, sched: Schedule) -> list[float]:
    """Parameters, gradients and optimizer state per rank, plus the fixed overhead."""
    return [n * hw.bytes_per_param + hw.overhead_bytes for n in rank_params(cfg, sched)]


def held_bytes(cfg: RunConfig, hw: Hardware, sched: Schedule) -> dict:
    """What F of each stage (and S) holds per microbatch until its B or W (or T) frees it."""
    n, h, v = cfg.micro_batch_size * cfg.seq_len, cfg.hidden, cfg.padded_vocab_size
    memory = {}
    for st, layers in enumerate(cfg.stage_layers):
        held = layers * layer_activation_bytes(cfg, hw)
        if not sched.vocab_parallel and st == sched.n_stages - 1:
            held += n * v * 4 + n * h * hw.act_bytes  # fp32 softmax of the whole vocabulary and the layer input
        memory[("F", st)] = held
    if sched.vocab_parallel:
        memory[("S", None)] = n * (v // cfg.pp) * 4 + n * h * hw.act_bytes
    return memory
