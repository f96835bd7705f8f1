"""The methods of DESIGN.md: which schedule family, where the vocabulary layers live, how stages sit on ranks."""
from dataclasses import dataclass


@dataclass(frozen=True)
class Method:
    name: str
    schedule: str  # '1f1b' | 'interleaved' | 'interlaced' | 'vhalf'
    vocab: str  # 'local' (input layer on the first stage, output on the last) | 'naive' | 'alg1' | 'alg2'
    chunks: int  # model chunks per rank; 0 means "taken from the run config" (interleaved)
    placement: str  # 'loop' (stage = chunk * pp + rank) | 'v' (rank r holds stages r and 2pp-1-r)
    split_w: bool  # backward split into B (input gradient) and W (weight gradient)

    @property
    def vocab_parallel(self) -> bool:
        return self.vocab != "local"


METHODS = {
    m.name: m
    for m in [
        Method("baseline", "1f1b", "local", 1, "loop", False),
        Method("redis", "1f1b", "local", 1, "loop", False),
        Method("interleaved", "interleaved", "local", 0, "loop", False),
        Method("interlaced", "interlaced", "naive", 1, "loop", False),
        Method("vocab-1", "1f1b", "alg1", 1, "loop", False),
        Method("vocab-2", "1f1b", "alg2", 1, "loop", False),
        Method("vhalf", "vhalf", "local", 2, "v", True),
        Method("vhalf-vocab-1", "vhalf", "alg1", 2, "v", True),
        Method("vhalf-vocab-2", "vhalf", "alg2", 2, "v", True),
    ]
}


def get_method(name: str) -> Method:
    if name not in METHODS:
        raise ValueError(f"method={name!r} is unknown; choose one of {', '.join(METHODS)}")
    return METHODS[name]


def chunks_for(method: Method, chunks: int | None) -> int:
    """The number of model chunks per rank the method runs with."""
    if method.chunks:
        if chunks not in (None, method.chunks):
            raise ValueError(f"chunks={chunks} does not fit method={method.name}, which always uses "
                             f"{method.chunks} chunk(s) per rank; drop --chunks or set it to {method.chunks}")
        return method.chunks
    chunks = 2 if chunks is None else chunks
    if chunks < 2:
        raise ValueError(f"chunks={chunks}: method={method.name} needs at least 2 model chunks per rank")
    return chunks


def stage_of(placement: str, pp: int, rank: int, chunk: int) -> int:
    """Global stage index of (rank, chunk)."""
    if placement == "v":
        return rank if chunk == 0 else 2 * pp - 1 - rank
    return chunk * pp + rank


def rank_chunk_of(placement: str, pp: int, stage: int) -> tuple[int, int]:
    """(rank, chunk) holding a global stage index."""
    chunk, pos = divmod(stage, pp)
    if placement == "v" and chunk == 1:
        return pp - 1 - pos, 1
    return pos, chunk
