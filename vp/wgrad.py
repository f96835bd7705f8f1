"""Split backward: B computes input gradients and defers the weight-gradient GEMMs of linear layers to a
store that the W pass runs later (as in zero-bubble pipelines). Without a store, backward is whole."""
import torch
import torch.nn.functional as F


class WeightGradStore:
    """The weight-gradient GEMMs of one (microbatch, chunk), deferred from its B to its W."""

    def __init__(self):
        self._pending = []

    def put(self, x: torch.Tensor, grad_out: torch.Tensor, weight: torch.Tensor):
        self._pending.append((x, grad_out, weight))

    def defer(self, step):
        """A weight-gradient computation of another shape (a tensor-parallel SUMMA loop): run at flush()."""
        self._pending.append(step)

    @torch.no_grad()  # like autograd's own backward: no graph is built from the saved inputs
    def flush(self):
        for item in self._pending:
            if callable(item):
                item()
                continue
            x, grad_out, weight = item
            # grad W = grad_out^T x, summed over every token: [out, n] @ [n, in]
            grad = grad_out.reshape(-1, grad_out.shape[-1]).t() @ x.reshape(-1, x.shape[-1]).to(grad_out.dtype)
            grad = grad.to(weight.dtype)
            weight.grad = grad if weight.grad is None else weight.grad.add_(grad)
        self._pending.clear()

    def __len__(self):
        return len(self._pending)


class _Linear(torch.autograd.Function):
    """y = x W^T + b. Backward sends grad x = grad y W back through autograd; grad W goes to the store."""

    @staticmethod
    @torch.amp.custom_fwd(device_type="cuda")
    def forward(ctx, x, weight, bias, store):
        ctx.save_for_backward(x)
        # the parameter itself, not a saved copy: W accumulates into its .grad
        ctx.weight, ctx.store, ctx.has_bias = weight, store, bias is not None
        return F.linear(x, weight, bias)

    @staticmethod
    @torch.amp.custom_bwd(device_type="cuda")
    def backward(ctx, grad_out):
        (x,), weight = ctx.saved_tensors, ctx.weight
        grad_x = grad_out @ weight.to(grad_out.dtype)
        grad_b = grad_out.reshape(-1, grad_out.shape[-1]).sum(0).to(weight.dtype) if ctx.has_bias else None
        if ctx.store is None:
            grad_w = (grad_out.reshape(-1, grad_out.shape[-1]).t() @ x.reshape(-1, x.shape[-1]).to(grad_out.dtype))
            return grad_x, grad_w.to(weight.dtype), grad_b, None
        ctx.store.put(x, grad_out, weight)
        return grad_x, None, grad_b, None


def linear(x, weight, bias=None, store: WeightGradStore | None = None):
    return _Linear.apply(x, weight, bias, store)
