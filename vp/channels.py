"""The process groups of a run, by channel, and the communicators each rank holds: pure functions of the config,
the mesh and the schedule, without torch, shared by the processes of a real run (vp.run, vp.comm, vp.nccl,
vp.tp.context) and by backend=sim and the planner (harness.sim, vp.plan), which count the same communicators
without starting any process.

Channels: PIPELINE_CHANNELS along the pipeline (vp.comm explains each), the tensor-parallel ones of vp.tp.context
(GRID_CHANNELS, MEGATRON_CHANNELS), "dp" over replicas, and one group of two ranks per point-to-point link
(link_channel)."""
from dataclasses import dataclass

from vp.config import RunConfig
from vp.mesh import Mesh
from vp.schedule import Schedule
from vp.schedule.rules import shapes

PIPELINE_CHANNELS = ("fwd+", "fwd-", "bwd+", "bwd-", "C0", "C1", "C2", "IF", "IB", "naive", "step")
P2P_CHANNELS = PIPELINE_CHANNELS[:4]

GRID_CHANNELS = {"row": "row", "col": "col", "dep": "dep", "batch": "batch"}  # channel -> mesh axis
MEGATRON_CHANNELS = {"tp": "tp", "row": "row"}


@dataclass(frozen=True)
class Communicators:
    """The NCCL communicators one rank holds: `groups` run collectives (the world's and every group of two or more
    ranks but a link's), `links` are point-to-point links of two ranks (link_channel). The cost model prices their
    buffers (vp.cost.memory.comm_buffer_bytes)."""
    groups: int
    links: int


def channel_axes(mesh: Mesh) -> dict[str, str]:
    return GRID_CHANNELS if mesh.grid else MEGATRON_CHANNELS


def tp_slices(mesh: Mesh) -> dict[str, list[list[int]]]:
    """channel -> every group of it (global ranks), for vp.comm.make_groups."""
    return {ch: mesh.groups(axis) for ch, axis in channel_axes(mesh).items()}


def p2p_channel(kind: str, sender: int, receiver: int) -> str:
    """The channel of a transfer: activations ('fwd') or gradients ('bwd'), to a higher ('+') or lower ('-') rank."""
    return kind + ("+" if receiver > sender else "-")


def link_channel(channel: str, sender: int, receiver: int) -> str:
    """The name of one point-to-point link's own group: `channel`'s transfers from pipeline index `sender` to
    `receiver` (a group of those two ranks, in global rank order as every group)."""
    return f"{channel}:{sender}>{receiver}"


def parse_link(name: str) -> tuple[str, int, int] | None:
    """(channel, sender, receiver) of a link's group name, None for any other channel."""
    channel, sep, pair = name.partition(":")
    if not sep or ">" not in pair:
        return None
    sender, receiver = pair.split(">")
    return channel, int(sender), int(receiver)


def schedule_channels(sched: Schedule, cfg: RunConfig) -> list[str]:
    """The pipeline channels a run uses, in PIPELINE_CHANNELS order."""
    used = {ch for ch, _, _ in run_links(sched)}
    used |= {sh.entry.group for shape in shapes(sched) for sh in shape.values() if sh.entry}
    if cfg.dtype == "fp16":
        used.add("step")  # the loss scaler's overflow agreement
    return [ch for ch in PIPELINE_CHANNELS if ch in used]


def schedule_links(sched: Schedule) -> set[tuple[str, int, int]]:
    """(channel, sender, receiver) of every point-to-point transfer of the schedule, on every rank: read from the
    rules' shape of each rank's distinct (kind, chunk), since a send's peer does not depend on its microbatch."""
    return {(p2p_channel("fwd" if kind == "SF" else "bwd", r, sh.peer), r, sh.peer)
            for r, shape in enumerate(shapes(sched)) for (kind, _), sh in shape.items() if kind in ("SF", "SB")}


PROBE_LINKS = {("fwd+", 0, 1), ("bwd-", 1, 0)}  # link_probe's ping-pong


def run_links(sched: Schedule) -> list[tuple[str, int, int]]:
    """(channel, sender, receiver) of every point-to-point link a run uses (the schedule's and the link probe's), in
    one order: PIPELINE_CHANNELS, then sender, then receiver. Worked out once per schedule object (a new list each
    call)."""
    def make(sched: Schedule) -> tuple:
        links = schedule_links(sched) | (PROBE_LINKS if sched.pp > 1 else set())
        return tuple(sorted(links, key=lambda link: (PIPELINE_CHANNELS.index(link[0]), link[1], link[2])))
    return list(sched.memo("run_links", make))


def channels(cfg: RunConfig, sched: Schedule | None = None) -> dict[str, list[list[int]]]:
    """Every process group of a run, by channel (vp.comm.make_groups creates them in this order); given the
    schedule, only the pipeline channels it uses (NCCL makes a communicator, and its buffers, for every group), and
    point-to-point traffic on one group of two ranks per link (vp.channels.link_channel) instead of whole-pipeline
    groups: no send then waits behind another transfer of its communicator (docs/gpu-path.md)."""
    out = mesh_channels(cfg.mesh)
    if sched is None:
        return out
    return _used_channels(cfg, sched, out) | _links(sched, cfg.mesh.groups("pp"))


