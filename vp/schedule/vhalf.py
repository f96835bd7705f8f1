"""V-Half (Qi et al., arXiv 2405.15362): a repeating building block, as the official generator builds it
(zero-bubble-pipeline-parallelism, scheduler/zbv_greedy.py, PipelineGraph.create_schedule with mem setup 'half').

Time is cut into unit slots; each stage pass (F, B or W of one chunk) takes one. The building block gives every
pass of microbatch mb a slot, repeating every 6 slots; weight passes W fill the free slots of their rank, the W of a
chunk-1 B before that of a chunk-0 B (put_w with split W). Each rank runs its passes in slot order. This is the
generator the paper's V-Half runs used (arXiv 2411.05288, Table 6: the repository's v-half-vocab branch, which
calls schedule_from_pattern with do_reorder=False since vocabulary parallelism was added to it); with vocabulary
parallelism its stable pattern delays both backward slots by 6 (one barrier, Algorithm 2) or 12 (two, Algorithm
1) slots, the room its S and T passes take between the last stage's F and B.

The main branch instead squeezes both ends (do_reorder=True; `squeeze=True` here): visiting passes in slot order,
each warm-up or cool-down pass moves to the earliest free slot after what it needs, unless that raises its rank's
activation peak above the block's steady-state peak. The slots are then compacted (every pass as early as its
rank's order allows) and the cool-down squeezed again, which the compaction made room for. That shortens warm-up
and cool-down at the same peak count (about 0.5 % more MFU on the paper's V-Half grid, 128 microbatches), but lets
rank 0 hold up to p/4 + 1 forwards of the last stage at once (the plain block: 1), each with that stage's
output-layer activations.
"""
from collections import deque

PASSES = (("F", 0), ("F", 1), ("B", 1), ("B", 0))  # the block's passes per rank: (kind, chunk), by slot

Slots = list[dict[tuple[int, int], int]]  # per rank: (pass index in PASSES, microbatch) -> slot


def pattern(pp: int, shift: int = 0) -> list[list[int]] | None:
    """Slots of one microbatch's passes (in PASSES order) on each rank, or None where they collide.

    Rank i runs F of chunk 0 (stage i) at slot 2i, F of chunk 1 (stage 2p-1-i) at 3p-i-2, B of chunk 1 at
    3p+g+2i-1 and B of chunk 0 at 6p+g-i-2 (g = 3 for even p). `shift` delays both backward slots (the
    vocabulary algorithm's vhalf_gap, a multiple of 6 so that the slots keep their residues).
    """
    gap = 3 if pp % 2 == 0 else 0
    blocks = []
    for i in range(pp):
        block = [2 * i, 3 * pp - i - 2, 3 * pp + gap + 2 * i - 1 + shift, 6 * pp + gap - i - 2 + shift]
        if len({t % 6 for t in block}) < 4:
            return None
        blocks.append(block)
    return blocks


def _needs(pp: int, r: int, i: int, mb: int) -> list[tuple[int, int, int]]:
    """(rank, pass index, microbatch) of the passes that pass i of mb on rank r must follow."""
    out = [(r, i, mb - 1)] if mb else []
    if i == 0 and r > 0:  # F of stage r after F of stage r-1
        out.append((r - 1, 0, mb))
    if i == 1:  # F of stage 2p-1-r after F of stage 2p-2-r (rank r+1, or the V's turn on rank p-1)
        out.append((r + 1, 1, mb) if r < pp - 1 else (r, 0, mb))
    if i == 2:  # B of stage 2p-1-r after its F, and after B of stage 2p-r (rank r-1)
        out += [(r, 1, mb)] + ([(r - 1, 2, mb)] if r > 0 else [])
    if i == 3:  # B of stage r after B of stage r+1
        out.append((r + 1, 3, mb) if r < pp - 1 else (r, 2, mb))
    return out


def _grid(slots: dict) -> list[str]:
    """A rank's slots as a list of pass kinds ('' where free)."""
    grid = [""] * (max(slots.values()) + 1)
    for (i, _), t in slots.items():
        grid[t] = PASSES[i][0]
    return grid


def _peak(grid: list[str]) -> int:
    """A rank's activation peak (in chunk activations): F adds one, W (in the next free slot) frees one."""
    held = peak = pending = 0
    for kind in grid:
        if kind == "F":
            held += 1
            if held > peak:
                peak = held
        elif kind == "B":
            pending += 1
        elif pending:
            pending, held = pending - 1, held - 1
    return peak


class _Held:
    """A rank's grid with the activations held and the frees pending after each slot (as _peak counts them), so
    that moving one pass is checked against a cap by recounting only the slots whose counts it changes."""

    def __init__(self, grid: list[str]):
        self.grid, self.held, self.pending = grid, [], []
        held = pending = 0
        put_held, put_pending = self.held.append, self.pending.append
        for kind in grid:  # after each slot: F holds one more, B asks for a free, a free slot frees one asked for
            if kind == "F":
                held += 1
            elif kind == "B":
                pending += 1
            elif pending:
                held, pending = held - 1, pending - 1
            put_held(held)
            put_pending(pending)

    def move(self, t: int, free: int, cap: int) -> bool:
        """Move the pass at slot t to the free slot free < t if the rank's peak stays <= cap (which it is now)."""
        grid, held, pending = self.grid, self.held, self.pending
        kind = grid[t]
        grid[t], grid[free] = "", kind
        h, p = (held[free - 1], pending[free - 1]) if free else (0, 0)
        new_held, new_pending = [], []  # from slot free on, until the counts equal the old ones past slot t
        for x in range(free, len(grid)):  # counted as __init__ does: this loop is most of V-Half's generation
            k = grid[x]
            if k == "F":
                h += 1
                if h > cap:  # the slots not recounted hold what they held before, at most the cap
                    grid[t], grid[free] = kind, ""
                    return False
            elif k == "B":
                p += 1
            elif p:
                h, p = h - 1, p - 1
            if x >= t and h == held[x] and p == pending[x]:  # the grids agree from here on, and so do the counts
                break
            new_held.append(h)
            new_pending.append(p)
        held[free:free + len(new_held)] = new_held
        pending[free:free + len(new_pending)] = new_pending
        return True


