"""Building a stage without holding it twice: on the meta device, then materialised parameter by parameter.

A stage built eagerly in fp32 on the host and then moved holds the host copy and its temporaries (a randn and its
scaled copy) at once, and a tensor-parallel stage was cut from the whole stage: eight ranks of a node building
their parts of a 30B model would need several times the host memory a node has. Here the stage is built under
vp.model.meta() (shapes only) and each parameter is then allocated on the target device in the storage dtype (fp32:
the optimizer's master copy; compute copies are cast per step, vp.wgrad) and filled with the very values the eager
build drew (the same generator, seeded by (seed, the parameter's name), so the same seed gives the same weights):
on the host directly in place, for a device through one host tensor of that parameter's size. A tensor-parallel
stage materialises one whole block at a time, cuts it, and lets it go.
"""
import math
import re

import torch
import torch.nn as nn

from vp.model import STD, seeded_normal, vocab_rows

LINEARS = {"qkv": False, "proj": True, "fc1": False, "fc2": True}  # name -> scaled as a residual projection


def fill(name: str, out: torch.Tensor, cfg, seed: int):
    """Write the initial value of the stage parameter `name` (vp.model.Stage's naming) into the CPU tensor out."""
    if name in ("pos",):
        seeded_normal(tuple(out.shape), seed, "pos.weight", out=out)
    elif name in ("embed", "head"):
        vocab_rows(seed, f"{name}.weight", cfg.vocab_size, 0, out.shape[0], cfg.hidden, out=out)
    elif m := re.fullmatch(r"layers\.(\d+)\.(qkv|proj|fc1|fc2)\.weight", name):
        std = STD / math.sqrt(2 * cfg.layers) if LINEARS[m[2]] else STD
        seeded_normal(tuple(out.shape), seed, f"layers.{m[1]}.{m[2]}", std, out=out)
    elif name.endswith(".bias"):
        out.zero_()
    elif re.search(r"(ln1|ln2|final_norm)\.weight$", name):
        out.fill_(1.0)
    else:
        raise ValueError(f"no initial value for parameter {name!r}; add its rule to vp.init.fill")


@torch.no_grad()
def materialise(module: nn.Module, cfg, seed: int, device: torch.device, prefix: str = "") -> nn.Module:
    """Allocate module's meta parameters on `device` and fill them (`prefix`: the module's name in its stage)."""
    module.to_empty(device=device)
    for name, p in module.named_parameters():
        if device.type == "cpu":
            fill(prefix + name, p.data, cfg, seed)
        else:
            host = torch.empty(p.shape, dtype=torch.float32)
            fill(prefix + name, host, cfg, seed)
            p.copy_(host)
            del host
    return module


def one_at_a_time(stage: nn.Module, cfg, seed: int):
    """(name, block) of a meta stage's layers, each materialised on the host while the caller uses it and back on
    the meta device (its memory released) before the next."""
    for name, block in stage.layers.items():
        yield name, materialise(block, cfg, seed, torch.device("cpu"), f"layers.{name}.")
        block.to_empty(device="meta")
