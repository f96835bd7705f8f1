"""Passes timed as the runtime runs them, for a measured profile's layers and output tables (python -m
harness.calibrate --measure; vp.cost.passes.pass_factors turns them into factors on the composed model): a stage's
transformer layers with microbatches in flight, and the output layer's forward and backward parts per algorithm.
Timed with vp.cost.measure.Timer (a rank's thread's CPU time on CPU, CUDA events on a GPU); a tensor-parallel
stage's layers and vocabulary layers in a world of its group's processes (tp_passes: the tp_layers and tp_vocab
tables), on the wall clock and each rank's CPU time."""
import contextlib
import statistics
import time

import torch
import torch.distributed as dist

from vp.cost.measure import Timer
from vp.cost.measure_comm import in_world, or_exit
from vp.cost.tables import LAYER_PASSES, LAYERS_PER_ROW, VOCAB_PARTS

IN_FLIGHT = 4  # microbatches whose layer activations a layers row holds, as a pipeline stage holds several
LAYERS = LAYERS_PER_ROW  # transformer layers per timed pass of a layers row (the row is per layer)


def layers(shapes, device: torch.device, dtype: torch.dtype, timer: Timer, cycles: int = 12) -> list[list]:
    """[micro_batch, seq, hidden, heads, ffn, F, B, W, BW] per shape: seconds per transformer layer of each pass as
    the runtime runs a stage (vp.model.Block under the ActivationMeter's saved-tensor hooks, in the run's dtype):
    F the forward, B the split backward's input gradients (weight gradients deferred to a WeightGradStore), W their
    flush, BW the whole backward; IN_FLIGHT microbatches' activations held, each pass timed alone, the median of
    `cycles`. The shape-level tables compose a layer from its operations; a run pays more: every operation's
    autograd and Python cost, the saved-tensor hooks, the activations of several microbatches alive (on this
    project's 2-core CPU two of the smoke model's layers took 18.2-18.7 ms forward this way, 13.4 ms as composed,
    18-20 ms of CPU time in runs)."""
    from vp.model import Block
    from vp.runtime.memory import ActivationMeter

    cast = (torch.autocast("cuda", dtype=dtype) if device.type == "cuda" and dtype != torch.float32
            else contextlib.nullcontext())
    out = []
    for b, s, h, heads, ffn in shapes:
        blocks = [Block(h, heads, ffn, LAYERS, 0, i).to(device) for i in range(LAYERS)]
        meter = ActivationMeter([p for blk in blocks for p in blk.parameters()])
        times = {k: [] for k in LAYER_PASSES}
        stage_passes(blocks, meter, lambda: torch.randn(b, s, h, device=device).requires_grad_(),
                     timing(times, timer), cycles + IN_FLIGHT, cast)
        per_layer = {k: statistics.median(v) / LAYERS for k, v in times.items()}
        out.append([b, s, h, heads, ffn] + [per_layer[k] for k in LAYER_PASSES])
    return out


def empty_passes(device: torch.device, dtype: torch.dtype, timer: Timer, cycles: int = 12) -> list[list]:
    """[[F, B, W, BW]]: seconds of a stage pass over no transformer layer, run as `layers` runs a stage's (the
    activation meter's tracking, autograd's entry and exit, the WeightGradStore's flush): the part of a pass that
    does not grow with its layers, the profile's pass_overhead_s. What grows with them is the layers' operations,
    each at the profile's kernel_s beside its work (vp.cost.passes.LAYER_KERNELS)."""
    from vp.runtime.memory import ActivationMeter

    times = {k: [] for k in LAYER_PASSES}
    shape = (1, 8, 8)  # an input as small as a pass can be handed: what is left is the pass's own fixed cost
    stage_passes([], ActivationMeter([]), lambda: torch.randn(shape, device=device).requires_grad_(),
                 timing(times, timer), cycles + IN_FLIGHT)
    return [[statistics.median(times[k]) for k in LAYER_PASSES]]


def timing(times: dict[str, list], timer: Timer):
    """stage_passes' `timed`: a pass of a kind sampled by `timer` into times[kind]; a step of no kind just run."""
    def timed(kind, fn):
        if kind:
            times[kind].append(timer.sample(fn))
        else:
            fn()
    return timed


