"""<reports_dir>/<experiment>/ from <results_dir>/<experiment>/: tables (Markdown and LaTeX), figures, runs.csv and
a README that opens with the findings and indexes the rest; then <reports_dir>/index.md over every experiment
folder there. Reads only records (and traces) on disk. A report belongs to its results: reports_dir defaults
to a folder beside results_dir (report_dir_for), and a report folder built from other results is never overwritten.
A sweep (reuse=True) keeps a report whose records, traces and drawing code are those it was built from (`.built`
holds their fingerprint, written last); `python -m harness.report` always rebuilds."""
import hashlib
import json
import multiprocessing
import os
import re
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import pandas as pd

from harness.records import read_records
from vp.checks import writable_path
from harness.report.figures import Figure, all_figures
from harness.report.findings import findings
from harness.report.measured import noisy, peak_notes
from harness.report.first_screen import first_screen
from harness.report.frame import STATUS_LABEL, records_frame, summary
import harness.report.predicted as predicted
from harness.report.published import published_tables
from harness.report.render import latex, markdown
from harness.report.scaling import ASSUMPTIONS, scaling_tables
from harness.report.scaling_figures import scaling_figures
from harness.report.tables import Table, all_tables

# what a rebuild writes; such files left from an earlier build (a backend no longer there) are removed
GENERATED = re.compile(r"^(README\.md|tables\.md|runs\.csv|(winner|mfu_memory|speedup_vs|predicted_vs_measured|real_vs_sim|published_vs_sim|"
                       r"variant_effect|mfu_vs_vocab|memory_per_rank|bubble_per_rank|throughput_vs_gpus|timeline|"
                       r"tp_mesh|weak_scaling|strong_scaling|paper_claims)"
                       r"\S*\.(tex|png|pdf))$")
CSV_COLUMNS = ["run_id", "status", "backend", "hardware", "method", "gpus", "mesh", "dp", "pp", "tp", "tp_mode",
               "tp_depth", "seq_len", "vocab_size", "vocab", "model", "variant",
               "iteration_time_s", "tokens_per_s", "mfu", "max_memory_bytes", "error"]
SUMMARY = re.compile(r"^\d+ runs: ")
SOURCE = ".source"  # in each report folder: the results folder it was built from, relative to the report
BUILT = ".built"  # in each report folder: the fingerprint of what it was built from, written when it is complete
_HARNESS = Path(__file__).parents[1]
_DRAWN_BY = (_HARNESS / "report", _HARNESS / "published", _HARNESS / "timeline.py", _HARNESS / "records.py")


def experiment_dirs(results_dir: Path) -> list[str]:
    return [p.name for p in sorted(results_dir.iterdir())
            if p.is_dir() and not p.name.startswith(".") and p.name != "wandb"]


def report_dir_for(results_dir: Path, reports_dir) -> Path:
    """reports_dir, or by default a folder beside results_dir: `reports` for a folder named `results` (results ->
    reports, /tmp/a/results -> /tmp/a/reports), else `reports-<name>` (/tmp/b -> /tmp/reports-b), so two results
    folders side by side never share a reports folder."""
    if reports_dir:
        return Path(reports_dir)
    results_dir = Path(results_dir).resolve() if Path(results_dir).name in ("", ".", "..") else Path(results_dir)
    name = results_dir.name
    return results_dir.parent / ("reports" if name == "results" else f"reports-{name}")


def check_report_target(out: Path, source: Path) -> None:
    """out may hold the report of source: it is new, or was built from source before."""
    marker = out / SOURCE
    if not marker.is_file():  # a new folder, or a report from before the marker: (re)built in place
        return
    built_from = (out / marker.read_text().strip()).resolve()
    if built_from != Path(source).resolve():
        raise ValueError(f"reports_dir: {out} holds the report of {built_from}, not of {Path(source).resolve()}; "
                         f"give this sweep its own reports_dir=... (or remove that folder)")


def fingerprint(records: list[dict], source: Path, unreadable=()) -> str:
    """What a report is drawn from: its records, the traces beside them (name, size, time), the unreadable files
    it names, the code that draws it (harness.report, the published tables, timelines, the simulator that replays
    records: harness.sim.simulator_version) and the versions of pandas, matplotlib and seaborn."""
    from importlib.metadata import version

    from harness.sim import simulator_version

    h = hashlib.sha1(json.dumps([records, sorted(unreadable)], sort_keys=True, default=str).encode())
    for trace in sorted(Path(source).glob("*.trace.json")):
        st = trace.stat()
        h.update(f"{trace.name}:{st.st_size}:{st.st_mtime_ns}\0".encode())
    for src in _DRAWN_BY:
        for path in sorted(p for p in src.iterdir() if p.is_file()) if src.is_dir() else [src]:
            h.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    h.update(" ".join([simulator_version()] + [version(p) for p in ("pandas", "matplotlib", "seaborn")]).encode())
    return h.hexdigest()[:16]


