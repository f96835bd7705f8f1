"""python -m vp.bench peer end to end on a tiny GPT: torch.distributed.pipelining trains exactly what the
project trains (checked against the single-process reference, not only by the bench itself). No timings."""
import json

import torch

from vp.bench.__main__ import main
from vp.config import RunConfig
from vp.reference import train_reference

TINY = dict(hidden=32, heads=2, layers=4, seq_len=16, vocab_size=203, microbatches=4, iterations=2)


def test_peer_bench_runs_and_torch_pipelining_computes_the_projects_loss(capsys):
    argv = ["peer", "--json"] + [f"--{k.replace('_', '-')}={v}" for k, v in TINY.items()]
    assert main(argv) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [(r["runner"], r["schedule"]) for r in rows] == [
        ("torch", "Schedule1F1B"), ("torch", "ScheduleInterleaved1F1B"),
        ("vp", "baseline"), ("vp", "interleaved"), ("vp", "vocab-2")]
    assert all(r["iteration_time_s"] > 0 and r["loss_matches"] for r in rows)
    ref_losses, _ = train_reference(RunConfig(method="baseline", pp=2, **TINY))
    for r in rows:  # V = 203: vocab-2 pads to 204, the others do not pad
        torch.testing.assert_close(torch.tensor(r["loss"]), torch.tensor(ref_losses), rtol=1e-5, atol=0,
                                   msg=f"{r['runner']} {r['schedule']}")


def test_peer_bench_refuses_bad_input_before_starting_anything(capsys):
    assert main(["peer", "--rounds", "0"]) == 2
    assert "rounds=0" in capsys.readouterr().err
    assert main(["peer", "--layers", "6"]) == 2  # interleaved needs a multiple of pp * chunks = 4
    assert "layers=6" in capsys.readouterr().err


def test_sim_bench_rows_and_refusals(capsys):
    """python -m vp.bench sim: one row per method and size, measured in its own process (no timings asserted)."""
    assert main(["sim", "--json", "--methods", "vocab-2", "interleaved-vocab-2", "--sizes", "4x8"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [(r["method"], r["pp"], r["microbatches"], r["chunks"]) for r in rows] == [
        ("vocab-2", 4, 8, 1), ("interleaved-vocab-2", 4, 8, 2)]
    from vp.schedule import build
    assert [r["actions"] for r in rows] == [sum(map(len, build(r["method"], 4, 8).ranks)) for r in rows]
    assert all(r["cpu_s"] > 0 and r["ratio"] > 0 and r["peak_rss_bytes"] > 0 for r in rows)
    assert main(["sim", "--sizes", "4by8"]) == 2
    assert "--sizes '4by8'" in capsys.readouterr().err
    assert main(["sim", "--methods", "interleaved", "--sizes", "4x6"]) == 2  # 6 is not a multiple of pp
    assert "microbatches" in capsys.readouterr().err
