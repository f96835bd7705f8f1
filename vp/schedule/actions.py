"""A schedule is data: an ordered list of actions per rank, with a text form that parses back.

An action is (rank, kind, microbatch, chunk). Its text form is the kind, the microbatch and, for
schedules with several chunks per rank, `.chunk`: `F3`, `B3.1`, `S3`, `IF3`, `SF3.1`. Communication
steps name a microbatch after a colon, since their kind ends in a digit: `C0:3`, `C1:3`, `C2:3`.

Kinds:
  compute     F B W (transformer stage), S T (output layer), IF IB (input layer)
  collective  C0 (broadcast of the last stage's output), C1 (softmax statistics barrier),
              C2 (input-gradient all-reduce of Algorithm 1): launched here, waited for by their consumer
  p2p         SF RF (send / receive a stage's activation), SB RB (send / receive an input gradient)
"""
import re
from dataclasses import dataclass, field
from functools import cached_property, lru_cache
from typing import NamedTuple

from vp.schedule.algorithms import VocabAlgorithm, get_vocab


COMPUTE = ("F", "B", "W", "S", "T", "IF", "IB")
COLLECTIVES = ("C0", "C1", "C2")
P2P = ("SF", "RF", "SB", "RB")
KINDS = COMPUTE + COLLECTIVES + P2P

def stage_of(placement: str, pp: int, rank: int, chunk: int) -> int:
    """Global stage index of (rank, chunk): loop placement (stage = chunk * pp + rank) or V placement (rank r
    holds stages r and 2pp-1-r)."""
    if placement == "v":
        return rank if chunk == 0 else 2 * pp - 1 - rank
    return chunk * pp + rank


def rank_chunk_of(placement: str, pp: int, stage: int) -> tuple[int, int]:
    """(rank, chunk) holding a global stage index."""
    chunk, pos = divmod(stage, pp)
    if placement == "v" and chunk == 1:
        return pp - 1 - pos, 1
    return pos, chunk


@lru_cache(maxsize=1024)
def stage_ranks(placement: str, pp: int, chunks: int) -> tuple[int, ...]:
    """The rank holding each global stage of a placement (rank_chunk_of's rank, for every stage), once per shape."""
    return tuple(rank_chunk_of(placement, pp, st)[0] for st in range(pp * chunks))


_TOKEN = re.compile(r"^(IF|IB|SF|RF|SB|RB|C[012]:|F|B|W|S|T)(\d+)(?:\.(\d+))?$")


class Action(NamedTuple):
    rank: int
    kind: str
    mb: int
    chunk: int = 0

    def text(self, show_chunk: bool = False) -> str:
        sep = ":" if self.kind in COLLECTIVES else ""
        suffix = f".{self.chunk}" if show_chunk or self.chunk else ""
        return f"{self.kind}{sep}{self.mb}{suffix}"

    @staticmethod
    def parse(rank: int, token: str) -> "Action":
        match = _TOKEN.match(token)
        if not match:
            raise ValueError(f"rank {rank}: cannot parse action {token!r}; expected forms like F3, B3.1, C1:3, SF2.0")
        kind, mb, chunk = match.groups()
        return Action(rank, kind.rstrip(":"), int(mb), int(chunk or 0))


@dataclass(frozen=True)
class Collective:
    """One instance of a collective: every rank of its group enters it once, in the same order per group.

    group: the ordered channel it runs on (one process group in the runtime); kind: C0 C1 C2 IF IB, or S/T for
    the naive algorithm's synchronous barriers; phase: whether the entering action enters it at its 'start'
    (launched before the action's compute) or at its 'end' (launched with the action's result, IF)."""
    group: str
    kind: str
    mb: int
    phase: str = field(default="start", compare=False)

    def text(self) -> str:
        return f"{self.kind}:{self.mb}" if self.group == self.kind else f"{self.group}.{self.kind}:{self.mb}"


