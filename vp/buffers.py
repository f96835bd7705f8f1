"""The buffer-lifetime check of the CPU emulation (VP_CHECK_BUFFERS=1): a side-stream step's tensors must outlive it.

On CUDA a communication step runs on a side stream (vp.comm_stream) and NCCL reads or writes its tensors after the
launch returns. A tensor made on the compute stream that the launch then drops goes back to the caching allocator
at once, and the compute stream's next allocation of its size can overwrite it while NCCL still reads it: silent
wrong numbers. The launch must either name it (`reads=`: recorded on the side stream) or keep it until the step's
wait. gloo on CPU cannot show the hazard: its worker thread holds every tensor its step touches.

With the check on, every tensor a step hands to a collective (vp.comm.Comm's counted calls, made on a CommStream
worker) is tracked. At the step's wait, a tracked tensor that was not named and that nothing but the communication
machinery still holds (the caller dropped its last reference before the wait) has its storage poisoned (NaN; a
sentinel for integers) and the wait raises BufferLifetimeError naming the step. A tensor the step returns counts as
dropped too: a step that happens to return its input (a broadcast) keeps it alive by accident, not by contract.
"""
import os
import sys
import threading

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

ENV = "VP_CHECK_BUFFERS"
_local = threading.local()


class BufferLifetimeError(RuntimeError):
    pass


def enabled() -> bool:
    return os.environ.get(ENV, "0") == "1"


def _storages(tree) -> set[int]:
    return {t.untyped_storage().data_ptr() for t in tree_leaves(tree) if isinstance(t, torch.Tensor)}


class _Made(TorchDispatchMode):
    """Records the storage of every tensor an op makes on this thread (not those it writes in place)."""

    def __init__(self, made: set[int]):
        super().__init__()
        self.made = made

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        self.made |= _storages(out) - _storages((args, kwargs))
        return out


class StepBuffers:
    """The tensors one submitted step touched, those its launch named (`reads`), and the storages the step made
    itself (on CUDA: on the side stream, whose own pool holds them until the side stream is done)."""

    def __init__(self, what: str, reads=()):
        self.what = what
        self.named = {id(t) for t in reads}
        self.touched: dict[int, torch.Tensor] = {}
        self.made: set[int] = set()
        self._mode = None

    def __enter__(self):
        _local.step = self
        self._mode = _Made(self.made)
        self._mode.__enter__()
        return self

    def __exit__(self, *exc):
        self._mode.__exit__(*exc)
        _local.step = self._mode = None


def touch(t: torch.Tensor):
    """A collective's tensor, as it is handed over: tracked when called from inside a checked step."""
    step = getattr(_local, "step", None)
    if step is not None and isinstance(t, torch.Tensor):
        step.touched.setdefault(id(t), t)


def _result_refs(result, t: torch.Tensor) -> int:
    if result is t:
        return 1
    if isinstance(result, (tuple, list)):
        return sum(1 for r in result if r is t)
    return 0


def check(step: StepBuffers, future):
    """At the step's wait: poison and refuse every tracked tensor that was not named and that only the machinery
    holds (the finished future's result; `step.touched` itself)."""
    dropped = []
    for key in list(step.touched):
        t = step.touched[key]
        if key in step.named or t.untyped_storage().data_ptr() in step.made:
            continue
        # references: step.touched (1), the local t (1), getrefcount's argument (1), the future's result
        machinery = 3 + _result_refs(future._result, t)
        # no other tensor (a view), no C++ owner (autograd); the storage object made here to ask holds one count
        alone = t._use_count() == 1 and torch._C._storage_Use_Count(t.untyped_storage()._cdata) == 2
        if alone and sys.getrefcount(t) <= machinery:
            with torch.no_grad():
                t.fill_(float("nan") if t.is_floating_point() else -(2 ** 31) + 1)
            dropped.append(f"{tuple(t.shape)} {str(t.dtype).removeprefix('torch.')}")
    step.touched.clear()
    if dropped:
        raise BufferLifetimeError(
            f"{step.what}: the launch dropped its last reference to {', '.join(dropped)} before the step's wait, "
            f"while the side stream still uses it (poisoned); name it in Comm.submit(..., reads=...) or keep it "
            f"until the wait ({ENV}=1)")
