"""The tensor-parallel parts of the harness, end to end through the real entry points: reports count GPUs as the
world size and show the mesh; the weak-scaling efficiency and the 2.5-D paper's claims are computed from the
records; the tp experiments plan the expected jobs; invalid tensor-parallel axes are refused before submission.

The records here are built from the schema (RunConfig, vp.metrics.throughput, vp.record.make_record) with
iteration times chosen by the test, so every expected number is computed from them, not typed in."""
import json
import re
from pathlib import Path

import pytest
from hydra import initialize_config_dir

from harness.report import build_reports
from harness.sweep import run
from vp.config import RunConfig, check_config
from vp.metrics import throughput
from vp.record import make_record, write_atomic

ROOT = Path(__file__).parents[1]
CONF = str(ROOT / "conf")
PEAK = 312e12


def sim_record(model: str, hidden: int, heads: int, tp: int, mode: str, depth: int, seconds: float,
               status: str = "ok", hw: str = "a100_80g", pp: int = 1, method: str = "baseline") -> dict:
    cfg = check_config(RunConfig(method=method, pp=pp, tp=tp, tp_mode=mode, tp_depth=depth, layers=16, hidden=hidden,
                                 heads=heads, seq_len=512, vocab_size=32000, micro_batch_size=16,
                                 microbatches=max(4, pp), device="cuda", dtype="bf16"))
    world = cfg.world
    metrics = {**throughput(cfg, seconds, world, PEAK), "iteration_time_s": seconds, "iteration_times_s": [seconds],
               "peak_memory_bytes": [(1 + hidden / 1024) * 2**30] * world, "bubble_fraction": [0.0] * world}
    rec = make_record(cfg.to_dict(), metrics if status == "ok" else None, {"hardware": {"name": hw}},
                      status=status, error=None if status == "ok" else "simulated peak memory exceeds",
                      experiment="tp_scaling", backend="sim", hardware={"name": hw})
    rec["labels"] = {"model": model, "vocab": "32k", "hardware": hw}
    return rec


# (model, hidden, heads, tp, mode, depth, seconds): weak series per mode, and one strong model on 16 and 64
RUNS = [("weak-p4", 2048, 16, 4, "1d", 1, 1.0), ("weak-p4", 2048, 16, 4, "2d", 1, 1.1),
        ("weak-p8", 2816, 22, 8, "2.5d", 2, 1.2), ("weak-p16", 4096, 32, 16, "1d", 1, 1.5),
        ("weak-p64", 8192, 64, 64, "1d", 1, 2.5), ("weak-p64", 8192, 64, 64, "2d", 1, 1.9),
        ("weak-p64", 8192, 64, 64, "2.5d", 4, 1.4),
        ("strong", 4096, 64, 16, "1d", 1, 0.8), ("strong", 4096, 64, 16, "2d", 1, 0.9),
        ("strong", 4096, 64, 16, "2.5d", 4, 0.7), ("strong", 4096, 64, 64, "1d", 1, 0.5),
        ("strong", 4096, 64, 64, "2d", 1, 0.45), ("strong", 4096, 64, 64, "2.5d", 4, 0.3)]


def md_rows(text: str, title: str) -> list[dict]:
    section = text.split(f" {title}\n", 1)[1]
    lines = [line for line in section.split("\n\n", 2)[1].splitlines() if line.startswith("|")]
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    return [dict(zip(header, (c.strip() for c in line.strip("|").split("|")))) for line in lines[2:]]


@pytest.fixture(scope="module")
def tp_report(tmp_path_factory):
    root = tmp_path_factory.mktemp("tp")
    recs = {spec: sim_record(*spec) for spec in RUNS}
    recs[("oom",)] = sim_record("weak-p64", 8192, 64, 64, "2.5d", 4, 1.0, status="oom", hw="h100")
    recs[("pipe",)] = sim_record("pipe", 2048, 16, 2, "1d", 1, 1.0, pp=4, method="vocab-2")  # 4 x 2 = 8 GPUs
    for rec in recs.values():
        write_atomic(root / "results" / "tp_scaling" / f"{rec['run_id']}.json", rec)
    [readme] = build_reports(root / "results", root / "reports", ["tp_scaling"])
    return recs, readme.parent


