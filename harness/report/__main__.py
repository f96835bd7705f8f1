"""python -m harness.report [--results-dir results] [--reports-dir DIR] [--experiment NAME ...] [--logger wandb]

The reports go to --reports-dir, by default a folder beside --results-dir: `reports` for a folder named `results`
(results -> reports), else `reports-<name>` (/tmp/b -> /tmp/reports-b).

With --logger NAME (conf/logger/NAME.yaml: wandb, wandb_online; `make report` gives wandb), each experiment's report
is also logged to W&B as a report run, and every record W&B does not hold yet is logged (harness.report.wandb_report).

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
    parser.add_argument("--logger", default="off", metavar="NAME",
                        help="also log the reports and the records W&B lacks to W&B, as the sweep's logger=NAME "
                             "(conf/logger/NAME.yaml: wandb offline, wandb_online; default off)")
    try:
        args = refuse_renamed_flags(parser).parse_args(argv)
        logger = logger_config(args.logger)
        written = build_reports(args.results_dir, args.reports_dir, args.experiment)
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    for path in written:
        print(path)
    if logger["mode"] != "disabled":
        from harness.report.wandb_report import log_report

        for path in written:
            log_report(args.results_dir, args.reports_dir, path.parent.name, logger, Path.cwd(),
                       lambda line: print(line, file=sys.stderr))
    print(report_dir_for(args.results_dir, args.reports_dir) / INDEX)
    return 0


def logger_config(name: str) -> dict:
    """conf/logger/NAME.yaml as a dict; ValueError naming the choices."""
    from omegaconf import OmegaConf

    folder = Path(__file__).resolve().parents[2] / "conf" / "logger"
    choices = sorted(p.stem for p in folder.glob("*.yaml"))
    if name not in choices:
        raise ValueError(f"--logger {name}: not one of {', '.join(choices)} (conf/logger/)")
    return OmegaConf.to_container(OmegaConf.load(folder / f"{name}.yaml"), resolve=True)


if __name__ == "__main__":
    sys.exit(main())
