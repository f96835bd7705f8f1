"""The project as a newcomer meets it (issue 46): the suite on a machine without SLURM or other external tools skips
what needs them and fails nothing."""
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from harness.slurm import COMMANDS as SLURM_COMMANDS
from harness_util import ROOT

# the programs the tests call, by marker (tests/conftest.py): SLURM's commands (marker `slurm`), and `needs(...)`
OTHER_TOOLS = ("make", "bash")
SLURM_EXTRA = ("srun", "salloc", "sacct", "sbcast", "sstat")  # SLURM's other commands, hidden too
NEEDS_TOOLS = ["tests/test_repository.py::test_make_declares_only_targets_that_have_rules",
               "tests/test_repository.py::test_make_venv_reinstalls_torch_when_another_build_is_asked_for",
               "tests/test_gpucheck.py::test_the_script_runs_with_hydra_omegaconf_submitit_and_wandb_blocked"]


def _path_without(tools: set[str], into: Path) -> str:
    """A PATH of one folder holding a link to every program of the current PATH except `tools` (first one wins)."""
    into.mkdir()
    for folder in os.environ.get("PATH", "").split(os.pathsep):
        if not folder or not Path(folder).is_dir():
            continue
        for exe in Path(folder).iterdir():
            if exe.name not in tools and not (into / exe.name).exists() and os.access(exe, os.X_OK):
                (into / exe.name).symlink_to(exe)
    return str(into)


def test_front_door_slurm_and_tool_tests_skip_cleanly_where_the_tools_are_absent(tmp_path):
    """The SLURM tests (test_harness_slurm.py against a cluster, test_slurm.py against recorded output) and the tests
    that call make or bash, run with a PATH that has none of those programs: those that need them skip, the rest
    pass, none fails. VP_REQUIRE_SLURM is unset in the child (CI sets it to make a missing cluster a failure)."""
    hidden = set(SLURM_COMMANDS) | set(SLURM_EXTRA) | set(OTHER_TOOLS)
    env = {k: v for k, v in os.environ.items() if k not in ("VP_REQUIRE_SLURM", "PYTEST_XDIST_WORKER",
                                                           "PYTEST_ADDOPTS", "PYTEST_CURRENT_TEST")}
    env["PATH"] = _path_without(hidden, tmp_path / "bin")
    out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-n", "0", "-p", "no:cacheprovider", "-rs",
                          "tests/test_harness_slurm.py", "tests/test_slurm.py", *NEEDS_TOOLS],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    tail = out.stdout[-3000:] + out.stderr[-2000:]
    counts = {word: int(n) for n, word in re.findall(r"(\d+) (passed|failed|skipped|errors?)", out.stdout)}
    marked = len(re.findall(r"^@pytest\.mark\.slurm$", (ROOT / "tests/test_harness_slurm.py").read_text(), re.M))
    assert out.returncode == 0 and "failed" not in counts and "error" not in counts, tail
    assert counts.get("skipped") == marked + len(NEEDS_TOOLS) and counts.get("passed", 0) > 0, tail
    assert "no SLURM cluster here" in out.stdout and "needs make on PATH" in out.stdout, tail


def test_front_door_license_and_citation_name_both_papers():
    """A permissive licence, and a CITATION.cff (valid YAML, cff 1.2.0) citing both papers by their arXiv ids."""
    import yaml

    assert (ROOT / "LICENSE").read_text().startswith("MIT License\n\nCopyright (c) 2026 The vp-harness authors")
    cff = yaml.safe_load((ROOT / "CITATION.cff").read_text())
    assert cff["cff-version"] == "1.2.0" and cff["license"] == "MIT"
    ids = {i["value"] for ref in cff["references"] for i in ref["identifiers"]}
    assert ids == {"arXiv:2411.05288", "arXiv:2105.14500"}
    assert all(ref["authors"] and ref["year"] and ref["url"].startswith("https://arxiv.org/abs/")
               for ref in cff["references"])


# what a method file's opening line says of each part of its row (vp/schedule/methods.py)
FAMILY_WORDS = {"1f1b": "1F1B", "interleaved": "Megatron's interleaved 1F1B", "interlaced": "the interlaced schedule",
                "vhalf": "V-Half", "vhalf-squeezed": "V-Half in the squeezed order of the zero-bubble main branch"}