def tokens(recs, *spec) -> float:
    [rec] = [r for k, r in recs.items() if k[:1] + k[3:6] == spec]
    return rec["metrics"]["tokens_per_s"]


def test_tables_count_gpus_as_the_world_size_and_show_the_mesh(tp_report):
    recs, out = tp_report
    tables = (out / "tables.md").read_text()
    mesh = md_rows(tables, "Throughput, MFU and memory per mesh, sim (a100_80g)")
    row = next(r for r in mesh if r["Mesh (dp x pp x tp)"] == "1x1x64 2.5d [4,4,4]" and "strong" in r["Model"])
    assert row["GPUs"] == "64" and row["tokens/s total"] == f"{tokens(recs, 'strong', 64, '2.5d', 4):.4g}"
    pipe = next(r for r in mesh if r["Method"] == "vocab-2")
    assert (pipe["GPUs"], pipe["Mesh (dp x pp x tp)"]) == ("8", "1x4x2 1d")  # dp x pp x tp, not pp
    mfu = md_rows(tables, "MFU and peak memory, sim (a100_80g)")
    assert {(r["GPUs"], r["Mesh (dp x pp x tp)"]) for r in mfu} >= {("64", "1x1x64 1d"), ("4", "1x1x4 2d [2,2,1]"),
                                                                   ("8", "1x1x8 2.5d [2,2,2]"), ("8", "1x4x2 1d")}
    runs_csv = (out / "runs.csv").read_text().splitlines()
    assert runs_csv[0].startswith("run_id,status,backend,hardware,method,gpus,mesh,dp,pp,tp,tp_mode,tp_depth")
    readme = (out / "README.md").read_text()
    assert "64 GPUs (1x1x64 2.5d [4,4,4]), seq 512" in readme  # a setup with its mesh (the failure list)


def test_weak_scaling_efficiency_is_mfu_relative_to_the_modes_smallest_run(tp_report):
    recs, out = tp_report
    rows = md_rows((out / "tables.md").read_text(), "Weak scaling per tensor mode, sim (a100_80g)")
    by = {(r["Mode"], r["GPUs"]): r for r in rows}
    assert set(by) == {("1-D", "4"), ("1-D", "16"), ("1-D", "64"), ("2-D", "4"), ("2-D", "64"), ("2.5-D", "8"),
                       ("2.5-D", "64")}
    mfu = {k[:1] + k[3:6]: r["metrics"]["mfu"] for k, r in recs.items() if len(k) > 1}
    for mode, name, base in (("1d", "1-D", 4), ("2d", "2-D", 4), ("2.5d", "2.5-D", 8)):
        depth = 4 if mode == "2.5d" else 1
        expected = mfu[("weak-p64", 64, mode, depth)] / mfu[(f"weak-p{base}", base, mode, 2 if base == 8 else 1)]
        assert by[(name, "64")]["weak-scaling efficiency"] == f"{expected:.3f}"
        assert by[(name, str(base))]["weak-scaling efficiency"] == "1.000"
    strong = md_rows((out / "tables.md").read_text(), "Strong scaling per tensor mode, sim (a100_80g)")
    row = next(r for r in strong if (r["Mode"], r["GPUs"]) == ("2.5-D", "64"))
    speedup = tokens(recs, "strong", 64, "2.5d", 4) / tokens(recs, "strong", 16, "2.5d", 4)
    assert row["strong-scaling efficiency"] == f"{speedup / 4:.3f}"
    for stem in ("weak_scaling_sim_a100_80g", "strong_scaling_sim_a100_80g"):
        assert (out / f"{stem}.png").is_file() and (out / f"{stem}.pdf").is_file()


