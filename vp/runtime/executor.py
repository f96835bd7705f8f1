"""What each action does on one rank. The dispatch loop (loop.py) calls, per action: launch() if the
action enters a collective at its start, wait() for each collective it needs (rules.waits_on), compute(),
and launch() if it enters one at its end -- the order the simulator assumes.
"""
import contextlib
from dataclasses import dataclass

import torch

from vp.channels import p2p_channel
from vp.comm import Comm
from vp.data import loss_weights, microbatch
from vp.model import Stage
from vp.runtime.memory import ActivationMeter
from vp.runtime.state import IterState
from vp.schedule import Action, Schedule
from vp.schedule.rules import collective, p2p_peer, root_of
from vp.tp.context import TensorParallel
from vp.tp.grads import reduce_replicated
from vp.tp.layout import token_rows
from vp.tp.sequence import gather_sequence, scatter_sequence, sequence_block
from vp.vocab import input as vocab_in
from vp.vocab import output as vocab_out
from vp.wgrad import WeightGradStore

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


@dataclass
class RankModel:
    """The parameters one rank holds: its stages (by chunk) and, under vocabulary parallelism, its shard
    of the output weight and of the input embedding."""
    stages: dict[int, Stage]
    shard: vocab_out.Shard | None = None
    out_weight: torch.nn.Parameter | None = None
    in_weight: torch.nn.Parameter | None = None
    tp: TensorParallel | None = None  # this rank's tensor-parallel group (its stages are vp.tp stages)

    def parameters(self) -> list[torch.nn.Parameter]:
        params = [p for st in self.stages.values() for p in st.parameters()]
        return params + [p for p in (self.out_weight, self.in_weight) if p is not None]

    def reduce_grads(self):
        """After the iteration's last backward: sum the gradients of parameters a tensor-parallel grid replicates
        (the vocabulary shards too: a grid holds shard p * q + c on every (r, k), each device summing its rows)."""
        if self.tp is None:
            return
        reduce_replicated(list(self.stages.values()), self.tp)
        shards = [p for p in (self.out_weight, self.in_weight) if p is not None and p.grad is not None]
        if shards and self.tp.size("batch") > 1:
            flat = self.tp.all_reduce(torch.cat([p.grad.reshape(-1) for p in shards]), "batch")
            for p, g in zip(shards, flat.split([p.numel() for p in shards])):
                p.grad.copy_(g.view_as(p))

    def total_loss(self, loss: float | None) -> float | None:
        """The iteration's loss over every token block (a grid device computes its own block's share)."""
        if self.tp is None or loss is None:
            return loss
        # on the parameters' device: the batch group's communicator is NCCL's on CUDA, which has no CPU tensors
        device = self.parameters()[0].device
        return self.tp.all_reduce(torch.tensor([loss], dtype=torch.float64, device=device), "batch").item()


