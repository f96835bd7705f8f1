"""Preflight: what this machine and its torch are, before anything is run on them.

- versions: Python, torch, CUDA, cuDNN, NCCL; the device, its compute capability, total and free memory;
- the device's name against the peak table (vp.flops.DEVICE_NAMES): a name not listed gets a measured peak in
  every record's MFU instead of the datasheet's;
- the NCCL/CUDA variables of the environment, CUDA_DEVICE_MAX_CONNECTIONS named even when unset (1 serialises
  point-to-point behind collectives; unset lets NCCL's kernels run concurrently);
- every torch.distributed function vp/ calls, and every keyword it passes, found in this torch (read from
  vp/'s source, so a new call is checked without listing it here).
"""
import ast
import importlib
import inspect
import os
import platform
from pathlib import Path

import torch

from vp.flops import DEVICE_NAMES, DEVICE_PEAKS

VP = Path(__file__).resolve().parents[1]
ENV_PREFIXES = ("NCCL_", "TORCH_NCCL_", "CUDA_", "PYTORCH_CUDA_ALLOC_CONF", "TORCH_DISTRIBUTED_DEBUG")
ALWAYS = ("CUDA_DEVICE_MAX_CONNECTIONS", "CUDA_VISIBLE_DEVICES", "TORCH_NCCL_AVOID_RECORD_STREAMS")


def distributed_calls(root: Path = VP) -> dict[tuple[str, str], set[str]]:
    """{(module, name): keywords} of every torch.distributed attribute used under root: `dist.NAME(...)` (with
    `import torch.distributed as dist`) and `from torch.distributed[.sub] import NAME`."""
    found: dict[tuple[str, str], set[str]] = {}
    for path in sorted(root.rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        aliases = {a.asname or a.name: a.name for node in ast.walk(tree) if isinstance(node, ast.Import)
                   for a in node.names if a.name.startswith("torch.distributed")}
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("torch.distributed"):
                for a in node.names:
                    found.setdefault((node.module, a.name), set())
            elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in aliases:
                found.setdefault((aliases[node.value.id], node.attr), set())
        for node in ast.walk(tree):
            f = getattr(node, "func", None)
            if isinstance(node, ast.Call) and isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) \
                    and f.value.id in aliases:
                found[(aliases[f.value.id], f.attr)] |= {k.arg for k in node.keywords if k.arg}
    return found


def missing_api(calls: dict[tuple[str, str], set[str]]) -> list[str]:
    """What of `calls` this torch lacks: 'module.name', or 'module.name(keyword=)' for an unknown keyword."""
    missing = []
    for (module, name), keywords in sorted(calls.items()):
        try:
            obj = getattr(importlib.import_module(module), name)
        except (ImportError, AttributeError):
            try:  # `from torch.distributed import pipelining`: a submodule
                importlib.import_module(f"{module}.{name}")
                continue
            except ImportError:
                missing.append(f"{module}.{name}")
                continue
        if keywords and callable(obj):
            try:
                params = inspect.signature(obj).parameters
            except (TypeError, ValueError):  # a builtin without a signature: nothing to check
                continue
            if not any(p.kind is p.VAR_KEYWORD for p in params.values()):
                missing += [f"{module}.{name}({k}=)" for k in sorted(keywords - set(params))]
    return missing


def environment(env=os.environ) -> dict:
    out = {k: v for k, v in sorted(env.items()) if k.startswith(ENV_PREFIXES)}
    return {**{k: env.get(k) for k in ALWAYS}, **out}


def run(device: torch.device, out: Path) -> dict:
    import torch.distributed as dist

    calls = distributed_calls()
    missing = missing_api(calls)
    result = {"python": platform.python_version(), "torch": torch.__version__, "cuda": torch.version.cuda,
              "distributed": dist.is_available(), "nccl_available": dist.is_available() and dist.is_nccl_available(),
              "env": environment(), "api_checked": sorted(f"{m}.{n}" for m, n in calls), "api_missing": missing}
    summary = [f"Python {result['python']}, torch {result['torch']}, CUDA {result['cuda']}"]
    ok = not missing
    if device.type == "cuda":
        free, total = torch.cuda.mem_get_info(device)
        props = torch.cuda.get_device_properties(device)
        name = torch.cuda.get_device_name(device)
        model = DEVICE_NAMES.get(name)
        nccl = torch.cuda.nccl.version() if result["nccl_available"] else None  # (2, 27, 3); an int before 2.x
        result |= {"devices": torch.cuda.device_count(), "device": name, "capability": [props.major, props.minor],
                   "sms": props.multi_processor_count, "memory_total": total, "memory_free": free,
                   "cudnn": torch.backends.cudnn.version(),
                   "nccl": ".".join(map(str, nccl)) if isinstance(nccl, tuple) else nccl,
                   "peak_table": model, "peak_flops": DEVICE_PEAKS.get(model)}
        summary += [f"{result['devices']} device(s); cuda:0 {name!r}, capability {result['capability']}, "
                    f"{result['sms']} SMs, {free / 2**30:.1f} of {total / 2**30:.1f} GiB free; NCCL {result['nccl']}, "
                    f"cuDNN {result['cudnn']}",
                    f"peak table: {model} ({DEVICE_PEAKS[model] / 1e12:.0f} TFLOP/s bf16 dense)" if model else
                    f"peak table: {name!r} is not in vp.flops.DEVICE_NAMES, so records measure a peak (add it)"]
        ok = ok and result["nccl_available"]
    connections = result["env"]["CUDA_DEVICE_MAX_CONNECTIONS"]
    summary += [f"CUDA_DEVICE_MAX_CONNECTIONS={connections}" + (" (serialises point-to-point behind collectives)"
                                                                if connections == "1" else ""),
                "environment: " + (", ".join(f"{k}={v}" for k, v in result["env"].items() if v is not None)
                                   or "no NCCL/CUDA variables set"),
                f"torch.distributed: {len(calls)} functions vp/ uses, "
                + (f"MISSING here: {', '.join(missing)}" if missing else "all present with every keyword passed")]
    return {"ok": ok, "summary": summary, **result}
