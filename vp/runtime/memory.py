"""CPU memory accounting: bytes of tensors saved for backward by each stage pass (from F to B; where W is split,
F's until B and then what B leaves for W until W), of the output layer's state between S and T, and of received
buffers, tracked from the action that creates them to the action that frees them. (On CUDA the allocator's own
peak figures are reported instead.)"""
import contextlib

import torch


class ActivationMeter:
    def __init__(self, parameters):
        self._params = {p.untyped_storage().data_ptr() for p in parameters}
        self.live: dict = {}
        self.current = 0
        self.peak = 0

    def add(self, key, nbytes: int):
        self.live[key] = self.live.get(key, 0) + nbytes
        self.current += nbytes
        self.peak = max(self.peak, self.current)

    def release(self, key):
        self.current -= self.live.pop(key, 0)

    def hold(self, key, storages: dict[int, int]):
        """Counts {storage address: bytes} under key, parameters excluded: what a split B leaves for its W
        (vp.wgrad.WeightGradStore.held_storages: each linear's input and output gradient, made again by B under
        full recomputation)."""
        self.add(key, sum(n for ptr, n in storages.items() if ptr not in self._params))

    @contextlib.contextmanager
    def track(self, key):
        """Counts each storage saved for backward inside the block once, parameters excluded."""
        seen = {}

        def pack(t):
            storage = t.untyped_storage()
            if storage.data_ptr() not in self._params:
                seen[storage.data_ptr()] = storage.nbytes()
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            yield
        self.add(key, sum(seen.values()))


def held_static(params, optimizer: torch.optim.Optimizer, flat: list[torch.Tensor] = ()) -> dict:
    """Bytes of the tensors a rank holds for training: its `parameters` and `gradients` (the flat data-parallel
    buffers where they exist, padding included, else each parameter's own) and its `optimizer_states` (AdamW's
    moments of what it steps: every parameter, or its shard under zero 1)."""
    if flat:
        weights, grads = flat
        held = {"parameters": weights.nbytes, "gradients": grads.nbytes}
    else:
        held = {"parameters": sum(p.nbytes for p in params),
                "gradients": sum(p.grad.nbytes for p in params if p.grad is not None)}
    held["optimizer_states"] = sum(t.nbytes for state in optimizer.state.values() for t in state.values()
                                   if torch.is_tensor(t) and t.dim() > 0)  # the moments, not the step count
    return held