class Executor:
    def __init__(self, cfg, sched: Schedule, rank: int, model: RankModel, comm: Comm, device: torch.device,
                 meter: ActivationMeter, replica: int = 0):
        """rank: this process's pipeline rank; replica: its data-parallel replica, which takes microbatches
        replica * microbatches ... of the global batch."""
        self.cfg, self.s, self.rank, self.model, self.comm, self.device = cfg, sched, rank, model, comm, device
        self.first_mb = replica * sched.microbatches
        self.global_mbs = cfg.dp * sched.microbatches
        self.meter = meter
        self.dtype = DTYPES[cfg.dtype]
        # a tensor-parallel grid device holds token block j of the micro-batch's sequences and hidden column c
        self.tp = model.tp
        self.blocks, self.block = (self.tp.batch_blocks, self.tp.token_block) if self.tp else (1, 0)
        self.grid = self.tp is not None and self.tp.mode.grid
        # 1-D sequence parallelism: a device holds positions [t s/t, (t+1) s/t) of its stage's activations
        self.seq_parallel = self.tp is not None and self.tp.sequence_parallel
        rows = cfg.micro_batch_size // self.blocks
        seq = cfg.seq_len // self.tp.q if self.seq_parallel else cfg.seq_len
        self.act_shape = (rows, seq, cfg.hidden // self.tp.q if self.grid else cfg.hidden)
        self.tokens = rows * cfg.seq_len
        self.last_stage = sched.n_stages - 1
        self.loss_scale = 1.0
        self.st: IterState | None = None

    def autocast(self):
        """The run's compute dtype for every GEMM of a pass (docs/gpu-path.md, precision): autocast on the run's
        device (CPU too, where tests run bf16), fp32 gradients and softmax statistics inside the passes."""
        if self.dtype != torch.float32:
            return torch.autocast(self.device.type, dtype=self.dtype)
        return contextlib.nullcontext()

    # -- data ---------------------------------------------------------------------------------------
    def batch(self, mb: int):
        if mb not in self.st.batches:
            ids, targets, mask = microbatch(self.cfg.seed, self.st.iteration, self.first_mb + mb,
                                            self.cfg.micro_batch_size, self.cfg.seq_len, self.cfg.vocab_size)
            self.st.batches[mb] = tuple(t.to(self.device, non_blocking=True) for t in (ids, targets, mask))
        return self.st.batches[mb]

    def loss_weights(self, mb: int) -> torch.Tensor:
        return loss_weights(self.batch(mb)[2], self.global_mbs) * self.loss_scale

    def local(self, t: torch.Tensor) -> torch.Tensor:
        """This device's sequences (its token block) of a whole micro-batch tensor [b, ...]."""
        return token_rows(t, self.blocks, self.block)

    # -- layout of a stage's activation: a grid splits the hidden, 1-D sequence parallelism the positions; plain
    # 1-D devices and tp = 1 hold the whole of it ------------------------------------------------------------
    def full_hidden(self, x: torch.Tensor, channel: str) -> torch.Tensor:
        """[..., h/q] of each device of a grid row -> [..., h], gathered over the row (sequence parallel:
        [b, s/t, h] -> [b, s, h])."""
        if self.seq_parallel:
            return gather_sequence(x, self.tp, channel)
        if not self.grid:
            return x
        parts = self.comm.all_gather(x.contiguous(), channel)  # [q, ..., h/q]
        return parts.movedim(0, -2).reshape(*x.shape[:-1], -1)

    def sum_hidden(self, x: torch.Tensor, channel: str) -> torch.Tensor:
        """Partial [..., h] of the devices of a stage's row, summed: a grid device keeps its column's [..., h/q]
        (reduce-scatter), a 1-D device all of it (all-reduce) or, sequence parallel, its positions (reduce-scatter)."""
        if self.tp is None:
            return x
        if self.seq_parallel:
            return scatter_sequence(x, self.tp, channel)
        if not self.grid:
            return self.comm.all_reduce(x, channel)
        return self.comm.reduce_scatter(x.view(*x.shape[:-1], self.tp.q, -1).movedim(-2, 0).contiguous(), channel)

    def hidden_block(self, x: torch.Tensor) -> torch.Tensor:
        """[n, h] -> this device's column [n, h/q] (a grid), its positions [b, s/t, h] (sequence parallel) or all
        of it."""
        if self.seq_parallel:
            return sequence_block(x.view(self.act_shape[0], self.cfg.seq_len, -1), self.tp)
        if not self.grid:
            return x
        return x.view(*x.shape[:-1], self.tp.q, -1)[..., self.tp.c, :]

    # -- collectives --------------------------------------------------------------------------------
    def launch(self, a: Action, inst):
        """Start the collective instance an action enters, on its channel's CommStream."""
        st, comm, mb, algo = self.st, self.comm, a.mb, self.s.vocab
        if a.kind == "C0":  # the last stage's X and the loss weights, [n, h + 1] in fp32, to every rank
            root = root_of(self.s, "C0")
            if self.rank == root:  # a grid gathers X's hidden over its row first; S here reads the whole of it
                x = self.full_hidden(st.x_last[mb], "C0.row").reshape(self.tokens, -1).float()
                st.x_last[mb] = x
                buf = torch.cat([x, self.local(self.loss_weights(mb)).reshape(-1, 1)], dim=1)
            else:
                buf = torch.empty(self.tokens, self.cfg.hidden + 1, device=self.device)
            # the root keeps no reference to buf: the side stream's read of it must hold its memory (reads)
            st.pending[inst] = comm.submit(inst.group, lambda: comm.broadcast(buf, root, inst.group), inst.text(),
                                           reads=(buf,))
        elif a.kind in algo.collectives:
            out = st.out[mb]
            # C2 (after T) is the last use of the output state on a rank without the last stage: the launch drops
            # it, and with it T's partial grad X, made on the compute stream, that the all-reduce sums in place on
            # the side stream (reads). C1's inputs stay in `out` until T, which waits for C1 first.
            reads = ()
            if a.kind in algo.after_t:
                reads = (out.partial_grad_x,)
                self._used_out(mb)

            def step():  # fills `out` in place (statistics, loss, grad X); consumers read st.out[mb]
                if a.kind in algo.after_s:
                    vocab_out.c1_step(out, comm, algo)
                else:
                    vocab_out.c2_step(out, comm)

            st.pending[inst] = comm.submit(inst.group, step, inst.text(), reads=reads)
        elif a.kind == "IF":  # sum the partial embeddings on the first stage's rank, then over its row
            local, first = st.embed_local.pop(mb), root_of(self.s, "IF")

            def step():
                total = comm.reduce(local, first, inst.group)
                return self.sum_hidden(total, "IF.row") if self.rank == first else None

            # local is made on the compute stream and dropped here; only the side stream's reduce reads it (reads)
            st.pending[inst] = comm.submit(inst.group, step, inst.text(), reads=(local,))
        elif a.kind == "IB":  # the first stage's embedding gradient to every rank
            root = root_of(self.s, "IB")
            if self.rank == root:  # a grid gathers the gradient's hidden over its row first
                buf = self.full_hidden(st.embed_grad.pop(mb), "IB.row")
            else:  # the whole hidden and sequence of this device's token block, in the root's dtype
                buf = torch.empty(self.act_shape[0], self.cfg.seq_len, self.cfg.hidden, dtype=self.dtype,
                                  device=self.device)
            # the root drops buf at its IB, maybe before the broadcast has read it; the others' buf is written there
            st.pending[inst] = comm.submit(inst.group, lambda: comm.broadcast(buf, root, inst.group), inst.text(),
                                           reads=(buf,))
            if self.rank == root:
                st.ready[inst] = buf
        # S and T of the synchronous (naive) algorithm communicate inside their compute: nothing to launch

    def result(self, kind: str, mb: int):
        """The result of a collective this rank waited for (or, at the root of IB, its own input)."""
        return self.st.ready.pop(collective(self.s, kind, mb))

    def wait(self, inst, timeout: float):
        """Wait for a collective this rank consumes; its result (if any) goes to `ready` for the consumer."""
        handle = self.st.pending.pop(inst, None)
        if handle is not None:
            self.st.ready[inst] = handle.wait(timeout)

    def drain(self, timeout: float):
        """End of iteration: wait for every send and every collective nobody here consumed."""
        for work, _ in self.st.sends:
            work.wait()
        self.st.sends.clear()
        for inst in list(self.st.pending):
            self.st.pending.pop(inst).wait(timeout)
        results = {k for k, v in self.st.ready.items() if v is not None}
        assert not results, f"collective results never consumed: {sorted(results)}"
        self.st.ready.clear()

    # -- passes -------------------------------------------------------------------------------------
    def compute(self, a: Action):
        getattr(self, "_" + a.kind)(a)

    def _C0(self, a):
        pass

    _C1 = _C2 = _C0

    def _F(self, a: Action):
        st, mb, c = self.st, a.mb, a.chunk
        stage_idx = self.s.stage(self.rank, c)
        stage = self.model.stages[c]
        if stage_idx == 0:
            if self.s.vocab_parallel:
                x_in = self.result("IF", mb).to(self.dtype).reshape(self.act_shape).requires_grad_()
            else:
                x_in = self.batch(mb)[0]
        else:
            prev_rank, prev_chunk = self.s.where(stage_idx - 1)
            x_in = (st.local_act.pop((mb, prev_chunk)).detach().requires_grad_() if prev_rank == self.rank
                    else st.recv_act.pop((mb, c)))  # local_act is keyed by the chunk that produced it
        store = WeightGradStore() if self.s.split_w else None
        with self.meter.track((mb, c)), self.autocast():
            out = stage(x_in, store)
            if stage_idx == self.last_stage and not self.s.vocab_parallel:
                _, targets, _ = self.batch(mb)
                out = stage.loss(out, targets, self.loss_weights(mb), store)
                st.losses[mb] = out.detach() / self.loss_scale
            elif stage_idx < self.last_stage:
                out = out.to(self.dtype)
        st.fwd[(mb, c)] = (x_in, out, store)
        if stage_idx == self.last_stage:
            if self.s.vocab_parallel:
                st.x_last[mb] = out.detach()
            return
        if self.s.where(stage_idx + 1)[0] == self.rank:
            st.local_act[(mb, c)] = out
        else:
            st.to_send[(mb, c)] = out.detach()

    def _B(self, a: Action):
        st, mb, c = self.st, a.mb, a.chunk
        stage_idx = self.s.stage(self.rank, c)
        x_in, out, store = st.fwd.pop((mb, c))
        if stage_idx == self.last_stage:
            grad = None
            if self.s.vocab_parallel:
                grad = self.hidden_block(st.out[mb].grad_x).reshape(out.shape).to(out.dtype)
                self._used_out(mb)
        else:
            next_rank, next_chunk = self.s.where(stage_idx + 1)
            grad = st.local_grad.pop((mb, next_chunk)) if next_rank == self.rank else st.recv_grad.pop((mb, c))
        torch.autograd.backward(out, grad)
        if x_in.requires_grad:
            if stage_idx == 0:
                st.embed_grad[mb] = x_in.grad
            else:  # keyed by this chunk, the one that produced the gradient
                local = self.s.where(stage_idx - 1)[0] == self.rank
                (st.local_grad if local else st.to_send_grad)[(mb, c)] = x_in.grad
        self.meter.release((mb, c))
        if store is not None:
            st.wgrad[(mb, c)] = store
            self.meter.hold((mb, c), store.held_storages())

    def _W(self, a: Action):
        self.st.wgrad.pop((a.mb, a.chunk)).flush()
        self.meter.release((a.mb, a.chunk))

    def _channel(self, a: Action) -> tuple[int, str]:
        peer, _ = p2p_peer(self.s, a)
        sender, receiver = (self.rank, peer) if a.kind[0] == "S" else (peer, self.rank)
        return peer, p2p_channel("fwd" if a.kind in ("SF", "RF") else "bwd", sender, receiver)

    def _SF(self, a: Action):
        peer, channel = self._channel(a)
        t = self.st.to_send.pop((a.mb, a.chunk))
        self.st.sends.append((self.comm.isend(t, peer, channel), t))

    def _SB(self, a: Action):
        peer, channel = self._channel(a)
        t = self.st.to_send_grad.pop((a.mb, a.chunk)).to(self.dtype)
        self.st.sends.append((self.comm.isend(t, peer, channel), t))

    def _RF(self, a: Action):
        peer, channel = self._channel(a)
        buf = torch.empty(self.act_shape, dtype=self.dtype, device=self.device)
        self.comm.irecv(buf, peer, channel).wait()
        self.st.recv_act[(a.mb, a.chunk)] = buf.requires_grad_()

    def _RB(self, a: Action):
        peer, channel = self._channel(a)
        buf = torch.empty(self.act_shape, dtype=self.dtype, device=self.device)
        self.comm.irecv(buf, peer, channel).wait()
        self.st.recv_grad[(a.mb, a.chunk)] = buf

    def _S(self, a: Action):
        st, mb, m = self.st, a.mb, self.model
        targets = self.local(self.batch(mb)[1])
        if self.rank == self.s.last_rank:
            x, w = st.x_last.pop(mb), self.local(self.loss_weights(mb)).reshape(-1)
        else:
            pack = self.result("C0", mb)
            x, w = pack[:, :-1], pack[:, -1]
        algo = self.s.vocab
        with self.autocast():
            if algo.synchronous:
                out = vocab_out.naive_forward(m.shard, m.out_weight, x, targets.reshape(-1), w, self.comm)
            else:
                out = vocab_out.s_pass(m.shard, m.out_weight, x, targets.reshape(-1), w, algo)
        st.out[mb] = out
        # consumers of `out` on this rank: T, the collectives after T (C2), B of the last stage (on its rank)
        st.out_uses[mb] = 1 + len(algo.after_t) + (self.rank == self.s.last_rank)
        self.meter.add(("S", mb), out.nbytes())

    def _T(self, a: Action):
        st, mb, m = self.st, a.mb, self.model
        out = st.out[mb]
        with self.autocast():
            if self.s.vocab.synchronous:
                vocab_out.naive_backward(m.shard, m.out_weight, out, self.comm)
            else:
                vocab_out.t_pass(m.shard, m.out_weight, out, self.s.vocab)
        if self.rank == 0:
            st.losses[mb] = out.loss.detach() / self.loss_scale
        self.meter.release(("S", mb))
        self._used_out(mb)

    def _used_out(self, mb: int):
        self.st.out_uses[mb] -= 1
        if not self.st.out_uses[mb]:
            del self.st.out_uses[mb]
            del self.st.out[mb]

    def _IF(self, a: Action):
        ids = self.batch(a.mb)[0]
        self.st.embed_local[a.mb] = vocab_in.local_lookup(self.model.shard, self.model.in_weight, self.local(ids))

    def _IB(self, a: Action):
        grad = self.result("IB", a.mb)
        vocab_in.accumulate_grad(self.model.shard, self.model.in_weight, self.local(self.batch(a.mb)[0]), grad)
