"""A pool of gloo processes that start once per test session and run many checks.

`pool.run(fn, *args)` runs the module-level function fn(rank, world, *args) on every rank and returns the
per-rank results, or fails with the traceback of each rank that raised. Rendezvous goes through a fresh file.

The processes are forked from one forkserver that imported torch and vp once (PRELOAD): a spawned process pays
about 3 s of CPU importing torch (a minute on a loaded 2-core machine), so a session's pools of 2, 4, 8 and 16
ranks paid it 30 times. A fork of a process that has imported torch but run nothing is what DataLoader workers
are; each process still starts its own gloo group after the fork. The runs that tests start in this process
(vp.launch.launch_local) fork their ranks from the same server (conftest.py).
"""
import multiprocessing as mp
import os
import traceback
from datetime import timedelta

# imported once in the forkserver, before any pool starts; a module that fails to import there is imported by each
# process on first use instead (the forkserver ignores it), so the list is a speed-up, never a requirement
PRELOAD = ["torch", "torch.distributed", "vp.launch", "vp.run", "vp.reference", "vp.nccl", "vp.tp.context",
           "vp.bench.peer"]


class _SpawnLikeProcess(mp.context.ForkServerProcess):
    """A forked process that starts with the environment of the process that started it, as a spawned one does
    (a plain forkserver child has the server's, from when the server started); its working folder and sys.path
    are the starter's already (multiprocessing's preparation data)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._environ = dict(os.environ)

    def run(self):
        os.environ.clear()
        os.environ.update(self._environ)
        super().run()


class _Context(mp.context.ForkServerContext):
    Process = _SpawnLikeProcess


def forked():
    """The multiprocessing context whose processes fork from the preloaded server."""
    ctx = _Context()
    ctx.set_forkserver_preload(PRELOAD)  # takes effect when the forkserver starts, with the first pool
    return ctx


def _worker(rank, world, init_method, conn):
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=init_method, rank=rank, world_size=world,
                            timeout=timedelta(seconds=120))
    while True:
        msg = conn.recv()
        if msg is None:  # the session is over: leave without tearing down the groups (collective, and slow
            os._exit(0)  # with the many subgroups the checks made)
        fn, args = msg
        try:
            conn.send(("ok", fn(rank, world, *args)))
        except BaseException:  # noqa: BLE001 - every failure goes back to the test
            conn.send(("error", traceback.format_exc()))


class DistPool:
    def __init__(self, world: int, tmpdir):
        ctx = forked()
        self.world, self.conns, self.procs = world, [], []
        init = f"file://{tmpdir}/rendezvous-{world}"
        for rank in range(world):
            parent, child = ctx.Pipe()
            proc = ctx.Process(target=_worker, args=(rank, world, init, child), daemon=True)
            proc.start()
            self.conns.append(parent)
            self.procs.append(proc)

    def run(self, fn, *args, timeout: float = 300.0):
        for conn in self.conns:
            conn.send((fn, args))
        results, errors = [], []
        for rank, conn in enumerate(self.conns):
            if not conn.poll(timeout):
                raise TimeoutError(f"rank {rank} did not answer within {timeout} s running {fn.__name__}")
            status, value = conn.recv()
            results.append(value)
            if status == "error":
                errors.append(f"--- rank {rank} ---\n{value}")
        if errors:
            raise AssertionError(f"{fn.__name__} failed:\n" + "\n".join(errors))
        return results

    def close(self):
        for conn in self.conns:
            conn.send(None)
        for proc in self.procs:
            proc.join(timeout=10)
            if proc.is_alive():
                proc.kill()
