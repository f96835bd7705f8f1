"""W&B as its users browse it (harness.wandb_log, harness.live, harness.report.wandb_report, harness.dashboard), all
offline in a tmp folder: the config under the sweep's names and the sweep's tag, a live run's writer logging the
iterations and then the record into the one run, a writer that fails costing the run nothing, the report run holding
the report's comparison, the workspace whose every panel reads keys the runs really log, and the dashboard's refusal
offline."""
import json
import re
import shutil
import time
from pathlib import Path

import pytest

from harness_util import FIXTURES
from test_harness_runs import _wandb_records

MINI = FIXTURES / "mini"
OFFLINE = {"name": "wandb", "mode": "offline", "project": "vocab-parallelism", "entity": None, "sim": True,
           "live": None, "live_timeout_s": 120}


def _records(folder: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(folder.glob("????????????.json"))]


def _run_dirs(root: Path) -> dict[str, Path]:
    return {p.name.split("-", 3)[-1]: p for p in (root / "wandb").glob("offline-run-*")}


def _logged_keys(run_dir: Path) -> tuple[set, set, set]:
    """(history keys, summary keys, config keys) of an offline run, from its transaction log."""
    history = {item.key or "/".join(item.nested_key) for h in _wandb_records(run_dir, "history") for item in h.item}
    history |= {k.rsplit("/", 1)[0] for k in history if k.endswith("/_type")}  # a table or image: its key
    summary = {item.key or "/".join(item.nested_key) for s in _wandb_records(run_dir, "summary") for item in s.update}
    config = {item.key for r in _wandb_records(run_dir, "run") for item in r.config.update}
    config |= {item.key for c in _wandb_records(run_dir, "config") for item in c.update}
    return history, summary, config


def test_dashboard_config_uses_the_names_users_type_and_the_sweep_id_as_tag():
    from harness.wandb_log import config_of, tags_of

    rec = _records(MINI)[0]
    rec["labels"] = {**rec.get("labels", {}), "vocab": "64k", "model": "small", "sweep": "sweep-20261206-031502-7f3a"}
    cfg = config_of(rec)
    assert cfg["method"] == rec["config"]["method"] and cfg["vocab"] == "64k" and cfg["model"] == "small"
    assert cfg["run.pp"] == rec["config"]["pp"] and cfg["run.tp"] == rec["config"].get("tp", 1)
    assert "run.method" not in cfg and "pp" not in cfg and cfg["sweep"] == "sweep-20261206-031502-7f3a"
    assert tags_of(rec) == [rec["status"], "sweep-20261206-031502-7f3a"]


def test_dashboard_writer_roles_one_offline_and_shared_writers_online():
    from harness.live import writer_role
    from vp.config import RunConfig

    cfg = RunConfig(method="baseline", pp=4, dp=2, layers=4, device="cuda")
    assert writer_role(cfg, 0, 0, "offline") == "primary"
    assert [writer_role(cfg, r, r % 4, "offline") for r in range(1, 8)] == [None] * 7
    online = [writer_role(cfg, r, r % 4, "online") for r in range(8)]  # two nodes of 4: ranks 0-3, 4-7
    assert online == ["primary", None, None, "loss", "node", None, None, None]


@pytest.fixture(scope="module")
def logged(tmp_path_factory):
    """The mini records in a tmp results folder; the first of them logged through a live writer (iterations as they
    come, then the record), the rest by log_unlogged (what make report does), then the report run."""
    from harness.live import LiveRun
    from harness.report.build import build_reports
    from harness.report.wandb_report import log_report, log_unlogged

    root = tmp_path_factory.mktemp("dashboard")
    results = root / "results" / "mini"
    shutil.copytree(MINI, results)
    records = _records(results)
    live_rec = next(r for r in records if r["status"] == "ok" and r["backend"] == "real")
    path = results / f"{live_rec['run_id']}.json"
    opening = {**live_rec, "status": "running"}
    live = LiveRun(opening, OFFLINE, root, "primary", False, "rank0")
    t0 = time.monotonic()
    for it, loss in enumerate(live_rec["metrics"]["loss"]):
        live(it, loss, 0.25)
    observed_s = time.monotonic() - t0
    finished = live.finish(live_rec, path)
    first = log_unlogged(root / "results", "mini", OFFLINE, root, log=lambda line: None)
    again = log_unlogged(root / "results", "mini", OFFLINE, root, log=lambda line: None)
    build_reports(root / "results", root / "reports", ["mini"])
    lines = []
    reported = log_report(root / "results", root / "reports", "mini", OFFLINE, root, lines.append)
    return root, records, live_rec, finished, observed_s, (first, again), reported, lines


