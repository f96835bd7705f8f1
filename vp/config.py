"""The run configuration, vocabulary padding and layer placement, with the checks that refuse bad input.

Every user error is a ValueError that names the field and says how to fix it; nothing here touches torch.
"""
import math
from dataclasses import asdict, dataclass, fields, replace
from functools import cached_property

from vp.mesh import Mesh, check_mesh
from vp.schedule.methods import Method, chunks_for, get_method
from vp.tp.modes import check_sizes, get_mode, near

DEVICES = ("cpu", "cuda")
NCCL_FORMS = ("lazy", "queue", "p2p", "both", "all")  # vp.nccl.FORMS (this module stays free of torch)
DTYPES = ("fp32", "bf16", "fp16")


@dataclass(frozen=True)
class RunConfig:
    method: str = "vocab-2"
    pp: int = 2
    dp: int = 1  # data-parallel replicas; each runs `microbatches` of one global batch of dp x microbatches
    tp: int = 1  # tensor-parallel devices per pipeline stage (vp.tp); world = dp x pp x tp
    tp_mode: str = "1d"  # 1d (Megatron) | 2d (SUMMA [q, q, 1]) | 2.5d (SUMMA [q, q, tp_depth])
    tp_depth: int = 1  # 2.5d only: d of the [q, q, d] grid, tp = q * q * d
    chunks: int | None = None  # model chunks per rank; only interleaved takes a value (default 2)
    layers: int = 4
    hidden: int = 64
    heads: int = 4
    ffn_hidden: int | None = None  # default 4 * hidden
    seq_len: int = 32
    vocab_size: int = 1000
    pad_multiple: int | None = None  # default: the number of vocabulary shards
    microbatches: int = 4
    micro_batch_size: int = 1
    iterations: int = 3
    warmup: int = 1
    seed: int = 1234
    device: str = "cpu"
    dtype: str = "fp32"
    redis_last_layers: int | None = None  # redis only: layers on the last stage (official --final-stage-num-layers);
    #                                       None = the official default, 0
    lr: float = 1e-3
    timeout_s: float = 300.0
    emulate_nccl: str | None = None  # CPU runs: keep NCCL's rules on gloo, lazy | queue | p2p | both | all (vp.nccl)
    zero: int = 0  # 1: the distributed optimizer (Adam states and master shard per dp rank; vp.runtime.data_parallel)
    overlap_grad_reduce: bool = False  # dp reduction of each bucket launched in the last backward, on its own stream
    bucket_mb: float = 25.0  # MiB of fp32 gradients per dp reduction bucket
    recompute: str = "none"  # activation recomputation: none | selective (attention core) | full (vp.recompute)
    sequence_parallel: bool = False  # 1-D tp: LayerNorms and the residual stream split over tp along the sequence

    @property
    def ffn(self) -> int:
        return self.ffn_hidden or 4 * self.hidden

    @property
    def world(self) -> int:
        """Processes (devices) of the run: dp x pp x tp."""
        return self.dp * self.pp * self.tp

    @property
    def spec(self) -> Method:
        return get_method(self.method)

    @property
    def n_chunks(self) -> int:
        return chunks_for(self.spec, self.chunks)

    @cached_property  # built once per config (the cost model asks for it per collective)
    def mesh(self) -> Mesh:
        return Mesh(dp=self.dp, pp=self.pp, tp=self.tp, tp_mode=self.tp_mode, tp_depth=self.tp_depth)

    @property
    def vocab_shards(self) -> int:
        """Pipeline ranks (vocabulary parallelism) x tensor-parallel columns (grid columns; 1-D: tp)."""
        columns = get_mode(self.tp_mode).side(self.tp, self.tp_depth)
        return (self.pp if self.spec.vocab_parallel else 1) * columns

    @cached_property  # a frozen config: computed once (the cost model asks for it per pass and per stage)
    def padded_vocab_size(self) -> int:
        return padded_vocab_size(self.vocab_size, self.pad_multiple, self.vocab_shards)

    @property
    def stage_layers(self) -> list[int]:
        return list(self._stage_layers)  # a copy: the caller may change it

    @cached_property
    def _stage_layers(self) -> tuple[int, ...]:
        return tuple(stage_layers(self))

    def to_dict(self) -> dict:
        d = asdict(self)
        d.update(ffn_hidden=self.ffn, chunks=self.n_chunks, padded_vocab_size=self.padded_vocab_size,
                 pad_multiple=self.pad_multiple or self.vocab_shards, stage_layers=self.stage_layers)
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "RunConfig":
        names = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - names - {"padded_vocab_size", "stage_layers"})
        if unknown:
            raise ValueError(f"unknown run config field(s) {unknown}; known fields: {sorted(names)}")
        return cls(**{k: v for k, v in d.items() if k in names})

    def with_(self, **changes) -> "RunConfig":
        return replace(self, **changes)


