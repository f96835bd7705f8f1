"""The flat dispatch loop over one rank's actions, one optimizer step per iteration.

On a failure it raises RankFailure naming the rank, iteration, step and action, with the rank x step grid
around the failing action marked.
"""
import os
import time

import torch

from vp.runtime.executor import Executor, RankModel
from vp.runtime.memory import ActivationMeter
from vp.runtime.state import IterState
from vp.schedule import Schedule
from vp.schedule.actions import COMPUTE
from vp.schedule.rules import enters, waits_on


class RankFailure(RuntimeError):
    pass


class PassTimer:
    """Seconds of each compute pass: perf_counter on CPU, CUDA events (resolved once per iteration) on GPU."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self.marks = []

    def start(self):
        if self.cuda:
            ev = torch.cuda.Event(enable_timing=True)
            ev.record()
            return ev
        return time.perf_counter()

    def stop(self, kind: str, began):
        if self.cuda:
            ev = torch.cuda.Event(enable_timing=True)
            ev.record()
            self.marks.append((kind, began, ev))
        else:
            self.marks.append((kind, time.perf_counter() - began, None))

    def collect(self) -> dict[str, list[float]]:
        if self.cuda:
            torch.cuda.synchronize()
        out: dict[str, list[float]] = {}
        for kind, began, ev in self.marks:
            out.setdefault(kind, []).append(began.elapsed_time(ev) / 1e3 if ev is not None else began)
        self.marks.clear()
        return out


class LossScaler:
    """Dynamic loss scaling for fp16: skip the step and halve the scale when any rank overflowed."""

    def __init__(self, enabled: bool, comm, scale: float = 2.0**16, growth_interval: int = 1000):
        self.enabled, self.comm, self.scale, self.growth_interval, self.good = enabled, comm, scale, growth_interval, 0

    def step(self, optimizer, params) -> bool:
        if not self.enabled:
            optimizer.step()
            return True
        grads = [p.grad for p in params if p.grad is not None]
        bad = torch.stack([(~torch.isfinite(g)).any() for g in grads]).any().float().reshape(1)
        if self.comm.all_reduce(bad, "step", op=torch.distributed.ReduceOp.MAX).item():
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
                 fault: tuple[int, str, str] | None = None):
        self.cfg, self.s, self.rank, self.model, self.device, self.fault = cfg, sched, rank, model, device, fault
        self.actions = sched.ranks[rank]
        self.params = model.parameters()
        self.meter = ActivationMeter(self.params)
        self.ex = Executor(cfg, sched, rank, model, comm, device, self.meter)
        self.optimizer = torch.optim.AdamW(self.params, lr=cfg.lr, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.01)
        self.scaler = LossScaler(cfg.dtype == "fp16", comm)
        self.timer = PassTimer(device)

    def iteration(self, it: int) -> dict:
        st = IterState(it)
        self.ex.st = st
        self.ex.loss_scale = self.scaler.scale if self.scaler.enabled else 1.0
        self.optimizer.zero_grad(set_to_none=True)
        if self.device.type == "cuda":
            torch.cuda.synchronize()
        begin = time.perf_counter()
        for i, a in enumerate(self.actions):
            try:
                if self.fault and self.fault[0] == self.rank and self.fault[1] == a.text() and it == 0:
                    self._inject(self.fault[2])
                self._dispatch(a)
            except Exception as err:
                raise RankFailure(f"rank {self.rank} failed at iteration {it}, step {i} ({a.text()}): "
                                  f"{type(err).__name__}: {err}\n" + self.s.grid((self.rank, i), 5)) from err
        try:
            self.ex.drain(self.cfg.timeout_s)
        except Exception as err:
            raise RankFailure(f"rank {self.rank} failed at iteration {it} waiting for its last communication: "
                              f"{type(err).__name__}: {err}") from err
        left = st.leftovers()
        assert not left, f"rank {self.rank}: state left over after iteration {it}: {sorted(left)}"
        if self.device.type == "cuda":
            torch.cuda.synchronize()
        schedule_done = time.perf_counter()  # the optimizer step is part of the iteration, not of the schedule
        stepped = self.scaler.step(self.optimizer, self.params)
        if self.device.type == "cuda":
            torch.cuda.synchronize()
        end = time.perf_counter()
        loss = sum(v.item() for v in st.losses.values()) if len(st.losses) == self.s.microbatches else None
        return {"loss": loss, "seconds": end - begin, "optimizer_s": end - schedule_done,
                "pass_s": self.timer.collect(), "executed": st.executed, "stepped": stepped}

    def _dispatch(self, a):
        entry = enters(self.s, a)
        if entry and entry[3] == "start":
            self.ex.launch(a)
        for inst in waits_on(self.s, a):
            self.ex.wait(inst, self.cfg.timeout_s)
        if a.kind in COMPUTE:
            began = self.timer.start()
            self.ex.compute(a)
            self.timer.stop(a.kind, began)
        else:
            self.ex.compute(a)
        if entry and entry[3] == "end":
            self.ex.launch(a)
        self.ex.st.executed.append(a)

    def _inject(self, mode: str):
        """Test aid (--inject-fault): die, raise, or hang, at a chosen action."""
        if mode == "exit":
            os._exit(17)
        if mode == "raise":
            raise RuntimeError("injected fault")
        time.sleep(10 * self.cfg.timeout_s + 3600)