VOCAB_WORDS = {"local": "the input layer on the first stage and the output layer on the last",
               "naive": "the naive vocabulary-parallel output layer (its barriers inside S and T)",
               "alg1": "the vocabulary passes of Algorithm 1 over all ranks (two barriers)",
               "alg2": "the vocabulary passes of Algorithm 2 over all ranks (one barrier)"}


def method_file(method) -> str:
    """conf/method/<name>.yaml as its row in METHODS makes it: a one-line summary, the name, the chunks setting
    (2, the default, where the family takes it from the run; null where the family fixes it)."""
    what = f"{FAMILY_WORDS[method.family.name]} with {VOCAB_WORDS[method.vocab.name]}"
    if method.redistributes_layers:
        what += ", fewer transformer layers on the last stage"
    chunks = "null" if method.family.chunks else "2  # model chunks per rank (the layers split into pp x chunks)"
    return f"# @package method\n# method={method.name}: {what}\nname: {method.name}\nchunks: {chunks}\n"


def test_front_door_method_files_are_the_method_rows():
    """conf/method/ holds one file per row of vp.schedule.methods.METHODS, each as method_file makes it from the row:
    a method added or changed there without its config file (or the other way round) fails here."""
    from vp.schedule.methods import METHODS

    files = {p.stem: p.read_text() for p in (ROOT / "conf/method").glob("*.yaml")}
    assert sorted(files) == sorted(METHODS), "conf/method/ and METHODS name different methods"
    wrong = {name: method_file(m) for name, m in METHODS.items() if files[name] != method_file(m)}
    assert not wrong, "write these files as:\n" + "\n".join(f"conf/method/{n}.yaml:\n{t}" for n, t in wrong.items())


def test_front_door_every_conf_file_opens_with_what_it_sets():
    """Every file of conf/ opens (after Hydra's `# @package` line, which must come first) with one comment line
    `# group=name: what it sets`, the override that picks it; conf/config.yaml with a comment on the sweep config."""
    bad = []
    for path in sorted((ROOT / "conf").rglob("*.yaml")):
        rel = path.relative_to(ROOT / "conf").with_suffix("")
        lines = [line for line in path.read_text().splitlines() if not line.startswith("# @package")]
        want = "# The sweep config" if rel.parts == ("config",) else f"# {rel.parent.as_posix()}={rel.name}: "
        if not (lines and lines[0].startswith(want) and len(lines[0]) > len(want) + 10):
            bad.append(f"{path.relative_to(ROOT)}: {lines[0] if lines else ''!r} does not start with {want!r}")
    assert not bad, bad


REFUSED = [  # (entry point, argv with an old spelling, the new one it points to)
    ("harness.plan_check", ["--results", "r"], "--results-dir"),
    ("harness.model_check", ["--results", "r"], "--results-dir"),
    ("harness.calibrate", ["--results", "r"], "--results-dir"),
    ("harness.report", ["--results", "r"], "--results-dir"),
    ("vp.bench", ["vocab", "--reps", "3"], "--rounds"),
    ("vp.bench", ["vocab", "--vocab", "32000"], "--vocab-size"),
    ("vp.bench", ["sim", "--repeat", "2"], "--rounds"),
    ("vp.train", ["--timeout", "5"], "--timeout-s"),
]


def _main_of(module: str):
    import importlib

    mod = importlib.import_module(module if module in ("vp.train",) else f"{module}.__main__"
                                  if module in ("harness.report", "vp.bench") else module)
    return mod.parse_args if module == "vp.train" else mod.main


def test_front_door_old_spellings_are_refused_with_a_pointer_to_the_new_one(capsys):
    """Every renamed flag of vp/renamed.py, given to an entry point that takes its new name, exits 2 naming the new
    one (argparse's own exit) before anything runs; argparse no longer takes it as an abbreviation of the new name."""
    for module, argv, new in REFUSED:
        with pytest.raises(SystemExit) as stop:
            _main_of(module)(argv)
        err = capsys.readouterr().err
        assert stop.value.code == 2 and f"{argv[-2]} is renamed {new}" in err, (module, argv, err)
    with pytest.raises(SystemExit) as stop:
        _main_of("vp.bench")(["tpsim"])
    err = capsys.readouterr().err
    assert stop.value.code == 2 and "experiment=tp_scaling backend=sim" in err, err


