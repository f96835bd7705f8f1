"""The sweeper of `python -m harness.sweep -m key=a,b`: Hydra hands it the command line, and it runs the
harness's own plan (the experiment's grid with the command line's axes put in, every job checked before any
starts, jobs already done skipped, dispatch through the cluster group) instead of one Hydra job per value.
conf/config.yaml selects it (`override hydra/sweeper: vp`, conf/hydra/sweeper/vp.yaml). Hydra finds plugins
only in the hydra_plugins package, hence this file."""
import sys

from hydra.plugins.sweeper import Sweeper


class VPSweeper(Sweeper):
    def __init__(self, params=None):
        self.params = params
        self.config = None

    def setup(self, *, hydra_context, task_function, config) -> None:
        self.config = config

    def sweep(self, arguments: list[str]) -> list:
        from harness.sweep import start

        code = start(self.config.hydra, arguments)
        if code:
            sys.exit(code)
        return []
