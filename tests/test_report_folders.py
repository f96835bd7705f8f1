"""Where reports go and what harness.report refuses: a report beside its results, never over another's, a custom
results folder's own reports folder, unwritable destinations, missing results and unreadable record files (the
fixture records of tests/fixtures/records/mini)."""
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from harness_util import FIXTURES, ROOT, fixture_records
from harness.records import load
from harness.report import build_reports
from harness.report.__main__ import main
from harness.report.build import report_dir_for


def test_cli_refuses_missing_results_and_unknown_experiment(tmp_path, capsys):
    proc = subprocess.run([sys.executable, "-m", "harness.report", "--results-dir", str(tmp_path / "nope")],
                          capture_output=True, text=True, cwd=Path(__file__).parent.parent)
    assert proc.returncode == 2
    assert f"results_dir={tmp_path / 'nope'} does not exist" in proc.stderr
    shutil.copytree(FIXTURES, tmp_path / "results")
    code = main(["--results-dir", str(tmp_path / "results"), "--reports-dir", str(tmp_path / "reports"),
                 "--experiment", "mini", "nothing_here"])
    assert code == 2
    assert "experiment nothing_here has no records" in capsys.readouterr().err
    assert not (tmp_path / "reports").exists()  # nothing written when one asked experiment is missing


def test_unreadable_records_are_reported_by_name(tmp_path, capsys):
    shutil.copytree(FIXTURES, tmp_path / "results")
    folder = tmp_path / "results" / "mini"
    victims = sorted(folder.glob("*.json"))[:2]
    victims[0].write_text(victims[0].read_text()[:100])  # truncated
    rec = json.loads(victims[1].read_text())
    rec["config"] = [1, 2]  # config not a mapping
    victims[1].write_text(json.dumps(rec))
    (folder / f"{rec['run_id']}.trace.json").write_text("{}")  # a trace is not mistaken for a record
    [readme] = build_reports(tmp_path / "results")
    text = readme.read_text()
    assert "**2 record file(s) could not be read and are not in this report:**" in text
    assert f"{victims[0]}: not valid JSON" in text and f"{victims[1]}: not a result record: `config` is a list" in text
    assert f"{rec['run_id']}.trace.json" not in text
    assert len(load(tmp_path / "results", "mini")) == len(fixture_records()) - 2
    assert f"warning: skipped {victims[0]}: not valid JSON" in capsys.readouterr().err


def test_reports_go_beside_their_results_and_never_over_another(tmp_path):
    for name in ("a", "b"):
        shutil.copytree(FIXTURES, tmp_path / name / "results")
    [readme] = build_reports(tmp_path / "a" / "results")
    assert readme == tmp_path / "a" / "reports" / "mini" / "README.md"
    before = readme.read_text()
    with pytest.raises(ValueError, match=r"holds the report of .*a/results/mini, not of .*b/results/mini"):
        build_reports(tmp_path / "b" / "results", tmp_path / "a" / "reports")
    assert readme.read_text() == before
    build_reports(tmp_path / "a" / "results", tmp_path / "a" / "reports")  # its own results: rebuilt in place


def test_custom_results_folders_get_their_own_reports_folder_and_bad_ones_are_refused(tmp_path):
    """results -> reports; any other name -> reports-<name> beside it, so /tmp/b and /tmp/c never share one (the
    issue's collision on /tmp/reports); a reports folder that cannot be written is refused before anything."""
    assert report_dir_for(Path("results"), None) == Path("reports")
    assert report_dir_for(Path("/tmp/a/results"), None) == Path("/tmp/a/reports")
    assert report_dir_for(Path("/tmp/b"), None) == Path("/tmp/reports-b")
    assert report_dir_for(Path("/tmp/c/"), None) == Path("/tmp/reports-c")
    assert report_dir_for(Path("/tmp/b"), "/srv/r") == Path("/srv/r")
    shutil.copytree(FIXTURES, tmp_path / "results")
    for bad, why in (("/proc/x", "reports_dir=/proc/x: cannot write in /proc"),
                     (tmp_path / "results" / "mini" / next(iter(os.listdir(FIXTURES / "mini"))) / "x", "is a file")):
        with pytest.raises(ValueError, match=why):
            build_reports(tmp_path / "results", bad)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["results"]
    out = subprocess.run([sys.executable, "-m", "harness.report", "--results-dir", str(tmp_path / "results"),
                          "--reports-dir", "/proc/x"], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert out.returncode == 2 and "Traceback" not in out.stderr and "cannot write in /proc" in out.stderr


def test_compare_results_names_every_field_that_differs_and_nothing_else(tmp_path):
    """scripts/compare-results.py, which checks that a change leaves the sweeps' records alone: timestamps and the
    simulator's source hash are not results; any other field is."""
    old, new = tmp_path / "old", tmp_path / "new"
    shutil.copytree(FIXTURES, old)
    shutil.copytree(FIXTURES, new)
    path = next(p for p in sorted((new / "mini").glob("*.json")) if json.loads(p.read_text())["status"] == "ok")
    rec = json.loads(path.read_text())
    rec.setdefault("env", {}).update(start="later", end="later", simulator_version="other")

    def compare():
        return subprocess.run([sys.executable, "scripts/compare-results.py", str(old), str(new)], cwd=ROOT,
                              capture_output=True, text=True)

    path.write_text(json.dumps(rec))
    same = compare()
    assert same.returncode == 0 and "mini: 22 records equal" in same.stdout, same.stdout + same.stderr
    rec["metrics"]["peak_memory_bytes"][0] += 1
    path.write_text(json.dumps(rec))
    changed = compare()
    assert changed.returncode == 1 and f"{rec['run_id']}.metrics.peak_memory_bytes[0]: " in changed.stdout