def build_reports(results_dir: Path, reports_dir=None, experiments: list[str] | None = None, reuse: bool = False,
                  log=None) -> list[Path]:
    """Write <reports_dir>/<experiment>/ for each experiment (all under results_dir when None) and the index;
    returns the README.md of each experiment. Every experiment is read and checked before anything is written.
    reuse: keep a report already built from the same records, traces and code (log says so)."""
    results_dir = Path(results_dir)
    reports_dir = report_dir_for(results_dir, reports_dir)
    if not results_dir.is_dir():
        raise ValueError(f"results_dir={results_dir} does not exist; run a sweep first (make sweep) or point "
                         f"--results-dir at the folder that holds <experiment>/<run_id>.json")
    known = experiment_dirs(results_dir)
    read = {name: read_records(results_dir, name) for name in (experiments or known)}
    empty = [name for name, (recs, bad) in read.items() if not recs and not bad]
    if experiments and empty:
        raise ValueError(f"experiment {', '.join(empty)} has no records under {results_dir}/; folders there: "
                         f"{', '.join(n for n in known if n not in empty) or 'none'}")
    read = {name: rb for name, rb in read.items() if rb[0] or rb[1]}
    if not read:
        raise ValueError(f"no records under {results_dir}/<experiment>/; run a sweep first (make sweep)")
    writable_path(reports_dir, "reports_dir")
    for name in read:
        check_report_target(reports_dir / name, results_dir / name)
    jobs = [(name, recs, reports_dir / name, results_dir / name, bad) for name, (recs, bad) in read.items()]
    kept = []
    if reuse:
        for job in list(jobs):
            name, recs, out, source, bad = job
            built = out / BUILT
            if built.is_file() and (out / "README.md").is_file() and \
                    built.read_text().strip() == fingerprint(recs, source, bad):
                jobs.remove(job)
                kept.append(out / "README.md")
                if log:
                    log(f"report {out}: up to date (built from these records, traces and code)")
    workers = min(len(jobs), os.cpu_count() or 1, 4)
    if workers > 1 and sum(len(job[1]) for job in jobs) >= 100:
        # experiments are independent and drawing their figures dominates: they are shared out by record count, and
        # this process builds the first share itself while workers - 1 new processes build the others (each new
        # process imports pandas and matplotlib again, about 2 CPU s)
        shares = _shares([len(job[1]) for job in jobs], workers)
        with ProcessPoolExecutor(workers - 1, mp_context=multiprocessing.get_context("spawn")) as pool:
            futures = {i: pool.submit(_build_one, jobs[i]) for share in shares[1:] for i in share}
            mine = {i: _build_one(jobs[i]) for i in shares[0]}
            written = [mine[i] if i in mine else futures[i].result() for i in range(len(jobs))]
    else:
        written = [_build_one(job) for job in jobs]
    write_index(reports_dir)
    return kept + written


def _build_one(job: tuple) -> Path:
    return build_experiment(*job)


def _shares(sizes: list[int], n: int) -> list[list[int]]:
    """The indices of sizes split into n shares of about equal sum: largest first, each to the smallest share."""
    shares, sums = [[] for _ in range(n)], [0] * n
    for i in sorted(range(len(sizes)), key=lambda i: -sizes[i]):
        least = sums.index(min(sums))
        shares[least].append(i)
        sums[least] += sizes[i]
    return shares


def _write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


def _table_md(table: Table, level: str) -> str:
    return f"{level} {table.title}\n\n{table.note} LaTeX: [{table.name}.tex]({table.name}.tex).\n\n{markdown(table)}\n"


def _figure_md(fig: Figure) -> str:
    if not fig.paths:
        return f"- **{fig.title}**: not drawn, {fig.skipped}."
    links = ", ".join(f"[{p.name}]({p.name})" for p in fig.paths)
    return f"- **{fig.title}**: {fig.what} {links}" + (f" (Also {fig.skipped}.)" if fig.skipped else "")


def _failure_md(run: dict) -> str:
    variant = f" ({run['variant']})" if run["variant"] else ""
    return (f"- `{run['run_id']}` {run['group']}, {run['setup']}, {run['method']}, vocabulary {run['vocab']}{variant}: "
            f"**{STATUS_LABEL[run['status']]}**: {run['error'] or 'no error text'}")


