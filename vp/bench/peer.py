"""python -m vp.bench peer: this project's runtime against PyTorch's own pipelining, side by side in one run.

Every runner trains the same GPT stages (vp.model.build_stage, values seeded by parameter name), on the same
microbatches (vp.data), with the same per-token loss weights and the same AdamW, on pp CPU processes over
gloo with the same threads per process (vp.launch.launch_local starts both kinds):
  torch  Schedule1F1B / ScheduleInterleaved1F1B of torch.distributed.pipelining, over PipelineStage; the last
         stage returns logits and the schedule's loss_fn applies the project's weighted cross-entropy
  vp     this project's methods baseline, interleaved (same stages, same schedules) and vocab-2
Fairness is checked, not assumed: every runner's loss per iteration must equal the vp baseline's.
"""
import statistics
import sys
import time
from dataclasses import dataclass
from datetime import timedelta
from functools import partial

import torch
import torch.distributed as dist
import torch.nn as nn

from vp.config import RunConfig, check_config
from vp.data import loss_weights, microbatch
from vp.launch import launch_local
from vp.model import build_stage, weighted_cross_entropy

LOSS_RTOL = 1e-5  # fp32, the same ops in the same order up to the accumulation order of gradients


@dataclass(frozen=True)
class Runner:
    method: str  # the project method whose stages and layer split it runs (and, without torch_schedule, runs)
    torch_schedule: str | None = None  # a schedule class of torch.distributed.pipelining, or this project

    @property
    def runner(self) -> str:
        return "torch" if self.torch_schedule else "vp"

    @property
    def schedule(self) -> str:
        return self.torch_schedule or self.method


TORCH_1F1B = Runner("baseline", "Schedule1F1B")
TORCH_INTERLEAVED = Runner("interleaved", "ScheduleInterleaved1F1B")
VP_BASELINE, VP_INTERLEAVED, VP_VOCAB2 = Runner("baseline"), Runner("interleaved"), Runner("vocab-2")
RUNNERS = (TORCH_1F1B, TORCH_INTERLEAVED, VP_BASELINE, VP_INTERLEAVED, VP_VOCAB2)
# (runner, reference, at most this fraction of the reference's iteration time): the project's goals
GOALS = ((VP_BASELINE, TORCH_1F1B, 0.9), (VP_INTERLEAVED, TORCH_INTERLEAVED, 1.0), (VP_VOCAB2, TORCH_1F1B, 0.5))


# -- the torch runner (one process per pipeline rank) -------------------------------------------------
class LogitsStage(nn.Module):
    """The last stage for torch's schedules: the project's stage, then the output layer's logits."""

    def __init__(self, stage: nn.Module):
        super().__init__()
        self.stage = stage

    def forward(self, x):
        return self.stage.logits(self.stage(x))


def packed_loss(logits, packed):
    """The schedule's loss_fn: packed [b, s, 2] fp64 holds target ids and per-token loss weights (torch's
    schedules split one target tensor into microbatches, so both travel in it; fp64 keeps both exact)."""
    return weighted_cross_entropy(logits, packed[..., 0].long(), packed[..., 1].float())


