"""python -m harness.dashboard experiment=NAME [logger=wandb_online] [entity=E] [project=P] [results_dir=results]
[report=true]: save a W&B workspace for one experiment, built with wandb-workspaces (W&B's library for saved views).

The workspace is filtered to the experiment's runs (W&B group = experiment; the report run left out), its runs
grouped by vocabulary and mesh, and its panels answer the experiment's question: throughput and MFU by method, the
per-device peak memory and its balance, the ranks' idle (bubble) fraction, loss and step time per iteration against
the baseline run's, and the live values of live runs. report=true also saves a W&B Report mirroring the report's
first screen (the summary line, the comparison table, the figures).

The workspace is built from the experiment's records without network (`build_workspace`, what the tests check: every
panel reads keys the runs log); only saving needs W&B. Offline (WANDB_MODE=offline or disabled, no API key, or runs of
the experiment still only in offline files) it refuses, exit code 2, with what to run first.
"""
import os
import sys
from pathlib import Path

from harness.wandb_log import HISTORY, LIVE, derived_id

KEYS = ("experiment", "logger", "entity", "project", "results_dir", "report")
PER_RANK = "per_rank"


def panels_spec() -> list[tuple[str, list[tuple[str, str, list[str], str | None]]]]:
    """(section, [(kind, title, keys, group-by config key)]): kind bar (summary keys), line (history keys against
    `iteration`), table (a logged W&B Table). The workspace is built from this, and the test checks these keys."""
    return [
        ("Throughput and MFU by method", [
            ("bar", "Throughput (tokens/s)", ["tokens_per_s"], "method"),
            ("bar", "MFU", ["mfu"], "method"),
            ("bar", "Iteration time (s, median)", ["iteration_time_s"], "method")]),
        ("Memory per device", [
            ("bar", "Peak memory of the fullest device (bytes)", ["max_peak_memory_bytes"], "method"),
            ("table", "Per rank: peak memory, idle fraction, pass times", [PER_RANK], None)]),
        ("Bubble", [
            ("bar", "Idle fraction, the rank that waits most", ["bubble_fraction_max"], "method"),
            ("bar", "Idle fraction, mean over ranks", ["bubble_fraction_mean"], "method")]),
        ("Loss and step time (the baseline run pinned)", [
            ("line", "Loss", [HISTORY[0]], "method"),
            ("line", "Step time (s)", [HISTORY[1]], "method")]),
        ("Live (runs on a cluster, as they train)", [
            ("line", "Loss, live", [LIVE[0]], "method"),
            ("line", "Step time (s), live", [LIVE[1]], "method")]),
    ]


GROUP_BY = ["vocab", "run.dp", "run.pp", "run.tp"]  # the runs table: by vocabulary, then mesh


def _panel(kind: str, title: str, keys: list[str], group: str | None):
    import wandb_workspaces.reports.v2 as wr

    if kind == "bar":
        return wr.BarPlot(title=title, metrics=[wr.SummaryMetric(k) for k in keys], groupby=wr.Config(group),
                          groupby_aggfunc="mean", orientation="v")
    if kind == "line":
        return wr.LinePlot(title=title, x="iteration", y=list(keys), groupby=wr.Config(group) if group else None)
    return wr.WeavePanelSummaryTable(table_name=keys[0])


def baseline_run(records: list[dict]) -> str | None:
    """The run the loss panels are read against: an ok real baseline run (the first by run id), else None."""
    ids = sorted(r["run_id"] for r in records
                 if r["config"]["method"] == "baseline" and r["status"] == "ok" and r["backend"] == "real")
    return ids[0] if ids else None


def build_workspace(experiment: str, records: list[dict], entity: str, project: str):
    """The workspace of one experiment (wandb_workspaces.workspaces.Workspace), built without network."""
    import wandb_workspaces.workspaces as ws
    from wandb_workspaces import expr

    if not records:
        raise ValueError(f"experiment={experiment} has no records; run its sweep first "
                         f"(python -m harness.sweep experiment={experiment})")
    sections = [ws.Section(name=name, is_open=True, panels=[_panel(*p) for p in panels])
                for name, panels in panels_spec()]
    base = baseline_run(records)
    runset = ws.RunsetSettings(
        filters=expr.And(expr.Config("experiment") == experiment, expr.Metric("JobType") != "report"),
        groupby=[expr.Config(k) for k in GROUP_BY],
        pinned_columns=["config:method", "config:vocab", "summary:tokens_per_s", "summary:mfu",
                        "summary:max_peak_memory_bytes", "summary:status"],
        **({"baseline_run": base} if base else {}))
    workspace = ws.Workspace(entity=entity, project=project, name=f"{experiment}: methods against baseline and "
                             f"interleaved", sections=sections, runset_settings=runset,
                             settings=ws.WorkspaceSettings(x_axis="iteration"))
    workspace._internal_name = view_name(experiment)  # saved over the experiment's earlier workspace, not beside it
    return workspace


