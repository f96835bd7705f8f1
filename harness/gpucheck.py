"""python -m harness.gpucheck [--out DIR] [--budget-s 480] [--pp 2 4 8] [--methods ...]   (make gpu-check)

The prepared check of the GPU path, for the first machine with a GPU. On one GPU:
  math     the vocabulary passes (S, C1, T, C2 of every algorithm) on CUDA in fp32 against an fp64 CPU reference
  passes   F, B, W of a transformer layer and S, T, IF, IB of a vocabulary shard at the 4b paper shape (h 3072,
           seq 2048, V 256k over 8 shards), bf16 under autocast, timed with the runtime's CUDA-event timer and by
           the wall clock; a GPU profile fitted from them (OUT/gpucheck.yaml, for backend=sim)
  memory   the CUDA memory metrics: allocated and reserved peaks of one layer's F+B, and its activations against
           the cost model's
On a node with G >= 2 GPUs, also:
  pipeline torchrun pp = 2, 4, 8 (<= G) of every method, bf16, loss against the fp32 CPU reference within bf16's
           tolerance; one injected fault under NCCL, whose culprit must be named
Exit 0 when every check that ran passed; OUT/gpucheck.json holds the figures. Parts that do not fit the budget
are reported as skipped. --device cpu runs the same code on CPU at tiny shapes (the test suite does that).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import torch

from vp.config import RunConfig
from vp.cost import EFF_KINDS, Hardware, layer_activation_bytes
from vp.flops import layer_flops
from vp.schedule.methods import METHODS

BF16_RTOL = 3e-2  # loss of a bf16 run against the fp32 reference
PAPER = dict(hidden=3072, heads=24, seq_len=2048, vocab_size=256000, pp=8)  # 4b on 8 GPUs (conf/model/4b.yaml)
TINY = dict(hidden=32, heads=2, seq_len=16, vocab_size=512, pp=2)


def check_math(device: torch.device) -> dict:
    """Relative errors of loss, grad X and grad W of each algorithm (one shard, group of one) against fp64."""
    from vp.comm import Comm
    from vp.schedule.methods import VOCAB
    from vp.vocab.output import Shard, c1_step, c2_step, naive_backward, naive_forward, s_pass, t_pass

    n, h, v = 256, 64, 1000
    gen = torch.Generator().manual_seed(3)
    x, w = torch.randn(n, h, generator=gen, dtype=torch.float64), torch.randn(v, h, generator=gen).double() * 0.1
    targets, weights = torch.randint(0, v, (n,), generator=gen), torch.full((n,), 1.0 / n, dtype=torch.float64)
    p = torch.softmax(x @ w.t(), -1)
    loss = (weights * -torch.log(p[torch.arange(n), targets])).sum()
    p[torch.arange(n), targets] -= 1
    ref_x, ref_w = (p * weights[:, None]) @ w, (p * weights[:, None]).t() @ x
    comm, shard, out = Comm.local([0], 0, device), Shard(0, 1, v, v), {}
    for algo in (a for a in VOCAB.values() if a.parallel):
        weight = torch.nn.Parameter(w.float().to(device))
        args = (shard, weight, x.float().to(device), targets.to(device), weights.float().to(device))
        if algo.synchronous:
            state = naive_backward(shard, weight, naive_forward(*args, comm), comm)
        else:
            state = t_pass(shard, weight, c1_step(s_pass(*args, algo), comm, algo), algo)
            state = c2_step(state, comm) if algo.after_t else state
        errs = [abs(state.loss.item() - loss.item()) / loss.item(), _rel(state.grad_x, ref_x), _rel(weight.grad, ref_w)]
        out[algo.name] = {"loss": errs[0], "grad_x": errs[1], "grad_w": errs[2], "ok": max(errs) < 1e-4}
    comm.close()
    return out


def _rel(a: torch.Tensor, ref: torch.Tensor) -> float:
    return ((a.double().cpu() - ref).norm() / ref.norm()).item()


def time_passes(device: torch.device, shape: dict, reps: int = 5) -> dict:
    """Median seconds of each pass at `shape` (bf16 autocast on CUDA, fp32 on CPU) by the runtime's timer, the
    wall clock around the same passes, and the CUDA memory peaks of one layer's F + B."""
    from vp.comm import Comm
    from vp.model import Block
    from vp.runtime.loop import ActionTimer
    from vp.schedule.methods import VOCAB
    from vp.vocab import input as vocab_in
    from vp.vocab.output import Shard, c1_step, s_pass, t_pass
    from vp.wgrad import WeightGradStore

    h, s, pp = shape["hidden"], shape["seq_len"], shape["pp"]
    cuda = device.type == "cuda"
    cast = torch.autocast("cuda", dtype=torch.bfloat16) if cuda else torch.autocast("cpu", enabled=False)
    block = Block(h, shape["heads"], 4 * h, 32, 0, 0).to(device)
    shard = Shard.of(0, pp, -(-shape["vocab_size"] // pp) * pp, shape["vocab_size"])
    w_out = torch.nn.Parameter(torch.randn(shard.rows, h, device=device) * 0.02)
    w_in = torch.nn.Parameter(torch.randn(shard.rows, h, device=device) * 0.02)
    ids = torch.randint(0, shard.rows, (1, s), device=device)
    comm, timer, times, wall, mem = Comm.local([0], 0, device), ActionTimer(device), {}, {}, {}
    x = torch.randn(1, s, h, device=device, dtype=torch.bfloat16 if cuda else torch.float32)
    for rep in range(reps + 1):  # the first round warms up
        if cuda:
            torch.cuda.reset_peak_memory_stats(device)
            base = torch.cuda.memory_allocated(device)
        timer.begin()
        t_wall = time.perf_counter()
        store, x_in = WeightGradStore(), x.detach().requires_grad_()
        marks = {}

        def run(kind, fn):
            t0 = timer.now()
            result = fn()
            marks[kind] = (t0, timer.now())
            return result

        with cast:
            out = run("F", lambda: block(x_in, store))
        if cuda:
            mem = {"activations": torch.cuda.memory_allocated(device) - base}
        run("B", lambda: torch.autograd.backward(out, torch.ones_like(out)))
        run("W", store.flush)
        with cast:
            st = run("S", lambda: c1_step(s_pass(shard, w_out, x[0], ids[0], torch.ones(s, device=device) / s,
                                                  VOCAB["alg2"]), comm, VOCAB["alg2"]))
            run("T", lambda: t_pass(shard, w_out, st, VOCAB["alg2"]))
        run("IF", lambda: vocab_in.local_lookup(shard, w_in, ids))
        run("IB", lambda: vocab_in.accumulate_grad(shard, w_in, ids, x))
        for kind, (t0, t1) in marks.items():
            timer.add(kind, t0, t0, t1)
        events = timer.collect()  # synchronises on CUDA
        if rep:
            for kind, _, start, end in events:
                times.setdefault(kind, []).append(end - start)
            wall.setdefault("all", []).append(time.perf_counter() - t_wall)
            wall.setdefault("ratio", []).append(sum(end - start for _, _, start, end in events) / wall["all"][-1])
        if cuda:
            mem.update(allocated=torch.cuda.max_memory_allocated(device), reserved=torch.cuda.max_memory_reserved(device))
    comm.close()
    seconds = {k: statistics.median(v) for k, v in times.items()}
    return {"seconds": seconds, "wall_s": statistics.median(wall["all"]), "memory": mem,
            "timer_vs_wall": statistics.median(wall["ratio"])}


def pass_flops(shape: dict) -> dict:
    """FLOPs of each timed pass (vp.cost's counts): a third of the layer per F, B, W; vocab-2's S (2 GEMMs) and
    T (1 GEMM) of one shard; IF and IB."""
    n, h = shape["seq_len"], shape["hidden"]
    layer, gemm = layer_flops(n, n, h, 4 * h), 2.0 * n * h * -(-shape["vocab_size"] // shape["pp"])
    return {"F": layer / 3, "B": layer / 3, "W": layer / 3, "S": 2 * gemm, "T": gemm, "IF": n * h, "IB": 2 * n * h}


def fit_profile(seconds: dict, shape: dict, peak: float, name: str) -> Hardware:
    """A hardware profile whose pass speeds are the measured ones: efficiency = FLOPs / (seconds x peak)."""
    flops = pass_flops(shape)
    eff = {k: flops[k] / (seconds[k] * peak) for k in EFF_KINDS if k in seconds}
    return replace(Hardware(name, peak), efficiency=eff)


def check_passes(device: torch.device, shape: dict, out: Path) -> dict:
    from harness.profiles import write_profile
    from vp.metrics import device_peak

    measured = time_passes(device, shape)
    peak, how = device_peak(device)
    hw = fit_profile(measured["seconds"], shape, peak, f"gpucheck-{device.type}")
    path = write_profile(hw, out / "gpucheck.yaml", f"python -m harness.gpucheck at {shape}")
    cfg = RunConfig(method="vocab-2", hidden=shape["hidden"], heads=shape["heads"], seq_len=shape["seq_len"])
    mem = measured["memory"]
    result = {**measured, "peak_flops": peak, "peak_source": how, "efficiency": hw.efficiency, "profile": str(path)}
    # the runtime's timer accounts for the wall clock's time (on CUDA, where kernels dominate, for most of it)
    ok = all(0 < e < 1.2 for e in hw.efficiency.values()) and (0.5 if mem else 0) < result["timer_vs_wall"] <= 1.0 + 1e-6
    if mem:  # CUDA: the peaks are consistent and one layer's activations are near the cost model's
        result["activations_vs_cost_model"] = mem["activations"] / layer_activation_bytes(cfg, Hardware("x", 1.0))
        ok = ok and 0 < mem["allocated"] <= mem["reserved"] and 0.25 < result["activations_vs_cost_model"] < 4
    return {**result, "ok": ok}


def check_pipeline(device: str, pps: list[int], methods: list[str], out: Path, budget_s: float) -> dict:
    """torchrun pp processes per pp (one per GPU), each running every method in turn; losses against the fp32
    CPU reference (bf16 tolerance on CUDA, 1e-5 on CPU)."""
    from vp.reference import train_reference

    results, deadline = {}, time.monotonic() + budget_s
    for pp in pps:
        left = deadline - time.monotonic()
        if left < 30:
            results[f"pp{pp}"] = {"ok": None, "skipped": "budget"}
            continue
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={pp}", "-m",
               "harness.gpucheck", "worker", "--pp", str(pp), "--device", device, "--out", str(out), "--methods",
               *methods]
        run = subprocess.run(cmd, capture_output=True, text=True, timeout=left)
        losses_file = out / f"losses-pp{pp}.json"
        got = json.loads(losses_file.read_text()) if losses_file.exists() else {}
        for method in methods:
            cfg = worker_config(method, pp, device)
            ref = train_reference(cfg.with_(device="cpu", dtype="fp32"))[0]
            loss = got.get(method)
            rtol = BF16_RTOL if device == "cuda" else 1e-5
            ok = loss is not None and all(abs(a - b) <= rtol * abs(b) for a, b in zip(loss, ref))
            results[f"pp{pp}/{method}"] = {"ok": ok, "loss": loss, "reference": ref}
        if run.returncode:
            results[f"pp{pp}"] = {"ok": False, "stderr": run.stderr[-3000:]}
    return results


def worker_config(method: str, pp: int, device: str) -> RunConfig:
    chunks = METHODS[method].family.chunks or 2
    return RunConfig(method=method, pp=pp, layers=pp * chunks, hidden=64, heads=4, seq_len=32, vocab_size=1000,
                     microbatches=2 * pp, iterations=3, warmup=1, device=device,
                     dtype="bf16" if device == "cuda" else "fp32", timeout_s=120)


def worker(args) -> int:
    """One torchrun process: every method in turn through vp.run.run_rank; rank 0 writes the losses."""
    from vp.run import run_rank

    rank, world, local_rank = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), int(os.environ["LOCAL_RANK"])
    losses = {}
    for method in args.methods:
        record = run_rank(worker_config(method, world, args.device), rank, world,
                          f"file://{args.out.resolve()}/rendezvous-pp{world}-{method}", local_rank)
        if record is not None:
            losses[method] = record["metrics"]["loss"]
            (args.out / f"losses-pp{world}.json").write_text(json.dumps(losses))
    return 0


def check_fault(out: Path) -> dict:
    """A rank that raises under NCCL: the run fails at once (abort of its communicators), naming that rank."""
    from vp.launch import RunFailed, launch_local

    cfg = worker_config("vocab-2", 2, "cuda").with_(timeout_s=60)
    t0 = time.monotonic()
    try:
        launch_local(cfg, fault=(1, "F2", "raise"))
        return {"ok": False, "error": "the run did not fail"}
    except RunFailed as err:
        seconds = time.monotonic() - t0
        return {"ok": err.status == "failed" and str(err).startswith("rank 1") and seconds < 60,
                "status": err.status, "seconds": seconds, "message": str(err)[:500]}


def plan(gpus: int, pps: list[int]) -> list[str]:
    """The checks this machine can run, in order."""
    single = ["math", "passes"]
    return single + (["pipeline", "fault"] if gpus >= 2 and any(p <= gpus for p in pps) else [])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m harness.gpucheck", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="part")
    w = sub.add_parser("worker", help="(internal) one torchrun process of the pipeline check")
    for p in (ap, w):
        p.add_argument("--out", type=Path, default=Path("results/gpucheck"))
        p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
        p.add_argument("--methods", nargs="+", default=list(METHODS))
        p.add_argument("--pp", type=int, nargs="+", default=[2, 4, 8])
    ap.add_argument("--budget-s", type=float, default=480.0)
    args = ap.parse_args(argv)
    unknown = sorted(set(args.methods) - set(METHODS))
    if unknown:
        ap.error(f"--methods: unknown {unknown}; choose from {', '.join(METHODS)}")
    args.out.mkdir(parents=True, exist_ok=True)
    if args.part == "worker":
        return worker(args)
    if args.device == "cuda" and not torch.cuda.is_available():
        print("error: no CUDA device here; run on a GPU machine, or --device cpu to exercise the check on CPU",
              file=sys.stderr)
        return 2
    gpus = torch.cuda.device_count() if args.device == "cuda" else 2
    pps = [p for p in args.pp if p <= gpus]
    device, started, report = torch.device(args.device, 0) if args.device == "cuda" else torch.device("cpu"), \
        time.monotonic(), {"torch": torch.__version__, "gpus": gpus, "plan": plan(gpus, args.pp)}
    if args.device == "cuda":
        report["devices"] = [torch.cuda.get_device_name(i) for i in range(gpus)]
    for part in report["plan"]:
        left = args.budget_s - (time.monotonic() - started)
        t0 = time.monotonic()
        if part == "math":
            report[part] = check_math(device)
        elif part == "passes":
            report[part] = check_passes(device, PAPER if args.device == "cuda" else TINY, args.out)
        elif part == "pipeline":
            report[part] = check_pipeline(args.device, pps, args.methods, args.out, left - 60)
        elif part == "fault" and args.device == "cuda" and left > 60:
            report[part] = check_fault(args.out)
        print(f"{part}: {_verdict(report.get(part))} ({time.monotonic() - t0:.0f} s)", flush=True)
    (args.out / "gpucheck.json").write_text(json.dumps(report, indent=1, default=str))
    failed = [p for p in report["plan"] if _verdict(report.get(p)) == "FAILED"]
    print(f"{'FAILED: ' + ', '.join(failed) if failed else 'all checks that ran passed'}; "
          f"figures in {args.out / 'gpucheck.json'}")
    return 1 if failed else 0


def _verdict(result) -> str:
    if result is None:
        return "skipped"
    oks = [result.get("ok")] if "ok" in result else [r.get("ok") for r in result.values() if isinstance(r, dict)]
    return "FAILED" if any(ok is False for ok in oks) else "passed" if any(oks) else "skipped"


if __name__ == "__main__":
    sys.exit(main())
