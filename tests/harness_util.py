"""What the harness tests share: the sweep in this process, the CLI in a subprocess, the records a sweep wrote."""
import json
import subprocess
import sys
from pathlib import Path

from hydra import initialize_config_dir

from harness.sweep import run

ROOT = Path(__file__).parents[1]
CONF = str(ROOT / "conf")
TINY = ["model=tiny", "run.seq_len=64"]  # the smoke experiment's model is too large for tests


def sweep(tmp_path, *overrides, report=False, logger="off"):
    """harness.sweep in this process (compose + run, as @hydra.main does); returns (exit code, log lines)."""
    overrides = [f"results_dir={tmp_path}/results", f"reports_dir={tmp_path}/reports", f"report={report}",
                 f"logger={logger}", f"cluster.folder={tmp_path}/submitit", *overrides]
    lines = []
    with initialize_config_dir(CONF, version_base="1.3"):
        code = run(overrides, log=lines.append)
    return code, lines


def cli(*args, cwd=ROOT, timeout=120):
    return subprocess.run([sys.executable, "-m", "harness.sweep", *args], capture_output=True, text=True, cwd=cwd,
                          timeout=timeout)


def records(tmp_path, experiment="smoke"):
    return [json.loads(p.read_text()) for p in sorted((tmp_path / "results" / experiment).glob("????????????.json"))]


def files_under(path: Path) -> list[Path]:
    return [p for p in path.rglob("*") if p.is_file()] if path.exists() else []


FIXTURES = Path(__file__).parent / "fixtures" / "records"  # tests/fixtures/records/mini: the reports' fixture records


def fixture_records(backend: str | None = None) -> list[dict]:
    recs = [json.loads(p.read_text()) for p in sorted((FIXTURES / "mini").glob("*.json"))]
    return [r for r in recs if backend is None or r["backend"] == backend]
