"""A pipeline transfer as the runtime makes it on CPU (vp.runtime.executor: SF posts dist.isend and goes on; RF posts
dist.irecv and waits at once), timed at the receiver in two cases: both sides post together, and the receive is
posted 0.3 s after the send (the receiver was computing). Equal times mean the data moves only once the receive
is posted (a rendezvous: gloo and NCCL both), so the transfer overlaps the sender's compute, never the
receiver's: what vp.schedule.simulate models (a send takes no time; a receive ends at max(sent, reached) plus the
transfer). A late receive near zero would mean the data had moved during the receiver's compute.

    .venv/bin/python scripts/p2p-late-receive.py [MiB ...]   (default 1 4 16; 15 repetitions of each case)
"""
import os
import statistics
import sys
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

LATE_S = 0.3


def work(rank: int, n: int, reps: int, init: str) -> None:
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=2)
    t, waits = torch.ones(n), {"together": [], "late": []}
    for mode in ["together", "late"] * reps:
        dist.barrier()
        if rank == 0:
            dist.isend(t, 1).wait()
            continue
        if mode == "late":
            time.sleep(LATE_S)
        buf = torch.empty(n)
        t0 = time.perf_counter()
        dist.irecv(buf, 0).wait()
        waits[mode].append(time.perf_counter() - t0)
    if rank == 1:
        for mode, v in waits.items():
            print(f"{n * 4 / 2**20:g} MiB {mode:>8}: receive {1e3 * statistics.median(v):.2f} ms median "
                  f"(least {1e3 * min(v):.2f}, most {1e3 * max(v):.2f}, n {len(v)})", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as folder:
        for mib in [float(a) for a in sys.argv[1:]] or [1, 4, 16]:
            init = f"file://{folder}/rendezvous-{mib}-{os.getpid()}"
            mp.spawn(work, args=(int(mib * 2**18), 15, init), nprocs=2)
