"""The methods of the project as tables of small frozen rows: what every part (schedule builder, validator,
simulator, cost model, runtime, config checks) reads instead of comparing names.

A method is one row of METHODS: a schedule family (its generator, how stages sit on ranks, whether W is split),
a vocabulary algorithm (a row of VOCAB, vp/schedule/algorithms.py) and whether layers move off the last stage.
Adding a method means one row here, one generator (or a family that exists), one config file (conf/method/, as
tests/test_front_door.py's method_file writes it from the row) and tests.
"""
from dataclasses import dataclass
from functools import partial
from typing import Callable

from vp.schedule import generators as gen
from vp.schedule.algorithms import VOCAB, VocabAlgorithm, get_vocab  # noqa: F401 - the rows' vocabulary part
from vp.schedule.interlaced import interlaced
from vp.schedule.vhalf import vhalf
from vp.schedule.vhalf_vocab import place_vocab_passes


@dataclass(frozen=True)
class Family:
    """A schedule family: its generator and what it asks of a run."""
    name: str
    generate: Callable  # (pp, microbatches, chunks, vocab) -> per rank, ordered (kind, microbatch, chunk)
    placement: str  # 'loop' (stage = chunk * pp + rank) | 'v' (rank r holds stages r and 2pp-1-r)
    split_w: bool  # backward split into B (input gradient) and W (weight gradient)
    chunks: int  # model chunks per rank; 0: taken from the run config (at least 2, default 2)
    microbatches_multiple_of_pp: bool = False
    places_vocab: bool = False  # the generator places the vocabulary passes itself
    vocab_placer: Callable | None = None  # (schedule, build.stage_timeline) -> the schedule, vocabulary passes
    # placed; None: build.insert_vocab_passes


FAMILIES = {
    f.name: f
    for f in [
        Family("1f1b", gen.one_f_one_b, "loop", False, 1),
        Family("interleaved", gen.interleaved, "loop", False, 0, microbatches_multiple_of_pp=True),
        Family("interlaced", interlaced, "loop", False, 1, places_vocab=True),
        Family("vhalf", vhalf, "v", True, 2, vocab_placer=place_vocab_passes),
        # the zero-bubble main branch's order: both ends squeezed (vp.schedule.vhalf); the paper's runs did not. No
        # vocabulary parallelism: the squeeze lets S passes pile up, which the planner's activation bound does not hold
        Family("vhalf-squeezed", partial(vhalf, squeeze=True), "v", True, 2),
    ]
}


@dataclass(frozen=True)
class Method:
    name: str
    family: Family
    vocab: VocabAlgorithm
    redistributes_layers: bool = False  # layer redistribution (redis): fewer transformer layers on the last stage

    @property
    def vocab_parallel(self) -> bool:
        return self.vocab.parallel

    @property
    def placement(self) -> str:
        return self.family.placement

    @property
    def split_w(self) -> bool:
        return self.family.split_w


def _method(name: str, family: str, vocab: str, **kw) -> Method:
    return Method(name, FAMILIES[family], VOCAB[vocab], **kw)


METHODS = {
    m.name: m
    for m in [
        _method("baseline", "1f1b", "local"),
        _method("redis", "1f1b", "local", redistributes_layers=True),
        _method("interleaved", "interleaved", "local"),
        _method("interlaced", "interlaced", "naive"),
        _method("vocab-1", "1f1b", "alg1"),
        _method("vocab-2", "1f1b", "alg2"),
        _method("vhalf", "vhalf", "local"),
        _method("vhalf-vocab-1", "vhalf", "alg1"),
        _method("vhalf-vocab-2", "vhalf", "alg2"),
        _method("vhalf-squeezed", "vhalf-squeezed", "local"),
        _method("interleaved-vocab-1", "interleaved", "alg1"),
        _method("interleaved-vocab-2", "interleaved", "alg2"),
    ]
}


def get_method(name: str) -> Method:
    if name not in METHODS:
        raise ValueError(f"method={name!r} is unknown; choose one of {', '.join(METHODS)}")
    return METHODS[name]


def chunks_for(method: Method, chunks: int | None) -> int:
    """The number of model chunks per rank the method runs with."""
    fixed = method.family.chunks
    if fixed:
        if chunks not in (None, fixed):
            raise ValueError(f"chunks={chunks} does not fit method={method.name}, which always uses "
                             f"{fixed} chunk(s) per rank; drop --chunks or set it to {fixed}")
        return fixed
    chunks = 2 if chunks is None else chunks
    if chunks < 2:
        raise ValueError(f"chunks={chunks}: method={method.name} needs at least 2 model chunks per rank")
    return chunks
