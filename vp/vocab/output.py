"""The output layer and softmax cross-entropy split over p ranks along the vocabulary, as pass functions
a schedule places (arXiv 2411.05288, section 4).

Rank i holds W_i = rows [i V/p, (i+1) V/p) of the padded output weight. With X [n, h] on every rank
(broadcast C0), targets y [n] and loss weights w [n] (w_t = mask_t / (tokens * microbatches)):

  loss = sum_t w_t (log sum_j exp(Y_tj - m_t) + m_t - Y_t,y_t)            Y = X W^T, m_t = max_j Y_tj
  grad Y = w (softmax(Y) - onehot(y)),   grad W_i = grad Y_i^T X,   grad X = sum_i grad Y_i W_i

Each algorithm is a row of vp.schedule.methods.VOCAB; these functions read its fields, never its name.
naive   (Megatron, interlaced): S = logits, all-reduce max, all-reduce (sum exp, target logit);
        T = grad W_i and G_i = grad Y_i W_i, all-reduce G: three barriers.
alg1    S = logits and local statistics m_i, s_i = sum exp(Y_i - m_i), target logit, local softmax P_i;
        C1 all-gathers the statistics (m = max m_i, s = sum s_i exp(m_i - m), exactly);
        T = grad W_i and G_i; C2 all-reduces G into grad X: two barriers.
alg2    S also computes A'_i = (P_i - onehot_i(y)) W_i and E_i = W_i[y] (0 where y is not in shard i);
        C1 all-gathers the statistics and then all-reduces sum_i w (alpha_i A'_i + (alpha_i - 1) E_i) = grad X,
        alpha_i = s_i exp(m_i - m) / s rescaling the local softmax; T only computes grad W_i: one barrier.
        This is the paper's w (alpha_i A_i - E_i) with A_i = P_i W_i = A'_i + E_i, rearranged for precision: with
        A_i from a bf16 GEMM, alpha_i A_i - E_i subtracts two nearly equal terms as p_target -> 1 and keeps only
        bf16's error of |A_i|; P_i - onehot is formed in fp32 before the GEMM (as Algorithm 1 forms
        P - onehot), so A'_i carries bf16's error of its own, small, size, and (alpha_i - 1) comes from fp32
        statistics. Both algorithms' grad X then have the same error (docs/gpu-path.md, precision).
Padded rows get logit -inf, so they never receive probability mass or gradient.
"""
from dataclasses import dataclass

import torch
import torch.distributed as dist

from vp.comm import Comm
from vp.schedule.methods import VOCAB, VocabAlgorithm
from vp.wgrad import accumulated, compute_dtype, compute_weight


