"""The tensor-parallel parts of the harness, end to end through the real entry points: reports count GPUs as the
world size and show the mesh; the weak-scaling efficiency and the 2.5-D paper's claims are computed from the
records; the tp experiments plan the expected jobs; invalid tensor-parallel axes are refused before submission.

The report's records come from the real simulator: `harness.sweep experiment=tp_scaling backend=sim
hardware=a100_80g` (15 runs), plus one pipeline x tensor run (harness.sim.simulate_job) and one hand-made OOM record
on h100 (the schema's failure record); every expected number is computed from the records, not typed in."""
from pathlib import Path

import pytest
from hydra import initialize_config_dir

from harness.records import failure_record, load
from harness.report import build_reports
from harness.sim import simulate_job
from harness.sweep import run
from vp.config import RunConfig, check_config
from vp.cost import PROFILES
from vp.record import write_atomic

ROOT = Path(__file__).parents[1]
CONF = str(ROOT / "conf")


def sweep(tmp_path, *overrides):
    """harness.sweep in this process, as @hydra.main runs it; returns (exit code, log lines)."""
    lines = []
    with initialize_config_dir(CONF, version_base="1.3"):
        code = run([f"results_dir={tmp_path}/results", f"reports_dir={tmp_path}/reports", "logger=off",
                    f"cluster.folder={tmp_path}/submitit", *overrides], log=lines.append)
    return code, lines


def md_rows(text: str, title: str) -> list[dict]:
    section = text.split(f" {title}\n", 1)[1]
    lines = [line for line in section.split("\n\n", 2)[1].splitlines() if line.startswith("|")]
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    return [dict(zip(header, (c.strip() for c in line.strip("|").split("|")))) for line in lines[2:]]


@pytest.fixture(scope="module")
def tp_report(tmp_path_factory):
    root = tmp_path_factory.mktemp("tp")
    code, lines = sweep(root, "experiment=tp_scaling", "backend=sim", "hardware=a100_80g", "report=false")
    assert code == 0 and lines[0].startswith("experiment tp_scaling: 15 jobs, 0 done")  # 9 weak + 6 strong
    folder = root / "results" / "tp_scaling"
    pipe = check_config(RunConfig(method="vocab-2", pp=4, tp=2, layers=16, hidden=2048, heads=16, seq_len=512,
                                  vocab_size=32000, micro_batch_size=16, microbatches=4, device="cuda", dtype="bf16"))
    rec = simulate_job(pipe, PROFILES["a100_80g"], "tp_scaling", {"model": "pipe", "vocab": "32k"})
    write_atomic(folder / f"{rec['run_id']}.json", rec)
    oom = pipe.with_(method="baseline", pp=1, tp=64, tp_mode="2.5d", tp_depth=4, hidden=8192, heads=64)
    rec = failure_record(oom.to_dict(), "tp_scaling", "sim", {"model": "weak-p64", "vocab": "32k",
                                                               "hardware": "h100"}, "oom", "simulated peak memory")
    write_atomic(folder / f"{rec['run_id']}.json", rec)
    [readme] = build_reports(root / "results", root / "reports", ["tp_scaling"])
    recs = {(r["labels"].get("hardware"), r["labels"]["model"], r["config"]["tp"], r["config"]["tp_mode"]): r
            for r in load(root / "results", "tp_scaling")}
    return recs, readme.parent


def tokens(recs, model: str, tp: int, mode: str) -> float:
    return recs[("a100_80g", model, tp, mode)]["metrics"]["tokens_per_s"]


