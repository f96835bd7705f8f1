"""harness.report on the fixture records in tests/fixtures/records/mini: two setups (2 and 4 GPUs), two
vocabularies, five methods, a failed, an OOM and a timeout run, a combination never run, and configs that have
both a real and a sim record (one of the sim records an OOM that keeps its metrics)."""
import json
import os
import re
import shutil
from pathlib import Path

import matplotlib.image
import pytest

from harness_util import FIXTURES, fixture_records
from harness.records import load
from harness.report import build_reports
from harness.report.figures import memory_per_rank, mfu_vs_vocab
from harness.report.frame import records_frame
from harness.report.tables import all_tables
from vp.config import RunConfig, check_config

LABEL = {"failed": "failed", "oom": "OOM", "timeout": "timeout"}
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def md_table(text: str, title: str) -> list[dict]:
    """The rows of the Markdown table under the heading `title`, as {column name: cell}."""
    section = text.split(f" {title}\n", 1)[1]
    lines = [line for line in section.split("\n\n", 2)[1].splitlines() if line.startswith("|")]
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    return [dict(zip(header, (c.strip() for c in line.strip("|").split("|")))) for line in lines[2:]]


def row_of(rows: list[dict], pp: int, seq: int, method: str) -> dict:
    """The row of a setup and method; the first column counts the ranks (GPUs, or CPU processes)."""
    [row] = [r for r in rows if (next(iter(r.values())), r["Seq"], r["Method"]) == (str(pp), str(seq), method)]
    return row


def label(rec: dict) -> str:
    return rec["labels"]["vocab"] if "labels" in rec else f"{rec['config']['vocab_size'] // 1000}k"


def timeline_methods() -> set[str]:
    """The methods drawn as timelines: ok real runs of the smallest setup at its largest vocabulary."""
    ok = [r for r in fixture_records("real") if r["status"] == "ok"]
    pp = min(r["config"]["pp"] for r in ok)
    vocab = max(r["config"]["vocab_size"] for r in ok if r["config"]["pp"] == pp)
    return {r["config"]["method"] for r in ok if (r["config"]["pp"], r["config"]["vocab_size"]) == (pp, vocab)}


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    root = tmp_path_factory.mktemp("report")
    shutil.copytree(FIXTURES, root / "results")
    written = build_reports(root / "results", root / "reports")
    return root, written


def test_fixture_configs_are_valid_runs():
    for rec in fixture_records():
        check_config(RunConfig.from_dict(rec["config"]))
    statuses = {r["status"] for r in fixture_records()}
    assert statuses == {"ok", "failed", "oom", "timeout"}


def test_build_writes_tables_figures_and_indexes(built):
    root, written = built
    out = root / "reports" / "mini"
    assert written == [out / "README.md"]
    for name in ("tables.md", "runs.csv", "mfu_memory_real.tex", "speedup_vs_baseline_real.tex",
                 "speedup_vs_interleaved_real.tex", "mfu_memory_sim_a100_80g.tex", "predicted_vs_measured.tex",
                 "predicted_vs_measured.png"):
        assert (out / name).is_file(), name
    for stem in ("mfu_vs_vocab", "memory_per_rank", "bubble_per_rank", "throughput_vs_gpus"):
        for group in ("real", "sim_a100_80g"):
            assert (out / f"{stem}_{group}.png").read_bytes().startswith(PNG_MAGIC)
            assert (out / f"{stem}_{group}.pdf").read_bytes().startswith(b"%PDF")
    methods = timeline_methods()
    assert {p.name for p in out.glob("timeline_real_*.png")} == {f"timeline_real_{m}_replayed.png" for m in methods}
    readme = (out / "README.md").read_text()
    assert "(mfu_vs_vocab_real.png)" in readme and "(timeline_real_vocab-2_replayed.png)" in readme
    assert "no trace (run before traces were recorded) for" in readme
    assert "| CPU processes" in readme and "| GPUs" in readme  # tables inline: real CPU runs, simulated GPUs
    assert "Throughput relative to interleaved, sim (a100_80g): no ok interleaved run." in readme
    index = (root / "reports" / "index.md").read_text()
    assert "[mini](mini/README.md): 22 runs: 18 ok, 1 failed, 2 oom, 1 timeout; backends: real: 19" in index