@dataclass
class Schedule:
    method: str
    pp: int
    microbatches: int
    chunks: int
    placement: str  # 'loop' | 'v'
    vocab: VocabAlgorithm
    split_w: bool
    ranks: list[list[Action]] = field(default_factory=list)

    @property
    def n_stages(self) -> int:
        return self.pp * self.chunks

    @property
    def vocab_parallel(self) -> bool:
        return self.vocab.parallel

    def stage(self, rank: int, chunk: int) -> int:
        return stage_of(self.placement, self.pp, rank, chunk)

    def where(self, stage: int) -> tuple[int, int]:
        return rank_chunk_of(self.placement, self.pp, stage)

    @property
    def stage_ranks(self) -> tuple[int, ...]:
        """The rank of each global stage (where(stage)[0] of every stage), worked out once per shape."""
        return stage_ranks(self.placement, self.pp, self.chunks)

    def memo(self, name: str, compute):
        """compute(self), once per schedule object: what the simulator and the cost model derive from the actions
        (a schedule is not changed once built, as the cached properties below assume; derive a changed one with
        dataclasses.replace)."""
        cache = self.__dict__.setdefault("_memo", {})
        if name not in cache:
            cache[name] = compute(self)
        return cache[name]

    @cached_property
    def first_rank(self) -> int:
        return self.where(0)[0]

    @cached_property
    def last_rank(self) -> int:
        return self.where(self.n_stages - 1)[0]

    @cached_property
    def first_chunk(self) -> int:
        return self.where(0)[1]

    @cached_property
    def last_chunk(self) -> int:
        return self.where(self.n_stages - 1)[1]

    def header(self) -> str:
        return (f"# schedule method={self.method} pp={self.pp} microbatches={self.microbatches} "
                f"chunks={self.chunks} placement={self.placement} vocab={self.vocab.name} split_w={int(self.split_w)}")

    def to_text(self) -> str:
        show = self.chunks > 1
        lines = [self.header()]
        lines += [f"{r}: " + " ".join(a.text(show) for a in acts) for r, acts in enumerate(self.ranks)]
        return "\n".join(lines) + "\n"

    @classmethod
    def from_text(cls, text: str) -> "Schedule":
        lines = [line for line in text.strip().splitlines() if line.strip()]
        if not lines or not lines[0].startswith("# schedule "):
            raise ValueError("schedule text must start with a '# schedule key=value ...' header line")
        meta = dict(kv.split("=", 1) for kv in lines[0][len("# schedule "):].split())
        sched = cls(meta["method"], int(meta["pp"]), int(meta["microbatches"]), int(meta["chunks"]),
                    meta["placement"], get_vocab(meta["vocab"]), meta["split_w"] == "1")
        for r, line in enumerate(lines[1:]):
            head, _, body = line.partition(":")
            if int(head) != r:
                raise ValueError(f"schedule line {r + 2} names rank {head}; ranks must be listed in order 0..pp-1")
            sched.ranks.append([Action.parse(r, tok) for tok in body.split()])
        if len(sched.ranks) != sched.pp:
            raise ValueError(f"schedule header says pp={sched.pp} but lists {len(sched.ranks)} ranks")
        return sched

    def grid(self, mark: tuple[int, int] | None = None, around: int | None = None) -> str:
        """The rank x step grid as text; `mark` = (rank, step) is bracketed, `around` limits the steps shown."""
        show = self.chunks > 1
        width = max(len(a.text(show)) for acts in self.ranks for a in acts) + 2
        steps = max(len(acts) for acts in self.ranks)
        lo, hi = 0, steps
        if mark is not None and around is not None:
            lo, hi = max(0, mark[1] - around), min(steps, mark[1] + around + 1)
        out = ["step".ljust(8) + "".join(str(i).ljust(width) for i in range(lo, hi))]
        for r, acts in enumerate(self.ranks):
            cells = []
            for i in range(lo, hi):
                text = acts[i].text(show) if i < len(acts) else ""
                cells.append((f"[{text}]" if mark == (r, i) else text).ljust(width))
            out.append(f"rank {r}".ljust(8) + "".join(cells))
        return "\n".join(line.rstrip() for line in out)