def padded_vocab_size(vocab_size: int, pad_multiple: int | None, shards: int) -> int:
    """The vocabulary rounded up to `pad_multiple`, which must split evenly over `shards`."""
    if vocab_size < shards:
        raise ValueError(f"vocab_size={vocab_size} is smaller than the {shards} vocabulary shards; "
                         f"use vocab_size >= {shards} or fewer pipeline ranks")
    multiple = shards if pad_multiple is None else pad_multiple
    if multiple < 1:
        raise ValueError(f"pad_multiple={multiple} must be a positive integer (for example {shards})")
    if multiple % shards:
        below = (multiple // shards) * shards
        above = below + shards
        near = f"{below} or {above}" if below else f"{above}"
        raise ValueError(f"pad_multiple={multiple} is not divisible by the {shards} vocabulary shards; "
                         f"use a multiple of {shards}: the nearest are {near}, "
                         f"and {math.lcm(multiple, shards)} keeps your alignment to {multiple}")
    return -(-vocab_size // multiple) * multiple


def stage_layers(cfg: RunConfig) -> list[int]:
    """Transformer layers of each global stage (pp * chunks of them), checked against the method."""
    spec, pp, layers = cfg.spec, cfg.pp, cfg.layers
    stages = pp * cfg.n_chunks
    if spec.redistributes_layers:
        return redis_layers(layers, pp, cfg.redis_last_layers or 0)
    if cfg.redis_last_layers is not None:
        raise ValueError(f"redis_last_layers={cfg.redis_last_layers} only applies to method=redis; "
                         f"drop it for method={spec.name}")
    if layers % stages:
        lo = max(stages, (layers // stages) * stages)
        raise ValueError(f"layers={layers} cannot be split evenly over the {stages} stages of method={spec.name} "
                         f"with pp={pp}" + (f" and chunks={cfg.n_chunks}" if cfg.n_chunks > 1 else "")
                         + f"; use a multiple of {stages} such as {lo} or {lo + stages}, or change pp")
    return [layers // stages] * stages


def redis_layers(layers: int, pp: int, last: int) -> list[int]:
    """Layer redistribution as the official code places layers (sail-sg/VocabularyParallelism,
    transformer_block.py::get_num_layers_to_build, --final-stage-num-layers N): N layers on the last stage, the
    rest split over stages 0..p-2 with the remainders on the later ones (p-2, p-3, ...), so that stage 0, which
    holds the input layer, never gains one."""
    if not isinstance(last, int) or not 0 <= last <= layers - (pp - 1):
        fix = (f"use 0..{layers - (pp - 1)}" if layers >= pp - 1 else
               f"use pp <= {layers + 1}, or a model with at least {pp - 1} layers")
        raise ValueError(f"redis_last_layers={last} leaves fewer than one layer for each of the other "
                         f"{pp - 1} stages of layers={layers}; {fix}")
    base, extra = divmod(layers - last, pp - 1)
    return [base + (1 if s >= pp - 1 - extra else 0) for s in range(pp - 1)] + [last]


def check_config(cfg: RunConfig) -> RunConfig:
    """Refuse a run that cannot work, naming the field and the fix; returns cfg unchanged."""
    spec = get_method(cfg.method)
    for name in ("pp", "dp", "layers", "hidden", "heads", "seq_len", "vocab_size", "microbatches",
                 "micro_batch_size", "iterations"):
        value = getattr(cfg, name)
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"{name}={value!r} must be a positive integer")
    if cfg.ffn_hidden is not None and (not isinstance(cfg.ffn_hidden, int) or cfg.ffn_hidden < 1):
        raise ValueError(f"ffn_hidden={cfg.ffn_hidden!r} must be a positive integer (default 4 * hidden)")
    one_stage = not spec.vocab_parallel and not spec.redistributes_layers and spec.family.chunks == 1
    if cfg.pp < 2 and not one_stage:
        raise ValueError(f"pp={cfg.pp}: method={spec.name} is a pipeline method and needs pp >= 2 "
                         f"(pp=1 runs one stage with method=baseline)")
    check_tensor_parallel(cfg, spec)
    check_sequence_parallel(cfg)
    if not isinstance(cfg.warmup, int) or not 0 <= cfg.warmup < cfg.iterations:
        raise ValueError(f"warmup={cfg.warmup!r} must be 0..iterations-1 = {cfg.iterations - 1} "
                         f"so that at least one iteration is measured")
    if cfg.hidden % cfg.heads:
        raise ValueError(f"hidden={cfg.hidden} is not divisible by heads={cfg.heads}; "
                         f"pick heads that divide hidden")
    if cfg.device not in DEVICES:
        raise ValueError(f"device={cfg.device!r} is unknown; use one of {', '.join(DEVICES)}")
    if cfg.dtype not in DTYPES:
        raise ValueError(f"dtype={cfg.dtype!r} is unknown; use one of {', '.join(DTYPES)}")
    if cfg.device == "cpu" and cfg.dtype != "fp32":
        raise ValueError(f"dtype={cfg.dtype} needs device=cuda; CPU runs use dtype=fp32")
    if not _finite_positive(cfg.lr):
        raise ValueError(f"lr={cfg.lr} must be a positive finite number (the default is 1e-3)")
    if not _finite_positive(cfg.timeout_s):
        raise ValueError(f"timeout_s={cfg.timeout_s} must be a positive finite number of seconds")
    if cfg.emulate_nccl is not None:
        if cfg.emulate_nccl not in NCCL_FORMS:
            raise ValueError(f"emulate_nccl={cfg.emulate_nccl!r} is unknown; use one of {', '.join(NCCL_FORMS)} "
                             f"(or leave it unset)")
        if cfg.device != "cpu":
            raise ValueError(f"emulate_nccl={cfg.emulate_nccl} emulates NCCL on CPU (gloo); device={cfg.device} "
                             f"runs NCCL itself: drop emulate_nccl")
    check_data_parallel(cfg)
    check_recompute(cfg)
    chunks = chunks_for(spec, cfg.chunks)
    padded_vocab_size(cfg.vocab_size, cfg.pad_multiple, cfg.vocab_shards)
    stage_layers(cfg)
    if cfg.microbatches < cfg.pp:
        raise ValueError(f"microbatches={cfg.microbatches} is fewer than pp={cfg.pp}: the pipeline never "
                         f"fills; use microbatches >= {cfg.pp}")
    if spec.family.microbatches_multiple_of_pp and cfg.microbatches % cfg.pp:
        up = -(-cfg.microbatches // cfg.pp) * cfg.pp
        raise ValueError(f"microbatches={cfg.microbatches}: {spec.family.name} 1F1B (method={spec.name}, "
                         f"chunks={chunks}) needs a multiple of pp={cfg.pp}; use {up}")
    return cfg


def _finite_positive(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value > 0


def check_tensor_parallel(cfg: RunConfig, spec: Method) -> None:
    """The tensor-parallel fields: a buildable grid, sizes it splits evenly, a layout that exists."""
    check_mesh(cfg.dp, cfg.pp, cfg.tp, cfg.tp_mode, cfg.tp_depth)
    if cfg.tp == 1:
        if cfg.tp_mode != "1d":
            raise ValueError(f"tp_mode={cfg.tp_mode} needs tensor parallelism, but tp=1; set tp (e.g. tp=4 for a "
                             f"[2, 2, 1] grid) or drop tp_mode")
        return
    check_sizes(get_mode(cfg.tp_mode), cfg.tp, cfg.tp_depth, cfg.hidden, cfg.heads, cfg.ffn, cfg.micro_batch_size)


def check_sequence_parallel(cfg: RunConfig) -> None:
    """Sequence parallelism (vp.tp.sequence) shards Megatron's 1-D layout along the sequence: it needs 1-D tp over
    two or more devices and a sequence that splits evenly over them."""
    sp = cfg.sequence_parallel
    if not isinstance(sp, bool):
        raise ValueError(f"sequence_parallel={sp!r} must be true or false")
    if not sp:
        return
    if cfg.tp < 2:
        raise ValueError(f"sequence_parallel splits the sequence over the tensor-parallel devices, but tp={cfg.tp}; "
                         f"set tp >= 2 with tp_mode=1d or drop sequence_parallel")
    if get_mode(cfg.tp_mode).grid:
        raise ValueError(f"sequence_parallel applies to 1-D tensor parallelism only, but tp_mode={cfg.tp_mode} (a grid "
                         f"already splits every activation over its devices); use tp_mode=1d or drop "
                         f"sequence_parallel")
    if cfg.seq_len % cfg.tp:
        raise ValueError(f"seq_len={cfg.seq_len} is not divisible by tp={cfg.tp} (sequence_parallel gives each device "
                         f"seq_len / tp positions); use a multiple of {cfg.tp} such as {near(cfg.seq_len, cfg.tp)}, "
                         f"or drop sequence_parallel")


ZERO_STAGES = (0, 1)
RECOMPUTE = ("none", "selective", "full")  # vp.recompute.MODES (this module stays free of torch)


def check_recompute(cfg: RunConfig) -> None:
    if cfg.recompute not in RECOMPUTE:
        raise ValueError(f"recompute={cfg.recompute!r} is unknown; use one of {', '.join(RECOMPUTE)} (selective: "
                         f"the attention core, full: each transformer layer)")


def check_knobs(cfg: RunConfig) -> None:
    """The checks of check_config that read the production features' fields (sequence_parallel, zero,
    overlap_grad_reduce, bucket_mb, recompute): check_config reads them nowhere else, so runs that differ in those
    fields alone and pass these get one verdict from check_config (the planner checks a configuration once for its
    knob variants: vp.plan.space)."""
    check_sequence_parallel(cfg)
    check_data_parallel(cfg)
    check_recompute(cfg)


def check_data_parallel(cfg: RunConfig) -> None:
    """The data-parallel knobs (vp.runtime.data_parallel): each needs replicas to act on."""
    if cfg.zero == 2 and not isinstance(cfg.zero, bool):
        raise ValueError("zero=2 (sharded gradients) is not built: every parameter's gradient accumulates over the "
                         "microbatches until the last backward, so the whole fp32 gradient buffer is held at the "
                         "peak whatever is freed after the reduce-scatter (docs/design.md); use zero=1, the "
                         "distributed optimizer (Megatron's is ZeRO-1 too)")
    if cfg.zero not in ZERO_STAGES or isinstance(cfg.zero, bool):
        raise ValueError(f"zero={cfg.zero!r} is unknown; use 0 (replicated optimizer) or 1 (distributed optimizer: "
                         f"Adam states and fp32 master weights sharded over the dp group)")
    if cfg.zero and cfg.dp < 2:
        raise ValueError(f"zero={cfg.zero} shards the optimizer over data-parallel replicas, but dp={cfg.dp}; "
                         f"set dp >= 2 or drop zero")
    if not isinstance(cfg.overlap_grad_reduce, bool):
        raise ValueError(f"overlap_grad_reduce={cfg.overlap_grad_reduce!r} must be true or false")
    if cfg.overlap_grad_reduce and cfg.dp < 2:
        raise ValueError(f"overlap_grad_reduce overlaps the data-parallel gradient reduction, but dp={cfg.dp}; "
                         f"set dp >= 2 or drop overlap_grad_reduce")
    if isinstance(cfg.bucket_mb, bool) or not isinstance(cfg.bucket_mb, (int, float)) or not cfg.bucket_mb > 0:
        raise ValueError(f"bucket_mb={cfg.bucket_mb!r} must be a positive number of MiB (default 25)")
    if cfg.bucket_mb != RunConfig.bucket_mb and cfg.dp < 2:
        raise ValueError(f"bucket_mb={cfg.bucket_mb} sizes the data-parallel reduction's buckets, but dp={cfg.dp}; "
                         f"set dp >= 2 or drop bucket_mb")
