"""One small pure generator per schedule family (a row of methods.FAMILIES). Each takes (pp, microbatches,
chunks, vocab) -- vocab is the method's vocabulary-algorithm row, of which generators read extra_warmup and
vhalf_gap -- and returns, per rank, the ordered stage passes (kind, microbatch, chunk). build.py then places
the vocabulary passes and adds the sends and receives (lower).
"""
from collections import deque

Order = list[list[tuple[str, int, int]]]


def one_f_one_b(pp: int, microbatches: int, chunks: int = 1, vocab=None) -> Order:
    """Megatron's non-interleaved 1F1B: rank r runs p - r (+ the vocabulary algorithm's extra) forwards before
    its first backward."""
    extra = vocab.extra_warmup if vocab else 0
    order = []
    for r in range(pp):
        warm = min(pp - r + extra, microbatches)
        acts = [("F", i, 0) for i in range(warm)]
        for i in range(microbatches - warm):
            acts += [("B", i, 0), ("F", i + warm, 0)]
        acts += [("B", i, 0) for i in range(microbatches - warm, microbatches)]
        order.append(acts)
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

    def virtual(i: int, forward: bool) -> tuple[int, int]:
        group, pos = divmod(i, pp * chunks)
        chunk = pos // pp
        return group * pp + i % pp, (chunk if forward else chunks - 1 - chunk)

    order = []
    for r in range(pp):
        warm = min(2 * (pp - r - 1) + (chunks - 1) * pp + extra, total)
        acts = [("F", *virtual(i, True)) for i in range(warm)]
        for i in range(total - warm):
            acts += [("F", *virtual(i + warm, True)), ("B", *virtual(i, False))]
        acts += [("B", *virtual(i, False)) for i in range(total - warm, total)]
        order.append(acts)
    return order


def vhalf_pattern(pp: int, shift: int = 0) -> list[list[tuple[int, str, int]]] | None:
    """Slots of one microbatch's building block of V-Half (Qi et al., arXiv 2405.15362) on each rank.

    Rank i runs F of chunk 0 (stage i) at slot 2i, F of chunk 1 (stage 2p-1-i) at 3p-i-2, B of chunk 1 at
    3p+g+2i-1 and B of chunk 0 at 6p+g-i-2 (g = 3 for even p); the block repeats every 6 slots, leaving two
    slots for the weight passes. `shift` delays both backward slots, to make room for vocabulary passes.
    Returns None when the shifted slots collide.
    """
    gap = 3 if pp % 2 == 0 else 0
    blocks = []
    for i in range(pp):
        block = [(2 * i, "F", 0), (3 * pp - i - 2, "F", 1),
                 (3 * pp + gap + 2 * i - 1 + shift, "B", 1), (6 * pp + gap - i - 2 + shift, "B", 0)]
        if len({t % 6 for t, _, _ in block}) < 4:
            return None
        blocks.append(block)
    return blocks


def vhalf_shift(pp: int, gap: int) -> int:
    """Smallest delay of V-Half's backward slots that leaves `gap` slots between the last stage's F and B.

    The last stage (rank 0, chunk 1) runs F at slot 3p-2 and, after the shift, B at 3p+g-1+shift. Algorithm 2
    needs one slot between them (C1, gap 2); Algorithm 1 needs T of k, placed with S of k+1 six slots later,
    and one more slot for C2 before B (gap 8).
    """
    if not gap:
        return 0
    g = 3 if pp % 2 == 0 else 0
    shift = 0
    while vhalf_pattern(pp, shift) is None or g + 1 + shift < gap:
        shift += 1
    return shift


def vhalf(pp: int, microbatches: int, chunks: int = 2, vocab=None) -> Order:
    """V-Half: the building block repeated per microbatch; each weight pass W fills the next free slot. The
    backward slots are delayed to leave the vocabulary algorithm its gap (vhalf_shift)."""
    shift = vhalf_shift(pp, vocab.vhalf_gap if vocab else 0)
    blocks = vhalf_pattern(pp, shift)
    assert blocks is not None, f"V-Half building block collides with shift={shift}"
    order = []
    for block in blocks:
        slots = {t + 6 * mb: (kind, mb, chunk) for mb in range(microbatches) for t, kind, chunk in block}
        acts, pending = [], deque()
        for t in range(max(slots) + 1):
            if t in slots:
                acts.append(slots[t])
                if slots[t][0] == "B":
                    pending.append(("W", slots[t][1], slots[t][2]))
            elif pending:
                acts.append(pending.popleft())
        order.append(acts + list(pending))
    return order


def interlaced(pp: int, microbatches: int, chunks: int = 1, vocab=None) -> Order:
    """The interlaced baseline (nnScaler): the output layer runs on all ranks together, synchronously.

    Time is cut into steps; in each step a rank runs one F and one B, in the order F,B or B,F by parity
    (the last rank runs B,F), and then every rank joins the synchronous output layer S, T of the
    microbatch whose X the last rank just produced. A forward crosses two ranks per step and a backward
    one, so rank r holds about 1.5p - r microbatches (the 1.5p warm-up of the interlaced schedule).
    C0, IF and IB are placed in the same steps: receivers of C0(k) enter one step early, IF(k) runs a
    step before the first stage's F(k), and IB(k) follows the step of the first stage's B(k).
    """
    last = pp - 1
    fb_first = [(last - r) % 2 == 1 for r in range(pp)]
    f_step = [0] * pp
    for r in range(1, pp):
        f_step[r] = f_step[r - 1] + (1 if fb_first[r] and not fb_first[r - 1] else 0)
    b_step = [f_step[last] + 1 + (last - r) for r in range(pp)]
    s_step = f_step[last]
    order = []
    for r in range(pp):
        acts = [("C0", 0, 0)] if r != last else []
        acts += [("IF", 0, 0)]
        for t in range(b_step[0] + microbatches):
            f, b, k = t - f_step[r], t - b_step[r], t - s_step
            fwd = [("F", f, 0)] + ([("C0", f, 0)] if r == last else []) if 0 <= f < microbatches else []
            bwd = [("B", b, 0)] if 0 <= b < microbatches else []
            acts += fwd + bwd if fb_first[r] else bwd + fwd
            if 0 <= k < microbatches:
                acts += [("S", k, 0), ("T", k, 0)]
                if r != last and k + 1 < microbatches:
                    acts.append(("C0", k + 1, 0))
            if t + 1 < microbatches:
                acts.append(("IF", t + 1, 0))
            ib = t - b_step[0]
            if 0 <= ib < microbatches:
                acts.append(("IB", ib, 0))
        order.append(acts)
    return order
