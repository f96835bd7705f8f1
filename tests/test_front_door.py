"""The project as a newcomer meets it (issue 46): the suite on a machine without SLURM or other external tools skips
what needs them and fails nothing."""
import os
import re
import subprocess
import sys
from pathlib import Path

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
                "vhalf": "V-Half"}
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
