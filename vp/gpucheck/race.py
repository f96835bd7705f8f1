"""Is IF's input overwritten before the reduce reads it? (issue: the IF step runs on a side stream and calls
work.wait() there; recent ProcessGroupNCCL releases a collective's stashed inputs at wait() after syncing only
the current, side, stream; the non-first ranks drop `local`, allocated on the compute stream, at once, so the
compute stream's next allocation of that size may take its memory before NCCL has read it.)

On a world-size-1 NCCL group, with the collective held back by a sleep kernel (torch.cuda._sleep) ahead of it:

- pattern: the pattern itself, with a collective that reads its input at world size 1 (all_gather_into_tensor:
  NCCL copies input to output; an in-place reduce of one rank reads nothing). The input is dropped right after
  wait(), a same-size tensor is allocated on the compute stream and filled with 2s: if the collective's output
  holds 2s, the input was overwritten before it was read. The control keeps the input alive; its output must
  hold the input's 1s, or the probe proves nothing.
- runtime: the runtime's own IF launch (vp.runtime.executor.Executor.launch) on a non-first rank, its group's
  communicator this world of one; the compute stream sleeps first, so IF's side stream and NCCL wait behind it.
  If the allocator hands IF's input to the compute stream while the side stream's work has not finished, the
  input of a pending reduce is free for reuse: the race at world size > 1. A fix (record_stream on the side
  stream, or keeping the tensor until the reduce completes) makes it not reused.

On CPU (gloo, a worker thread that holds the input for the whole step) the runtime probe only exercises its code.
"""
import contextlib
import os
import tempfile
from pathlib import Path

import torch
import torch.distributed as dist

NUMEL = 2**21  # 8 MiB of fp32: a large-pool block the allocator hands back exactly (after empty_cache)
SLEEP_CYCLES = 200_000_000  # ~0.1 s at ~2 GHz: the collective runs long after the host is done


@contextlib.contextmanager
def fresh_rendezvous():
    """A new file:// rendezvous each time (a reused file joins an old run's store), removed afterwards."""
    with tempfile.TemporaryDirectory(prefix="gpucheck-rendezvous-") as folder:
        yield f"file://{folder}/store"


def pattern(device: torch.device, keep: bool) -> dict:
    compute, side = torch.cuda.current_stream(device), torch.cuda.Stream(device)
    torch.cuda.synchronize(device)
    torch.cuda.empty_cache()
    local = torch.full((NUMEL,), 1.0, device=device)  # on the compute stream, as IF's lookup
    out = torch.zeros(NUMEL, device=device)
    ptr, held = local.data_ptr(), None
    side.wait_stream(compute)
    with torch.cuda.stream(side):
        torch.cuda._sleep(SLEEP_CYCLES)  # NCCL's stream waits for the side stream when the collective is issued
        work = dist.all_gather_into_tensor(out, local, async_op=True)
        work.wait()  # on the side stream, as vp.comm.Comm.block does inside the step
        done = torch.cuda.Event()
        done.record(side)
    if keep:
        held = local
    del local, work
    new = torch.empty(NUMEL, device=device)  # the compute stream's next allocation of that size
    reused, pending = new.data_ptr() == ptr, not done.query()
    new.fill_(2.0)
    torch.cuda.synchronize(device)
    result = {"reused": reused, "pending": pending, "overwritten": bool((out == 2.0).any()),
              "intact": bool((out == 1.0).all())}
    del held
    return result


