"""Everything one iteration keeps between actions on one rank; owned by the runtime, empty at the end."""
from dataclasses import dataclass, field, fields


@dataclass
class IterState:
    iteration: int
    batches: dict = field(default_factory=dict)  # mb -> (ids, targets, mask), made on first use
    fwd: dict = field(default_factory=dict)  # (mb, chunk) -> (stage input, stage output, weight-grad store)
    local_act: dict = field(default_factory=dict)  # (mb, chunk) -> activation handed to a chunk on this rank
    local_grad: dict = field(default_factory=dict)  # (mb, chunk) -> output gradient from a chunk on this rank
    to_send: dict = field(default_factory=dict)  # (mb, chunk) -> activation waiting for its SF
    to_send_grad: dict = field(default_factory=dict)  # (mb, chunk) -> input gradient waiting for its SB
    recv_act: dict = field(default_factory=dict)  # (mb, chunk) -> received stage input
    recv_grad: dict = field(default_factory=dict)  # (mb, chunk) -> received output gradient
    wgrad: dict = field(default_factory=dict)  # (mb, chunk) -> weight-grad store waiting for its W
    x_last: dict = field(default_factory=dict)  # mb -> X of the last stage (vocabulary parallel)
    out: dict = field(default_factory=dict)  # mb -> OutputState of the output layer
    out_uses: dict = field(default_factory=dict)  # mb -> consumers of `out` left on this rank
    embed_local: dict = field(default_factory=dict)  # mb -> this shard's part of the embedding, for IF's reduce
    embed_grad: dict = field(default_factory=dict)  # mb -> gradient of the summed embedding (first stage)
    pending: dict = field(default_factory=dict)  # collective instance -> Handle
    ready: dict = field(default_factory=dict)  # collective instance -> its result, until consumed
    sends: list = field(default_factory=list)  # (work, tensor) of sends not yet known complete
    losses: dict = field(default_factory=dict)  # mb -> loss of the microbatch (where known)

    def leftovers(self) -> dict:
        """Per-microbatch state that should have been consumed by the end of the iteration."""
        keep = {"iteration", "batches", "losses"}
        return {f.name: getattr(self, f.name) for f in fields(self)
                if f.name not in keep and getattr(self, f.name)}