def test_mfu_memory_table_holds_the_records_numbers(built):
    root, _ = built
    rows = md_table((root / "reports" / "mini" / "tables.md").read_text(), "MFU and peak memory, real")
    for rec in fixture_records("real"):
        cfg = rec["config"]
        row = row_of(rows, cfg["pp"], cfg["seq_len"], cfg["method"])
        mfu, mem = row[f"{label(rec)} MFU (%)"], row[f"{label(rec)} Mem (MiB)"]
        if rec["status"] == "ok":
            assert mfu == f"{rec['metrics']['mfu'] * 100:.2f}"
            assert mem == f"{max(rec['metrics']['peak_memory_bytes']) / 2**20:.2f}"
        else:
            assert mfu == mem == LABEL[rec["status"]]
    never_run = row_of(rows, 4, 64, "interleaved")
    assert never_run["2k MFU (%)"] == never_run["2k Mem (MiB)"] == "–"
    assert len(rows) == 2 * 5  # every setup x every method, so the missing combination has its row


def test_failures_are_listed_with_the_first_line_of_their_error(built):
    root, _ = built
    readme = (root / "reports" / "mini" / "README.md").read_text()
    failures = readme.split("## Runs that did not finish", 1)[1]
    for rec in fixture_records():
        if rec["status"] != "ok":
            first = rec["error"].splitlines()[0]
            assert re.search(rf"`{rec['run_id']}` .*\*\*{LABEL[rec['status']]}\*\*: {re.escape(first)}$", failures,
                             re.M)
            [line] = [x for x in failures.splitlines() if x.startswith(f"- `{rec['run_id']}` ")]
            assert f", {rec['config']['method']}, vocabulary " in line  # named, not only by its hash
    assert "at rank 1, step 7" not in readme  # only the first line of an error


def test_speedup_is_throughput_over_the_reference(built):
    root, _ = built
    text = (root / "reports" / "mini" / "tables.md").read_text()
    rows = md_table(text, "Throughput relative to baseline, real")
    ok = {(r["config"]["pp"], r["config"]["method"], label(r)): r["metrics"]["tokens_per_s"]
          for r in fixture_records("real") if r["status"] == "ok"}
    checked = 0
    for (pp, method, vocab), tps in ok.items():
        cell = row_of(rows, pp, 64, method)[f"tokens/s relative to baseline {vocab}"]
        if (pp, "baseline", vocab) in ok:
            assert cell == f"{tps / ok[(pp, 'baseline', vocab)]:.3f}"
            checked += 1
        else:
            assert cell == "–"  # baseline ran out of memory there: no ratio
    assert checked >= 8
    assert row_of(rows, 4, 64, "baseline")["tokens/s relative to baseline 8k"] == "OOM"