@dataclass(frozen=True)
class Shard:
    """Rows [start, start + rows) of a padded vocabulary, of which the first `valid` are real tokens."""
    index: int
    count: int
    rows: int
    vocab_size: int

    @property
    def start(self) -> int:
        return self.index * self.rows

    @property
    def valid(self) -> int:
        return max(0, min(self.rows, self.vocab_size - self.start))

    @classmethod
    def of(cls, index: int, count: int, padded_vocab_size: int, vocab_size: int) -> "Shard":
        assert padded_vocab_size % count == 0, "padded vocabulary must split evenly over the shards"
        return cls(index, count, padded_vocab_size // count, vocab_size)

    def local_targets(self, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(index of each target within the shard, clamped into range; whether the target is in the shard)."""
        local = targets - self.start
        inside = (local >= 0) & (local < self.rows)
        return local.clamp(0, self.rows - 1), inside


@dataclass
class OutputState:
    """What one microbatch's output layer keeps between its S, C1, T and C2 on one rank."""
    x: torch.Tensor  # [n, h]
    targets: torch.Tensor  # [n]
    weights: torch.Tensor  # [n] loss weights (gradient of the loss w.r.t. each token's loss)
    exp: torch.Tensor  # [n, V/p] exp(Y_i - m_i), the local softmax P_i = exp / s_i left unnormalised
    stats: torch.Tensor  # [3, n] local max m_i, local sum s_i, target logit (naive: global m, s)
    a: torch.Tensor | None = None  # [n, h] alg2: A'_i = (P_i - onehot_i(y)) W_i, in the GEMM's dtype
    e: torch.Tensor | None = None  # [n, h] alg2: W_i[y]
    alpha: torch.Tensor | None = None  # [n] after C1: s_i exp(m_i - m) / s
    loss: torch.Tensor | None = None  # [] after C1: sum_t w_t loss_t
    partial_grad_x: torch.Tensor | None = None  # [n, h] alg1 after T: G_i
    grad_x: torch.Tensor | None = None  # [n, h] after the last barrier

    def nbytes(self) -> int:
        tensors = [self.x, self.exp, self.stats, self.a, self.e, self.partial_grad_x, self.grad_x]
        return sum(t.numel() * t.element_size() for t in tensors if t is not None)


def check_inputs(shard: Shard, weight: torch.Tensor, x: torch.Tensor, ids: torch.Tensor):
    """Refuse mismatched shapes and token ids outside the vocabulary (ids are range-checked on CPU only,
    to keep GPU runs free of host syncs; the runtime checks its data on CPU before moving it)."""
    if weight.shape[0] != shard.rows:
        raise ValueError(f"weight has {weight.shape[0]} rows but shard {shard.index} of {shard.count} has "
                         f"{shard.rows}; build the shard from padded_vocab_size / shards")
    if x is not None and (x.dim() != 2 or x.shape[1] != weight.shape[1]):
        raise ValueError(f"x has shape {tuple(x.shape)}; expected [tokens, {weight.shape[1]}] "
                         f"(hidden size of the vocabulary weight)")
    if x is not None and ids.shape != (x.shape[0],):
        raise ValueError(f"targets have shape {tuple(ids.shape)}; expected [{x.shape[0]}], one per row of x")
    if ids.device.type == "cpu" and ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= shard.vocab_size):
        bad = int(ids.max()) if int(ids.max()) >= shard.vocab_size else int(ids.min())
        raise ValueError(f"token id {bad} is outside the vocabulary [0, {shard.vocab_size}); "
                         f"fix the data or raise vocab_size")


def _logits(shard: Shard, weight: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    y = x @ weight.t()  # [n, V/p]
    if shard.valid < shard.rows:
        y[:, shard.valid:] = float("-inf")
    return y.float()


def _local_stats(shard: Shard, y: torch.Tensor, targets: torch.Tensor):
    """-> exp(Y - m) [n, V/p] made in place of the logits Y (one [n, V/p] buffer, not two), [m, s, t] [3, n]."""
    m = y.amax(dim=-1).clamp_min(torch.finfo(y.dtype).min)  # [n]; finite even for an all-padding shard
    local, inside = shard.local_targets(targets)
    t = torch.where(inside, y.gather(1, local[:, None])[:, 0], torch.zeros_like(m))  # target logit or 0
    e = y.sub_(m[:, None]).exp_()  # [n, V/p]
    s = e.sum(dim=-1)  # [n]
    return e, torch.stack([m, s, t])


def s_pass(shard: Shard, weight: torch.Tensor, x: torch.Tensor, targets: torch.Tensor,
           weights: torch.Tensor, algo: VocabAlgorithm) -> OutputState:
    """S of alg1 / alg2: local logits, statistics and (unnormalised) softmax; where grad X leaves with C1 (alg2),
    also A_i, E_i."""
    check_inputs(shard, weight, x, targets)
    with torch.no_grad():
        y = _logits(shard, weight, x)
        exp, stats = _local_stats(shard, y, targets)
        state = OutputState(x, targets, weights, exp, stats)
        if algo.grad_x_in_s:
            # every row's (clamped) target column, masked arithmetic: no host sync (nonzero, boolean indexing)
            local, inside = shard.local_targets(targets)
            column = local[:, None]
            s = _nonzero(stats[1])
            exp_target = exp.gather(1, column)
            exp.scatter_add_(1, column, -(s * inside)[:, None])  # s_i (P_i - onehot_i(y)), in fp32; - 0 elsewhere
            # A'_i = (P_i - onehot_i(y)) W_i; under autocast a bf16 GEMM of an fp32-exact difference
            state.a = (exp @ weight).div_(s[:, None])
            exp.scatter_(1, column, exp_target)  # exp(Y_i - m_i) again, exactly, for T
            state.e = weight[local].float() * inside[:, None]  # [n, h], exact
        return state


def _combine(state: OutputState, gathered: torch.Tensor, me: int):
    """Exact global softmax statistics from every shard's [m_i, s_i, t_i] (gathered: [p, 3, n])."""
    m_all, s_all, t_all = gathered.unbind(1)  # each [p, n]
    m = m_all.max(dim=0).values
    scaled = s_all * torch.exp(m_all - m)  # s_i exp(m_i - m)
    s = scaled.sum(dim=0)
    # loss_t = log s + m - Y_t,y_t
    state.loss = (state.weights * (torch.log(s) + m - t_all.sum(dim=0))).sum()
    state.alpha = scaled[me] / s


def c1_step(state: OutputState, comm: Comm, algo: VocabAlgorithm) -> OutputState:
    """C1: the one barrier of alg2 (statistics, then grad X) or the first of alg1 (statistics)."""
    with torch.no_grad(), comm.barrier("C1"):
        _combine(state, comm.all_gather(state.stats, "C1"), comm.index("C1"))
        if algo.grad_x_in_s:
            w, alpha = state.weights[:, None], state.alpha[:, None]
            grad_x = w * (alpha * state.a.float() + (alpha - 1.0) * state.e)  # w (alpha_i A'_i + (alpha_i - 1) E_i)
            state.grad_x = comm.all_reduce(grad_x, "C1")
            # A_i and E_i were made on the compute stream: T drops them after waiting for this step
    return state


def t_pass(shard: Shard, weight: torch.Tensor, state: OutputState, algo: VocabAlgorithm) -> OutputState:
    """T: grad W_i += grad Y_i^T X (and, unless S precomputed it (alg2), the local input gradient
    G_i = grad Y_i W_i)."""
    with torch.no_grad():
        # the global softmax restricted to shard i is alpha_i P_i = exp(Y_i - m_i) alpha_i / s_i
        grad_y = _grad_y_(shard, state.exp, state.alpha / _nonzero(state.stats[1]), state.targets, state.weights)
        state.a = state.e = None
        accumulate_product(weight, grad_y.t(), state.x)
        if not algo.grad_x_in_s:  # fp32 like Algorithm 2's grad X, so both reduce the same bytes
            dtype = compute_dtype(grad_y) or weight.dtype
            state.partial_grad_x = (grad_y.to(dtype) @ compute_weight(weight, dtype)).float()
        state.exp = None
    return state


def c2_step(state: OutputState, comm: Comm) -> OutputState:
    """C2 of alg1: all-reduce sum_i G_i into grad X."""
    with torch.no_grad(), comm.barrier("C2"):
        state.grad_x = comm.all_reduce(state.partial_grad_x, "C2")
        state.partial_grad_x = None
    return state


def naive_forward(shard: Shard, weight: torch.Tensor, x: torch.Tensor, targets: torch.Tensor,
                  weights: torch.Tensor, comm: Comm) -> OutputState:
    """S of the naive algorithm: two synchronous barriers, max and (sum of exp, target logit)."""
    check_inputs(shard, weight, x, targets)
    with torch.no_grad():
        y = _logits(shard, weight, x)
        local_max = y.amax(dim=-1).clamp_min(torch.finfo(y.dtype).min)
        with comm.barrier("max"):
            m = comm.all_reduce(local_max, "naive", op=dist.ReduceOp.MAX)
        local, inside = shard.local_targets(targets)
        t = torch.where(inside, y.gather(1, local[:, None])[:, 0], torch.zeros_like(m))
        e = y.sub_(m[:, None]).exp_()  # in place of the logits
        with comm.barrier("sum"):
            s, t = comm.all_reduce(torch.stack([e.sum(dim=-1), t]), "naive").unbind(0)
        state = OutputState(x, targets, weights, e, torch.stack([m, s, t]))  # exp / s: the global softmax
        state.loss = (weights * (torch.log(s) + m - t)).sum()
        state.alpha = torch.ones_like(s)
        return state


def naive_backward(shard: Shard, weight: torch.Tensor, state: OutputState, comm: Comm) -> OutputState:
    """T of the naive algorithm: grad W_i and the synchronous all-reduce of grad X."""
    t_pass(shard, weight, state, VOCAB["naive"])
    with torch.no_grad(), comm.barrier("grad_x"):
        state.grad_x = comm.all_reduce(state.partial_grad_x, "naive")
        state.partial_grad_x = None
    return state


def _nonzero(s: torch.Tensor) -> torch.Tensor:
    """A sum of exponentials safe to divide by: 0 only on a shard of nothing but padding, whose exp is 0."""
    return s.clamp_min(torch.finfo(s.dtype).tiny)


def _grad_y_(shard: Shard, exp: torch.Tensor, scale: torch.Tensor, targets: torch.Tensor,
             weights: torch.Tensor) -> torch.Tensor:
    """grad Y = w (P - onehot(y)) on the shard's columns, with P = exp * scale [n, V/p], made in place of exp
    in one pass (the normalisation and the loss weights are folded into one factor per token)."""
    grad_y = exp.mul_((weights * scale)[:, None])
    local, inside = shard.local_targets(targets)
    return grad_y.scatter_add_(1, local[:, None], -(weights * inside)[:, None])  # no host sync: - 0 off the shard


def accumulate_product(param: torch.Tensor, a: torch.Tensor, b: torch.Tensor, dtype: torch.dtype | None = None):
    """param.grad += a @ b, the GEMM in the step's compute dtype (`dtype`, else autocast's on a's device, else a's:
    vp.wgrad.compute_dtype, the one precision policy), accumulated into the fp32 gradient. In fp32, one GEMM into
    the existing gradient (addmm_): on CPU a fresh [V/p, h] product costs page faults and another pass over memory.
    In-place ops are not autocast, so the policy cannot be left to autocast here."""
    dtype = dtype or compute_dtype(a) or a.dtype
    if param.grad is not None and dtype == param.grad.dtype:
        param.grad.addmm_(a.to(dtype), b.to(dtype))
    else:
        grad = (a.to(dtype) @ b.to(dtype)).to(param.dtype)
        param.grad = grad if param.grad is None else param.grad.add_(grad)
    accumulated(param)


class LocalOutputLoss(torch.autograd.Function):
    """The whole output layer and its loss on one rank (baseline placement), fused as Megatron's
    cross-entropy: the softmax overwrites the logits, grad Y overwrites the softmax, and grad W accumulates
    in place (or goes to a split-backward store) -- the same statistics as the vocabulary-parallel passes
    with a single shard. forward(x [n, h], weight [V, h], targets [n], weights [n]) -> sum_t w_t loss_t."""

    @staticmethod
    @torch.amp.custom_fwd(device_type="cuda")
    def forward(ctx, x, weight, targets, weights, shard: Shard, store):
        check_inputs(shard, weight, x, targets)
        y = _logits(shard, weight, x)  # [n, V] fp32
        exp, stats = _local_stats(shard, y, targets)  # exp(Y - m) in place of Y; [m, s, target logit]
        m, s, t = stats
        ctx.save_for_backward(x, exp, s, targets, weights)
        # the backward's GEMMs in the forward's compute dtype, whatever autocast state the backward runs under
        ctx.weight, ctx.shard, ctx.store, ctx.dtype = weight, shard, store, compute_dtype(x) or x.dtype
        # loss_t = log s + m - Y_t,y_t
        return (weights * (torch.log(s) + m - t)).sum()

    @staticmethod
    @torch.amp.custom_bwd(device_type="cuda")
    def backward(ctx, grad_loss):
        x, exp, s, targets, weights = ctx.saved_tensors
        weight = ctx.weight
        grad_y = _grad_y_(ctx.shard, exp, 1.0 / s, targets, weights * grad_loss)  # [n, V], in place of exp
        dtype = ctx.dtype
        grad_x = grad_y.to(dtype) @ compute_weight(weight, dtype)  # [n, h]
        if ctx.store is not None:  # W of a split backward computes grad W = grad Y^T x later, in the same dtype
            ctx.store.put(x.to(dtype), grad_y.to(dtype), weight)
        else:
            accumulate_product(weight, grad_y.t(), x, dtype)
        return grad_x.to(x.dtype), None, None, None, None, None


def local_loss(shard: Shard, weight: torch.Tensor, x: torch.Tensor, targets: torch.Tensor, weights: torch.Tensor,
               store=None) -> torch.Tensor:
    """sum_t w_t cross_entropy(x_t W^T, y_t) over the whole (padded) vocabulary held by this rank; grad W is
    accumulated into weight.grad by the backward itself, never handed to autograd."""
    return LocalOutputLoss.apply(x, weight, targets, weights, shard, store)
