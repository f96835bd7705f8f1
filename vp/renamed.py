"""The project's one set of names, and the old spellings it refuses for one release with a pointer to the new one.

One concept has one name, written as each place writes names: `results_dir` as a Hydra key, `--results-dir` as a
command-line flag, `RESULTS_DIR` as a Make variable; `harness.plan_check` as a module, `plan-check` as a Make target.
Record fields keep their names. An old spelling listed here is refused where it used to work (a flag by the
parsers that take its new name, a Make variable by the Makefile, a module or command by a stand-in that says where
it went), never silently accepted; after one release the entries and stand-ins go, and the old spelling is simply
unknown.
"""
import argparse

# old flag -> new flag (refused by every parser that has the new one: refuse_renamed_flags)
FLAGS = {
    "--results": "--results-dir",  # the results folder, as harness.sweep's results_dir= and harness.report's flag
    "--reps": "--rounds",  # repeats of a measurement, as every other tool counts them
    "--repeat": "--rounds",
    "--vocab": "--vocab-size",  # a vocabulary size in tokens (vocab= is the Hydra group of named sizes)
    "--timeout": "--timeout-s",  # seconds carry their unit, as --budget-s and run.timeout_s
}
# old Make variable -> new (the Makefile refuses them; tests/test_front_door.py checks the two tables agree)
MAKE_VARIABLES = {"PLAN_HW": "HARDWARE", "PAPER_HW": "HARDWARE"}
# old module or command -> where it went
MODULES = {"harness.plancheck": "harness.plan_check", "harness.modelcheck": "harness.model_check"}
COMMANDS = {"vp.bench tpsim": "python -m harness.sweep experiment=tp_scaling backend=sim (make paper-tables), "
                              "whose report reports/tp_scaling/ has the same grids and the paper's claims"}


class _Renamed(argparse.Action):
    def __init__(self, option_strings, dest, new: str = "", **kw):
        super().__init__(option_strings, dest=argparse.SUPPRESS, nargs="?", default=argparse.SUPPRESS,
                         help=argparse.SUPPRESS)
        self.new = new

    def __call__(self, parser, namespace, values, option_string=None):
        parser.error(f"{option_string} is renamed {self.new}; write {self.new}"
                     + (f" {values}" if values is not None else ""))


def refuse_renamed_flags(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Give `parser` the old spelling of each of its flags that was renamed: used, it exits as argparse does (2)
    naming the new flag. Registered as flags of their own, the old spellings are no longer taken by argparse as
    abbreviations of the new ones (--results of --results-dir)."""
    have = parser._option_string_actions
    for old, new in FLAGS.items():
        if new in have and old not in have:
            parser.add_argument(old, action=_Renamed, new=new)
    return parser


def moved(old: str) -> str:
    """The message of a module or command that moved."""
    new = MODULES.get(old) or COMMANDS[old]
    how = f"python -m {new}" if old in MODULES else new
    return f"{old} is renamed: use {how} (the old name is refused for one release, then removed)"
