"""The simulator's Costs of a run: seconds per pass (vp.cost.passes), seconds per communication step over the
two-level network (vp.cost.network, bytes from vp.cost.traffic) and bytes held per microbatch (vp.cost.memory);
and the Costs a recorded run implies, for replaying it."""
import statistics

from vp.config import RunConfig
from vp.cost.memory import held_bytes, rank_params
from vp.cost.network import ALL_REDUCE, OPS, Network, fit_link, groups
from vp.cost.passes import pass_times
from vp.cost.profiles import Hardware
from vp.cost.traffic import payloads
from vp.schedule import Costs, Schedule, build

COLLECTIVE_KINDS = ("C0", "C1", "C2", "IF", "IB", "S", "T")


def check_modelled(cfg: RunConfig) -> RunConfig:
    """Refuse a run the cost model cannot time: it models data and pipeline parallelism, not a stage split over
    a tensor-parallel group."""
    if cfg.tp > 1:
        raise ValueError(f"tp={cfg.tp}: the cost model times each stage on one device and does not model tensor "
                         f"parallelism; use backend=sim with tp=1 (dp and pp are modelled), or backend=real")
    return cfg


def comm_times(cfg: RunConfig, hw: Hardware, sched: Schedule) -> dict:
    """{kind: seconds} of each collective step (over the first replica's vocabulary group) and
    {("P2P", src, dst): seconds} per pair of pipeline ranks that pass activations; "P2P" alone is the slowest
    such pair. Message sizes come from payloads(), ranks sit on nodes as the mesh places them."""
    net = Network.of(hw)
    sizes = payloads(cfg, sched)
    vocab = groups(cfg.mesh, "vocab")[0]
    out = {kind: sum(net.collective(OPS[op], vocab, nbytes) for op, nbytes in sizes[kind])
           for kind in COLLECTIVE_KINDS}
    where = groups(cfg.mesh, "pp")[0]  # global rank of each pipeline rank
    (send,) = sizes["SF"]
    for st in range(sched.n_stages - 1):
        a, b = sched.where(st)[0], sched.where(st + 1)[0]
        if a != b:
            out[("P2P", a, b)] = out[("P2P", b, a)] = net.p2p(where[a], where[b], send[1])
    out["P2P"] = max((t for k, t in out.items() if isinstance(k, tuple)), default=0.0)
    return out


def dp_allreduce_s(cfg: RunConfig, hw: Hardware, sched: Schedule) -> float:
    """Seconds of the data-parallel gradient all-reduce after the pipeline's flush (the slowest rank's): one flat
    fp32 buffer of each pipeline rank's parameters over its replicas' group."""
    if cfg.dp < 2:
        return 0.0
    net = Network.of(hw)
    dp_groups = {g[0]: g for g in groups(cfg.mesh, "dp")}  # first member = the rank in replica 0
    where = groups(cfg.mesh, "pp")[0]
    return max(net.collective(ALL_REDUCE, dp_groups[where[p]], 4.0 * n)
               for p, n in enumerate(rank_params(cfg, sched)))


def pass_costs(cfg: RunConfig, hw: Hardware, sched: Schedule) -> Costs:
    """Seconds per action and bytes held per microbatch, for the simulator (times only for tp=1: check_modelled;
    the memory of a tensor-parallel run is still its estimate)."""
    return Costs(pass_times(cfg, hw, sched), comm_times(cfg, hw, sched), held_bytes(cfg, hw, sched))


def record_costs(record: dict) -> tuple[Schedule, Costs]:
    """The schedule of a recorded run and the costs its record implies: for a simulated run, its hardware
    profile through the cost model; otherwise its pass times (per kind and rank) with communication from its
    link probe. Timelines, benchmarks and reports replay records through this one function."""
    cfg = RunConfig.from_dict(record["config"])
    sched = build(cfg.method, cfg.pp, cfg.microbatches, cfg.n_chunks)
    profile = (record.get("env") or {}).get("hardware")
    if record["backend"] == "sim" and profile:
        return sched, pass_costs(cfg, Hardware.from_dict(profile), sched)
    pass_s = record["metrics"].get("pass_time_s") or {}
    compute = {}
    for st in range(sched.n_stages):
        rank = sched.where(st)[0]
        for kind in ("F", "B", "W"):
            per_rank = pass_s.get(kind) or []
            if rank < len(per_rank) and per_rank[rank] is not None:
                compute[(kind, st)] = per_rank[rank]
    for kind in ("S", "T", "IF", "IB"):
        values = [t for t in pass_s.get(kind) or [] if t is not None]
        if values:
            compute[(kind, None)] = statistics.mean(values)
    comm = {}
    probe = (record.get("env") or {}).get("link_probe") or []
    if len(probe) >= 2:
        comm = comm_times(cfg, probe_link(probe, cfg), sched)
    return sched, Costs(compute, comm)


def probe_link(probe: list[list[float]], cfg: RunConfig) -> Hardware:
    """One machine's ranks on one flat link measured by a run's probe: every step costs the probe's latency."""
    latency, bandwidth = fit_link(probe)
    return Hardware("link_probe", 1.0, gpus_per_node=cfg.dp * cfg.pp, link_latency=latency,
                    link_bandwidth=bandwidth, ib_latency=latency, ib_bandwidth=bandwidth, collective_latency=0.0,
                    act_bytes=4 if cfg.dtype == "fp32" else 2)
