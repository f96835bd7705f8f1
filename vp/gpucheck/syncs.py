"""Host syncs inside the runtime's actions, one mechanism for the GPU check's `trust` part (world size 1) and its
node form (every rank of every method under torchrun, vp.gpucheck.node_rank).

A sync in the microbatch path stalls the thread that launches kernels. Within `strict_actions`, every action of
vp.runtime.executor.Executor (compute, launch, wait) runs under CUDA's sync debug mode "error", so a sync inside one
raises, and is recorded; the loss report at the iteration's end is outside the actions and stays allowed. CPU has no
sync debug mode: there the calls that would sync on a device (Tensor.item, nonzero, tolist) are counted instead.
"""
import contextlib

import torch

ACTIONS = ("compute", "launch", "wait")
SYNC_CALLS = ("item", "nonzero", "tolist")


@contextlib.contextmanager
def strict_actions(cuda: bool):
    """Executor's actions strict about host syncs while inside; yields the list of syncs seen ('action: error' on
    CUDA, the call's name on CPU). The actions and Tensor's methods are restored on the way out."""
    from vp.runtime.executor import Executor

    syncs: list[str] = []
    originals = {name: getattr(Executor, name) for name in ACTIONS}
    calls = {name: getattr(torch.Tensor, name) for name in SYNC_CALLS}

    def counting(name):
        def call(self, *args, **kwargs):
            syncs.append(name)
            return calls[name](self, *args, **kwargs)
        return call

    def strict(name):
        def action(self, *args):
            if cuda:
                torch.cuda.set_sync_debug_mode("error")
            else:
                for call in calls:
                    setattr(torch.Tensor, call, counting(call))
            try:
                return originals[name](self, *args)
            except RuntimeError as err:
                if cuda:
                    syncs.append(f"{name}: {err}"[:300])
                raise
            finally:
                if cuda:
                    torch.cuda.set_sync_debug_mode("default")
                else:
                    for call, f in calls.items():
                        setattr(torch.Tensor, call, f)
        return action

    for name in ACTIONS:
        setattr(Executor, name, strict(name))
    try:
        yield syncs
    finally:
        for name, f in originals.items():
            setattr(Executor, name, f)