def test_front_door_renamed_modules_say_where_they_went():
    from vp.renamed import MODULES

    for old, new in MODULES.items():
        out = subprocess.run([sys.executable, "-m", old], cwd=ROOT, capture_output=True, text=True, timeout=60)
        assert out.returncode == 2 and f"use python -m {new}" in out.stderr, out.stderr
        assert (ROOT / Path(*new.split("."))).with_suffix(".py").exists()


def _flags_defined() -> dict[str, list[str]]:
    """{flag: [file, ...]} of every add_argument("--flag", ...) in the project's code."""
    import ast

    found: dict[str, list[str]] = {}
    for path in [*ROOT.glob("vp/**/*.py"), *ROOT.glob("harness/**/*.py"), *ROOT.glob("scripts/*.py")]:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "add_argument":
                for arg in node.args:
                    if isinstance(arg, ast.Constant) and str(arg.value).startswith("--"):
                        found.setdefault(arg.value, []).append(str(path.relative_to(ROOT)))
    return found


def test_front_door_one_spelling_per_flag():
    """Flags are lower-case words joined by hyphens (the Hydra key with `_` for `-`: --results-dir is results_dir=),
    and no tool defines an old spelling of vp/renamed.py as a flag of its own again."""
    from vp.renamed import FLAGS

    flags = _flags_defined()
    assert "--results-dir" in flags and "--rounds" in flags  # the scan sees the code
    assert not [f for f in flags if not re.fullmatch(r"--[a-z0-9]+(-[a-z0-9]+)*", f)]
    back = {old: flags[old] for old in FLAGS if old in flags}
    assert not back, f"old spellings defined again (vp/renamed.py FLAGS): {back}"
    assert all(new in flags for new in FLAGS.values())


@pytest.mark.needs("make")
def test_front_door_renamed_make_variables_are_refused():
    """The Makefile's RENAMED_VARIABLES are vp/renamed.py's MAKE_VARIABLES, and each stops make with the pointer."""
    from vp.renamed import MAKE_VARIABLES

    line = next(x for x in (ROOT / "Makefile").read_text().splitlines() if x.startswith("RENAMED_VARIABLES :="))
    assert dict(pair.split(":") for pair in line.split(":=")[1].split()) == MAKE_VARIABLES
    for old, new in MAKE_VARIABLES.items():
        out = subprocess.run(["make", "-n", "help", f"{old}=x"], cwd=ROOT, capture_output=True, text=True, timeout=60)
        assert out.returncode == 2 and f"{old} is renamed {new}: write {new}=NAME" in out.stderr, out.stderr
    out = subprocess.run(["make", "--no-print-directory", "-n", "sim-paper_1f1b", "HARDWARE=h100"], cwd=ROOT,
                         capture_output=True, text=True, timeout=60)  # under `make test` a nested make says where it is
    (command,) = [x for x in out.stdout.splitlines() if "harness.sweep" in x]
    assert "hardware=h100" in command, out.stdout


@pytest.mark.needs("make")
def test_front_door_make_help_lists_entry_points_apart_from_maintainer_tools():
    out = subprocess.run(["make", "help"], cwd=ROOT, capture_output=True, text=True, timeout=60).stdout
    users, dev = out.split("Maintainer tools (dev):")
    for target in ("sweep", "plan", "report", "paper-tables", "test", "gpu-check"):
        assert f"make {target} " in users, target
    for target in ("plan-check", "model-check", "calibrate-paper", "bench", "slurm-up"):
        assert f"make {target} " in dev and f"make {target} " not in users, target


