"""The simulator's Costs of a run: seconds per pass (vp.cost.passes), seconds per communication step over the
two-level network (vp.cost.network, bytes from vp.cost.traffic) and bytes held per microbatch (vp.cost.memory);
and the Costs a recorded run implies, for replaying it."""
import statistics

from vp.config import RunConfig
from vp.cost.data_parallel import exposed_reduce_per_rank, gather_per_rank, reduce_per_rank
from vp.cost.memory import held_bytes, rank_params
from vp.cost.network import OPS, Network, fit_link, groups
from vp.cost.passes import compute_times, pass_times
from vp.cost.profiles import Hardware
from vp.cost.tensor import Split, vocab_row_steps
from vp.cost.tensor import seconds as tp_seconds
from vp.cost.tensor import tails_s as tp_tails_s
from vp.cost.traffic import payloads
from vp.schedule import Costs, Schedule, build
from vp.schedule.sharing import Sharing

COLLECTIVE_KINDS = ("C0", "C1", "C2", "IF", "IB", "S", "T")
ROOTED_KINDS = ("C0", "IF", "IB")  # along the pipeline axis (one tp offset); the rest over the vocabulary group


def comm_times(cfg: RunConfig, hw: Hardware, sched: Schedule) -> dict:
    """{kind: seconds} of each collective step and {("P2P", src, dst): seconds} per pair of pipeline ranks that
    pass activations; "P2P" alone is the slowest such pair. Message sizes come from payloads(), ranks sit on
    nodes as the mesh places them (vp.channels.mesh_channels): C0, IF and IB along the first replica's pipeline (tp
    offset 0), the others over its first vocabulary group (pipeline ranks x grid columns); with tp > 1 C0, IF
    and IB include their root's step inside its stage's tp group (vp.cost.tensor.vocab_row_steps). Each step
    and transfer also waits comm_wake_s for a core where the run's devices hold every core of the node."""
    net = Network.of(hw, cfg.world)
    sizes = payloads(cfg, sched)
    where = groups(cfg.mesh, "pp")[0]  # global rank of each pipeline rank
    axis = _collective_ranks(cfg)
    wake = comm_wake_s(cfg, hw)
    out = {kind: sum(net.collective(OPS[op], axis[kind], nbytes) + wake for op, nbytes in sizes[kind])
           for kind in COLLECTIVE_KINDS}
    if cfg.tp > 1 and sched.vocab_parallel:
        for kind in ROOTED_KINDS:
            root = {"C0": sched.last_rank}.get(kind, sched.first_rank)
            steps = [c for c in vocab_row_steps(cfg, sched, root, Split.of(cfg)) if c.pass_kind == kind]
            out[kind] += tp_seconds(cfg, net, steps, root, cfg.microbatches)
    (send,) = sizes["SF"]
    ranks = sched.stage_ranks
    for a, b in zip(ranks, ranks[1:]):
        if a != b:
            out[("P2P", a, b)] = out[("P2P", b, a)] = net.p2p(where[a], where[b], send[1]) + wake
    out["P2P"] = max((t for k, t in out.items() if isinstance(k, tuple)), default=0.0)
    return out


def comm_wake_s(cfg: RunConfig, hw: Hardware) -> float:
    """Seconds each pipeline transfer and each step of a vocabulary collective waits for a core on top of its
    table time: the profile's wake_s (a CPU profile's measured wait of a woken process for a core) where the run
    puts at least as many devices on a node as it has cores, else 0 (every GPU and built-in profile). gloo moves
    a message on threads of both processes; with every core held by a computing rank, the thread woken to move it
    waits for one, as the calibration's exchanging pairs waited beside computing ones (vp.cost.measure_comm.wake).
    The tables time the steps between processes that do nothing else. On this project's 2-core CPU interlaced's
    synchronous steps took 2.1-2.7 ms from the later rank's arrival in runs, against about 1 ms in the table and
    1.45-2.1 ms of wake_s (docs/cost-model.md)."""
    if hw.cores <= 0 or min(cfg.world, hw.gpus_per_node) < hw.cores:
        return 0.0
    return hw.wake_s


def _collective_ranks(cfg: RunConfig) -> dict:
    """{kind: global ranks} a collective step of that kind spans: C0, IF and IB the first replica's pipeline (tp
    offset 0), the others its first vocabulary group (pipeline ranks x grid columns)."""
    pipeline, vocab = groups(cfg.mesh, "pp")[0], groups(cfg.mesh, "vocab")[0]
    return {kind: pipeline if kind in ROOTED_KINDS else vocab for kind in COLLECTIVE_KINDS}


