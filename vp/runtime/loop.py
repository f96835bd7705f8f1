"""The flat dispatch loop over one rank's actions, one optimizer step per iteration.

On a failure it raises RankFailure naming the rank, iteration, step and action, with the rank x step grid
around the failing action marked.
"""
import os
import time

import torch

from vp.runtime.data_parallel import DataParallel
from vp.runtime.executor import Executor, RankModel
from vp.runtime.memory import ActivationMeter, held_static
from vp.runtime.state import IterState
from vp.schedule import Schedule
from vp.schedule.rules import enters, waits_on


class RankFailure(RuntimeError):
    pass


class ActionTimer:
    """Start and end of every action of one iteration on this rank, in seconds since the iteration began:
    perf_counter on CPU; CUDA events on GPU (resolved once per iteration, so no action waits for the host)."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self.marks = []
        self.origin = None
        self.cpu: dict[str, list[float]] = {}  # CPU only: per pass kind, this thread's CPU seconds of each compute

    def now(self):
        if self.cuda:
            ev = torch.cuda.Event(enable_timing=True)
            ev.record()
            return ev
        return time.perf_counter()

    def begin(self):
        self.marks.clear()
        self.cpu = {}
        self.origin = self.now()

    def cpu_clock(self) -> float | None:
        """This thread's CPU seconds (time.thread_time) on CPU, None on GPU: the part of a pass's wall time the rank
        computed, against the part it waited for a core (other ranks, communication threads, the system)."""
        return None if self.cuda else time.thread_time()

    def add(self, text: str, arrived, began, ended):
        self.marks.append((text, arrived, began, ended))

    def collect(self) -> list[tuple[str, float, float, float]]:
        """(action text, arrived, start, end) of every action in the order executed, in seconds: the action was
        reached at `arrived`, waited for the collectives it consumes until `start`, and ran until `end`."""
        if self.cuda:
            torch.cuda.synchronize()
            return [(text, *(self.origin.elapsed_time(m) / 1e3 for m in marks)) for text, *marks in self.marks]
        return [(text, *(m - self.origin for m in marks)) for text, *marks in self.marks]


class LossScaler:
    """Dynamic loss scaling for fp16: skip the step and halve the scale when any rank overflowed."""

    def __init__(self, enabled: bool, comm, channels=("step",), scale: float = 2.0**16, growth_interval: int = 1000):
        self.enabled, self.comm, self.scale, self.growth_interval, self.good = enabled, comm, scale, growth_interval, 0
        self.channels = channels  # where the overflow verdict is agreed: a replica, and the dp group under zero 1

    def step(self, optimizer, params) -> bool:
        if not self.enabled:
            optimizer.step()
            return True
        grads = [p.grad for p in params if p.grad is not None]
        bad = torch.stack([(~torch.isfinite(g)).any() for g in grads]).any().float().reshape(1)
        for channel in self.channels:
            bad = self.comm.all_reduce(bad, channel, op=torch.distributed.ReduceOp.MAX)
        if bad.item():
            self.scale, self.good = self.scale / 2, 0
            return False
        for g in grads:
            g.div_(self.scale)
        optimizer.step()
        self.good += 1
        if self.good % self.growth_interval == 0:
            self.scale *= 2
        return True


class Runtime:
    def __init__(self, cfg, sched: Schedule, rank: int, model: RankModel, comm, device: torch.device,
                 fault: tuple[int, str, str] | None = None, replica: int = 0, global_rank: int | None = None):
        """rank: the pipeline rank whose actions this process runs; replica: its data-parallel replica;
        global_rank: its rank in the world (names it in errors and fault specs; default: rank)."""
        self.cfg, self.s, self.rank, self.model, self.device, self.fault = cfg, sched, rank, model, device, fault
        self.me = rank if global_rank is None else global_rank
        self.comm = comm
        self.actions = sched.ranks[rank]
        self.params = model.parameters()
        # dp > 1: the parameters move into the flat buffers of the gradient reduction (before the meter notes them)
        self.dp = DataParallel(self.params, comm, cfg.zero, cfg.overlap_grad_reduce, cfg.bucket_mb) if cfg.dp > 1 \
            else None
        self.meter = ActivationMeter(self.params)
        self.ex = Executor(cfg, sched, rank, model, comm, device, self.meter, replica)
        self.optimizer = torch.optim.AdamW(self.dp.step_params if self.dp else self.params, lr=cfg.lr,
                                           betas=(0.9, 0.95), eps=1e-8, weight_decay=0.01)
        # zero 1: each replica checks its own shard of the gradients for overflow, so the verdict spans the dp group
        self.scaler = LossScaler(cfg.dtype == "fp16", comm, ("step", "dp") if cfg.zero else ("step",))
        self.timer = ActionTimer(device)
        self.show_chunk = sched.chunks > 1

    def iteration(self, it: int) -> dict:
        st = IterState(it)
        self.ex.st = st
        self.ex.loss_scale = self.scaler.scale if self.scaler.enabled else 1.0
        if self.dp:
            self.dp.zero_grad()
        else:
            self.optimizer.zero_grad(set_to_none=True)
        if self.device.type == "cuda":
            torch.cuda.synchronize()
        begin = time.perf_counter()
        self.timer.begin()
        for i, a in enumerate(self.actions):
            self.ex.comm.doing(f"iteration {it}, step {i} ({a.text()})")
            try:
                if self.fault and self.fault[0] == self.me and self.fault[1] == a.text() and it == 0:
                    self._inject(self.fault[2])
                self._dispatch(a)
            except Exception as err:
                raise RankFailure(f"rank {self.me} failed at iteration {it}, step {i} ({a.text()}): "
                                  f"{type(err).__name__}: {err}\n" + self.s.grid((self.rank, i), 5)) from err
        self.ex.comm.doing(f"iteration {it}, the end (waiting for its last communication)")
        try:
            self.ex.drain(self.cfg.timeout_s)
        except Exception as err:
            raise RankFailure(f"rank {self.me} failed at iteration {it} waiting for its last communication: "
                              f"{type(err).__name__}: {err}") from err
        left = st.leftovers()
        assert not left, f"rank {self.me}: state left over after iteration {it}: {sorted(left)}"
        if self.dp:  # the data-parallel sum first (overlapped: already under way), then the grid's replicas'
            self.dp.finish(self.cfg.timeout_s)
        self.model.reduce_grads()  # parameters replicated inside a tensor-parallel grid
        stepped = self.scaler.step(self.optimizer, self.dp.step_params if self.dp else self.params)
        if self.dp and stepped:
            self.dp.after_step()
        if self.device.type == "cuda":
            torch.cuda.synchronize()
        seconds = time.perf_counter() - begin
        # the iteration's one named host sync: every microbatch's loss in one transfer
        losses = list(st.losses.values())
        loss = torch.stack(losses).double().sum().item() if len(losses) == self.s.microbatches else None
        loss = self.model.total_loss(loss)
        return {"loss": loss, "seconds": seconds, "events": self.timer.collect(), "stepped": stepped,
                "cpu": self.timer.cpu}

    def held_memory(self) -> dict:
        """Bytes of parameters, gradients and optimizer states this rank holds (vp.runtime.memory.held_static)."""
        flat = (self.dp.param_flat, self.dp.grad_flat) if self.dp else ()
        return held_static(self.params, self.optimizer, flat)

    def _dispatch(self, a):
        """launch (a collective entered at the start) -> wait for consumed collectives -> compute -> launch (at
        the end): the order the simulator assumes. The action's time span covers all of it."""
        arrived = self.timer.now()
        entry = enters(self.s, a)
        if entry and entry.phase == "start":
            self.ex.launch(a, entry)
        waits = waits_on(self.s, a)
        for inst in waits:
            self.ex.wait(inst, self.cfg.timeout_s)
        began = self.timer.now() if waits else arrived
        cpu = self.timer.cpu_clock()
        self.ex.compute(a)
        if cpu is not None:
            self.timer.cpu.setdefault(a.kind, []).append(self.timer.cpu_clock() - cpu)
        if entry and entry.phase == "end":
            self.ex.launch(a, entry)
        self.timer.add(a.text(self.show_chunk), arrived, began, self.timer.now())

    def _inject(self, mode: str):
        """Test aid (--inject-fault): die, raise, hang, or fail as a NCCL call does when CUDA is out of memory."""
        if mode == "exit":
            os._exit(17)
        if mode == "raise":
            raise RuntimeError("injected fault")
        if mode == "oom":
            raise torch.distributed.DistBackendError(NCCL_OOM)
        time.sleep(10 * self.cfg.timeout_s + 3600)


# what ProcessGroupNCCL raises when a NCCL call fails for want of device memory (injected fault "oom")
NCCL_OOM = ("NCCL error in: torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:1970, unhandled cuda error (run with "
            "NCCL_DEBUG=INFO for details), NCCL version 2.21.5\nncclUnhandledCudaError: Call to CUDA function "
            "failed.\nLast error:\nCuda failure 'out of memory'")