# The house: the project's floors, lowest first. A module's floor is that of the longest prefix naming it. A module
# imports from its own floor and the floors below; an import of a higher floor (inside a function too) is counted.
FLOORS = [
    ("base: files, host, failures, records on disk, names", [
        "vp", "vp.files", "vp.flops", "vp.hostenv", "vp.failure", "vp.renamed", "vp.data", "vp.record", "vp.trace"]),
    ("schedule data types: actions, vocabulary algorithms, costs", [
        "vp.schedule.actions", "vp.schedule.algorithms", "vp.schedule.costs"]),
    ("schedule generators and the method rows", [
        "vp.schedule.generators", "vp.schedule.interlaced", "vp.schedule.vhalf", "vp.schedule.vhalf_vocab",
        "vp.schedule.methods"]),
    ("schedule simulator", ["vp.schedule.rules", "vp.schedule.kernel", "vp.schedule.derive", "vp.schedule.program",
                            "vp.schedule.sharing", "vp.schedule.simulate"]),
    ("schedule building and checking", ["vp.schedule", "vp.schedule.build", "vp.schedule.validate",
                                        "vp.schedule.picture"]),
    ("run description: config, mesh, tensor modes, channels", [
        "vp.config", "vp.mesh", "vp.tp.modes", "vp.tp.traffic", "vp.channels"]),
    ("cost model, planner, limits, metrics", ["vp.cost", "vp.plan", "vp.checks", "vp.metrics"]),
    ("compute: torch layers, communication, runtime", [
        "vp.wgrad", "vp.comm", "vp.comm_counts", "vp.comm_groups", "vp.comm_stream", "vp.nccl", "vp.vocab", "vp.tp",
        "vp.model", "vp.runtime", "vp.reference"]),
    ("runs: launching, training, measuring a machine, checks, benchmarks", [
        "vp.run", "vp.launch", "vp.train", "vp.cost.measure", "vp.cost.measure_comm", "vp.cost.measure_passes",
        "vp.cost.measure_crowding", "vp.gpucheck", "vp.bench", "vp.schedule.__main__"]),
    ("harness records: schema, records, profiles, published tables, SLURM facts", [
        "harness.records", "harness.schema", "harness.profiles", "harness.timeline", "harness.wandb_log",
        "harness.slurm", "harness.published"]),
    ("harness running: jobs, simulation, dispatch", [
        "harness.sim", "harness.task", "harness.jobs", "harness.dispatch", "harness.compose", "harness.published.fit"]),
    ("harness reports", ["harness.report", "harness.plan_output"]),
    ("harness commands", [
        "harness", "harness.sweep", "harness.plan", "harness.calibrate", "harness.published.calibrate",
        "harness.measure", "harness.plan_check", "harness.model_check", "harness.plancheck", "harness.modelcheck",
        "hydra_plugins"]),
]
MAX_UPWARD = 8


def floor_of(module: str) -> int | None:
    hits = [(len(p), i) for i, (_, prefixes) in enumerate(FLOORS) for p in prefixes
            if module == p or module.startswith(p + ".")]
    return max(hits)[1] if hits else None


