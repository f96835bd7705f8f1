"""A command line's main(argv) run in this test's process, its output captured: for the tests of refusals, which
check the exit code and the messages of input that never reaches a run. A `python -m vp.train` process would
pay about 3 s importing torch for each; the entry points themselves are started as processes by the tests of
real runs (tests/test_train_cli.py, tests/test_refusals.py)."""
import contextlib
import importlib
import io
import os
import subprocess
from unittest import mock


def run_main(module: str, *args, cwd=None, env=None) -> subprocess.CompletedProcess:
    """module's main(argv) as `python -m module` runs it, in cwd with env added, no GPU visible (as
    CUDA_VISIBLE_DEVICES="" makes it) and no run allowed to start: a refusal must come before any process."""
    mod = importlib.import_module(module)
    main = mod.main if hasattr(mod, "main") else importlib.import_module(f"{module}.__main__").main
    out, err = io.StringIO(), io.StringIO()

    def started(*_, **__):
        raise AssertionError(f"{module} {' '.join(args)} started a run instead of refusing it")

    with contextlib.ExitStack() as stack:
        if cwd is not None:
            stack.enter_context(contextlib.chdir(cwd))
        stack.enter_context(mock.patch.dict(os.environ, env or {}))
        stack.enter_context(mock.patch("torch.cuda.device_count", return_value=0))
        stack.enter_context(mock.patch("vp.launch.launch_local", started))
        stack.enter_context(mock.patch("vp.train.launch_local", started))
        stack.enter_context(mock.patch("vp.run.run_rank", started))  # a launcher's process runs its rank
        stack.enter_context(contextlib.redirect_stdout(out))
        stack.enter_context(contextlib.redirect_stderr(err))
        try:
            code = main(list(args))
        except SystemExit as end:  # argparse's own refusals
            code = end.code if isinstance(end.code, int) else int(end.code is not None)
    return subprocess.CompletedProcess([module, *args], code, out.getvalue(), err.getvalue())
