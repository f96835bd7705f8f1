"""Precision: the vocabulary-parallel output layer's algorithms on this device's GEMMs (cuBLAS on a GPU) in fp32 and
under bf16 autocast, against an fp64 reference, at the precision cases of the test suite (tests/test_precision.py:
mean target probabilities about 0.31, 0.976 and 0.9998, where Algorithm 2's former form lost grad X). One
shard in a group of one: the GEMMs and the softmax arithmetic, not the communication.

Pass: fp32 errors below 1e-3 (fp32's rounding of P - onehot near p = 1 is the floor); bf16 errors below 6e-2 with
Algorithm 2 within twice Algorithm 1's, as the suite asks on CPU.
"""
from pathlib import Path

import torch

N, H, V = 64, 32, 96
CONFIDENCES = (4.0, 10.0, 20.0)
FP32_TOL, BF16_TOL = 1e-3, 6e-2


def problem(confidence: float):
    """x [N, H], W [V, H], targets [N], loss weights [N]; the target logit exceeds the others by ~confidence."""
    gen = torch.Generator().manual_seed(7)
    w = torch.randn(V, H, generator=gen, dtype=torch.float64) / H**0.5
    targets = torch.randint(0, V, (N,), generator=gen)
    x = torch.randn(N, H, generator=gen, dtype=torch.float64) * 0.1 + confidence * w[targets] / (w[targets] ** 2).sum(
        1, keepdim=True)
    weights = torch.full((N,), 1.0 / N, dtype=torch.float64)
    return x, w, targets, weights


def reference(x, w, targets, weights):
    """fp64 loss, grad X and grad W of sum_t w_t cross_entropy(x_t W^T, y_t)."""
    p = torch.softmax(x @ w.t(), dim=-1)
    loss = (weights * -torch.log(p[torch.arange(len(targets)), targets])).sum()
    p[torch.arange(len(targets)), targets] -= 1.0
    grad_y = p * weights[:, None]
    return loss, grad_y @ w, grad_y.t() @ x


def rel(a: torch.Tensor, ref: torch.Tensor) -> float:
    return ((a.double().cpu() - ref).norm() / ref.norm()).item()


def errors(device: torch.device, confidence: float, dtype: str) -> dict:
    """{algorithm: {loss, grad_x, grad_w}} relative errors against fp64, passes under autocast(dtype)."""
    from vp.comm import Comm
    from vp.schedule.methods import VOCAB
    from vp.vocab.output import Shard, c1_step, c2_step, naive_backward, naive_forward, s_pass, t_pass

    x, w, targets, weights = problem(confidence)
    loss, ref_x, ref_w = reference(x, w, targets, weights)
    comm, shard, out = Comm.local([0], 0, device), Shard.of(0, 1, V, V), {}
    cast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=dtype == "bf16")
    try:
        for algo in (a for a in VOCAB.values() if a.parallel):
            weight = torch.nn.Parameter(w.float().to(device))
            args = (shard, weight, x.float().to(device), targets.to(device), weights.float().to(device))
            with cast:
                if algo.synchronous:
                    state = naive_backward(shard, weight, naive_forward(*args, comm), comm)
                else:
                    state = t_pass(shard, weight, c1_step(s_pass(*args, algo), comm, algo), algo)
                    state = c2_step(state, comm) if algo.after_t else state
            out[algo.name] = {"loss": abs(state.loss.item() - loss.item()) / loss.item(),
                              "grad_x": rel(state.grad_x, ref_x), "grad_w": rel(weight.grad, ref_w)}
    finally:
        comm.close()
    return out


def verdict(err: dict, dtype: str) -> bool:
    if dtype == "fp32":
        return all(e < FP32_TOL for algo in err.values() for e in algo.values())
    return all(e < BF16_TOL for algo in err.values() for e in algo.values()) and all(
        err["alg2"][k] <= 2 * err["alg1"][k] + 1e-3 for k in ("grad_x", "grad_w"))


def run(device: torch.device, out: Path) -> dict:
    cases, ok = {}, True
    tf32 = device.type == "cuda" and torch.backends.cuda.matmul.allow_tf32
    summary = [f"fp32 GEMMs {'in TF32' if tf32 else 'in full fp32'} (torch.backends.cuda.matmul.allow_tf32); "
               f"N {N}, H {H}, V {V}, one shard",
               "", "| dtype | confidence | algorithm | loss | grad X | grad W |", "|---|---|---|---|---|---|"]
    for dtype in ("fp32", "bf16"):
        for confidence in CONFIDENCES:
            err = errors(device, confidence, dtype)
            good = verdict(err, dtype)
            ok = ok and good
            cases[f"{dtype}/{confidence:g}"] = {"errors": err, "ok": good}
            summary += [f"| {dtype} | {confidence:g} | {name} | {e['loss']:.2e} | {e['grad_x']:.2e} | "
                        f"{e['grad_w']:.2e} |" for name, e in err.items()]
    summary += ["", f"tolerances: fp32 {FP32_TOL:g}; bf16 {BF16_TOL:g} and Algorithm 2 <= 2 x Algorithm 1 + 1e-3"]
    return {"ok": ok, "summary": summary, "cases": cases}