def readme(name: str, source: Path, df: pd.DataFrame, tables: list[Table], skipped: list[str],
           figures: list[Figure], unreadable: list[str], notes: list[str] = (), claims: list[str] = (),
           opening: list[str] = (), first: list[str] = ()) -> str:
    """The README: first the answer (which method wins against the baselines: first_screen), then the summary line,
    the predicted-against-measured section (opening) and the rest."""
    failures = [_failure_md(r) for r in df[df["status"] != "ok"].to_dict("records")]
    first = list(first) or [findings(df, claims), ""]
    lines = [f"# Report: {name}", "", *first, summary(df), "", *opening]
    if unreadable:
        lines += [f"**{len(unreadable)} record file(s) could not be read and are not in this report:**", "",
                  *[f"- {line}" for line in unreadable], ""]
    lines += [f"Built by `python -m harness.report` from the records in `{source}/`. The tables are also in "
             f"[tables.md](tables.md) and, as LaTeX (booktabs), in the .tex file named under each; every run is a "
             f"row of [runs.csv](runs.csv).", "", "## Tables", ""]
    lines += [_table_md(t, "###") for t in tables]
    lines += [f"Not written: {s}" for s in skipped] + ([""] if skipped else [])
    lines += (["## Against published measurements", "", *[f"- {n}" for n in notes], ""] if notes else [])
    if claims:
        sim = (df["backend"] == "sim").any()
        lines += ["## The 2.5-D paper's claims", "", *[f"- {n}" for n in claims],
                  *([f"- {ASSUMPTIONS}"] if sim else []), ""]
    lines += ["## Figures", "", *[_figure_md(f) for f in figures], "", "## Runs that did not finish", ""]
    lines += failures or ["None: every run ended ok."]
    quality = [f"- {n}" for n in peak_notes(df)] + [f"- **noisy**: {n}" for n in noisy(df)]
    lines += ["", "## How the CPU runs were measured", "", *quality] if quality else []
    return "\n".join(lines) + "\n"


def build_experiment(name: str, records: list[dict], out: Path, source: Path, unreadable=()) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    (out / BUILT).unlink(missing_ok=True)  # until this build is complete
    drawn_from = fingerprint(records, source, unreadable)  # before anything reads (or could change) the records
    _write(out / SOURCE, os.path.relpath(Path(source).resolve(), out.resolve()) + "\n")
    df = records_frame(records)
    tables, skipped = all_tables(df)
    pairs, opening = predicted.pairs(df), []
    if pairs.empty:
        skipped.append(f"{predicted.TITLE}: no config has both a real and a sim record (backend=both makes both).")
    else:
        first = predicted.table(pairs)
        tables.insert(0, first)
        fig = predicted.figure(pairs, out)
        picture = f"![{fig.title}]({fig.paths[0].name})" if fig.paths else f"(No figure: {fig.skipped}.)"
        opening = [f"## {first.title}", "", predicted.errors_line(pairs), "", first.note, "", markdown(first),
                   picture, ""]
        where = predicted.sources(pairs)
        if where is not None:
            tables.insert(1, where)
            opening += [f"### {where.title}", "", where.note, "", markdown(where), ""]
    extra, notes = published_tables(df, name)
    tp_tables, claims = scaling_tables(df)
    first, winner, winner_fig = first_screen(df, out, findings(df, claims, with_next=False))
    if winner is not None:
        tables.insert(0, winner)
    tables += extra + tp_tables
    written = [_write(out / f"{t.name}.tex", latex(t)) for t in tables]
    written.append(_write(out / "tables.md", f"# Tables: {name}\n\n" + "\n".join(_table_md(t, "##") for t in tables)))
    written.append(_write(out / "runs.csv", df[CSV_COLUMNS].to_csv(index=False)))
    figures = all_figures(df, out, source) + scaling_figures(df, out)
    if not pairs.empty:
        figures.insert(0, fig)
    if winner_fig is not None:
        figures.insert(0, winner_fig)
    written += [p for f in figures for p in f.paths]
    written.append(_write(out / "README.md", readme(name, source, df, tables, skipped, figures, list(unreadable),
                                                    notes, claims, opening, first)))
    for path in out.iterdir():
        if path.is_file() and GENERATED.match(path.name) and path not in written:
            path.unlink()
    _write(out / BUILT, drawn_from + "\n")
    return out / "README.md"


def _summary_of(readme_path: Path) -> str:
    if not readme_path.is_file():
        return "no README.md (not written by harness.report)"
    lines = readme_path.read_text(encoding="utf-8").splitlines()
    return next((line for line in lines if SUMMARY.match(line)), "README.md without a run summary")


INDEX = "index.md"  # README.md of the reports folder is the user's (the repository's reports/README.md)


def write_index(reports_dir: Path) -> Path:
    """<reports_dir>/index.md: every experiment folder under reports_dir with a link and its run counts."""
    names = [p.name for p in sorted(reports_dir.iterdir()) if p.is_dir() and not p.name.startswith(".")]
    lines = ["# Reports", "", "One folder per experiment, built by `python -m harness.report` from the "
             "records of `<results_dir>/<experiment>/`.", ""]
    lines += [f"- [{n}]({n}/README.md): {_summary_of(reports_dir / n / 'README.md')}" for n in names]
    lines += [] if names else ["No experiment reports yet."]
    return _write(reports_dir / INDEX, "\n".join(lines) + "\n")