def _squeeze(pp: int, m: int, slots: Slots, warmup: bool) -> Slots:
    """Move warm-up (if asked) and cool-down passes to earlier free slots, under the steady-state peak.

    Passes are visited in slot order. Warm-up: those before rank 0's first B of stage 0; cool-down: those after
    it and after rank 0's F of stage 0 of the last microbatch (with few microbatches there is no steady state).
    Each trial move is checked by recounting the activations only where it changes them (_Held), so the cost
    does not grow with the length of the steady state."""
    grids = [_Held(_grid(s)) for s in slots]
    cap = max([0] + [max(g.held, default=0) for g in grids])
    first_b, last_f = (slots[0][(3, 0)], 0, 3, 0), (slots[0][(0, m - 1)], 0, 0, m - 1)
    keys = [(t, r, i, mb) for r in range(pp) for (i, mb), t in slots[r].items()]
    movable = [key for key in keys if (key < first_b and warmup) or (key > last_f and key >= first_b)]
    for key in sorted(movable):  # the steady state in between never moves: only these are sorted and visited
        t, r, i, mb = key
        held, grid = grids[r], grids[r].grid
        lo = max((slots[q][(j, k)] + 1 for q, j, k in _needs(pp, r, i, mb)), default=0)
        for free in range(lo, t):
            if grid[free]:  # every movable pass of this rank before slot t has been visited
                continue
            if held.move(t, free, cap):
                slots[r][(i, mb)] = free
                break
    return slots


def _with_w(slots: dict) -> list[tuple[str, int, int]]:
    """A rank's passes in slot order, each W in the first free slot after its B (first come first served)."""
    at = {t: (PASSES[i][0], mb, PASSES[i][1]) for (i, mb), t in slots.items()}
    acts, pending = [], deque()
    for t in range(max(at) + 1):
        if t in at:
            acts.append(at[t])
            if at[t][0] == "B":
                pending.append(("W", at[t][1], at[t][2]))
        elif pending:
            acts.append(pending.popleft())
    return acts + list(pending)


def _compact(pp: int, slots: Slots) -> Slots:
    """Each pass (W included) as early as its rank's order and its needs allow; W passes are then dropped.

    Each rank runs its order until a pass needs one not yet placed, and is parked on that pass until it is."""
    orders = [_with_w(s) for s in slots]
    index = {p: n for n, p in enumerate(PASSES)}
    start = [dict() for _ in range(pp)]
    pos, clock = [0] * pp, [0] * pp
    parked = {}  # (rank, pass index, microbatch) -> ranks waiting for it to be placed
    work = list(range(pp - 1, -1, -1))
    while work:
        r = work.pop()
        order, placed, p, t_clock = orders[r], start[r], pos[r], clock[r]
        while p < len(order):
            kind, mb, chunk = order[p]
            t = t_clock
            if kind != "W":
                i = index[(kind, chunk)]
                for q, j, k in _needs(pp, r, i, mb):
                    got = start[q].get((j, k))
                    if got is None:
                        parked.setdefault((q, j, k), []).append(r)
                        break
                    if got + 1 > t:
                        t = got + 1
                else:
                    got = 0
                if got is None:
                    break
                placed[(i, mb)] = t
                work.extend(parked.pop((r, i, mb), ()))
            t_clock, p = t + 1, p + 1
        pos[r], clock[r] = p, t_clock
    assert all(pos[r] == len(orders[r]) for r in range(pp)), "V-Half squeeze produced an order that cannot run"
    return start


def _put_w(slots: dict) -> list[tuple[str, int, int]]:
    """A rank's passes in slot order, a W in each free slot after its B: of the pending ones, the oldest W of
    chunk 1 first, else the oldest of chunk 0 (the official put_w with split W)."""
    at = {t: (PASSES[i][0], mb, PASSES[i][1]) for (i, mb), t in slots.items()}
    acts, pending = [], {1: deque(), 0: deque()}
    for t in range(max(at) + 1):
        if t in at:
            acts.append(at[t])
            if at[t][0] == "B":
                pending[at[t][2]].append(("W", at[t][1], at[t][2]))
        elif pending[1] or pending[0]:
            acts.append(pending[1].popleft() if pending[1] else pending[0].popleft())
    return acts + list(pending[1]) + list(pending[0])


def vhalf(pp: int, microbatches: int, chunks: int = 2, vocab=None,
          squeeze: bool = False) -> list[list[tuple[str, int, int]]]:
    """V-Half: the building block per microbatch, backward slots delayed by the vocabulary algorithm's vhalf_gap;
    W in free slots. squeeze: both ends squeezed, as the zero-bubble main branch does (see the module)."""
    block = pattern(pp, vocab.vhalf_gap if vocab else 0)
    slots = [{(i, mb): t + 6 * mb for i, t in enumerate(block[r]) for mb in range(microbatches)} for r in range(pp)]
    if not squeeze:
        return [_put_w(s) for s in slots]
    slots = _squeeze(pp, microbatches, slots, warmup=True)
    slots = _squeeze(pp, microbatches, _compact(pp, slots), warmup=False)
    return [_with_w(s) for s in slots]