def test_tables_count_gpus_as_the_world_size_and_show_the_mesh(tp_report):
    recs, out = tp_report
    tables = (out / "tables.md").read_text()
    mesh = md_rows(tables, "Throughput, MFU and memory per mesh, sim (a100_80g)")
    row = next(r for r in mesh if r["Mesh (dp x pp x tp)"] == "1x1x64 2.5d [4,4,4]" and "strong" in r["Model"])
    assert row["GPUs"] == "64" and row["tokens/s total"] == f"{tokens(recs, 'strong-h4096', 64, '2.5d'):.4g}"
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
    assert set(by) == {(m, p) for m in ("1-D", "2-D") for p in ("4", "16", "64")} | {("2.5-D", p) for p in
                                                                                     ("8", "16", "64")}
    mfu = {k[1:]: r["metrics"]["mfu"] for k, r in recs.items() if k[0] == "a100_80g"}
    for mode, name, base in (("1d", "1-D", 4), ("2d", "2-D", 4), ("2.5d", "2.5-D", 8)):
        expected = mfu[("weak-p64", 64, mode)] / mfu[(f"weak-p{base}", base, mode)]
        assert by[(name, "64")]["weak-scaling efficiency"] == f"{expected:.3f}"
        assert by[(name, str(base))]["weak-scaling efficiency"] == "1.000"
    strong = md_rows((out / "tables.md").read_text(), "Strong scaling per tensor mode, sim (a100_80g)")
    row = next(r for r in strong if (r["Mode"], r["GPUs"]) == ("2.5-D", "64"))
    speedup = tokens(recs, "strong-h4096", 64, "2.5d") / tokens(recs, "strong-h4096", 16, "2.5d")
    assert row["strong-scaling efficiency"] == f"{speedup / 4:.3f}"
    for stem in ("weak_scaling_sim_a100_80g", "strong_scaling_sim_a100_80g"):
        assert (out / f"{stem}.png").is_file() and (out / f"{stem}.pdf").is_file()


def test_the_claims_table_puts_the_papers_ratios_beside_the_records(tp_report):
    recs, out = tp_report
    rows = md_rows((out / "tables.md").read_text(), "The 2.5-D paper's claims beside these runs")
    by = {(r["Claim"], r["Series"]): r for r in rows}
    expected = {("2.5-D [4,4,4] / 2-D [8,8,1]", "weak"): ("1.45x", "weak-p64", "2d"),
                ("2.5-D [4,4,4] / 1-D 64", "strong"): ("1.38x", "strong-h4096", "1d"),
                ("2.5-D [4,4,4] / 2-D [8,8,1]", "strong"): ("1.53x", "strong-h4096", "2d")}
    assert set(by) == set(expected)
    for key, (paper, model, slow) in expected.items():
        ratio = tokens(recs, model, 64, "2.5d") / tokens(recs, model, 64, slow)
        assert by[key]["Paper"] == paper and by[key]["sim (a100_80g) simulated"] == f"{ratio:.2f}x"
    # on h100 only the weak [4,4,4] run exists, and it ran out of memory
    assert by[("2.5-D [4,4,4] / 2-D [8,8,1]", "weak")]["sim (h100) simulated"] == "–"
    readme = (out / "README.md").read_text()
    assert "## The 2.5-D paper's claims" in readme and "the paper reports 1.45x" in readme
    assert "Simulated ratios are the cost model's predictions" in readme


@pytest.mark.parametrize("overrides,jobs", [
    # (the whole tp_scaling on one hardware, 15 jobs, is planned and simulated by the tp_report fixture)
    (["experiment=tp_scaling", "backend=sim", "hardware=h100", "run.tp_mode=2.5d"], 5),  # 2.5-D: 3 weak, 2 strong
    (["experiment=vp_tp", "backend=sim", "method=vocab-2"], 8),  # 4 meshes x 2 vocabularies (x 3 methods: 24)
    (["experiment=tp_smoke"], 4),
])
def test_tp_experiments_plan_their_jobs(tmp_path, overrides, jobs):
    code, lines = sweep(tmp_path, *overrides, "dry_run=true")
    assert code == 0 and lines[0].startswith(f"experiment {overrides[0].split('=')[1]}: {jobs} jobs, 0 done")
    assert len(lines) == 1 + jobs and not list(tmp_path.rglob("*.json"))


SMALL = ["model=tiny", "run.seq_len=16", "vocab=2k", "grid.product.method=[baseline]", "run.pp=1"]


@pytest.mark.parametrize("overrides,message", [
    (["run.tp=3", "run.tp_mode=2d"], "tp=3 is not q*q*1 for tp_mode=2d; a [q, q, 1] grid needs tp = q*q*1, "
                                     "e.g. 1 or 4"),
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
