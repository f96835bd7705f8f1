"""The bytes the tensor-parallel layers send, as Comm counts them, equal the closed form of vp.tp.traffic for every
grid of python -m vp.bench tp (tiny sizes): per layer (a 2-layer run minus a 1-layer run) and for a whole run."""
import pytest
import torch

from tp_util import BENCH_PLACEMENTS, GRIDS, place, placed
from vp.bench.tp import compare, grid_name, paper_rows
from vp.config import RunConfig
from vp.run import train_rank

SIZES = dict(method="baseline", pp=1, hidden=16, heads=8, seq_len=8, vocab_size=101, microbatches=2,
             micro_batch_size=4, iterations=1, warmup=0)


def config(name: str, layers: int) -> RunConfig:
    tp, mode, depth = GRIDS[name]
    return RunConfig(tp=tp, tp_mode=mode, tp_depth=depth, layers=layers, **SIZES)


def bytes_sent(rank, world, names):
    name, _, me, comm = place(rank, world, names, pipeline=True)
    try:
        if name is None:
            return None
        sent = []
        for layers in (1, 2):
            comm.reset_counts()
            sent.append(train_rank(config(name, layers), me, comm, torch.device("cpu")).bytes_sent)
        return name, sent
    finally:
        comm.close()


@pytest.fixture(scope="module")
def measured(pools):
    out = {}
    for name, sent in placed(pools(8), bytes_sent, BENCH_PLACEMENTS):
        out.setdefault(name, []).append(sent)
    return out


@pytest.mark.parametrize("name", [g for names in BENCH_PLACEMENTS for g in names])
def test_measured_bytes_equal_the_closed_form(measured, name):
    per_rank = measured[name]
    row = compare(config(name, 2), [s[0] for s in per_rank], [s[1] for s in per_rank], None)
    assert row["grid"] == grid_name(*GRIDS[name])
    assert abs(row["ratio"] - 1) <= 0.02, row
    assert row["bytes_per_layer_spread"] == 0, "every device of a grid sends the same bytes"
    assert abs(row["bytes_one_layer_run_measured"] / row["bytes_one_layer_run_formula"] - 1) <= 0.02, row


def test_paper_scale_closed_form_orders_the_modes():
    """At 64 devices, per layer: 2.5-D [4,4,4] moves the fewest wire bytes, 1-D(64) the most."""
    rows = {r["grid"]: r["bytes_per_layer_wire"] for r in paper_rows()}
    assert rows["[4,4,4]"] < rows["[8,8,1]"] < rows["1d(64)"]