def full_batch(cfg: RunConfig, iteration: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The iteration's microbatches, concatenated along the batch (torch's schedules split them again):
    ids [m*b, s] and packed targets with weights [m*b, s, 2]."""
    ids, packed = [], []
    for mb in range(cfg.microbatches):
        x, targets, mask = microbatch(cfg.seed, iteration, mb, cfg.micro_batch_size, cfg.seq_len, cfg.vocab_size)
        ids.append(x)
        packed.append(torch.stack([targets.double(), loss_weights(mask, cfg.microbatches).double()], dim=-1))
    return torch.cat(ids), torch.cat(packed)


def torch_schedule(cfg: RunConfig, schedule: str, rank: int):
    """-> (torch schedule, parameters of this rank, whether this rank feeds the first stage)."""
    from torch.distributed import pipelining
    from torch.distributed.pipelining.schedules import PipelineScheduleMulti

    device, n_stages = torch.device("cpu"), cfg.pp * cfg.n_chunks
    stages, params = [], []
    for chunk in range(cfg.n_chunks):  # loop placement, as torch's interleaved schedule expects
        index = chunk * cfg.pp + rank
        module = build_stage(cfg, cfg.seed, index, cfg.stage_layers, local_vocab=True)
        module = LogitsStage(module) if index == n_stages - 1 else module
        params += list(module.parameters())
        stages.append(pipelining.PipelineStage(module, index, n_stages, device))
    cls = getattr(pipelining, schedule)
    held = stages if issubclass(cls, PipelineScheduleMulti) else stages[0]  # several stages per rank, or one
    # the weights already hold 1/microbatches: no further gradient scaling
    return cls(held, cfg.microbatches, loss_fn=packed_loss, scale_grads=False), params, rank == 0


def torch_rank(cfg: RunConfig, rank: int, world: int, init_method: str, local_rank: int = 0, fault=None,
               trace_path=None, schedule: str = "Schedule1F1B") -> dict | None:
    """One process of a torch pipelining run; rank 0 returns {"metrics": loss and times per iteration}."""
    assert fault is None and trace_path is None, "the torch runner takes no injected faults and writes no trace"
    dist.init_process_group("gloo", init_method=init_method, rank=rank, world_size=world,
                            timeout=timedelta(seconds=cfg.timeout_s))
    try:
        sched, params, feeds = torch_schedule(cfg, schedule, rank)
        optimizer = torch.optim.AdamW(params, lr=cfg.lr, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.01)
        losses, seconds = [], []
        for it in range(cfg.iterations):  # timed as vp.runtime: batch, schedule and optimizer step
            optimizer.zero_grad(set_to_none=True)
            begin = time.perf_counter()
            ids, packed = full_batch(cfg, it)
            mb_losses = []
            sched.step(*((ids,) if feeds else ()), target=packed, losses=mb_losses, return_outputs=False)
            optimizer.step()
            seconds.append(time.perf_counter() - begin)
            losses.append(sum(x.item() for x in mb_losses) if mb_losses else None)
        gathered = [None] * world
        dist.all_gather_object(gathered, (losses, seconds))
    finally:
        dist.destroy_process_group()
    if rank != 0:
        return None
    iter_s = [max(s[i] for _, s in gathered) for i in range(cfg.warmup, cfg.iterations)]  # as vp.metrics
    loss = next(ls for ls, _ in gathered if all(x is not None for x in ls))
    return {"metrics": {"loss": loss, "iteration_time_s": statistics.median(iter_s), "iteration_times_s": iter_s}}


def run(runner: Runner, cfg: RunConfig) -> dict:
    """One run of a runner -> its metrics (loss per iteration, median and measured iteration times)."""
    cfg = check_config(cfg.with_(method=runner.method))
    if runner.torch_schedule:
        return launch_local(cfg, rank_fn=partial(torch_rank, schedule=runner.torch_schedule))["metrics"]
    return launch_local(cfg)["metrics"]


# -- the benchmark ----------------------------------------------------------------------------------
def loss_check(results: dict[Runner, list[dict]]) -> dict[Runner, float]:
    """Largest relative difference of each runner's loss per iteration from the vp baseline's first run."""
    ref = results[VP_BASELINE][0]["loss"]
    return {r: max(abs(a - b) / abs(b) for m in runs for a, b in zip(m["loss"], ref, strict=True))
            for r, runs in results.items()}


def bench_peer(cfg: RunConfig, rounds: int = 1) -> tuple[list[dict], bool]:
    """Run every runner `rounds` times, round-robin (so load on a shared machine hits all alike); -> one
    row per runner (its iteration time: the best round's median over measured iterations, the round least
    disturbed by other work) and whether every runner's losses equal the vp baseline's."""
    if cfg.device != "cpu" or cfg.dtype != "fp32":
        raise ValueError(f"device={cfg.device}, dtype={cfg.dtype}: the peer bench runs torch's schedules on "
                         f"gloo/CPU in fp32; use device=cpu, dtype=fp32")
    for r in RUNNERS:
        check_config(cfg.with_(method=r.method))
    results: dict[Runner, list[dict]] = {r: [] for r in RUNNERS}
    for i in range(rounds):
        for r in RUNNERS:
            results[r].append(run(r, cfg))
            print(f"  round {i + 1}/{rounds} {r.runner} {r.schedule}: "
                  f"{results[r][-1]['iteration_time_s']:.3f} s/iteration", file=sys.stderr, flush=True)
    diffs = loss_check(results)
    rows = []
    for r in RUNNERS:
        times = [m["iteration_time_s"] for m in results[r]]
        rows.append({"runner": r.runner, "schedule": r.schedule, "method": r.method,
                     "iteration_time_s": min(times), "iteration_time_s_per_round": times,
                     "loss": results[r][0]["loss"], "loss_max_rel_diff_vs_vp_baseline": diffs[r],
                     "loss_matches": diffs[r] <= LOSS_RTOL})
    return rows, all(row["loss_matches"] for row in rows)


def print_table(cfg: RunConfig, rows: list[dict], rounds: int, fair: bool):
    by = {(row["runner"], row["schedule"]): row for row in rows}
    t = {r: by[(r.runner, r.schedule)]["iteration_time_s"] for r in RUNNERS}
    print(f"{cfg.pp} CPU ranks (gloo, {torch.get_num_threads()} thread(s) here, the launcher's split per rank), "
          f"h={cfg.hidden}, {cfg.layers} layers, seq {cfg.seq_len}, V={cfg.vocab_size}, {cfg.microbatches} "
          f"microbatches, {cfg.iterations} iterations ({cfg.warmup} warm-up), best of {rounds} round(s)")
    print(f"{'runner':>6} {'schedule':>24} {'s/iter':>8} {'vs Schedule1F1B':>15} {'loss rel diff':>13}")
    for row in rows:
        print(f"{row['runner']:>6} {row['schedule']:>24} {row['iteration_time_s']:>8.3f} "
              f"{row['iteration_time_s'] / t[TORCH_1F1B]:>14.2f}x {row['loss_max_rel_diff_vs_vp_baseline']:>13.1e}")
    print("goals (time ratio, at most):")
    for runner, ref, goal in GOALS:
        ratio = t[runner] / t[ref]
        print(f"  vp {runner.schedule} / torch {ref.schedule}: {ratio:.2f} (goal <= {goal}) "
              f"{'met' if ratio <= goal else 'NOT met'}")
    if fair:
        print(f"same losses: every runner's loss per iteration equals the vp baseline's within {LOSS_RTOL:g} "
              f"(relative) -- the same model, data and weights, so the times compare like with like")
    else:
        print(f"LOSSES DIFFER beyond {LOSS_RTOL:g}: the runners did not compute the same thing; "
              f"the times above do not compare like with like")
