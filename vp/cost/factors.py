"""How much longer a measured profile's passes took than their composed operations (vp.cost.passes): factors on the
composed work, from the layers, output, tp_layers and tp_vocab tables (vp.cost.measure_passes)."""
import statistics
import weakref

from vp.cost.network import Network
from vp.cost.passes import layer_gemm_s, work_seconds
from vp.cost.profiles import Hardware
from vp.cost.tables import LAYERS_PER_ROW
from vp.cost.tensor import ONE_DEVICE, Split, layer_comm_s, vocab_comm_s
from vp.cost.work import OUTPUT_GEMMS, Shapes
from vp.schedule.methods import VOCAB
from vp.tp.modes import get_mode

_FACTORS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()  # Tables -> pass_factors


def pass_factors(hw: Hardware) -> dict:
    """How much longer the runtime's passes took than their composed operations, from the profile's layers and
    output tables (vp.cost.measure_passes.layers, output_passes): each row's seconds over the composed seconds of the same
    shape, the median over rows, per part kind: "F", "B", "W", "BW" (the whole backward) for transformer layers;
    "S" and "T" for the output layer's parts over every algorithm's rows (local, naive, alg1, alg2), which
    compute_times uses, and ("S", algorithm), ("T", algorithm) for each alone, which it does not: on the
    development machine two rows of one algorithm gave factors 1.14-1.36 for S, apart by more than the algorithms'
    difference. From the tp_layers and tp_vocab tables (a stage's layers and vocabulary layers timed in a world of
    its group's processes), per (mode, tp, depth): ("tp", ..., kind) the CPU time over the composed work of F, B,
    W and BW (and, per tp_vocab_key, of that shape's parts IF, IB, S, T alone), ("tpcomm", ..., kind) what the
    wall clock added beyond the work (stretched where the group's processes share cores) over the layers' modelled
    collectives, and ("tpvocab", ..., F or B) the same over the rest of a stage's (vocabulary layers, final
    LayerNorm: vp.cost.tensor.pass_comm_s). Empty for a profile without those tables."""
    tables = hw.tables
    if tables in _FACTORS:
        return _FACTORS[tables]
    ratios: dict = {}

    def add(kind, measured: float, parts: dict, passes: float = 1.0):  # passes: of the row's time (a layer 1/2)
        seconds = work_seconds(hw, parts)  # the row's time less its share of the per-pass part, over the operations
        composed, measured = seconds.work(hw), measured - passes * seconds.passes * hw.pass_overhead_s
        if measured > 0 and composed > 0:
            ratios.setdefault(kind, []).append(measured / composed)

    for (b, seq, h, heads, ffn), row in tables.layers.items():
        sh = Shapes(b * seq, seq, b, h, ffn, hw.act_bytes, ONE_DEVICE, heads)
        for kind in ("F", "B", "W"):
            add(kind, row[kind], {kind: sh.layer(kind)}, 1 / LAYERS_PER_ROW)
        add("BW", row["BW"], {"B": sh.layer("B") + sh.layer("W")}, 1 / LAYERS_PER_ROW)
    for (n, rows, h, algo), (s_time, t_time) in tables.output.items():
        sh = Shapes(n, n, 1, h, 4 * h, hw.act_bytes)
        s_gemms = 1 if algo == "local" else VOCAB[algo].s_gemms
        add(("S", algo), s_time, {"S": sh.output(rows, OUTPUT_GEMMS[:s_gemms], True)})
        add(("T", algo), t_time, {"T": sh.output(rows, OUTPUT_GEMMS[s_gemms:], False)})
    for (mode, tp, depth, b, seq, h, heads, ffn), row in tables.tp_layers.items():
        sh = Shapes(b * seq, seq, b, h, ffn, hw.act_bytes, Split(get_mode(mode), tp, depth), heads)
        for kind in ("F", "B", "W"):
            add(("tp", mode, tp, depth, kind), row["cpu"][kind], {kind: sh.layer(kind)}, 1 / LAYERS_PER_ROW)
        add(("tp", mode, tp, depth, "BW"), row["cpu"]["BW"], {"B": sh.layer("B") + sh.layer("W")},
            1 / LAYERS_PER_ROW)
        net = Network.of(hw, tp)
        for split_w, kinds in ((True, ("F", "B", "W")), (False, ("BW",))):
            modelled = layer_comm_s(net, mode, tp, depth, b, seq, h, ffn, hw.act_bytes, split_w,
                                    layer_gemm_s(hw, sh, split_w))
            for kind in kinds:
                exposed = _beyond_work(hw, tp, row, (kind,))
                seconds = modelled["B" if kind == "BW" else kind]
                if seconds > 0:
                    ratios.setdefault(("tpcomm", mode, tp, depth, kind), []).append(exposed / seconds)
    for (mode, tp, depth, b, seq, h, vocab), row in tables.tp_vocab.items():
        split = Split(get_mode(mode), tp, depth)
        sh, rows = Shapes(b * seq, seq, b, h, 4 * h, hw.act_bytes, split), split.vocab_rows(vocab)
        parts = {"IF": sh.input(True, rows), "IB": sh.input(False, rows),
                 "S": sh.output(rows, OUTPUT_GEMMS[:1], True), "T": sh.output(rows, OUTPUT_GEMMS[1:], False)}
        for part, work in parts.items():
            # this shape's alone: the parts are mostly fixed costs at a calibration's sizes (on the development
            # machine IF took 96 times its composed work), which no factor carries to other sizes
            add(("tp", mode, tp, depth, b, seq, h, vocab, part), row["cpu"][part], {part: work})
        # the rest of a stage's collectives (vocabulary layers, final LayerNorm) as the layers' above
        modelled = vocab_comm_s(Network.of(hw, tp), mode, tp, depth, b, seq, h, vocab, hw.act_bytes)
        for kind, kinds in (("F", ("IF", "S")), ("B", ("IB", "T"))):
            exposed = _beyond_work(hw, tp, row, kinds)
            if modelled[kind] > 0:
                ratios.setdefault(("tpvocab", mode, tp, depth, kind), []).append(exposed / modelled[kind])
    for kind in ("S", "T"):  # every algorithm's rows together: for an algorithm the tables lack
        pooled = [r for key, values in ratios.items() if isinstance(key, tuple) and key[0] == kind for r in values]
        if pooled:
            ratios[kind] = pooled
    _FACTORS[tables] = out = {k: statistics.median(v) for k, v in ratios.items()}
    return out


def _beyond_work(hw: Hardware, tp: int, row: dict, kinds: tuple) -> float:
    """What a tp_layers or tp_vocab row's wall clock added beyond its passes' own work (`kinds` summed), as the
    simulator adds it: the work stretched where the group's processes share cores (vp.cost.costs.sharing), the
    collectives and the waits for peers on top."""
    slower = hw.contention(min(tp, hw.gpus_per_node))
    return max(0.0, sum(row["wall"][k] - slower * row["cpu"][k] for k in kinds))