def project_imports() -> dict[str, set[str]]:
    """{module: the project's modules it imports}, at its top or inside functions; `from a import b` names the
    module a.b where there is one; imports under `if TYPE_CHECKING:` (annotations only) are left out."""
    import ast

    files = {}
    for top in ("vp", "harness", "hydra_plugins"):
        for path in (ROOT / top).rglob("*.py"):
            parts = path.relative_to(ROOT).with_suffix("").parts
            files[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    out = {}
    for name, path in files.items():
        tree = ast.parse(path.read_text())
        typing_only = {id(n) for node in ast.walk(tree) if isinstance(node, ast.If)
                       and getattr(node.test, "id", None) == "TYPE_CHECKING" for n in ast.walk(node)}
        targets = set()
        for node in ast.walk(tree):
            if id(node) in typing_only:
                continue
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                targets |= {f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in files else node.module
                            for a in node.names}
            elif isinstance(node, ast.Import):
                targets |= {a.name for a in node.names}
        out[name] = {t for t in targets if t in files and t != name}
    return out


def test_front_door_imports_run_down_the_floors():
    """Every module of vp/, harness/ and hydra_plugins/ has a floor (FLOORS), and at most MAX_UPWARD imports run
    from a floor to a higher one (each is a module that reaches above itself: move the code it needs down, or the
    module up)."""
    imports = project_imports()
    unplaced = sorted(m for m in imports if floor_of(m) is None)
    assert not unplaced, f"modules without a floor (add them to FLOORS): {unplaced}"
    upward = sorted(f"{a} -> {b} ({FLOORS[floor_of(a)][0].split(':')[0]} -> {FLOORS[floor_of(b)][0].split(':')[0]})"
                    for a, targets in imports.items() for b in targets if floor_of(b) > floor_of(a))
    assert len(upward) <= MAX_UPWARD, "\n".join(upward)


def test_front_door_schedule_modules_import_no_circle():
    """vp.schedule's modules form no import circle (actions -> methods -> vhalf_vocab -> simulate -> program ->
    actions was one): data types at the bottom, generators above them, the simulator above those."""
    imports = project_imports()
    edges = {m: {t for t in ts if t.startswith("vp.schedule")} for m, ts in imports.items()
             if m.startswith("vp.schedule")}

    def reach(start: str) -> set[str]:
        seen, todo = set(), [start]
        while todo:
            for nxt in edges.get(todo.pop(), set()) - seen:
                seen.add(nxt)
                todo.append(nxt)
        return seen

    circles = sorted(f"{a} <-> {b}" for a in edges for b in edges[a] if a in reach(b))
    assert not circles, circles


def test_front_door_report_opens_with_which_method_wins_against_both_baselines(tmp_path):
    """The first screen (harness.report.first_screen, the opening section of every report's README; the order in
    the README is checked by test_report.py): the fastest method per setup and vocabulary, its tokens/s over
    baseline's and interleaved's (the records' numbers), the peak memory of the three, and its figure; an
    experiment of one method opens with the same section, without a table."""
    from harness.records import load
    from harness.report.first_screen import TITLE, first_screen
    from harness.report.frame import records_frame
    from harness.report.render import markdown
    from harness_util import FIXTURES, fixture_records

    df = records_frame(load(FIXTURES / "mini"))
    lines, table, fig = first_screen(df, tmp_path, "FINDINGS")
    assert lines[:4] == [f"## {TITLE}", "", "FINDINGS", ""] and markdown(table) in lines
    assert table.title == "Which method wins (real)" and f"![{fig.title}](winner_real.png)" in lines
    assert (tmp_path / "winner_real.png").read_bytes().startswith(b"\x89PNG")
    assert lines[-2].startswith("Next: ")  # the commands to run next close the section
    rows = [dict(zip([b if not a else f"{a} {b}" for a, b in table.data.columns], r))
            for r in table.data.itertuples(index=False)]
    cells = {}
    for r in fixture_records("real"):
        cells.setdefault((r["config"]["pp"], r["config"]["vocab_size"]), {})[r["config"]["method"]] = r
    assert len(rows) == len(cells)
    for row in rows:
        [(pp, size)] = [k for k in cells if (str(k[0]), f"{k[1] // 1000}k") == (row["CPU processes"], row["Vocab"])]
        runs = cells[(pp, size)]
        ok = {m: r for m, r in runs.items() if r["status"] == "ok"}
        best = max(ok.values(), key=lambda r: r["metrics"]["tokens_per_s"])
        assert row["Fastest"] == best["config"]["method"]
        assert row["Peak memory (MiB) fastest"] == f"{max(best['metrics']['peak_memory_bytes']) / 2**20:.2f}"
        for ref in ("baseline", "interleaved"):
            got = row[f"tokens/s over {ref}"]
            if ref in ok:
                want = best["metrics"]["tokens_per_s"] / ok[ref]["metrics"]["tokens_per_s"]
                assert got == f"{want:.2f}x", (row, ref)
                assert row[f"Peak memory (MiB) {ref}"] == f"{max(ok[ref]['metrics']['peak_memory_bytes']) / 2**20:.2f}"
            else:
                assert got == ({"oom": "OOM"}.get(runs[ref]["status"], runs[ref]["status"]) if ref in runs else "–")
    assert any(row["tokens/s over baseline"] == "OOM" for row in rows)  # the fixture's OOM baseline is shown so
    # one method only: the same first section, without a table or figure
    lines, table, fig = first_screen(df[df["method"] == "baseline"], tmp_path / "one", "ONLY")
    assert lines[:3] == [f"## {TITLE}", "", "ONLY"] and table is None and fig is None
