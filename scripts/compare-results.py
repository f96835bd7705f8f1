"""Two results folders (and their reports) compared field by field: every record of each experiment, and the
report's tables. For checking that a change to the simulator, the sweep or the reports leaves their output alone.

A record is compared whole but for what differs between any two runs of the same code: env.start and env.end
(timestamps) and env.simulator_version (a hash of the simulator's source, which changes with any edit to it, by
design). A report is compared on tables.md, runs.csv, every .tex table and the README, but for the results folder
the README names; figures are not compared (their pixels follow the plotting libraries).

Usage:  python scripts/compare-results.py OLD_RESULTS NEW_RESULTS [EXPERIMENT ...] [--reports OLD_REPORTS NEW_REPORTS]
Exits 0 when everything compared is equal, else 1 after naming each difference (the first 20 per experiment).
"""
import argparse
import json
import re
import sys
from pathlib import Path

VOLATILE_ENV = ("start", "end", "simulator_version")


def _records(folder: Path) -> dict[str, dict]:
    out = {}
    for path in sorted(folder.glob("*.json")):
        rec = json.loads(path.read_text())
        for key in VOLATILE_ENV:
            (rec.get("env") or {}).pop(key, None)
        out[rec["run_id"]] = rec
    return out


def differences(old, new, where: str = "") -> list[str]:
    """Every path at which two JSON values differ (type, keys, length or value)."""
    if isinstance(old, dict) and isinstance(new, dict):
        out = [f"{where}.{k}: only in {'old' if k in old else 'new'}" for k in sorted(set(old) ^ set(new))]
        return out + [d for k in sorted(set(old) & set(new)) for d in differences(old[k], new[k], f"{where}.{k}")]
    if isinstance(old, list) and isinstance(new, list):
        if len(old) != len(new):
            return [f"{where}: length {len(old)} != {len(new)}"]
        return [d for i, (a, b) in enumerate(zip(old, new)) for d in differences(a, b, f"{where}[{i}]")]
    return [] if type(old) is type(new) and old == new else [f"{where}: {old!r} != {new!r}"]


def compare_records(old: Path, new: Path) -> tuple[int, list[str]]:
    a, b = _records(old), _records(new)
    out = [f"{run_id}: only in {'old' if run_id in a else 'new'}" for run_id in sorted(set(a) ^ set(b))]
    out += [f"{run_id}{d}" for run_id in sorted(set(a) & set(b)) for d in differences(a[run_id], b[run_id])]
    return len(set(a) & set(b)), out


def _report_files(folder: Path) -> dict[str, str]:
    files = {p.name: p.read_text() for p in sorted(folder.iterdir())
             if p.name in ("README.md", "tables.md", "runs.csv") or p.suffix == ".tex"}
    if "README.md" in files:  # the results folder it names, as it was given (relative or not)
        files["README.md"] = re.sub(r"from the records in `[^`]*`", "from the records in `<results>`",
                                    files["README.md"])
    return files


def compare_report(old: Path, new: Path) -> tuple[int, list[str]]:
    a, b = _report_files(old), _report_files(new)
    out = [f"{name}: only in {'old' if name in a else 'new'}" for name in sorted(set(a) ^ set(b))]
    for name in sorted(set(a) & set(b)):
        if a[name] != b[name]:
            lines = [(i, x, y) for i, (x, y) in enumerate(zip(a[name].splitlines(), b[name].splitlines())) if x != y]
            out.append(f"{name}: differs" + (f" first at line {lines[0][0] + 1}: {lines[0][1]!r} != {lines[0][2]!r}"
                                              if lines else " in length"))
    return len(a), out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("old", type=Path)
    ap.add_argument("new", type=Path)
    ap.add_argument("experiments", nargs="*", help="default: every folder of OLD")
    ap.add_argument("--reports", nargs=2, type=Path, metavar=("OLD_REPORTS", "NEW_REPORTS"))
    args = ap.parse_args(argv)
    names = args.experiments or sorted(p.name for p in args.old.iterdir() if p.is_dir() and p.name[0] != ".")
    failed = False
    for name in names:
        checked, diffs = compare_records(args.old / name, args.new / name)
        if args.reports:
            files, report_diffs = compare_report(args.reports[0] / name, args.reports[1] / name)
            diffs += [f"report {d}" for d in report_diffs]
        print(f"{name}: {checked} records" + (f", {files} report files" if args.reports else "") +
              (" equal" if not diffs else f", {len(diffs)} differences"))
        for d in diffs[:20]:
            print(f"  {d}")
        failed |= bool(diffs)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
