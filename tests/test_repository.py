"""The repository as a user meets it: the Makefile's targets, the venv's torch pin, docs that cite only files
that are here."""
import subprocess

import pytest

from harness_util import ROOT


@pytest.mark.needs("make")
def test_make_declares_only_targets_that_have_rules():
    text = (ROOT / "Makefile").read_text()
    declared = text.split(".PHONY:", 1)[1].splitlines()[0].split()
    for target in declared:
        out = subprocess.run(["make", "-n", target], capture_output=True, text=True, cwd=ROOT, timeout=60)
        assert out.returncode == 0 and out.stdout.strip(), (target, out.stderr)
    helped = subprocess.run(["make", "help"], capture_output=True, text=True, cwd=ROOT, timeout=60).stdout
    assert all(target in helped for target in declared if target != "help")


@pytest.mark.needs("make")
def test_make_venv_reinstalls_torch_when_another_build_is_asked_for(tmp_path):
    """The stamp names the requested torch: another TORCH reinstalls it (--force-reinstall), the same one is a
    no-op. A stand-in python records what pip was asked to do."""
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    log = tmp_path / "pip.log"
    fake = venv / "bin" / "python"
    fake.write_text(f"#!/bin/sh\necho \"$*\" >> {log}\n")
    fake.chmod(0o755)
    make = ["make", "--no-print-directory", "venv", f"VENV={venv}"]
    assert subprocess.run([*make, "TORCH=torch==1.0"], cwd=ROOT, capture_output=True, timeout=60).returncode == 0
    first = log.read_text()
    assert "install" in first and "torch==1.0" in first and "--force-reinstall" not in first
    assert subprocess.run([*make, "TORCH=torch==1.0"], cwd=ROOT, capture_output=True, timeout=60).returncode == 0
    assert log.read_text() == first  # up to date
    assert subprocess.run([*make, "TORCH=torch==2.0"], cwd=ROOT, capture_output=True, timeout=60).returncode == 0
    assert "--force-reinstall torch==2.0" in log.read_text()[len(first):]
    assert len(list(venv.glob(".torch-*"))) == 1


def test_docs_and_code_cite_only_files_that_are_in_the_repository():
    """Every Markdown file a doc, a module or a test names exists (the repository's docs stand alone)."""
    import re

    named = re.compile(r"(?<![\w/.-])((?:[\w-]+/)*[\w-]+\.md)\b")
    # written by a run (reports/..., the GPU check's gpu-check.md), a placeholder (NAME.md) or in the paper's own
    # artifact repository
    elsewhere = re.compile(r"reports/|tables\.md|index\.md|NAME\.md|artifact/README\.md|gpu-check[\w-]*\.md")
    sources = [ROOT / "README.md", ROOT / "Makefile", *ROOT.glob("docs/*.md"), *ROOT.glob("conf/**/*.yaml"),
               *[p for d in ("vp", "harness", "hydra_plugins", "scripts") for p in (ROOT / d).rglob("*.py")]]
    missing = []
    for src in sources:
        for ref in named.findall(src.read_text()):
            bases = (ROOT, src.parent, ROOT / "docs")
            if not elsewhere.search(ref) and not any((base / ref).exists() for base in bases):
                missing.append(f"{src.relative_to(ROOT)}: {ref}")
    assert not missing, missing


def test_harness_modules_import_no_circle():
    """No harness module imports, at its top or inside a function, one that imports it back (directly or through
    others): calibrate <-> published.calibrate and records <-> timeline were such circles."""
    import ast

    def module(path) -> str:
        parts = path.relative_to(ROOT).with_suffix("").parts
        return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)

    files = {module(p): p for p in (ROOT / "harness").rglob("*.py")}
    edges = {}
    for name, path in files.items():
        targets = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                targets |= {node.module} | {f"{node.module}.{a.name}" for a in node.names}
            elif isinstance(node, ast.Import):
                targets |= {a.name for a in node.names}
        edges[name] = {t for t in targets if t in files and t != name}

    def reach(start: str) -> set[str]:
        seen, todo = set(), [start]
        while todo:
            for nxt in edges[todo.pop()] - seen:
                seen.add(nxt)
                todo.append(nxt)
        return seen

    circles = sorted(f"{a} <-> {b}" for a in edges for b in edges[a] if a in reach(b) and a < b)
    assert not circles, circles