def view_name(experiment: str) -> str:
    """The workspace's internal name on W&B, derived from the experiment: W&B upserts a view by its name, so a second
    `make dashboard` updates the experiment's workspace. The form of W&B's generated names: nw-<11 characters>-v."""
    import hashlib

    return f"nw-{hashlib.sha1(experiment.encode()).hexdigest()[:11]}-v"


def build_report(experiment: str, readme: Path, figures: list[Path], entity: str, project: str):
    """A W&B Report mirroring the report's first screen: its opening (README.md up to the tables), the report run's
    comparison table and the experiment's runs."""
    import wandb_workspaces.reports.v2 as wr

    text = readme.read_text(encoding="utf-8") if readme.is_file() else ""
    opening = text.split("\n## Tables", 1)[0]
    runs = wr.Runset(entity=entity, project=project, name=experiment, filters=f"Config('experiment') = '{experiment}'")
    return wr.Report(entity=entity, project=project, title=f"{experiment}: the report",
                     description=f"Built from the records of {experiment} by python -m harness.dashboard report=true",
                     blocks=[wr.MarkdownBlock(text=opening or f"# {experiment}"),
                             wr.PanelGrid(runsets=[runs], panels=[
                                 wr.WeavePanelSummaryTable(table_name="comparison"),
                                 *[_panel(*p) for p in panels_spec()[0][1]]])])


def parse(argv: list[str]) -> dict:
    opts = {"experiment": "smoke", "logger": "wandb_online", "entity": None, "project": None,
            "results_dir": "results", "report": "false"}
    for arg in argv:
        key, eq, value = arg.partition("=")
        if not eq or key not in KEYS:
            raise ValueError(f"{arg}: expected key=value with key one of {', '.join(KEYS)}")
        opts[key] = value
    if opts["report"] not in ("true", "false"):
        raise ValueError(f"report={opts['report']}: expected true or false")
    return opts


def has_api_key(environ=os.environ) -> bool:
    """Whether W&B has a key to use, where `wandb login` leaves one (WANDB_API_KEY, else the netrc entry of the W&B
    host): asked before anything could prompt for a login. The key itself is never read out or kept."""
    import netrc
    from urllib.parse import urlparse

    if environ.get("WANDB_API_KEY"):
        return True
    host = urlparse(environ.get("WANDB_BASE_URL", "https://api.wandb.ai")).hostname
    try:
        return netrc.netrc(environ.get("NETRC")).authenticators(host) is not None
    except (OSError, netrc.NetrcParseError):
        return False


def offline_reason(run_ids: list[str], root: Path) -> str | None:
    """Why W&B cannot take the workspace now, with what to run first; None when it can."""
    mode = os.environ.get("WANDB_MODE", "")
    if mode in ("offline", "disabled", "dryrun"):
        return f"WANDB_MODE={mode}: a workspace is saved on W&B's server; unset WANDB_MODE, `wandb login`, then rerun"
    if not has_api_key():
        return "no W&B API key here: run `wandb login` (or set WANDB_API_KEY), then rerun"
    unsynced = [p for p in (root / "wandb").glob("offline-run-*") if p.name.rsplit("-", 1)[-1] in run_ids
                and not list(p.glob("*.synced"))]
    if unsynced:
        return (f"{len(unsynced)} run(s) of this experiment are only in offline files: upload them first with "
                f"`wandb sync {root / 'wandb'}/offline-run-*` (then rerun)")
    return None


def main(argv: list[str] | None = None) -> int:
    from harness.records import load
    from harness.report.__main__ import logger_config
    from harness.report.build import report_dir_for

    try:
        opts = parse(sys.argv[1:] if argv is None else argv)
        logger = logger_config(opts["logger"])
        records = load(Path(opts["results_dir"]), opts["experiment"])
        if not records:
            raise ValueError(f"no records under {opts['results_dir']}/{opts['experiment']}/; run the sweep first "
                             f"(python -m harness.sweep experiment={opts['experiment']})")
        project = opts["project"] or logger.get("project")
        ids = [r["run_id"] for r in records] + [derived_id("report", opts["experiment"])]
        why = offline_reason(ids, Path.cwd())
        if why:
            raise ValueError(f"the dashboard is saved on W&B, which is not reachable from here: {why}")
    except ValueError as err:
        print(f"dashboard refused: {err}", file=sys.stderr)
        return 2
    import wandb

    entity = opts["entity"] or logger.get("entity") or wandb.Api(timeout=30).default_entity
    workspace = build_workspace(opts["experiment"], records, entity, project).save()
    print(f"workspace: {workspace.url}")
    if opts["report"] == "true":
        out = report_dir_for(Path(opts["results_dir"]), None) / opts["experiment"]
        report = build_report(opts["experiment"], out / "README.md", sorted(out.glob("*.png")), entity, project)
        print(f"report: {report.save().url}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