def stage_passes(blocks, meter, new_input, timed, steps: int, cast=contextlib.nullcontext()) -> None:
    """The passes of a stage of `blocks` as the runtime runs them, IN_FLIGHT microbatches' activations held: per
    microbatch (`steps`, inputs from new_input()) its forward, and once IN_FLIGHT are held the oldest one's
    backward; first with the weight gradients split off (B, then W: the WeightGradStore's flush), then whole (BW).
    timed(kind, fn) runs fn as pass `kind`: F, B, W, BW, or None for the forwards before IN_FLIGHT are held and
    those of the whole-backward round."""
    from vp.wgrad import WeightGradStore

    for split in (True, False):
        held = []
        for step in range(steps):
            x = new_input()
            store = WeightGradStore() if split else None
            box = {}

            def forward():
                y = x
                with meter.track(step), cast:
                    for blk in blocks:
                        y = blk(y, store)
                box["y"] = y

            timed("F" if split and step >= IN_FLIGHT else None, forward)
            held.append((box["y"], store, step))
            if len(held) <= IN_FLIGHT:
                continue
            y, old, key = held.pop(0)
            grad = torch.randn_like(y)
            timed("B" if split else "BW", lambda: torch.autograd.backward(y, grad))
            if split:
                timed("W", old.flush)
            meter.release(key)


OUTPUT_ALGORITHMS = ("local", "naive", "alg1", "alg2")  # an output row's algorithm: local = the whole layer, one rank


class _Alone:
    """The communicator of a rank with no peers, for timing the naive algorithm's passes without their
    collectives (the network model prices those): an all-reduce returns its input, a barrier waits for nothing."""

    def all_reduce(self, t, channel, op=None):
        return t

    def barrier(self, name):
        return contextlib.nullcontext()


def output_passes(shapes, device: torch.device, dtype: torch.dtype, timer: Timer, cycles: int = 6) -> list[list]:
    """[tokens, rows, hidden, algorithm, S, T] per shape: seconds of the output layer's forward part (S) and backward
    part (T) on `rows` vocabulary rows as the runtime runs them (vp.vocab.output, in the run's dtype): "local" the
    whole layer and its loss on one rank (LocalOutputLoss: S its forward, T its backward with grad W accumulated),
    "naive" its forward and backward with the collectives answering at once (_Alone), "alg1"/"alg2" the
    vocabulary-parallel s_pass and t_pass of that algorithm, two microbatches' states held between
    them as a schedule holds them; the median of `cycles`. Composed from the GEMM and elementwise tables, a pass
    misses what the run pays around them (the logits' fresh memory, the states held, the steps' own costs)."""
    from vp.schedule.methods import VOCAB
    from vp.vocab.output import Shard, local_loss, naive_backward, naive_forward, s_pass, t_pass

    cast = (torch.autocast("cuda", dtype=dtype) if device.type == "cuda" and dtype != torch.float32
            else contextlib.nullcontext())
    out = []
    for n, rows, h, algo in shapes:
        index = OUTPUT_ALGORITHMS.index(algo)
        shard = Shard.of(0, 1 if index == 0 else 2, rows if index == 0 else 2 * rows, rows if index == 0 else 2 * rows)
        weight = torch.nn.Parameter(torch.randn(rows, h, device=device) * 0.02)
        weight.grad = torch.zeros_like(weight)
        targets = torch.randint(0, shard.count * rows, (n,), device=device)
        weights = torch.full((n,), 1.0 / n, device=device)
        forward, backward, held = [], [], []
        for _ in range(cycles + 2):
            x = torch.randn(n, h, device=device, requires_grad=index == 0)
            box = {}
            if index == 0:
                def s_step():
                    with cast:
                        box["out"] = local_loss(shard, weight, x, targets, weights)

                def t_step(state):
                    state.backward()
            elif algo == "naive":  # its collectives answer at once (_Alone)
                def s_step():
                    with cast:
                        box["out"] = naive_forward(shard, weight.data, x, targets, weights, _Alone())

                def t_step(state):
                    with cast:
                        naive_backward(shard, weight, state, _Alone())
            else:
                def s_step():
                    with cast:
                        box["out"] = s_pass(shard, weight.data, x, targets, weights, VOCAB[algo])
                    box["out"].alpha = torch.ones(n, device=device)  # what C1 sets

                def t_step(state):
                    with cast:
                        t_pass(shard, weight, state, VOCAB[algo])
            forward.append(timer.sample(s_step))
            held.append(box["out"])
            if len(held) > 2:
                state = held.pop(0)
                backward.append(timer.sample(lambda: t_step(state)))
        out.append([n, rows, h, algo, statistics.median(forward[2:]), statistics.median(backward)])
    return out


