"""One small pure generator per schedule family (a row of methods.FAMILIES). Each takes (pp, microbatches,
chunks, vocab) -- vocab is the method's vocabulary-algorithm row, of which generators read extra_warmup and
vhalf_gap -- and returns, per rank, the ordered stage passes (kind, microbatch, chunk). build.py then places
the vocabulary passes and adds the sends and receives (lower).
"""
Order = list[list[tuple[str, int, int]]]


def one_f_one_b(pp: int, microbatches: int, chunks: int = 1, vocab=None) -> Order:
    """Megatron's non-interleaved 1F1B: rank r runs p - r (+ the vocabulary algorithm's extra) forwards before
    its first backward."""
    extra = vocab.extra_warmup if vocab else 0
    fwd = [("F", i, 0) for i in range(microbatches)]  # one tuple per pass, shared by the ranks
    bwd = [("B", i, 0) for i in range(microbatches)]
    order = []
    for r in range(pp):
        warm = min(pp - r + extra, microbatches)
        order.append(fwd[:warm] + [x for pair in zip(bwd, fwd[warm:]) for x in pair] + bwd[microbatches - warm:])
    return order


def interleaved(pp: int, microbatches: int, chunks: int, vocab=None) -> Order:
    """Megatron's interleaved 1F1B (virtual pipeline, loop placement); microbatches must be a multiple of pp.

    Virtual step i runs chunk (i // pp) % chunks of microbatch (i // (pp * chunks)) * pp + i % pp;
    backward steps visit the chunks in reverse. Rank r warms up with 2 (pp - r - 1) + (chunks - 1) pp steps,
    plus the vocabulary algorithm's extra forwards (interleaved-vocab-*): on the last rank they put that many
    forwards of the last chunk between F(k) and B(k) of the last stage, where S, C1 and T of k fit.
    """
    extra = vocab.extra_warmup if vocab else 0
    assert microbatches % pp == 0, "interleaved 1F1B needs microbatches to be a multiple of pp"
    total = microbatches * chunks

    def virtual(i: int) -> tuple[int, int]:  # (microbatch, chunk) of forward step i
        group, pos = divmod(i, pp * chunks)
        return group * pp + i % pp, pos // pp

    steps = [virtual(i) for i in range(total)]
    fwd = [("F", mb, chunk) for mb, chunk in steps]  # one tuple per pass, shared by the ranks
    bwd = [("B", mb, chunks - 1 - chunk) for mb, chunk in steps]
    order = []
    for r in range(pp):
        warm = min(2 * (pp - r - 1) + (chunks - 1) * pp + extra, total)
        order.append(fwd[:warm] + [x for pair in zip(fwd[warm:], bwd) for x in pair] + bwd[total - warm:])
    return order
