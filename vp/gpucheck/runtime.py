"""The real runtime at world size 1 (vp.run.run_rank: NCCL process group, CUDA side streams, CUDA-event timing,
autocast, the fp16 loss scaler, AdamW) for a method of each vocabulary algorithm and schedule family, in bf16 and
fp16, against the single-process fp32 CPU reference's loss (vp.reference). At pp 1 every vocabulary group has one
rank, so the passes S, T, IF, IB run but send nothing; the pipeline's traffic needs two GPUs.
"""
from pathlib import Path

import torch

from vp.config import RunConfig

METHODS = ("baseline", "interlaced", "vocab-1", "vocab-2", "vhalf-vocab-2", "interleaved-vocab-1")
CPU_METHODS = ("vocab-2", "vhalf-vocab-1")  # the CPU form: fp32 against fp32, two methods to stay cheap
RTOL = {"bf16": 3e-2, "fp16": 3e-2, "fp32": 1e-5}  # per iteration, relative to the fp32 reference


def config(method: str, device: str, dtype: str) -> RunConfig:
    cuda = device == "cuda"
    return RunConfig(method=method, pp=1, layers=2, hidden=256 if cuda else 32, heads=4 if cuda else 2,
                     seq_len=256 if cuda else 16, vocab_size=32000 if cuda else 200, microbatches=4, iterations=3,
                     warmup=1, device=device, dtype=dtype, timeout_s=60)


def run(device: torch.device, out: Path) -> dict:
    from vp.gpucheck.race import fresh_rendezvous
    from vp.reference import train_reference
    from vp.run import run_rank

    cuda = device.type == "cuda"
    methods, dtypes = (METHODS, ("bf16", "fp16")) if cuda else (CPU_METHODS, ("fp32",))
    reference = train_reference(config(methods[0], "cpu", "fp32"))[0]  # the same model and data for every method
    runs, ok = {}, True
    c = config(methods[0], device.type, dtypes[0])
    summary = [f"reference (fp32, CPU): loss {', '.join(f'{x:.4f}' for x in reference)}; {c.layers} layers, h "
               f"{c.hidden}, seq {c.seq_len}, V {c.vocab_size}, {c.microbatches} microbatches, {c.iterations} "
               f"iterations", "",
               "| method | dtype | loss per iteration | max rel. error | iteration s |", "|---|---|---|---|---|"]
    for dtype in dtypes:
        for method in methods:
            cfg = config(method, device.type, dtype)
            try:
                with fresh_rendezvous() as rendezvous:
                    record = run_rank(cfg, 0, 1, rendezvous)
            except Exception as err:  # noqa: BLE001 - one method's failure is a finding; the others still run
                runs[f"{method}/{dtype}"] = {"ok": False, "error": f"{type(err).__name__}: {err}"[:2000]}
                summary.append(f"| {method} | {dtype} | FAILED: {type(err).__name__}: {str(err)[:200]} | | |")
                ok = False
                continue
            loss = record["metrics"]["loss"]
            err = max(abs(a - b) / abs(b) for a, b in zip(loss, reference))
            good = len(loss) == len(reference) and err <= RTOL[dtype]
            ok = ok and good
            runs[f"{method}/{dtype}"] = {"ok": good, "loss": loss, "max_rel_error": err,
                                         "iteration_time_s": record["metrics"].get("iteration_time_s"),
                                         "peak_memory_bytes": record["metrics"].get("peak_memory_bytes")}
            summary.append(f"| {method} | {dtype} | {', '.join(f'{x:.4f}' for x in loss)} | {err:.1e}"
                           f"{'' if good else ' FAILED'} | {record['metrics'].get('iteration_time_s', 0):.3f} |")
    summary += ["", "tolerance per iteration: " + ", ".join(f"{d} {RTOL[d]:g}" for d in dtypes)]
    return {"ok": ok, "summary": summary, "reference": reference, "runs": runs}