def runtime_if(device: torch.device) -> dict:
    """The executor's IF launch on rank 1 of a two-rank IF group whose communicator is this one-rank world (so its
    reduce, rooted at index 0, is this process's own NCCL call)."""
    from vp.comm import Comm, Group
    from vp.config import RunConfig
    from vp.runtime.executor import Executor, RankModel
    from vp.runtime.memory import ActivationMeter
    from vp.runtime.state import IterState
    from vp.schedule import Action, build
    from vp.schedule.rules import collective

    cuda = device.type == "cuda"
    cfg = RunConfig(method="vocab-2", pp=2, hidden=4096, seq_len=NUMEL // 4096, device=device.type,
                    dtype="bf16" if cuda else "fp32")
    sched = build(cfg.method, cfg.pp, cfg.microbatches, 1)
    comm = Comm({"IF": Group((0, 1), 1, dist.group.WORLD)}, device)
    ex = Executor(cfg, sched, 1, RankModel({}), comm, device, ActivationMeter([]))
    ex.st = IterState(0)
    if cuda:
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()
    ex.st.embed_local[0] = torch.full((1, cfg.seq_len, cfg.hidden), 1.0, device=device)  # IF0's lookup
    ptr = ex.st.embed_local[0].data_ptr()
    inst = collective(sched, "IF", 0)
    if cuda:
        torch.cuda._sleep(SLEEP_CYCLES)  # on the compute stream: IF's side stream, then NCCL, wait behind it
    ex.launch(Action(1, "IF", 0), inst)
    done = None
    if cuda:
        done = torch.cuda.Event()
        done.record(comm.stream("IF").stream)
    new = torch.empty(1, cfg.seq_len, cfg.hidden, device=device)
    result = {"reused": new.data_ptr() == ptr, "pending": bool(done is not None and not done.query())}
    new.fill_(2.0)
    ex.drain(60.0)
    if cuda:
        torch.cuda.synchronize(device)
    comm.groups = {}  # the world is destroyed by the caller
    return result


def verdict(pattern_drop: dict | None, pattern_keep: dict | None, runtime: dict,
            cuda: bool) -> tuple[bool | None, list]:
    """(ok, summary): ok is None on CPU, False when the probe is invalid or the runtime's IF input is reused while
    its reduce is pending."""
    if not cuda:
        return None, ["CPU: the runtime's IF launch ran (gloo holds the input in its worker thread); the race needs "
                      "CUDA streams and NCCL, so nothing is decided here"]
    lines, ok = [], True
    if not pattern_keep["intact"]:
        return False, ["probe INVALID: with its input kept alive the collective did not deliver it "
                       f"({pattern_keep}); nothing can be concluded"]
    if pattern_drop["overwritten"]:
        lines.append("pattern: race CONFIRMED: the input, dropped after work.wait() on the side stream, was "
                     "overwritten by the compute stream before NCCL read it (this torch releases it at wait())")
    elif pattern_drop["reused"] and pattern_drop["pending"]:
        lines.append("pattern: the input's memory was handed out while the collective was pending, but the "
                     "collective read it first (the race exists; the timing hid it)")
    else:
        lines.append(f"pattern: refuted for this torch: the input's memory was not reused while the collective "
                     f"was pending ({pattern_drop})")
    if runtime["reused"] and runtime["pending"]:
        ok = False
        lines.append("runtime: RACE: the executor's IF input on a non-first rank was given to the compute stream "
                     "while its reduce was still queued (keep it alive or record_stream it on the side stream)")
    elif runtime["pending"]:
        lines.append("runtime: safe: the executor's IF input was not reused while its reduce was pending")
    else:
        ok = False
        lines.append("runtime: probe INVALID: the reduce had finished before the next allocation (no delay)")
    return ok, lines


def run(device: torch.device, out: Path) -> dict:
    cuda = device.type == "cuda"
    kw = {"device_id": device} if cuda else {}
    with fresh_rendezvous() as rendezvous:
        dist.init_process_group("nccl" if cuda else "gloo", init_method=rendezvous, rank=0, world_size=1, **kw)
        try:
            drop = pattern(device, keep=False) if cuda else None
            keep = pattern(device, keep=True) if cuda else None
            runtime = runtime_if(device)
        finally:
            dist.destroy_process_group()
    ok, summary = verdict(drop, keep, runtime, cuda)
    summary.append(f"TORCH_NCCL_AVOID_RECORD_STREAMS={os.environ.get('TORCH_NCCL_AVOID_RECORD_STREAMS')}")
    return {"ok": ok, "summary": summary, "pattern_drop": drop, "pattern_keep": keep, "runtime": runtime}
