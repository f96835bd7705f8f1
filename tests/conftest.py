import os
import signal
import sys
import tempfile
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from dist_pool import DistPool  # noqa: E402

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
