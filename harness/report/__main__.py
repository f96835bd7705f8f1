"""python -m harness.report [--results-dir results] [--reports-dir DIR] [--experiment NAME ...]

The reports go to --reports-dir, by default a folder beside --results-dir: `reports` for a folder named `results`
(results -> reports), else `reports-<name>` (/tmp/b -> /tmp/reports-b).

Prints the README.md of each report written. Exit code 2 when there is nothing to report on.
"""
import argparse
import sys
from pathlib import Path

from harness.report.build import INDEX, build_reports, report_dir_for
from vp.renamed import refuse_renamed_flags

def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m harness.report",
                                     description="Tables and figures of <reports-dir>/<experiment>/ from the "
                                                 "records of <results-dir>/<experiment>/.")
    parser.add_argument("--results-dir", type=Path, default=Path("results"))
    parser.add_argument("--reports-dir", type=Path, default=None,
                        help="default: beside --results-dir, `reports` for a folder named `results`, else "
                             "`reports-<name>`")
    parser.add_argument("--experiment", nargs="+", action="extend", metavar="NAME",
                        help="experiments to report on (default: every folder under --results-dir)")
    try:
        args = refuse_renamed_flags(parser).parse_args(argv)
        written = build_reports(args.results_dir, args.reports_dir, args.experiment)
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    for path in written:
        print(path)
    print(report_dir_for(args.results_dir, args.reports_dir) / INDEX)
    return 0


if __name__ == "__main__":
    sys.exit(main())