def test_dashboard_live_run_gets_the_iterations_then_the_record_on_one_run_id(logged):
    root, records, live_rec, finished, observed_s, (first, again), _, _ = logged
    assert finished and observed_s < 1.0  # the observer never waits for W&B
    runs = _run_dirs(root)
    history, summary, config = _logged_keys(runs[live_rec["run_id"]])
    assert {"live/loss", "live/time_s", "iteration/loss", "iteration/time_s", "per_rank"} <= history
    assert {"mfu", "tokens_per_s", "status"} <= summary and {"method", "vocab", "run.pp"} <= config
    values = {}
    for s in _wandb_records(runs[live_rec["run_id"]], "summary"):
        values.update({item.key: json.loads(item.value_json) for item in s.update})
    assert values["mfu"] == live_rec["metrics"]["mfu"] and values["status"] == "ok"
    # the live writer marked its record logged: make report's pass logged every other record, once
    assert first == len(records) - 1 and again == 0
    assert all((root / "results" / "mini" / f"{r['run_id']}.logged").is_file() for r in records)


def test_dashboard_a_failing_writer_costs_the_run_nothing_and_keeps_the_record_unlogged(tmp_path):
    from harness.live import LiveRun
    from harness.wandb_log import is_logged

    rec = next(r for r in _records(MINI) if r["status"] == "ok")
    path = tmp_path / f"{rec['run_id']}.json"
    shutil.copy(MINI / path.name, path)
    blocked = tmp_path / "not-a-folder"
    blocked.write_text("")  # W&B cannot make its folder here: wandb.init fails in the writer
    live = LiveRun({**rec, "status": "running"}, OFFLINE, blocked, "primary", False, "rank0")
    t0 = time.monotonic()
    for it in range(5000):
        live(it, 1.0, 0.1)
    assert time.monotonic() - t0 < 5.0
    assert live.finish(rec, path, timeout_s=60) is False
    assert not is_logged(path) and json.loads(path.read_text()) == rec


def test_dashboard_report_run_holds_the_reports_comparison(logged):
    from harness.report.frame import records_frame
    from harness.report.tables import all_tables
    from harness.wandb_log import derived_id

    root, records, *_, reported, lines = logged
    assert reported and any("report run" in line for line in lines), lines
    run = _run_dirs(root)[derived_id("report", "mini")]
    [table] = run.glob("files/media/table/comparison_*.table.json")
    data = json.loads(table.read_text())
    rows = [dict(zip(data["columns"], row)) for row in data["data"]]
    assert len(rows) == len(records)
    assert {"method", "vocab", "mesh", "mfu", "tokens_per_s", "ratio_to_baseline", "ratio_to_interleaved",
            "max_memory_bytes", "peak_memory_bytes"} <= set(data["columns"])
    # every ratio is the number the README's speedup table prints for that run
    df = records_frame(records)
    tables, _ = all_tables(df)
    printed = set()
    for t in tables:
        if t.name.startswith("speedup_vs_baseline"):
            printed |= {c for c in t.data.values.ravel() if re.fullmatch(r"\d+\.\d{3}", c)}
    ratios = [r["ratio_to_baseline"] for r in rows if r["ratio_to_baseline"] is not None]
    assert ratios and {format(v, ".3f") for v in ratios} == printed
    assert all(r["ratio_to_baseline"] == 1.0 for r in rows if r["method"] == "baseline" and r["status"] == "ok"
               and r["ratio_to_baseline"] is not None)
    assert list(run.glob("files/media/images/figures/*.png"))  # the report's figures
    assert list(run.glob("files/media/table/tables/speedup_vs_baseline*.table.json"))


def _panel_keys(panel) -> tuple[str, list[str], list[str]]:
    """(where the panel reads: summary, history; its keys; its group-by config keys) from the built panel."""
    import wandb_workspaces.reports.v2 as wr

    group = [panel.groupby.name] if isinstance(getattr(panel, "groupby", None), wr.Config) else []
    if isinstance(panel, wr.BarPlot):
        return "summary", [m.name for m in panel.metrics], group
    if isinstance(panel, wr.LinePlot):
        return "history", [panel.x, *panel.y], group
    if isinstance(panel, wr.WeavePanelSummaryTable):
        return "history", [panel.table_name], group
    raise AssertionError(f"a panel kind the test does not know: {type(panel).__name__}")


