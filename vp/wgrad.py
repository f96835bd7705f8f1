"""Split backward: B computes input gradients and defers the weight-gradient GEMMs of linear layers to a
store that the W pass runs later (as in zero-bubble pipelines). Without a store, backward is whole.

Under autocast the linear layer computes and saves in the compute dtype, as Megatron does: the input is saved
after its cast (not the fp32 tensor before it), and the weight's compute-dtype copy is made once per optimizer
step and shared by every forward and backward until the weight changes (compute_weight), not once per pass.
"""
import torch
import torch.nn.functional as F


def compute_dtype(t: torch.Tensor) -> torch.dtype | None:
    """The dtype autocast computes matmuls in on t's device, or None outside autocast."""
    kind = t.device.type
    return torch.get_autocast_dtype(kind) if torch.is_autocast_enabled(kind) else None


def compute_weight(weight: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """weight in `dtype`, cast once per change of the weight: the copy is kept on the parameter with the version
    it was made from (the optimizer's in-place update bumps the version, so the next use casts again)."""
    if weight.dtype == dtype:
        return weight
    cached = getattr(weight, "_compute_copy", None)
    if cached is None or cached[0] != weight._version or cached[1].dtype != dtype:
        cached = (weight._version, weight.detach().to(dtype))
        weight._compute_copy = cached
    return cached[1]


class WeightGradStore:
    """The weight-gradient GEMMs of one (microbatch, chunk), deferred from its B to its W."""

    def __init__(self):
        self._pending = []
        self._held: list[torch.Tensor] = []

    def put(self, x: torch.Tensor, grad_out: torch.Tensor, weight: torch.Tensor):
        self._pending.append((x, grad_out, weight))

    def defer(self, step, *held: torch.Tensor):
        """A weight-gradient computation of another shape (a tensor-parallel SUMMA loop): run at flush(); `held`:
        the tensors it keeps until then (for held_storages)."""
        self._pending.append(step)
        self._held.extend(held)

    def held_storages(self) -> dict[int, int]:
        """{storage address: bytes} of the tensors kept for flush(): the linears' inputs and output gradients."""
        tensors = [t for item in self._pending if not callable(item) for t in item[:2]] + self._held
        return {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors}

    @torch.no_grad()  # like autograd's own backward: no graph is built from the saved inputs
    def flush(self):
        for item in self._pending:
            if callable(item):
                item()
                continue
            x, grad_out, weight = item
            _accumulate(weight, _grad_weight(x, grad_out))
        self._pending.clear()
        self._held.clear()

    def __len__(self):
        return len(self._pending)


def _grad_weight(x: torch.Tensor, grad_out: torch.Tensor) -> torch.Tensor:
    # grad W = grad_out^T x, summed over every token: [out, n] @ [n, in]
    return grad_out.reshape(-1, grad_out.shape[-1]).t() @ x.reshape(-1, x.shape[-1]).to(grad_out.dtype)


def _accumulate(weight: torch.Tensor, grad: torch.Tensor):
    grad = grad.to(weight.dtype)
    weight.grad = grad if weight.grad is None else weight.grad.add_(grad)
    accumulated(weight)


def accumulated(param: torch.Tensor):
    """A pass added to param.grad by hand: tell whoever watches the gradient (vp.runtime.data_parallel sets
    grad_ready_hook), as autograd's post-accumulate-grad hooks hear of what autograd adds."""
    hook = getattr(param, "grad_ready_hook", None)
    if hook is not None:
        hook(param)


class _Linear(torch.autograd.Function):
    """y = x W^T + b. Backward sends grad x = grad y W back through autograd; grad W goes to the store."""

    @staticmethod
    def forward(ctx, x, weight, bias, store):
        dtype = compute_dtype(x) or x.dtype
        x = x.to(dtype)  # saved as computed: under autocast, bf16, not the fp32 tensor before the cast
        ctx.save_for_backward(x)
        # the parameter itself, not a saved copy: W accumulates into its .grad
        ctx.weight, ctx.store, ctx.has_bias = weight, store, bias is not None
        return F.linear(x, compute_weight(weight, dtype), None if bias is None else bias.to(dtype))

    @staticmethod
    def backward(ctx, grad_out):
        (x,), weight = ctx.saved_tensors, ctx.weight
        grad_out = grad_out.to(x.dtype)
        grad_x = grad_out @ compute_weight(weight, x.dtype)
        grad_b = grad_out.reshape(-1, grad_out.shape[-1]).sum(0, dtype=weight.dtype) if ctx.has_bias else None
        if ctx.store is None:
            return grad_x, _grad_weight(x, grad_out).to(weight.dtype), grad_b, None
        ctx.store.put(x, grad_out, weight)
        return grad_x, None, grad_b, None


def linear(x, weight, bias=None, store: WeightGradStore | None = None):
    return _Linear.apply(x, weight, bias, store)
