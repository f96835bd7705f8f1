"""Measured tables of a hardware profile (vp.cost.measure, written by python -m harness.calibrate --measure), read
by the cost model where they cover a question; None elsewhere, and the analytical model answers instead:
  gemm         interpolated in log-shape space: the achieved FLOP/s of the nearest measured shapes, weighted by
               inverse squared distance in log2(m), log2(n), log2(k); None beyond MAX_LOG2_DISTANCE of any; a
               GEMM that accumulates into its output (a weight gradient) from gemm_accumulate, timed in place, where
               that table is near enough, else from gemm;
  attention    per (seq, head dim) measured, linear in batch x heads between measured points, proportional
               beyond the largest, the smallest's time below it (a floor of fixed costs);
  elementwise  per tensor size: bytes moved per second of an in-place operation, log-log linear between measured
               sizes, and seconds per byte of a fresh output (out of place less in place: on a CPU, page faults
               above the allocator's reuse limit), linear in log size; the nearest measured size's beyond them;
  activation   per tensor size: seconds of GeLU forward and backward, log-log linear between measured sizes,
               proportional to the elements beyond them;
  optimizer    seconds per parameter of one step over a single tensor per tensor size, log-log linear between
               measured sizes, the nearest's beyond them; None without such rows; a rank's whole parameter set
               where optimizer_sets measured that set (exact match of its parameters and large tensors);
  layers       per transformer layer shape (layer_key): seconds per layer of F, B, W and a whole backward as the
               runtime runs a stage; vp.cost.passes.pass_factors turns each into a factor on the composed time;
  output       per (tokens, vocabulary rows, hidden, algorithm) the seconds of the output layer's forward (S) and
               backward (T) parts as the runtime runs them (local: the whole layer on one rank; naive, alg1, alg2),
               likewise factors (pass_factors);
  tp_layers    per tensor-parallel layer (tp_layer_key): seconds per layer of F, B, W and a whole backward on the
               wall clock and in a rank's CPU time, its group's processes at work together (measure_passes.tp_passes);
               pass_factors turns them into a factor on the composed work and one on the layers' collectives;
  tp_vocab     per tensor-parallel stage's vocabulary layers (tp_vocab_key): seconds of IF, IB (the input embedding)
               and S, T (final LayerNorm, output layer and loss) as a stage without vocabulary parallelism runs
               them, wall clock and CPU time likewise; pass_factors turns them into factors on the composed parts
               and one on the rest of a stage's collectives (vp.cost.tensor.pass_comm_s);
  collectives  per (op, group size, world) measured, log-log linear in payload bytes; the smallest's time below
               the smallest payload (latency); beyond the largest, a latency and a bandwidth through the two largest
               (the analytical network, whose point-to-point link answers a whole ring, was 2-8x too fast there).
               `world` is how many of the node's processes were at work at once (world / n groups side by side):
               a question about a run with `busy` ranks on the node reads the smallest world measured at or
               above max(busy, n), else the largest. On 2 CPU cores an all-reduce of 256 B between two
               processes took 1.4 ms with 2 processes at work and 4.6 ms with 8 (four pairs at once); rows
               without a world (older profiles) were measured with their group alone (world = n). On a CPU a
               row also holds the CPU seconds the collective cost each member's process where the runtime runs it,
               on a CommStream beside the passes (collective_cpu_s, read the same way): what a collective run off
               the compute path takes from a run's passes (vp.cost.costs.comm_cpu_times).
"""
import math
from dataclasses import dataclass, field

import numpy as np

MAX_LOG2_DISTANCE = 1.5  # a GEMM further than this (a factor of 2.8 in one dimension) from every measured one
NEAREST = 4