def _used_channels(cfg: RunConfig, sched: Schedule, out: dict) -> dict:
    """The mesh's channels (out) that the schedule uses: the pipeline channels it enters, and the within-stage halves
    of C0, IF, IB (ROW_STEPS) only where the schedule has the step (each is a communicator)."""
    used = set(schedule_channels(sched, cfg)) - set(P2P_CHANNELS)
    return {ch: groups for ch, groups in out.items()
            if (ch not in PIPELINE_CHANNELS or ch in used) and (ch not in ROW_STEPS or ch.split(".")[0] in used)}


def _links(sched: Schedule, pipelines: list) -> dict[str, list[list[int]]]:
    """One channel per point-to-point link of the run (run_links), a group of two ranks in each of pipelines."""
    return {link_channel(channel, sender, receiver): [sorted((pipe[sender], pipe[receiver])) for pipe in pipelines]
            for channel, sender, receiver in run_links(sched)}


VOCAB_AXIS = {"C1": "vocab", "C2": "vocab", "naive": "vocab", "step": "replica"}  # the rest: "pp"
ROW_STEPS = ("C0.row", "IF.row", "IB.row")


def mesh_channels(mesh: Mesh) -> dict[str, list[list[int]]]:
    """Every process group of a run, by channel, cut from the mesh:
    - p2p, C0, IF, IB along the pipeline axis: between the same tensor-parallel offset of every stage;
    - C1, C2 and the naive algorithm's all-reduces over the vocabulary shards of one token block: pipeline ranks x
      grid columns (mesh axis "vocab"; the pipeline when tp = 1);
    - "step", the end-of-iteration agreement, over a whole replica; "dp", the gradient all-reduce, over replicas;
    - with tp > 1, the tensor-parallel channels of the layers (vp.tp.context) and, for the vocabulary passes, the
      within-stage halves of C0, IF and IB over a grid row (1-D: the tp group), each its own group."""
    return {ch: mesh.groups(axis) for ch, axis in mesh_channel_axes(mesh).items()}


def mesh_channel_axes(mesh: Mesh) -> dict[str, str]:
    """The mesh axis each of mesh_channels' channels runs along (its groups are the mesh's groups of that axis)."""
    out = {ch: VOCAB_AXIS.get(ch, "pp") for ch in PIPELINE_CHANNELS}
    if mesh.dp > 1:
        out["dp"] = "dp"
    if mesh.tp > 1:
        out |= dict(channel_axes(mesh)) | {ch: "row" for ch in ROW_STEPS}
    return out


def rank_communicators(cfg: RunConfig, sched: Schedule, ranks=None) -> list[Communicators] | dict:
    """The NCCL communicators each global rank of a run holds (what its Comm.held() reports after connect): the
    world's, and one per group of two or more ranks of channels(cfg, sched), links counted apart. ranks: only those
    global ranks' ({rank: Communicators}), where a caller reads a few of a large world's."""
    if ranks is None:
        held = [[1, 0] for _ in range(cfg.world)]
        for channel, groups in channels(cfg, sched).items():
            kind = 1 if parse_link(channel) else 0
            for group in groups:
                for r in group if len(group) > 1 else ():
                    held[r][kind] += 1
        return [Communicators(g, links) for g, links in held]
    # a few ranks: each one's group of every channel it uses (the mesh's index of its axis), and the links of the
    # pipelines that hold one of them (each link's group lies in one pipeline)
    held = {r: [1, 0] for r in ranks}
    mesh = cfg.mesh
    for axis in _used_channels(cfg, sched, mesh_channel_axes(mesh)).values():
        index = mesh.group_index(axis)
        for r, count in held.items():
            count[0] += len(index[r]) > 1
    pipelines = list(dict.fromkeys(mesh.group_index("pp")[r] for r in held))
    for groups in _links(sched, pipelines).values():
        for group in groups:
            for r in group if len(group) > 1 else ():
                if r in held:
                    held[r][1] += 1
    return {r: Communicators(*count) for r, count in held.items()}


def creation_splits(slices: dict[str, list[list[int]]]) -> list[tuple[str, list[tuple[str, list[int]]]]]:
    """The communicator creations of a run, each one world-wide call that splits the world's communicator into
    disjoint groups (torch.distributed.split_group, NCCL's ncclCommSplit): (name, [(channel, ranks), ...]), in
    `slices`' order. A channel's groups are disjoint: one split each. The links' groups of two ranks share ranks
    across links (rank r is on r-1 > r and r > r+1), so they are packed greedily into as few splits as keep every
    rank in at most one group per split (an edge colouring of the link graph: at most twice a rank's links, in
    practice its number of links). Groups of one rank need no communicator and are left out. The count does not grow
    with the world: it is the number of channels plus about the links of one rank."""
    out, links = [], []
    for channel, groups in slices.items():
        groups = [list(g) for g in groups if len(g) > 1]
        if not groups:
            continue
        if parse_link(channel):
            links.append((channel, groups))
        else:
            out.append((channel, [(channel, g) for g in groups]))
    colours: list[tuple[set[int], list]] = []  # (ranks taken, [(channel, ranks)])
    for channel, groups in links:
        taken = {r for g in groups for r in g}
        colour = next((c for c in colours if not c[0] & taken), None)
        if colour is None:
            colour = (set(), [])
            colours.append(colour)
        colour[0].update(taken)
        colour[1].extend((channel, g) for g in groups)
    out += [(f"links/{i}", members) for i, (_, members) in enumerate(colours)]
    return out
