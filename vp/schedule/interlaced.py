"""The interlaced baseline (nnScaler; as the official interlaced_schedule.py of sail-sg/VocabularyParallelism runs
it): the output layer is split over all ranks and runs synchronously -- every rank joins S(k) and T(k) of each
microbatch, in order (the naive algorithm's barriers sit inside them).

Rank r of p warms up with W = 1.5p - r forwards (so it holds W microbatches of activations), then runs the output
layer of p - r microbatches back to back, then pairs a backward with each output-layer step until its 1F1B part;
there each step is a forward and a backward (F,B on ranks of the last rank's other parity, B,F on the others)
followed by the output layer of the next microbatch; the cool-down runs the remaining backwards.

Input layer: every rank looks up IF(k) for the first stage ahead of its F(k) (1.5p + 1 of them before the first
output-layer step, then one after each output-layer step from microbatch p-1 on), and IB(k) after each
output-layer step from microbatch p+1 on (p on an odd pipeline). The broadcast C0(k) starts on the last rank right
after its F(k); every other rank enters it at the same place in the collective order, which is early for it
(C0(0), which opens the group, as late as that order allows), but never before its own F(k).
"""


def _rank_steps(p: int, m: int, r: int) -> list[tuple[str, int]]:
    """Rank r's stage passes and output-layer steps ('L'), each with its microbatch, before the input layer."""
    warm = min(3 * p // 2 - r, m)
    drain = min(p - r, m)  # output-layer steps right after the warm-up
    waiting = max(0, warm - drain - (p - r - 1) // 2)  # then backward + output layer, before the 1F1B part
    steady = m - warm
    fb_first = r % 2 == p % 2
    steps = [("F", k) for k in range(warm)] + [("L", k) for k in range(drain)]
    b = iter(range(m))
    for i in range(waiting):
        steps += [("B", next(b)), ("L", drain + i)]
    for i in range(steady):
        fb = [("F", warm + i), ("B", next(b))]
        steps += (fb if fb_first else fb[::-1]) + [("L", drain + waiting + i)]
    for i in range(warm - drain - waiting):
        steps += [("B", next(b)), ("L", drain + waiting + steady + i)]
    steps += [("B", k) for k in b]
    return steps


def interlaced(pp: int, microbatches: int, chunks: int = 1, vocab=None) -> list[list[tuple[str, int, int]]]:
    p, m = pp, microbatches
    first_warm, first_drain = min(3 * p // 2, m), min(p, m)
    order = []
    for r in range(p):
        warm = min(3 * p // 2 - r, m)
        n_if, n_ib = 0, 0
        acts = []

        def lookup():
            nonlocal n_if
            if n_if < m:
                acts.append(("IF", n_if, 0))
                n_if += 1

        for _ in range(first_warm - warm + 1):
            lookup()
        for kind, k in _rank_steps(p, m, r):
            if kind == "F":
                if k < warm:  # warm-up: each forward one lookup ahead
                    lookup()
                acts.append(("F", k, 0))
                if r == p - 1:
                    acts.append(("C0", k, 0))
            elif kind == "B":
                acts.append(("B", k, 0))
            else:
                acts += [("S", k, 0), ("T", k, 0)]
                if k >= first_drain - 1:
                    lookup()
                if (k >= first_drain + 1 or (p % 2 and k == first_drain)) and n_ib < m:
                    acts.append(("IB", n_ib, 0))
                    n_ib += 1
        acts += [("IB", k, 0) for k in range(n_ib, m)]
        order.append(acts)
    return _receivers_enter_c0(order)


def _receivers_enter_c0(order: list[list[tuple[str, int, int]]]) -> list[list[tuple[str, int, int]]]:
    """Every rank but the last enters C0(k) right after the collective that precedes C0(k) on the last rank;
    C0(0), which opens its group, right before the collective that follows it there (a lazily created
    communicator then blocks no receiver before the work the last rank waits for)."""
    root = order[-1]
    entering = [a for a in root if a[0] in ("C0", "S", "T", "IF", "IB")]
    after, before = {}, {}  # an instance of the root -> C0s that follow it / the C0 that opens the group
    for i, a in enumerate(entering):
        if a[0] == "C0" and a[1] == 0:
            nxt = next((b for b in entering[i + 1:] if b[0] != "C0"), None)
            before[nxt] = a
        elif a[0] == "C0":
            after.setdefault(entering[i - 1], []).append(a)
    following, opening = after.get, before.get
    out = []
    for acts in order[:-1]:
        seq = []

        def put(todo: list) -> None:  # each C0 in turn, then the C0s that follow it
            while todo:
                x = todo.pop(0)
                seq.append(x)
                todo += following(x, ())

        for a in acts:
            if (x := opening(a)) is not None:
                put([x])
            seq.append(a)
            if (xs := following(a)) is not None:
                put(list(xs))
        if (x := opening(None)) is not None:
            put([x])
        out.append(_after_own_forward(seq))
    return out + [root]


def _after_own_forward(seq: list[tuple[str, int, int]]) -> list[tuple[str, int, int]]:
    """C0(k) moved after the rank's own F(k) where the order above put it earlier: the last rank's F(k) needs
    that F(k), and a tensor-parallel F communicates, so on one queue it must not wait behind C0(k). Only stage
    passes lie in between (the validator's cross-group order check would catch a collective)."""
    out, moved, done = [], set(), set()  # one pass: C0(k) met before F(k) is held back and put right after it
    for a in seq:
        if a[0] == "C0" and a[1] not in done:
            moved.add(a[1])
            continue
        out.append(a)
        if a[0] == "F":
            done.add(a[1])
            if a[1] in moved:
                moved.discard(a[1])
                out.append(("C0", a[1], 0))
    if moved:
        raise ValueError(f"interlaced: C0 of microbatch(es) {sorted(moved)} with no F on this rank")
    return out
