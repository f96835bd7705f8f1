"""python -m vp.bench comms: the communicators of a run at any size, without starting a process.

For a mesh and a method: the groups a rank joins (by channel), the world-wide creation calls the run makes (one
split per channel and per packed set of links, vp.channels.creation_splits; one new_group per group where NCCL
cannot split), the communicators per rank and NCCL's buffer memory per rank (vp.cost.memory.comm_buffer_bytes, the
formula the record's metrics.comm_buffer_bytes and backend=sim use)."""
import json

from vp.channels import channels, creation_splits, parse_link, rank_communicators
from vp.config import RunConfig
from vp.cost.memory import comm_buffer_bytes
from vp.cost.profiles import PROFILES
from vp.schedule import build
from vp.schedule.methods import METHODS


def config(method: str, dp: int, pp: int, tp: int, tp_mode: str = "1d", tp_depth: int = 1) -> RunConfig:
    """A run of the mesh and method with the smallest model that fits it: communicators depend on nothing else."""
    if method not in METHODS:
        raise ValueError(f"method={method!r} is unknown; use one of {', '.join(METHODS)}")
    chunks = METHODS[method].family.chunks or 1
    return RunConfig(method=method, dp=dp, pp=pp, tp=tp, tp_mode=tp_mode, tp_depth=tp_depth, layers=pp * chunks,
                     hidden=64 * tp, heads=tp, seq_len=8, vocab_size=1024, microbatches=2 * pp,
                     micro_batch_size=tp)


def report(cfg: RunConfig, rank: int = 0, hardware: str = "h100") -> dict:
    sched = build(cfg.method, cfg.pp, cfg.microbatches, cfg.n_chunks)
    slices = channels(cfg, sched)
    splits = creation_splits(slices)
    groups = sum(1 for gs in slices.values() for g in gs if len(g) > 1)
    held = rank_communicators(cfg, sched)
    hw = PROFILES[hardware]
    joined = {ch: g for ch, gs in slices.items() for g in gs if rank in g and len(g) > 1}
    buffers = [comm_buffer_bytes(h, hw) for h in held]
    return {
        "method": cfg.method, "mesh": cfg.mesh.describe(), "world": cfg.world, "rank": rank,
        "groups_of_rank": {ch: g if len(g) <= 8 else f"{len(g)} ranks" for ch, g in joined.items()},
        "links_of_rank": sum(1 for ch in joined if parse_link(ch)),
        "world_wide_creations": len(splits) + 1,  # the world's communicator (init_process_group), then the splits
        "world_wide_creations_without_split": groups + 1,
        "communicators_per_rank_max": max(h.groups + h.links for h in held),
        "communicators": held[rank].groups + held[rank].links,
        "comm_buffer_bytes_max": max(buffers), "comm_buffer_bytes": buffers[rank], "hardware": hardware,
    }


def run(method: str, dp: int, pp: int, tp: int, tp_mode: str, tp_depth: int, rank: int, hardware: str,
        as_json: bool) -> int:
    cfg = config(method, dp, pp, tp, tp_mode, tp_depth)
    if not 0 <= rank < cfg.world:
        raise ValueError(f"--rank {rank} is outside the world of {cfg.world} ranks")
    if hardware not in PROFILES:
        raise ValueError(f"--hardware {hardware!r} is unknown; use one of {', '.join(PROFILES)}")
    r = report(cfg, rank, hardware)
    if as_json:
        print(json.dumps(r, indent=1))
        return 0
    print(f"{r['method']} on {r['mesh']} ({r['world']} ranks), NCCL buffers at the {hardware} profile's sizes")
    print(f"world-wide creation calls: {r['world_wide_creations']} (by splitting; "
          f"{r['world_wide_creations_without_split']} with one new_group per group)")
    print(f"communicators per rank: {r['communicators_per_rank_max']} at most; rank {rank}: {r['communicators']} "
          f"(the world's, {r['links_of_rank']} links, the rest collective)")
    print(f"NCCL buffers per rank: {r['comm_buffer_bytes_max'] / 2**30:.2f} GiB at most; rank {rank}: "
          f"{r['comm_buffer_bytes'] / 2**30:.2f} GiB")
    print(f"groups of rank {rank}:")
    for ch, g in r["groups_of_rank"].items():
        print(f"  {ch:<12} {g}")
    return 0
