"""A pool of gloo processes that start once per test session and run many checks.

Each spawned process pays about 3 s importing torch, so checks share processes: `pool.run(fn, *args)`
runs the module-level function fn(rank, world, *args) on every rank and returns the per-rank results,
or fails with the traceback of each rank that raised. Rendezvous goes through a fresh file.
"""
import multiprocessing as mp
import os
import traceback
from datetime import timedelta


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
        ctx = mp.get_context("spawn")
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