def test_the_claims_table_puts_the_papers_ratios_beside_the_records(tp_report):
    recs, out = tp_report
    rows = md_rows((out / "tables.md").read_text(), "The 2.5-D paper's claims beside these runs")
    by = {(r["Claim"], r["Series"]): r for r in rows}
    fast = ("2.5d", 4)
    expected = {("2.5-D [4,4,4] / 2-D [8,8,1]", "weak"): ("1.45x", "weak-p64", ("2d", 1)),
                ("2.5-D [4,4,4] / 1-D 64", "strong"): ("1.38x", "strong", ("1d", 1)),
                ("2.5-D [4,4,4] / 2-D [8,8,1]", "strong"): ("1.53x", "strong", ("2d", 1))}
    assert set(by) == set(expected)
    for key, (paper, model, slow) in expected.items():
        ratio = tokens(recs, model, 64, *fast) / tokens(recs, model, 64, *slow)
        assert by[key]["Paper"] == paper and by[key]["sim (a100_80g) simulated"] == f"{ratio:.2f}x"
    # on h100 only the weak [4,4,4] run exists, and it ran out of memory
    assert by[("2.5-D [4,4,4] / 2-D [8,8,1]", "weak")]["sim (h100) simulated"] == "–"
    readme = (out / "README.md").read_text()
    assert "## The 2.5-D paper's claims" in readme and "the paper reports 1.45x" in readme
    assert "Simulated ratios are the cost model's predictions" in readme


def sweep(tmp_path, *overrides):
    """harness.sweep in this process, as @hydra.main runs it; returns (exit code, log lines)."""
    lines = []
    with initialize_config_dir(CONF, version_base="1.3"):
        code = run([f"results_dir={tmp_path}/results", f"reports_dir={tmp_path}/reports", "logger=off",
                    f"cluster.folder={tmp_path}/submitit", *overrides], log=lines.append)
    return code, lines


@pytest.mark.parametrize("overrides,jobs", [
    (["experiment=tp_scaling", "backend=sim"], 30),  # 9 weak + 6 strong setups x A100, H100
    (["experiment=tp_scaling", "backend=sim", "hardware=h100", "run.tp_mode=2.5d"], 5),
    (["experiment=vp_tp", "backend=sim"], 24),  # 4 meshes x 2 vocabularies x 3 methods
    (["experiment=tp_smoke"], 4),
])
def test_tp_experiments_plan_their_jobs(tmp_path, overrides, jobs):
    code, lines = sweep(tmp_path, *overrides, "dry_run=true")
    assert code == 0 and lines[0].startswith(f"experiment {overrides[0].split('=')[1]}: {jobs} jobs, 0 done")
    assert len(lines) == 1 + jobs and not list(tmp_path.rglob("*.json"))


SMALL = ["model=tiny", "run.seq_len=16", "vocab=2k", "grid.product.method=[baseline]", "run.pp=1"]


@pytest.mark.parametrize("overrides,message", [
    (["run.tp=3", "run.tp_mode=2d"], "tp=3 is not q*q*1 for tp_mode=2d; a [q, q, 1] grid needs tp = q*q*1, e.g. 1 or 4"),
    (["run.tp=4", "run.tp_depth=2"], "tp_depth=2 needs tp_mode=2.5d (depth of a [q, q, d] grid); drop tp_depth or "
                                     "set tp_mode=2.5d"),
    (["run.tp_mode=2d"], "tp_mode=2d needs tensor parallelism, but tp=1; set tp"),
    (["run.tp=8", "run.tp_mode=2.5d", "run.tp_depth=2", "run.micro_batch_size=2"],
     "micro_batch_size=2 is not divisible by d*q=4 of tp_mode=2.5d"),
    (["run.tp=2", "vocab.pad_multiple=3"], "pad_multiple=3 is not divisible by the 2 vocabulary shards"),
    (["run.tp=16", "model.heads=16"], "run.dp x run.pp x run.tp = 16 local processes but cluster.max_local_ranks=8"),
    (["run.tp=16"], "heads=4 is not divisible by tp=16 (tp_mode=1d); use a multiple of 16"),
    (["run.tp=4", "cluster=slurm", "cluster.partition=p", "cluster.tasks_per_node=3"],
     "the world of 4 tasks (run.dp x run.pp x run.tp) does not split over nodes of cluster.tasks_per_node=3"),
])
def test_invalid_tensor_parallel_axes_are_refused_before_submission(tmp_path, capsys, overrides, message):
    code, _ = sweep(tmp_path, *SMALL, *overrides)
    err = capsys.readouterr().err
    assert code == 2 and "sweep refused, nothing was submitted" in err and message in err, err
    assert not [p for p in tmp_path.rglob("*") if p.is_file()]
