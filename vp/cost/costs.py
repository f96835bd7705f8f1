"""The simulator's Costs of a run: seconds per pass (vp.cost.passes), seconds per communication step over the
two-level network (vp.cost.network, bytes from vp.cost.traffic) and bytes held per microbatch (vp.cost.memory);
and the Costs a recorded run implies, for replaying it."""
import statistics

from vp.config import RunConfig
from vp.cost.memory import held_bytes
from vp.cost.network import Network, fit_link, pipeline_ranks, vocab_ranks
from vp.cost.passes import pass_times
from vp.cost.profiles import Hardware
from vp.cost.traffic import traffic
from vp.schedule import Costs, Schedule, build


def comm_times(cfg: RunConfig, hw: Hardware, sched: Schedule) -> dict:
    """{kind: seconds} of each collective step (over the vocabulary group) and {("P2P", src, dst): seconds}
    per pair of pipeline ranks that pass activations; "P2P" alone is the slowest such pair."""
    net = Network.of(hw)
    n = cfg.micro_batch_size * cfg.seq_len
    kinds = traffic(n, cfg.hidden, cfg.vocab_shards, sched.vocab, hw.act_bytes)
    group = vocab_ranks(cfg.pp)
    out = {kind: sum(net.collective(t.op, group, t.nbytes) for t in transfers)
           for kind, transfers in kinds.items() if kind != "P2P"}
    where = pipeline_ranks(cfg.pp)
    (message,) = kinds["P2P"]
    for st in range(sched.n_stages - 1):
        a, b = sched.where(st)[0], sched.where(st + 1)[0]
        if a != b:
            out[("P2P", a, b)] = out[("P2P", b, a)] = net.p2p(where[a], where[b], message.nbytes)
    out["P2P"] = max((t for k, t in out.items() if isinstance(k, tuple)), default=0.0)
    return out


def pass_costs(cfg: RunConfig, hw: Hardware, sched: Schedule) -> Costs:
    """Seconds per action and bytes held per microbatch, for the simulator."""
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
    return Hardware("link_probe", 1.0, gpus_per_node=max(cfg.pp, 1), link_latency=latency,
                    link_bandwidth=bandwidth, ib_latency=latency, ib_bandwidth=bandwidth, collective_latency=0.0,
                    act_bytes=4 if cfg.dtype == "fp32" else 2)