def comm_cpu_times(cfg: RunConfig, hw: Hardware, sched: Schedule) -> dict:
    """{kind: CPU seconds} each member of a collective instance of that kind spends on it where the runtime runs it
    off the compute path (a CommStream: C0, C1, C2, IF, IB) on a CPU, from the profile's measured CPU time of
    collectives beside computing ranks (Network.collective_cpu; 0 on a GPU and for older profiles). On a CPU, gloo
    and the CommStream's thread move and sum the payload on the cores the passes use, so the simulator charges it to
    the action that launches the instance (vp.schedule.simulate). The steps a grid's C0, IF and IB take inside a
    stage's tensor-parallel group are not counted."""
    if not sched.vocab_parallel or not hw.tables.collectives_cpu:  # nothing launched, or nothing measured
        return {}
    net, sizes, axis = Network.of(hw, cfg.world), payloads(cfg, sched), _collective_ranks(cfg)
    # a vocabulary-parallel schedule's instances (from its shape alone: the planner prices skeletons without actions)
    launched = ("C0", "IF", "IB") + sched.vocab.collectives
    out = {kind: sum(net.collective_cpu(OPS[op], axis[kind], nbytes) for op, nbytes in sizes[kind])
           for kind in launched}
    return {kind: s for kind, s in out.items() if s > 0}


def tail_s(cfg: RunConfig, hw: Hardware, sched: Schedule, result=None, hidden: bool = False) -> float:
    """Seconds after the pipeline's flush on the slowest device: its tensor-parallel group's once-per-iteration
    all-reduces (grid: depth and token-block replicas' gradients, the loss), then what is exposed of the
    data-parallel reduction (vp.cost.data_parallel: all of it, or with overlap_grad_reduce and the simulated
    iteration `result` what the dp stream has left at the flush), then the optimizer step over its parameters
    (zero 1: its 1/dp shard) where the profile measured it, then zero 1's all-gather of the weights. Where devices
    share cores (a CPU profile's `cores`) the data-parallel collectives and the step are slowed by devices / cores:
    every device runs them at once (a gloo all-reduce of the gradients copies and sums them on the CPU).
    hidden=True counts none of the reduction as exposed: the least the tail can be with overlap_grad_reduce, before
    the iteration is simulated (the planner's bound tightens it: vp.cost.data_parallel.unhidden_reduce)."""
    exposed = [0.0] * cfg.pp if hidden else exposed_reduce_per_rank(cfg, hw, sched, result)
    return max(tail_per_rank(cfg, hw, sched, exposed))


def dp_slowdown(cfg: RunConfig, hw: Hardware) -> float:
    """How much slower the data-parallel collectives and the optimizer step run after the flush: devices / cores
    where devices share a node's cores (every device runs them at once), else 1."""
    return hw.contention(min(cfg.world, hw.gpus_per_node))


