"""Data parallelism of one rank (dp > 1): its gradients summed over the replicas, in buckets, and the optimizer that
steps on them, replicated (zero 0) or sharded over the dp group (zero 1, the distributed optimizer).

Layout. The rank's parameters (every one it holds: its stages' layers, tensor-parallel blocks, vocabulary shards)
are packed, in the reverse of RankModel.parameters() (about the order backward finishes them), into one flat fp32
parameter buffer and one flat gradient buffer, padded with zeros to a multiple of dp under zero 1. Each
parameter's .data and .grad become views into them, so autograd, the split backward's W pass and the vocabulary
and tensor-parallel layers (which add to .grad by hand) all accumulate straight into the buffer. Buckets are
consecutive ranges of bucket_mb MiB of it (a multiple of dp elements; a parameter may straddle two).

Reduction, on the "dp" channel: one communicator per dp group (vp.mesh) and its own CommStream (a worker thread on
CPU, a CUDA side stream on GPU), so it never queues behind the pipeline's traffic. Zero 0 all-reduces a bucket in
place; zero 1 reduce-scatters it in place, each rank keeping the sum of its 1/dp of the bucket. Buckets are launched
in index order on every replica (a collective's order must match across its group): without overlap all of them
after the pipeline's flush; with overlap_grad_reduce each as soon as it and the buckets before it hold only final
gradients. A gradient is final after its last accumulation of the iteration, heard through autograd's
register_post_accumulate_grad_hook and, for the passes that add by hand, vp.wgrad.accumulated. How many
accumulations a parameter gets per iteration depends on its layer (split backward, SUMMA's loops, the vocabulary
passes), not only on the microbatches: the first iteration counts them (its buckets wait for the flush) and every
later one launches on the count.

Zero 1: the optimizer holds, per replica d, the d-th 1/dp of each bucket as its parameters (views: the fp32
master weights are the weights themselves, as the runs train fp32 weights under autocast) with those shards of the
gradient buffer, where the reduce-scatter left their sums, as their gradients, so AdamW's states are 1/dp of the
replicated optimizer's; after the step an in-place all-gather per bucket gives every replica the updated weights.
Adam is elementwise, so the step is the replicated optimizer's exactly.
"""
import torch

from vp.comm import Comm

CHANNEL = "dp"


class DataParallel:
    def __init__(self, params: list[torch.nn.Parameter], comm: Comm, zero: int, overlap: bool, bucket_mb: float):
        self.comm, self.zero, self.overlap = comm, zero, overlap
        self.size, self.index = comm.size(CHANNEL), comm.index(CHANNEL)
        self.params = list(reversed(params))
        if any(p.dtype != torch.float32 for p in self.params):
            raise TypeError("data parallelism keeps fp32 weights: every parameter must be fp32")
        numel = sum(p.numel() for p in self.params)
        multiple = self.size if zero else 1
        self.numel = -(-numel // multiple) * multiple
        device = self.params[0].device
        self.param_flat = torch.zeros(self.numel, device=device)
        self.grad_flat = torch.zeros(self.numel, device=device)
        self.spans: dict[torch.nn.Parameter, tuple[int, int]] = {}
        offset = 0
        for p in self.params:
            n = p.numel()
            self.param_flat[offset:offset + n].copy_(p.detach().reshape(-1))
            p.data = self.param_flat[offset:offset + n].view_as(p)
            p.grad = self.grad_flat[offset:offset + n].view_as(p)
            self.spans[p] = (offset, offset + n)
            offset += n
        per_bucket = max(multiple, int(bucket_mb * 2**20 / 4) // multiple * multiple)
        self.buckets = [(lo, min(lo + per_bucket, self.numel)) for lo in range(0, self.numel, per_bucket)]
        self.of_param = {p: [b for b, (lo, hi) in enumerate(self.buckets) if lo < e and s < hi]
                         for p, (s, e) in self.spans.items()}
        self.master = []  # zero 1: this replica's 1/dp of each bucket, views: the step writes the weights themselves
        for lo, hi in self.buckets if zero else ():
            n = (hi - lo) // self.size
            a, b = lo + self.index * n, lo + (self.index + 1) * n
            shard = self.param_flat[a:b]
            shard.grad = self.grad_flat[a:b]
            self.master.append(shard)
        self.expected: dict[torch.nn.Parameter, int] | None = None  # accumulations per iteration (first one counts)
        for p in self.params:
            p.register_post_accumulate_grad_hook(self._accumulated)
            p.grad_ready_hook = self._accumulated  # vp.wgrad.accumulated: the passes that add by hand
        self._begin_counts()

    @property
    def step_params(self) -> list[torch.Tensor]:
        """What the optimizer steps: every parameter (zero 0) or this replica's shard of the flat buffer (zero 1)."""
        return self.master if self.zero else list(reversed(self.params))

    # -- one iteration ----------------------------------------------------------------------------
    def zero_grad(self):
        self.grad_flat.zero_()
        self._begin_counts()

    def _begin_counts(self):
        self.counts = {p: 0 for p in self.params}
        self.handles: list = []
        self.launched = 0
        if self.overlap and self.expected is not None:
            self.pending = [0] * len(self.buckets)
            for p, n in self.expected.items():
                for b in self.of_param[p] if n else ():
                    self.pending[b] += 1
            self._launch_ready()

    def _accumulated(self, p: torch.nn.Parameter):
        self.counts[p] += 1
        if self.overlap and self.expected is not None and self.counts[p] == self.expected[p]:
            for b in self.of_param[p]:
                self.pending[b] -= 1
            self._launch_ready()

    def _launch_ready(self):
        while self.launched < len(self.buckets) and self.pending[self.launched] == 0:
            self._launch(self.launched)

    def _launch(self, b: int):
        lo, hi = self.buckets[b]
        grad = self.grad_flat[lo:hi]
        if self.zero:
            step = lambda: self.comm.reduce_scatter_flat(grad, CHANNEL)  # noqa: E731
        else:
            step = lambda: self.comm.all_reduce(grad, CHANNEL)  # noqa: E731
        self.handles.append(self.comm.submit(CHANNEL, step, f"gradient bucket {b} ({hi - lo} elements)"))
        self.launched += 1

    def finish(self, timeout: float):
        """After the pipeline's flush: launch the buckets not launched yet and wait for all of them; the first
        iteration's counts become the expected ones. Afterwards each gradient (zero 0), or this replica's shard
        of the buffer (zero 1), holds the sum over the replicas."""
        for p in self.params:
            lo, hi = self.spans[p]
            if p.grad is None or p.grad.data_ptr() != self.grad_flat[lo:].data_ptr():
                raise RuntimeError("a gradient left the data-parallel buffer (assigned rather than accumulated in "
                                   "place): its reduction would be lost")
        if self.overlap and self.expected is not None and self.counts != self.expected:
            wrong = sum(self.counts[p] != self.expected[p] for p in self.params)
            raise RuntimeError(f"{wrong} gradient(s) were accumulated a different number of times than in the "
                               f"first iteration: overlapped buckets may have been reduced too early")
        self.early = self.launched  # buckets launched during the backward passes (overlapped)
        while self.launched < len(self.buckets):
            self._launch(self.launched)
        for handle in self.handles:
            handle.wait(timeout)
        if self.expected is None:
            self.expected = dict(self.counts)

    def after_step(self):
        """Zero 1: every replica's updated shards to every replica (an in-place all-gather per bucket)."""
        for lo, hi in self.buckets if self.zero else ():
            self.comm.all_gather_flat(self.param_flat[lo:hi], CHANNEL)
