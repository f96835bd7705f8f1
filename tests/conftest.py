import os
import shutil
import signal
import subprocess
import sys
import tempfile
import types
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from dist_pool import DistPool, forked  # noqa: E402

os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("WANDB_SILENT", "true")
# calibrated profiles go to the user's config folder (harness/profiles.py): a throwaway one, never the real one
os.environ["VP_HARNESS_CONFIG"] = tempfile.mkdtemp(prefix="vp-harness-conf-")
# what the planner keeps on disk between processes (vp.disk_cache): off, never the user's folder (a test process
# prices hundreds of small problems on one profile, and each search would write the profile's growing tables again);
# tests/test_planner_disk_cache.py turns it on in a folder of its own
os.environ["VP_CACHE_DIR"] = ""
# A suite started in the background of a non-interactive shell (`make test &`) inherits SIGINT ignored, and so would
# every process it starts: the Ctrl-C tests, which send SIGINT as a terminal does, would see it ignored.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


# External tools the tests call, by marker: a test marked `slurm` needs a SLURM cluster that answers (every command
# harness.slurm calls on PATH, and sinfo naming a partition that is up); one marked `needs("make")` needs that program
# on PATH. Both are decided here, before the test body runs, so no test can call a tool first and ask afterwards.
# Where one is missing the test skips; with VP_REQUIRE_SLURM=1 (CI, after make slurm-up) a missing SLURM fails it.
_SLURM_PARTITION: list = []  # [partition name or None], once per session


def slurm_partition() -> str | None:
    """The default partition of a SLURM cluster that answers here, or None where there is none."""
    if not _SLURM_PARTITION:
        from harness.slurm import COMMANDS

        name = None
        if all(shutil.which(c) for c in COMMANDS):
            try:
                out = subprocess.run(["sinfo", "-h", "-o", "%P %a"], capture_output=True, text=True, timeout=20)
            except (OSError, subprocess.SubprocessError):
                out = None
            up = [line.split() for line in out.stdout.splitlines()] if out and out.returncode == 0 else []
            name = next((p.rstrip("*") for p, a, *_ in up if a == "up"), None)
        _SLURM_PARTITION.append(name)
    return _SLURM_PARTITION[0]


def pytest_runtest_setup(item):
    if item.get_closest_marker("slurm") and slurm_partition() is None:
        if os.environ.get("VP_REQUIRE_SLURM") == "1":
            pytest.fail("VP_REQUIRE_SLURM=1 but no SLURM answers here; run `make slurm-up` first")
        pytest.skip("no SLURM cluster here (make slurm-up starts one)")
    for mark in item.iter_markers("needs"):
        missing = [tool for tool in mark.args if shutil.which(tool) is None]
        if missing:
            pytest.skip(f"needs {', '.join(missing)} on PATH")


@pytest.fixture
def partition() -> str:
    """The SLURM partition a `slurm` test submits to (the marker has made sure there is one)."""
    name = slurm_partition()
    assert name is not None, "a test that takes the partition fixture carries @pytest.mark.slurm"
    return name


@pytest.fixture
def user_conf(tmp_path, monkeypatch):
    """A user's profile folder of their own (VP_HARNESS_CONFIG), empty, and tmp_path as the working directory."""
    monkeypatch.setenv("VP_HARNESS_CONFIG", str(tmp_path / "conf"))
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.fixture(scope="session")
def pools(tmp_path_factory):
    """pools(world) -> a DistPool of that many gloo processes, shared by every test of the session."""
    made = {}

    def get(world: int) -> DistPool:
        if world not in made:
            made[world] = DistPool(world, tmp_path_factory.mktemp(f"pool{world}"))
        return made[world]

    yield get
    for pool in made.values():
        pool.close()


@pytest.fixture(scope="session", autouse=True)
def local_runs_fork_their_ranks():
    """Runs that tests start in this process (vp.launch.launch_local, under harness sweeps and the peer bench) fork
    their ranks from the pools' forkserver, which imported torch once, instead of spawning interpreters that import
    it again (about 3 s of CPU per rank). What differs is only how a rank's interpreter comes to be: each still
    unpickles its function and config, starts in the starter's folder with its environment at the start (as a
    spawned one), starts its own process group, and is watched, killed and reported on by launch_local as in a
    user's run. The spawned start itself is what the tests through the command line exercise
    (python -m vp.train and python -m harness.sweep in tests/test_train_cli.py, test_refusals.py,
    test_harness_runs.py and test_tp_train.py run as processes)."""
    import vp.launch

    def get_context(method):
        assert method == "spawn", f"vp.launch asked for {method!r}; this fixture stands in for spawn only"
        return forked()

    patch = pytest.MonkeyPatch()
    patch.setattr(vp.launch, "mp", types.SimpleNamespace(get_context=get_context))
    yield
    patch.undo()


# make test's workers (pytest-xdist, --dist loadgroup): the tests below run on one worker each group, one after another.
# - slurm: they submit to the one SLURM cluster; two at once would queue behind each other's jobs.
# - gloo: they train on the gloo pools; their ranks wait on each other, and with two or three such runs at once on
#   2 cores every rank waits longer for its peers to be scheduled, which costs several times the CPU (a pp 2 x tp 2
#   run took 1-3 CPU-s alone, 6-16 CPU-s beside others in the suite).
# - a module's tests that share a module-scoped fixture (a report built, a real sweep run): the fixture is made once,
#   not once per worker that runs one of them.
# The groups are named here, by test address, for the scheduler: pytest 9 ignores the renamed node ids by which
# pytest-xdist carries xdist_group marks to it. pytest_collection_modifyitems checks that they cover those tests.
GROUPS = {"test_harness_slurm.py": "slurm", "test_cluster2.py::test_cluster2_slurm_": "slurm",
          "test_report.py": "report", "test_tp_report.py": "tp_report", "test_dashboard.py": "dashboard",
          "test_harness_runs.py::test_killed_rank_": "real_sweep", "test_harness_runs.py::test_wandb_": "real_sweep",
          **dict.fromkeys(["test_mesh_train.py", "test_nccl.py", "test_runtime.py", "test_tp_bench.py",
                           "test_tp_layers.py", "test_tp_train.py", "test_vocab.py", "test_precision.py",
                            "test_prod_features.py", "test_prod_features_matrix.py", "test_gpu_trust.py",
                            "test_sequence_parallel.py"], "gloo")}


def group_of(nodeid: str) -> str | None:
    address = nodeid.split("/")[-1]
    return next((g for prefix, g in GROUPS.items() if address.startswith(prefix)), None)


def pytest_xdist_make_scheduler(config, log):
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class Groups(LoadScopeScheduling):
        """loadgroup's scheduling (work units in order of size, largest first) with the groups of GROUPS."""

        def _split_scope(self, nodeid: str) -> str:
            return group_of(nodeid) or nodeid

    return Groups(config, log)


def pytest_collection_modifyitems(config, items):
    """Every test that needs a group (above) is in its group: a new module of such tests gets its line in GROUPS."""
    for item in items:
        need = "slurm" if item.get_closest_marker("slurm") else "gloo" if "pools" in item.fixturenames else \
            "a group of its own module's tests" if _uses_module_fixture(item) else None
        got = group_of(item.nodeid)
        if need and (got is None or need in ("slurm", "gloo") and got != need):
            raise pytest.UsageError(f"{item.nodeid} needs {need} in tests/conftest.py GROUPS; it is in {got}")


def _uses_module_fixture(item) -> bool:
    info = getattr(item, "_fixtureinfo", None)
    return info is not None and any(defs and defs[-1].scope == "module" for defs in info.name2fixturedefs.values())