def tail_parts(cfg: RunConfig, hw: Hardware, sched: Schedule) -> tuple[list[float], float]:
    """What tail_s adds to the exposed data-parallel reduction, which alone depends on the simulated iteration: per
    pipeline rank the tail with none of the reduction exposed, and dp_slowdown (the factor on what is exposed)."""
    slower = dp_slowdown(cfg, hw)
    share = cfg.dp if cfg.zero else 1
    step = [slower * optimizer_s(hw, n // share, [t // share for t in vocab])
            for n, vocab in zip(rank_params(cfg, sched), vocab_tensors(cfg, sched))]
    gather = gather_per_rank(cfg, hw, sched)
    tp = tp_tails_s(cfg, hw, sched)
    return [tp[p] + slower * gather[p] + step[p] for p in range(cfg.pp)], slower


def exposed_tail_per_rank(parts: tuple[list[float], float], exposed: list[float]) -> list[float]:
    """Per pipeline rank, the tail from tail_parts with `exposed` seconds of its data-parallel reduction exposed."""
    fixed, slower = parts
    return [f + slower * e for f, e in zip(fixed, exposed)]


def tail_per_rank(cfg: RunConfig, hw: Hardware, sched: Schedule, exposed: list[float]) -> list[float]:
    """Per pipeline rank, tail_s's seconds after the flush with `exposed` seconds of its data-parallel reduction
    exposed (before dp_slowdown)."""
    return exposed_tail_per_rank(tail_parts(cfg, hw, sched), exposed)


def vocab_tensors(cfg: RunConfig, sched: Schedule) -> list[list[int]]:
    """Per pipeline rank, the elements of each vocabulary matrix one device holds (input embedding, output layer
    or their vocabulary-parallel shards): the few large tensors of a device's parameters (vp.cost.memory.rank_params
    counts them with the rest)."""
    v, h, split = cfg.padded_vocab_size, cfg.hidden, Split.of(cfg)
    if sched.vocab_parallel:
        return [[split.vocab_rows(v, cfg.pp) * h] * 2 for _ in range(cfg.pp)]
    out = [[] for _ in range(cfg.pp)]
    out[sched.where(0)[0]].append(split.vocab_rows(v) * h)
    out[sched.where(sched.n_stages - 1)[0]].append(split.vocab_rows(v) * h)
    return out


def optimizer_s(hw: Hardware, params: int, large: list[int]) -> float:
    """Seconds of the optimizer step over `params` parameters of which `large` are single large tensors: the
    profile's time for that very set where it measured it (vp.cost.measure.optimizer_set: the temporaries of all
    large tensors alive at once), else each large one at the profile's measured per-parameter rate for its size
    (vp.cost.tables: a CPU step allocates temporaries as large as the tensor), the rest at optimizer_s_per_param
    (many small tensors)."""
    measured = hw.tables.optimizer_set_s(params, large)
    if measured is not None:
        return measured
    seconds, rest = 0.0, params - sum(large)
    for n in large:
        rate = hw.tables.optimizer_s_per_param(n)
        if rate is None:
            rest += n
        else:
            seconds += n * rate
    return seconds + max(0, rest) * hw.optimizer_s_per_param


def dp_allreduce_s(cfg: RunConfig, hw: Hardware, sched: Schedule) -> float:
    """Seconds of the data-parallel gradient all-reduce after the pipeline's flush (the slowest rank's)."""
    return max(dp_allreduce_per_rank(cfg, hw, sched))


def dp_allreduce_per_rank(cfg: RunConfig, hw: Hardware, sched: Schedule) -> list[float]:
    """Per pipeline rank: the reduction of a device's fp32 gradients over its replicas' group, not overlapped (zero
    1: the reduce-scatter)."""
    return reduce_per_rank(cfg, hw, sched)


def pass_costs(cfg: RunConfig, hw: Hardware, sched: Schedule, compute: dict | None = None,
               held: dict | None = None, times: dict | None = None) -> Costs:
    """Seconds per action and bytes held per microbatch on one device of each stage, for the simulator (on a CPU
    the actions that launch collectives off the compute path also pay those collectives' CPU time,
    comm_cpu_times); with how the devices share the node's cores where they do (sharing: that CPU time competes
    for them as the passes' work does, since gloo's threads run on the same cores). compute, held: this run's
    compute_times and held_bytes where the caller has them already (the planner's memo); times: its pass_times of
    that compute, likewise; none of them is changed here."""
    compute = compute_times(cfg, hw, sched) if compute is None else compute
    times = pass_times(cfg, hw, sched, compute) if times is None else dict(times)
    work = dict(compute)  # what competes for cores where devices share them: the passes' work and that CPU time
    for kind, cpu in comm_cpu_times(cfg, hw, sched).items():  # the action of that kind launches the instance
        times[(kind, None)] = times.get((kind, None), 0.0) + cpu
        work[(kind, None)] = work.get((kind, None), 0.0) + cpu
    held = held_bytes(cfg, hw, sched) if held is None else held
    return Costs(times, comm_times(cfg, hw, sched), held, sharing(cfg, hw, work))


def sharing(cfg: RunConfig, hw: Hardware, compute: dict) -> Sharing | None:
    """How a run's devices share the node's cores (a profile with `cores`, a CPU one), for the simulator's
    processor sharing (vp.schedule.sharing): each pipeline rank stands for the devices of the node that run its
    passes at the same time, its data-parallel replicas and tensor-parallel peers (min(world, gpus_per_node) / pp:
    the node's share where a run spans several); the passes' own work (`compute`, with the CPU time of collectives
    run off the compute path under their launching kinds) competes for cores, their tensor-parallel collectives do
    not. Where the devices have a core each, they still slow each other by the profile's measured crowding, which
    the passes' rows (timed alone) lack; a tensor-parallel stage's rows were timed with its group at work together
    (vp.cost.measure_passes.tp_passes), crowding included, so it gets none. None where no device waits for a core
    or is slowed by its neighbours."""
    here = min(cfg.world, hw.gpus_per_node)
    crowding = hw.crowding if cfg.tp == 1 and here > 1 else 1.0
    if hw.cores <= 0 or (here <= hw.cores and crowding <= 1.0):
        return None
    return Sharing(float(hw.cores), here / cfg.pp, dict(compute), hw.wake_s, crowding)


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
        rank = cfg.mesh.rank(0, sched.where(st)[0], 0)  # the stage's first device in replica 0
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
    return Hardware("link_probe", 1.0, gpus_per_node=cfg.world, link_latency=latency,
                    link_bandwidth=bandwidth, ib_latency=latency, ib_bandwidth=bandwidth, collective_latency=0.0,
                    act_bytes=4 if cfg.dtype == "fp32" else 2)