TP_CYCLES = 8  # timed passes of each kind per tensor-parallel layer shape


def tp_passes(layer_shapes, vocab_shapes=(), threads: int = 1, cycles: int = TP_CYCLES,
              timeout_s: float = 600.0) -> tuple[list[list], list[list]]:
    """A tensor-parallel stage's passes as the runtime runs them (vp.tp's modules over vp.comm's channels, gloo,
    in fp32 on CPU processes), in a world of tp processes at work together, one world per tp for both tables:

    tp_layers  [mode, tp, depth, micro_batch, seq, hidden, heads, ffn, then F, B, W, BW on the wall clock, then
               F, B, W, BW in CPU time] per layer shape: seconds per transformer layer of each pass;
    tp_vocab   [mode, tp, depth, micro_batch, seq, hidden, padded vocabulary, then IF, IB, S, T on the wall clock,
               then in CPU time] per vocabulary shape: the vocabulary layers a stage holds without vocabulary
               parallelism, as the cost model names their parts: IF the input embedding's forward (with the
               position embedding), IB its backward, S the final LayerNorm and the output layer's forward with the
               cross-entropy, T their backward (the weight gradient included).

    The wall clock runs from a common start to the slowest rank's end (the mean over `cycles`: a run pays every
    wait for a peer or a core), the CPU time is a rank's thread's in the pass (the median over cycles of the
    ranks' mean), so that the cost model can tell a pass's own work from what its collectives and its peers add
    (vp.cost.passes.pass_factors). CPU only: a GPU group needs a device per rank."""
    layer_rows, vocab_rows = [], []
    for world in sorted({int(shape[1]) for shape in [*layer_shapes, *vocab_shapes]}):
        mine = ([tuple(shape) for shape in layer_shapes if int(shape[1]) == world],
                [tuple(shape) for shape in vocab_shapes if int(shape[1]) == world])
        layers_here, vocab_here = in_world(world, _tp_rank, (threads, *mine, cycles), timeout_s,
                                           "tensor-parallel layer")
        layer_rows += layers_here
        vocab_rows += vocab_here
    return layer_rows, vocab_rows


def _tp_rank(rank: int, world: int, init: str, threads: int, layer_shapes, vocab_shapes, cycles: int,
             queue) -> None:
    torch.set_num_threads(threads)
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    rows = or_exit(lambda: ([list(shape) + _tp_layer(rank, world, *shape, cycles) for shape in layer_shapes],
                            [list(shape) + _tp_vocab(rank, world, *shape, cycles) for shape in vocab_shapes]))
    if rank == 0:
        queue.put(rows)
    dist.barrier()
    dist.destroy_process_group()


def _tp_context(rank: int, mode: str, tp: int, depth: int):
    """(this rank's TensorParallel, its Comm) in a group of the whole world."""
    from vp.channels import tp_slices
    from vp.comm import Comm, make_groups
    from vp.mesh import Mesh
    from vp.tp.context import TensorParallel

    mesh = Mesh(tp=int(tp), tp_mode=mode, tp_depth=int(depth))
    comm = Comm(make_groups(tp_slices(mesh), rank), torch.device("cpu"))
    return TensorParallel.of(mesh, rank, comm), comm