@dataclass(frozen=True, eq=False)
class Tables:
    gemm: np.ndarray = field(default_factory=lambda: np.zeros((0, 4)))  # log2 m, log2 n, log2 k, FLOP/s
    gemm_accumulate: np.ndarray = field(default_factory=lambda: np.zeros((0, 4)))  # the same, C += A B in place
    attention: dict = field(default_factory=dict)  # (seq, head_dim) -> (bh[], forward s[], backward s[])
    collectives: dict = field(default_factory=dict)  # (op, n) -> {world: (bytes[], seconds[])}
    elementwise: np.ndarray = field(default_factory=lambda: np.zeros((0, 3)))  # log2 size, log2 bytes/s, s per fresh byte
    optimizer: np.ndarray = field(default_factory=lambda: np.zeros((0, 2)))  # log2 tensor elements, log2 s/param
    activation: np.ndarray = field(default_factory=lambda: np.zeros((0, 3)))  # log2 elements, log2 s fwd, log2 s bwd
    optimizer_sets: dict = field(default_factory=dict)  # (parameters, large tensors' elements sorted) -> seconds
    layers: dict = field(default_factory=dict)  # layer_key -> {F, B, W, BW: seconds per layer as a stage runs it}
    output: dict = field(default_factory=dict)  # (tokens, rows, hidden, algorithm) -> (S seconds, T seconds)
    # tp_layer_key -> {"wall": {F, B, W, BW: seconds}, "cpu": {...}} per layer as a tensor-parallel stage runs it
    tp_layers: dict = field(default_factory=dict)
    # tp_vocab_key -> {"wall": {IF, IB, S, T: seconds}, "cpu": {...}} of a tensor-parallel stage's vocabulary layers
    tp_vocab: dict = field(default_factory=dict)
    collectives_cpu: dict = field(default_factory=dict)  # as collectives, CPU seconds per member (CPU profiles)

    @classmethod
    def of(cls, measured: dict | None) -> "Tables":
        measured = {k: rows(v) for k, v in (measured or {}).items()}
        gemm, gemm_accumulate = (np.array([[math.log2(m), math.log2(n), math.log2(k), 2.0 * m * n * k / s]
                                           for m, n, k, s in measured.get(key) or [] if s > 0]).reshape(-1, 4)
                                 for key in ("gemm", "gemm_accumulate"))
        attention = {}
        for bh, s, d, fwd, bwd in sorted(measured.get("attention") or []):
            attention.setdefault((int(s), int(d)), []).append((bh, fwd, bwd))
        collectives, collectives_cpu = {}, {}  # a row: op, n, bytes, seconds[, world[, CPU seconds]]
        for r in sorted(measured.get("collectives") or [], key=lambda r: (r[0], r[1], r[4:5], r[2])):
            op, n, nbytes, seconds = r[:4]
            world = int(r[4]) if len(r) > 4 else int(n)
            collectives.setdefault((op, int(n)), {}).setdefault(world, []).append((nbytes, seconds))
            if len(r) > 5:
                collectives_cpu.setdefault((op, int(n)), {}).setdefault(world, []).append((nbytes, float(r[5])))
        # [bytes moved, seconds in place, seconds out of place] of x + y: three tensors of moved / 3 bytes each
        elementwise = np.array(sorted([math.log2(r[0] / 3), math.log2(r[0] / r[1]),
                                       max(0.0, r[2] - r[1]) / (r[0] / 3) if len(r) > 2 else 0.0]
                                      for r in measured.get("elementwise") or [] if r[0] > 0 and r[1] > 0))
        # [elements per tensor, tensors, seconds] rows (a bare [parameters, seconds] pair predates them)
        step = [r for r in measured.get("optimizer") or [] if isinstance(r, list)]
        optimizer = np.array(sorted([math.log2(n), math.log2(s / (n * k))] for n, k, s in step if n > 0 and s > 0))
        activation = np.array(sorted([math.log2(n), math.log2(f), math.log2(b)]
                                     for n, f, b in measured.get("activation") or [] if min(n, f, b) > 0))
        sets = {optimizer_key(r[0], r[2:]): float(r[1]) for r in measured.get("optimizer_sets") or []}
        layers = {tuple(int(x) for x in r[:5]): dict(zip(LAYER_PASSES, map(float, r[5:9])))
                  for r in measured.get("layers") or []}
        output = {(int(r[0]), int(r[1]), int(r[2]), str(r[3])): (float(r[4]), float(r[5]))
                  for r in measured.get("output") or []}
        tp_layers = {(str(r[0]), *(int(x) for x in r[1:8])): {"wall": dict(zip(LAYER_PASSES, map(float, r[8:12]))),
                                                             "cpu": dict(zip(LAYER_PASSES, map(float, r[12:16])))}
                     for r in measured.get("tp_layers") or []}
        tp_vocab = {(str(r[0]), *(int(x) for x in r[1:7])): {"wall": dict(zip(VOCAB_PARTS, map(float, r[7:11]))),
                                                            "cpu": dict(zip(VOCAB_PARTS, map(float, r[11:15])))}
                    for r in measured.get("tp_vocab") or []}
        return cls(gemm, gemm_accumulate,
                   {k: tuple(np.array(c, dtype=float) for c in zip(*v)) for k, v in attention.items()},
                   _curves(collectives), elementwise.reshape(-1, 3), optimizer.reshape(-1, 2),
                   activation.reshape(-1, 3), sets, layers, output, tp_layers, tp_vocab, _curves(collectives_cpu))

    def gemm_s(self, m: int, n: int, k: int, accumulate: bool = False) -> float | None:
        """Seconds of one [m, k] x [k, n] GEMM (accumulate: added into an existing [m, n]) from the measured shapes
        around it, or None."""
        if min(m, n, k) < 1:
            return None
        for table in (self.gemm_accumulate, self.gemm) if accumulate else (self.gemm,):
            if len(table):
                rate = _near_rate(table, m, n, k)
                if rate is not None:
                    return 2.0 * m * n * k / rate
        return None

    def attention_s(self, bh: float, seq: int, head_dim: int, backward: bool) -> float | None:
        """Seconds of causal attention forward (or backward) over bh batch x heads, or None."""
        entry = self.attention.get((int(seq), int(head_dim)))
        if entry is None:
            return None
        xs, ys = entry[0], entry[2 if backward else 1]
        if bh > xs[-1]:
            return float(ys[-1] * bh / xs[-1])
        return float(np.interp(bh, xs, ys))

    def elementwise_rate(self, tensor_bytes: float) -> tuple[float, float] | None:
        """(bytes moved per second in place, seconds per byte of a fresh output) of elementwise operations over
        tensors of tensor_bytes each, or None."""
        if not len(self.elementwise) or tensor_bytes <= 0:
            return None
        x, table = math.log2(tensor_bytes), self.elementwise
        return float(2.0 ** np.interp(x, table[:, 0], table[:, 1])), float(np.interp(x, table[:, 0], table[:, 2]))

    def activation_s(self, elements: float, backward: bool) -> float | None:
        """Seconds of GeLU forward (or backward) over a tensor of `elements`, or None."""
        if not len(self.activation) or elements <= 0:
            return None
        x, table, col = math.log2(elements), self.activation, 2 if backward else 1
        if x < table[0, 0] or x > table[-1, 0]:  # the nearest measured size's seconds per element
            end = 0 if x < table[0, 0] else -1
            return float(2.0 ** table[end, col] * elements / 2.0 ** table[end, 0])
        return float(2.0 ** np.interp(x, table[:, 0], table[:, col]))

    def optimizer_s_per_param(self, tensor_elements: int) -> float | None:
        """Seconds per parameter of the optimizer step over one tensor of tensor_elements, or None."""
        if not len(self.optimizer) or tensor_elements <= 0:
            return None
        return float(2.0 ** np.interp(math.log2(tensor_elements), self.optimizer[:, 0], self.optimizer[:, 1]))

    def optimizer_set_s(self, params: int, large) -> float | None:
        """Seconds of the optimizer step over one rank's parameters (`params` in all, `large` the elements of its
        large tensors) where the profile measured that very set, or None."""
        return self.optimizer_sets.get(optimizer_key(params, large)) if self.optimizer_sets else None

    def collective_s(self, op: str, n: int, nbytes: float, busy: int = 0) -> float | None:
        """Seconds of one collective (or 'p2p', n = 2) among n ranks of one machine on which `busy` ranks of the
        run communicate (0: the group alone), or None."""
        return _along(self.collectives.get((op, int(n))), n, nbytes, busy)

    def collective_cpu_s(self, op: str, n: int, nbytes: float, busy: int = 0) -> float | None:
        """CPU seconds one collective among n ranks of a CPU costs each member's process where the runtime runs it,
        off the compute path beside the passes (vp.cost.measure_comm._cpu_off_path), read as collective_s reads the
        seconds, or None (not measured: a GPU profile, or one measured before)."""
        return _along(self.collectives_cpu.get((op, int(n))), n, nbytes, busy)

    def __bool__(self) -> bool:
        return bool(len(self.gemm) or len(self.gemm_accumulate) or self.attention or self.collectives
                    or len(self.elementwise) or len(self.optimizer) or len(self.activation) or self.optimizer_sets
                    or self.layers or self.output or self.tp_layers or self.tp_vocab)


