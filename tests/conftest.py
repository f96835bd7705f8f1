import os
import signal
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
# A suite started in the background of a non-interactive shell (`make test &`) inherits SIGINT ignored, and so would
# every process it starts: the Ctrl-C tests, which send SIGINT as a terminal does, would see it ignored.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


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


def pytest_collection_modifyitems(config, items):
    """Under pytest-xdist (make test runs `-n` workers with --dist loadgroup), the tests that submit to the one
    SLURM cluster run on one worker, one after another: two at once would queue behind each other's jobs. The tests
    of a module that share a module-scoped fixture (a report built, a grid trained on the 8-process pool) run on one
    worker too, so the fixture is made once, not once per worker that runs one of them.
    The tests that train on the gloo pools run on one worker, one after another: their ranks wait on each other, and
    with two or three such runs at once on 2 cores every rank waits longer for its peers to be scheduled, which
    costs several times the CPU (a pp 2 x tp 2 run took 1-3 CPU-s alone, 6-16 s beside others in the suite)."""
    for item in items:
        if item.get_closest_marker("slurm"):
            item.add_marker(pytest.mark.xdist_group("slurm"))
        elif "pools" in item.fixturenames:
            item.add_marker(pytest.mark.xdist_group("gloo"))
        elif _uses_module_fixture(item):
            item.add_marker(pytest.mark.xdist_group(item.module.__name__))


def _uses_module_fixture(item) -> bool:
    info = getattr(item, "_fixtureinfo", None)
    return info is not None and any(defs and defs[-1].scope == "module" for defs in info.name2fixturedefs.values())