def _block_shape(ctx, b: int, s: int, h: int) -> tuple[int, int, int]:
    """A device's activation block of a micro-batch between layers, in vp.tp.stage's layout."""
    return max(1, b // ctx.batch_blocks), s, h // ctx.q if ctx.mode.grid else h


def _timer(kinds):
    """(samples {kind: [(wall, cpu)]}, timed(kind, fn) -> fn's result): each pass from a common start (a barrier),
    so that its wall time is its slowest rank's; kind None runs fn untimed."""
    samples = {k: [] for k in kinds}

    def timed(kind: str | None, fn):
        dist.barrier()
        t0, c0 = time.perf_counter(), time.thread_time()
        out = fn()
        if kind:
            samples[kind].append((time.perf_counter() - t0, time.thread_time() - c0))
        return out

    return samples, timed


def _reduced(samples: dict, world: int, cycles: int, per: int) -> list[float]:
    """[wall per kind, then CPU per kind] over the last `cycles` samples, each over `per` (layers): the wall the
    slowest rank's mean, the CPU time the median over cycles of the ranks' mean (collectives over the world)."""
    walls = torch.tensor([[w for w, _ in v[-cycles:]] for v in samples.values()], dtype=torch.float64)
    cpus = torch.tensor([[c for _, c in v[-cycles:]] for v in samples.values()], dtype=torch.float64)
    dist.all_reduce(walls, op=dist.ReduceOp.MAX)
    dist.all_reduce(cpus)
    return [float(v) / per for v in walls.mean(dim=1)] + [float(v) / per / world for v in cpus.median(dim=1).values]


def _tp_layer(rank: int, world: int, mode: str, tp: int, depth: int, b: int, s: int, h: int, heads: int, ffn: int,
              cycles: int) -> list[float]:
    from vp.model import Block
    from vp.runtime.memory import ActivationMeter
    from vp.tp.block import shard_block

    ctx, comm = _tp_context(rank, mode, tp, depth)
    blocks = [shard_block(Block(h, heads, ffn, LAYERS, 0, i), ctx) for i in range(LAYERS)]
    meter = ActivationMeter([p for blk in blocks for p in blk.parameters()])
    x_shape = _block_shape(ctx, b, s, h)
    samples, timed = _timer(LAYER_PASSES)
    stage_passes(blocks, meter, lambda: torch.randn(x_shape).requires_grad_(), timed,
                 cycles + IN_FLIGHT + 1)  # one cycle more: the first backward warms up (its samples are dropped)
    comm.close()
    return _reduced(samples, world, cycles, LAYERS)


def _tp_vocab(rank: int, world: int, mode: str, tp: int, depth: int, b: int, s: int, h: int, vocab: int,
              cycles: int) -> list[float]:
    """A stage's vocabulary layers on this rank's shard as vp.tp.stage runs them (TensorParallelStage: the
    embedding and position of the first stage, the final LayerNorm and VocabOutput of the last), every row of the
    padded vocabulary a real one (a run masks its padding rows' logits: one elementwise step left out)."""
    from vp.tp.layout import token_rows
    from vp.tp.norm import GridLayerNorm
    from vp.tp.stage import Position
    from vp.tp.vocab import VocabEmbedding, VocabOutput
    from vp.vocab.output import Shard

    ctx, comm = _tp_context(rank, mode, tp, depth)
    shard = Shard.of(ctx.c, ctx.columns, vocab, vocab)
    embed = VocabEmbedding(torch.randn(shard.rows, h) * 0.02, shard, ctx)
    head = VocabOutput(torch.randn(shard.rows, h) * 0.02, shard, ctx)
    norm = GridLayerNorm(torch.nn.LayerNorm(h), ctx) if ctx.mode.grid else torch.nn.LayerNorm(h)
    pos = Position(torch.randn(s, h) * 0.02, ctx)
    local = lambda t: token_rows(t, ctx.batch_blocks, ctx.token_block)  # noqa: E731 - this device's sequences
    ids, targets = torch.randint(0, vocab, (b, s)), torch.randint(0, vocab, (b, s))
    weights = torch.full((b, s), 1.0 / (b * s))
    x_shape = _block_shape(ctx, b, s, h)
    samples, timed = _timer(VOCAB_PARTS)
    for cycle in range(cycles + 1):  # the first cycle warms up (its samples are dropped)
        e = timed("IF", lambda: embed(local(ids)) + pos.weight[:s])
        timed("IB", lambda: e.backward(torch.randn_like(e)))
        x = torch.randn(x_shape, requires_grad=True)
        loss = timed("S", lambda: head(norm(x), local(targets), local(weights)))
        timed("T", loss.backward)
    comm.close()
    return _reduced(samples, world, cycles, 1)