def _curves(table: dict) -> dict:
    """(op, n) -> {world: [(bytes, value), ...]} as (op, n) -> {world: (bytes[], values[])}, worlds in order."""
    return {k: {w: tuple(np.array(c, dtype=float) for c in zip(*pts)) for w, pts in sorted(v.items())}
            for k, v in table.items()}


def _along(worlds: dict | None, n: int, nbytes: float, busy: int) -> float | None:
    """A collective's value at nbytes from its curves per world (Tables.collectives' docstring says how), or None."""
    if not worlds:
        return None
    want = max(int(busy), int(n))
    xs, ys = worlds[next((w for w in worlds if w >= want), max(worlds))]
    if nbytes <= xs[0]:
        return float(ys[0])
    if nbytes > xs[-1]:  # latency + bytes / bandwidth through the two largest payloads measured
        if len(xs) < 2:
            return None
        slope = (ys[-1] - ys[-2]) / (xs[-1] - xs[-2])
        return float(ys[-1] + (slope if slope > 0 else ys[-1] / xs[-1]) * (nbytes - xs[-1]))
    return float(2.0 ** np.interp(math.log2(nbytes), np.log2(xs), np.log2(ys)))


def _near_rate(table: np.ndarray, m: int, n: int, k: int) -> float | None:
    """FLOP/s at (m, n, k) from the measured shapes around it, or None when none is within MAX_LOG2_DISTANCE."""
    q = np.array([math.log2(m), math.log2(n), math.log2(k)])
    dist = np.sqrt(((table[:, :3] - q) ** 2).sum(axis=1))
    near = np.argsort(dist)[:NEAREST]
    if dist[near[0]] > MAX_LOG2_DISTANCE:
        return None
    if dist[near[0]] < 1e-9:
        return float(table[near[0], 3])
    w = 1.0 / dist[near] ** 2  # inverse-distance weights on log FLOP/s
    return float(2.0 ** (w @ np.log2(table[near, 3]) / w.sum()))