def test_dashboard_workspace_panels_read_keys_the_runs_log(logged):
    from harness.dashboard import GROUP_BY, build_workspace

    root, records, *_ = logged
    history, summary, config = set(), set(), set()
    for run_id, run in _run_dirs(root).items():
        if run_id.startswith("report-"):
            continue
        h, s, c = _logged_keys(run)
        history, summary, config = history | h, summary | s, config | c
    workspace = build_workspace("mini", records, "an-entity", "vocab-parallelism")  # no network
    panels = [p for section in workspace.sections for p in section.panels]
    assert len(panels) >= 10
    for panel in panels:
        where, keys, group = _panel_keys(panel)
        logged_keys = summary if where == "summary" else history
        assert set(keys) <= logged_keys, (panel.title, set(keys) - logged_keys)
        assert set(group) <= config, (panel.title, group)
    assert set(GROUP_BY) | {"experiment"} <= config
    assert "experiment" in workspace.runset_settings.filters and "mini" in workspace.runset_settings.filters
    base = workspace.runset_settings.baseline_run
    assert base and next(r for r in records if r["run_id"] == base)["config"]["method"] == "baseline"
    model = workspace._to_model()  # serialises without network, under the experiment's own name
    assert model.spec.section.panel_bank_config.sections and model.name == build_workspace(
        "mini", records[:1], "an-entity", "vocab-parallelism")._to_model().name != build_workspace(
        "other", records, "an-entity", "vocab-parallelism")._to_model().name


def test_dashboard_refuses_offline_with_what_to_run_first(tmp_path, monkeypatch, capsys):
    from harness.dashboard import main

    shutil.copytree(MINI, tmp_path / "results" / "mini")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("WANDB_MODE", "offline")
    assert main(["experiment=mini", f"results_dir={tmp_path / 'results'}"]) == 2
    err = capsys.readouterr().err
    assert "dashboard refused" in err and "wandb login" in err
    monkeypatch.delenv("WANDB_MODE")
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(tmp_path / "cfg"))
    monkeypatch.setenv("NETRC", str(tmp_path / "netrc"))
    assert main(["experiment=mini", f"results_dir={tmp_path / 'results'}"]) == 2
    assert "wandb login" in capsys.readouterr().err
    assert main(["experiment=nope", f"results_dir={tmp_path / 'results'}"]) == 2
    assert "run the sweep first" in capsys.readouterr().err
    assert main(["experimnt=mini"]) == 2 and "key one of experiment" in capsys.readouterr().err


def test_dashboard_make_report_logs_the_records_w_and_b_lacks(tmp_path, monkeypatch, capsys):
    """python -m harness.report --logger wandb (make report): the report run, and every record without a marker."""
    from harness.report.__main__ import main
    from harness.wandb_log import derived_id

    results = tmp_path / "results" / "two"
    results.mkdir(parents=True)
    for path in sorted(MINI.glob("????????????.json"))[:2]:
        rec = json.loads(path.read_text())
        rec["experiment"] = "two"
        (results / path.name).write_text(json.dumps(rec))
    monkeypatch.chdir(tmp_path)
    assert main(["--results-dir", str(tmp_path / "results"), "--logger", "nope"]) == 2
    assert "--logger nope: not one of off, wandb, wandb_online" in capsys.readouterr().err
    assert not (tmp_path / "wandb").exists()
    assert main(["--results-dir", str(tmp_path / "results"), "--logger", "wandb"]) == 0
    assert "logged 2 record(s) of two" in capsys.readouterr().err
    assert len(list(results.glob("*.logged"))) == 2
    assert set(_run_dirs(tmp_path)) == {p.stem for p in results.glob("*.json")} | {derived_id("report", "two")}


def test_dashboard_every_record_of_a_sweep_carries_its_id_and_the_next_sweep_another(tmp_path):
    from harness_util import TINY, records, sweep

    grid = [*TINY, "backend=sim", "grid.product.vocab=[2k]", "grid.product.method=[baseline,vocab-1]"]
    assert sweep(tmp_path, *grid)[0] == 0
    first = {r["labels"]["sweep"] for r in records(tmp_path)}
    assert len(first) == 1 and next(iter(first)).startswith("sweep-")
    assert sweep(tmp_path, *grid, "grid.product.method=[vocab-1]", "force=true")[0] == 0
    ids = {r["config"]["method"]: r["labels"]["sweep"] for r in records(tmp_path)}
    assert ids["baseline"] in first and ids["vocab-1"] not in first