def test_report_opens_with_predicted_vs_measured_and_the_error_of_each(built):
    root, _ = built
    readme = (root / "reports" / "mini" / "README.md").read_text()
    assert readme.split("\n")[2] == "## Which method wins"  # the first screen; then predicted vs measured
    assert readme.index("(winner_real.png)") < readme.index("## Predicted vs measured") < readme.index("## Tables")
    assert "(predicted_vs_measured.png)" in readme.split("## Tables")[0]
    rows = md_table((root / "reports" / "mini" / "tables.md").read_text(), "Predicted vs measured")
    real = {r["config"]["method"]: r for r in fixture_records("real")
            if r["config"]["pp"] == 2 and r["config"]["vocab_size"] == 2000}
    sims = fixture_records("sim")
    assert len(rows) == len(sims)
    errors = []
    for sim in sims:
        rec = real[sim["config"]["method"]]
        assert rec["config"] == sim["config"]
        row = row_of(rows, 2, 64, sim["config"]["method"])
        assert row["Hardware"] == "a100_80g"
        measured = rec["metrics"]["iteration_time_s"]
        assert row["Iteration time (s) measured"] == f"{measured:.4g}"
        if sim["status"] == "ok":
            m, p = rec["metrics"], sim["metrics"]
            assert row["Iteration time (s) predicted"] == f"{p['iteration_time_s']:.4g}"
            assert row["Iteration time (s) error (%)"] == f"{(p['iteration_time_s'] / measured - 1) * 100:+.1f}"
            assert row["Tokens/s error (%)"] == f"{(p['tokens_per_s'] / m['tokens_per_s'] - 1) * 100:+.1f}"
            worst = max((b / a - 1 for a, b in zip(m["peak_memory_bytes"], p["peak_memory_bytes"])), key=abs)
            assert row["Peak memory per rank (MiB) error (%)"] == f"{worst * 100:+.1f}"
            errors.append(abs(p["iteration_time_s"] / measured - 1))
        else:
            assert row["Iteration time (s) predicted"] == "OOM"
            assert row["Iteration time (s) error (%)"] == "–"
    errors.sort()
    median = (errors[(len(errors) - 1) // 2] + errors[len(errors) // 2]) / 2
    assert f"iteration time median |error| {median * 100:.1f} %, largest {errors[-1] * 100:.1f} %" in readme


def test_latex_uses_booktabs_and_escapes(built):
    root, _ = built
    for path in (root / "reports" / "mini").glob("*.tex"):
        tex = path.read_text()
        assert "\\toprule" in tex and "\\midrule" in tex and "\\bottomrule" in tex
        assert "\\hline" not in tex
        body = [line for line in tex.splitlines() if not line.startswith("%")]
        assert all(re.search(r"(?<!\\)[%_$#]", line) is None for line in body), path.name
    tex = (root / "reports" / "mini" / "mfu_memory_real.tex").read_text()
    assert "MFU (\\%)" in tex and "\\multicolumn{2}{c}{8k}" in tex and "\\cmidrule(lr){5-6}" in tex
    assert "Mesh (dp x pp x tp)" in tex and " & 1x2x1 & " in tex  # GPUs = world size, then the mesh
    assert " & OOM & OOM \\\\" in tex and " & -- & -- & " in tex


def test_second_build_gives_identical_tables_and_drops_stale_files(built):
    """The fixture's build, then a second one over it: the same tables byte for byte, a figure the second build
    does not draw is gone, a file of the user's is kept."""
    root, _ = built
    first = root / "reports" / "mini"
    tables = sorted(p.name for p in first.iterdir() if p.suffix in (".tex", ".md", ".csv"))
    assert "tables.md" in tables and len(tables) >= 8
    before = {name: (first / name).read_bytes() for name in tables}
    (first / "mfu_vs_vocab_gone.png").write_bytes(PNG_MAGIC)
    (first / "notes.txt").write_text("mine")
    build_reports(root / "results", root / "reports", ["mini"])
    for name in tables:
        assert (first / name).read_bytes() == before[name], name
    assert not (first / "mfu_vs_vocab_gone.png").exists() and (first / "notes.txt").exists()


def test_a_sweep_keeps_a_report_built_from_the_same_records_traces_and_code(built, monkeypatch, tmp_path):
    """reuse=True (what harness.sweep asks) keeps the report while its fingerprint holds; a changed record, trace or
    unreadable file, or a build that never finished (no .built), is built again."""
    import harness.report.build as B

    root, _ = built
    source, out = root / "results" / "mini", root / "reports" / "mini"
    rebuilt, lines = [], []
    monkeypatch.setattr(B, "build_experiment", lambda name, recs, out, *rest: rebuilt.append(name) or out / "README.md")
    assert build_reports(root / "results", root / "reports", ["mini"], reuse=True, log=lines.append) == \
        [out / "README.md"]
    assert rebuilt == [] and lines == [f"report {out}: up to date (built from these records, traces and code)"]
    build_reports(root / "results", root / "reports", ["mini"], log=lines.append)  # the report command rebuilds
    assert rebuilt == ["mini"]
    (out / B.BUILT).rename(tmp_path / "built")  # an interrupted build
    build_reports(root / "results", root / "reports", ["mini"], reuse=True)
    assert rebuilt == ["mini", "mini"]
    (tmp_path / "built").rename(out / B.BUILT)
    recs = fixture_records()
    base = B.fingerprint(recs, source)
    assert (out / B.BUILT).read_text().strip() == base == B.fingerprint(fixture_records(), source)
    changed = [dict(r) for r in recs]
    changed[0] = {**changed[0], "status": "failed"}
    assert B.fingerprint(changed, source) != base and B.fingerprint(recs, source, ["x.json: bad"]) != base
    copy = tmp_path / "mini"
    shutil.copytree(source, copy)
    assert B.fingerprint(recs, copy) == base
    trace = copy / f"{recs[0]['run_id']}.trace.json"
    trace.write_text("{}")
    with_trace = B.fingerprint(recs, copy)
    os.utime(trace, ns=(trace.stat().st_atime_ns, trace.stat().st_mtime_ns + 10**9))  # a rerun's new trace
    assert len({base, with_trace, B.fingerprint(recs, copy)}) == 3


def test_figures_grow_with_their_panels(tmp_path):
    df = records_frame(fixture_records("real"))
    one_setup = df[df["pp"] == 2]

    def size(draw, runs) -> tuple[int, int]:
        out = tmp_path / str(len(list(tmp_path.iterdir())))
        out.mkdir()
        png = draw(runs, "real", out).paths[0]
        assert png.read_bytes().startswith(PNG_MAGIC)
        return matplotlib.image.imread(png).shape[:2]

    (high, wide), (high_one, wide_one) = size(mfu_vs_vocab, df), size(mfu_vs_vocab, one_setup)
    assert wide > 1.5 * wide_one and high == high_one  # one panel per setup
    (high, wide), (high_one, wide_one) = size(memory_per_rank, df), size(memory_per_rank, one_setup)
    assert high > 1.5 * high_one and wide == wide_one  # one row of panels per setup, one column per method


def test_all_failed_experiment_skips_figures(tmp_path):
    results = tmp_path / "results" / "broken"
    results.mkdir(parents=True)
    for rec in fixture_records("real"):
        if rec["status"] != "ok":
            (results / f"{rec['run_id']}.json").write_text(json.dumps(rec))
    (tmp_path / "reports" / "old").mkdir(parents=True)  # a folder from elsewhere: still listed in the index
    [readme] = build_reports(tmp_path / "results", tmp_path / "reports")
    out = readme.parent
    assert not list(out.glob("*.png")) and not list(out.glob("*.pdf"))
    text = readme.read_text()
    assert "**MFU against vocabulary size, real**: not drawn, no ok run records an MFU." in text
    assert "**Schedule timelines, real**: not drawn, no ok run records pass times." in text
    assert "Throughput relative to baseline, real: no ok baseline run." in text
    rows = md_table((out / "tables.md").read_text(), "MFU and peak memory, real")
    assert row_of(rows, 4, 64, "baseline")["8k MFU (%)"] == "OOM"
    index = (tmp_path / "reports" / "index.md").read_text()
    assert "[broken](broken/README.md): 3 runs: 0 ok, 1 failed, 1 oom, 1 timeout" in index
    assert "[old](old/README.md): no README.md" in index


def test_runs_differing_outside_the_axes_get_a_variant_row():
    base = next(r for r in fixture_records("real") if r["status"] == "ok" and r["config"]["method"] == "vocab-2")
    records = []
    for multiple in (2 * base["config"]["pp"], 8 * base["config"]["pp"]):
        rec = json.loads(json.dumps(base))
        rec["config"]["pad_multiple"] = multiple
        rec["run_id"] = f"pad{multiple}"
        records.append(rec)
    table = all_tables(records_frame(records))[0][0]
    assert ("", "Variant") in table.data.columns
    assert list(table.data[("", "Variant")]) == [f"pad_multiple={r['config']['pad_multiple']}" for r in records]


def test_load_reads_every_fixture():
    assert len(load(FIXTURES, "mini")) == len(fixture_records())


def synthetic_trace(rec: dict, path: Path) -> None:
    """A trace of the record's schedule with every action taking 1 ms, back to back, per rank."""
    from vp.schedule import build
    from vp.trace import write_trace

    cfg = rec["config"]
    sched = build(cfg["method"], cfg["pp"], cfg["microbatches"], cfg["chunks"])
    events = [[[(a.text(sched.chunks > 1), i * 1e-3, i * 1e-3, (i + 1) * 1e-3) for i, a in enumerate(actions)]]
              for actions in sched.ranks]
    write_trace(path, events, [[len(actions) * 1e-3] for actions in sched.ranks])


def pp2_at_largest_vocab() -> dict:
    """The ok real runs of the 2-rank setup at its largest vocabulary, by method."""
    real = [r for r in fixture_records("real") if r["status"] == "ok" and r["config"]["pp"] == 2]
    largest = max(r["config"]["vocab_size"] for r in real)
    return {r["config"]["method"]: r for r in real if r["config"]["vocab_size"] == largest}


@pytest.fixture(scope="module")
def altered(tmp_path_factory):
    """One more build, of the fixture records with two changes that the next two tests check apart: baseline twice
    as fast at the 2-rank setup's largest vocabulary, and a trace (synthetic_trace) beside every ok real record."""
    root = tmp_path_factory.mktemp("altered")
    shutil.copytree(FIXTURES, root / "results")
    folder = root / "results" / "mini"
    path = folder / f"{pp2_at_largest_vocab()['baseline']['run_id']}.json"
    rec = json.loads(path.read_text())
    rec["metrics"]["tokens_per_s"] *= 2
    path.write_text(json.dumps(rec))
    for rec in fixture_records("real"):
        if rec["status"] == "ok":
            synthetic_trace(rec, folder / f"{rec['run_id']}.trace.json")
    [readme] = build_reports(root / "results")
    return root, readme


def test_the_report_opens_with_findings_computed_from_the_records(built, altered):
    at = pp2_at_largest_vocab()
    best = max(at.values(), key=lambda r: r["metrics"]["tokens_per_s"])
    ratio = best["metrics"]["tokens_per_s"] / at["baseline"]["metrics"]["tokens_per_s"]
    readme = built[0] / "reports" / "mini" / "README.md"  # the fixture's report of these records
    opening = next(p for p in readme.read_text().split("\n\n") if p.startswith("On "))
    assert opening.startswith(f"On 2 CPU processes, seq 64 at vocabulary {label(best)} (measured), "
                              f"{best['config']['method']} is the fastest method: {ratio:.2f}x the throughput")
    # the same records with baseline twice as fast: the sentence follows the data
    paragraphs = altered[1].read_text().split("\n\n")
    at = next(i for i, p in enumerate(paragraphs) if p.startswith("On "))
    assert f"{ratio / 2:.2f}x the throughput" in paragraphs[at]
    after = next(i for i, p in enumerate(paragraphs) if p.startswith("Next:"))  # after the first screen's table
    assert "make paper-tables" in paragraphs[after] and paragraphs[after - 1].startswith("![Which method wins")


def test_measured_timelines_come_from_the_traces_beside_the_records(altered):
    from harness.timeline import read_trace

    root, readme = altered
    folder = root / "results" / "mini"
    ok = [r for r in fixture_records("real") if r["status"] == "ok"]
    result = read_trace(folder / f"{ok[0]['run_id']}.trace.json", list(range(ok[0]["config"]["pp"])))
    assert [t1 for _, _, t1 in result.timeline[0][:2]] == pytest.approx([1e-3, 2e-3])
    out = readme.parent
    for method in timeline_methods():
        assert (out / f"timeline_real_{method}_measured.png").read_bytes().startswith(PNG_MAGIC)
        assert (out / f"timeline_real_{method}_replayed.png").read_bytes().startswith(PNG_MAGIC)
    assert "(timeline_real_vocab-2_measured.png)" in readme.read_text()
    bad = root / "bad.trace.json"
    bad.write_text('{"traceEvents": 3}')
    with pytest.raises(ValueError, match="not a trace of this run"):
        read_trace(bad, list(range(ok[0]["config"]["pp"])))


def test_where_the_error_comes_from_splits_passes_into_compute_and_waiting():
    """A real CPU record with its passes' CPU time (pass_cpu_time_s) beside its sim twin: the error of the passes
    against wall and CPU time and the share of wall time not computing, from the records' own numbers."""
    from harness.report import predicted

    sims = [s for s in fixture_records("sim") if s["status"] == "ok"]
    sim = sims[0]
    [real] = [r for r in fixture_records("real") if r["config"] == sim["config"]]
    assert predicted.sources(predicted.pairs(records_frame([real, sim]))) is None  # no CPU times: no table
    m = real["metrics"]
    for rec in (real, sim):  # these fixture records predate pass_count
        rec["metrics"]["pass_count"] = {k: [4] * len(v) for k, v in rec["metrics"]["pass_time_s"].items()}
    m["tail_s"], sim["metrics"]["tail_s"] = [0.012, 0.034], [0.025, 0.025]
    from vp.cost import PROFILES
    sim["env"]["hardware"] = PROFILES["a100_80g"].to_dict()  # as harness.sim writes it now
    m["pass_cpu_time_s"] = {k: [None if t is None else 0.8 * t for t in v] for k, v in m["pass_time_s"].items()}
    table = predicted.sources(predicted.pairs(records_frame([real, sim])))
    [row] = table.data.to_dict("records")
    wall = sum(t * c for k, v in m["pass_time_s"].items() for t, c in zip(v, m["pass_count"][k]) if t is not None)
    pred = sum(t * c for k, v in sim["metrics"]["pass_time_s"].items()
               for t, c in zip(v, sim["metrics"]["pass_count"][k]) if t is not None)
    assert row[("Passes", "error vs wall (%)")] == f"{(pred / wall - 1) * 100:+.1f}"
    own = predicted._own_work(real, sim)  # the a100_80g profile's compute for the fixture's config
    assert own["F"] > 0 and own["B"] > 0 and not own.get("W")  # a schedule that does not split W
    assert row[("Passes", "own work vs CPU time (%)")] == f"{((own['F'] + own['B']) / (0.8 * wall) - 1) * 100:+.1f}"
    assert row[("Passes", "not computing (%)")] == "20.0"
    assert table.note.startswith("Over 1 runs the passes' own work was predicted "
                                 f"{row[('Passes', 'own work vs CPU time (%)')]} % against the CPU time")
    assert "did not compute 20.0 % of their passes' wall time (median)" in table.note
    assert (row[("After the flush (s)", "measured")], row[("After the flush (s)", "predicted")]) == ("0.034", "0.025")