LAYERS_PER_ROW = 2  # transformer layers each timed pass of a layers or tp_layers row ran (the row is per layer)
LAYER_PASSES = ("F", "B", "W", "BW")  # a layers row's passes: BW the whole backward of a schedule without W
VOCAB_PARTS = ("IF", "IB", "S", "T")  # a tp_vocab row's parts, named as vp.cost.work.pass_work names them


def layer_key(cfg) -> tuple[int, int, int, int, int]:
    """A run's transformer layer as the layers table keys it: micro-batch size, sequence, hidden, heads, ffn."""
    return cfg.micro_batch_size, cfg.seq_len, cfg.hidden, cfg.heads, cfg.ffn


def tp_layer_key(cfg) -> tuple:
    """A run's tensor-parallel transformer layer as the tp_layers table keys it: tensor mode, tp, depth (1-D: 1),
    then layer_key."""
    return (cfg.tp_mode, cfg.tp, cfg.tp_depth if cfg.tp_mode == "2.5d" else 1, *layer_key(cfg))


def tp_vocab_key(cfg) -> tuple:
    """A run's tensor-parallel vocabulary layers as the tp_vocab table keys them: tensor mode, tp, depth (1-D: 1),
    micro-batch size, sequence, hidden, padded vocabulary."""
    return (*tp_layer_key(cfg)[:6], cfg.padded_vocab_size)


def optimizer_key(params, large) -> tuple[int, tuple[int, ...]]:
    """A rank's parameter set as the optimizer_sets table keys it: its parameters and its large tensors' sizes."""
    return int(params), tuple(sorted(int(n) for n in large))


def as_text(table: list) -> str | list:
    """A table as a profile stores it: one line per row, fields separated by spaces (a YAML string loads in one
    step, where a list of lists is a config node per number: Hydra loads the profile once per job it composes)."""
    if not table or not isinstance(table[0], list):
        return table
    return "\n".join(" ".join(x if isinstance(x, str) else str(x) if isinstance(x, int) else f"{x:.6g}" for x in row)
                     for row in table)


def rows(table) -> list:
    """The rows of a stored table (as_text), numbers as floats; a list is taken as it is."""
    if not isinstance(table, str):
        return table
    return [[_field(x) for x in line.split()] for line in table.splitlines() if line.strip()]


def _field(x: str):
    """A number as a float; a name (an operation, an algorithm, a tensor mode such as 2.5d) as it is."""
    try:
        return float(x)
    except ValueError:
        return x
