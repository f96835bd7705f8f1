"""What each action needs and what it starts: the one place the validator, the simulator and the runtime read.

Collective instances are named (group, kind, microbatch). A group is one ordered channel (one process
group in the runtime); every rank must enter a group's instances in the same order. C0 and IB are sent
from a root to each rank (a receiver waits for the root alone); IF is reduced to the first stage's rank;
C1, C2 and the naive algorithm's barriers are all-reduces (everyone waits for everyone).
"""
from vp.schedule.actions import Action, Schedule

LOCAL = tuple[str, int, int]  # (kind, mb, chunk) that must come earlier on the same rank


def local_needs(s: Schedule, a: Action) -> list[LOCAL]:
    r, k, mb, c = a
    last_chunk = s.where(s.n_stages - 1)[1]
    first_chunk = s.where(0)[1]
    if k == "F":
        st = s.stage(r, c)
        if st == 0:
            return []
        pr, pc = s.where(st - 1)
        return [("F", mb, pc)] if pr == r else [("RF", mb, c)]
    if k == "B":
        st = s.stage(r, c)
        needs = [("F", mb, c)]
        if st == s.n_stages - 1:
            if s.vocab == "naive":
                needs.append(("T", mb, 0))
            return needs
        nr, nc = s.where(st + 1)
        return needs + ([("B", mb, nc)] if nr == r else [("RB", mb, c)])
    if k == "W":
        return [("B", mb, c)]
    if k == "S":
        return [("F", mb, last_chunk)] if r == s.last_rank else [("C0", mb, 0)]
    if k == "T":
        return [("S", mb, 0)] + ([] if s.vocab == "naive" else [("C1", mb, 0)])
    if k == "IB":
        return [("B", mb, first_chunk)] if r == s.first_rank else []
    if k == "C0":
        return [("F", mb, last_chunk)] if r == s.last_rank else []
    if k == "C1":
        return [("S", mb, 0)]
    if k == "C2":
        return [("T", mb, 0)]
    if k == "SF":
        return [("F", mb, c)]
    if k == "SB":
        return [("B", mb, c)]
    return []  # IF, RF, RB


def waits_on(s: Schedule, a: Action) -> list[tuple[str, str, int]]:
    """The collective instances whose completion this action waits for before it starts."""
    r, k, mb, c = a
    if k == "S":
        waits = [] if r == s.last_rank else [("C0", "C0", mb)]
        return waits + ([("naive", "S", mb)] if s.vocab == "naive" else [])
    if k == "T":
        return [("naive", "T", mb)] if s.vocab == "naive" else [("C1", "C1", mb)]
    if k == "B" and s.stage(r, c) == s.n_stages - 1 and s.vocab in ("alg1", "alg2"):
        return [("C2", "C2", mb)] if s.vocab == "alg1" else [("C1", "C1", mb)]
    if k == "F" and s.stage(r, c) == 0 and s.vocab_parallel:
        return [("IF", "IF", mb)]
    if k == "IB" and r != s.first_rank:
        return [("IB", "IB", mb)]
    return []


def enters(s: Schedule, a: Action) -> tuple[str, str, int, str] | None:
    """The collective instance this action enters, and whether at its 'start' or 'end'."""
    k, mb = a.kind, a.mb
    if k in ("C0", "C1", "C2"):
        return (k, k, mb, "start")
    if k == "IF":
        return ("IF", "IF", mb, "end")
    if k == "IB":
        return ("IB", "IB", mb, "start")
    if k in ("S", "T") and s.vocab == "naive":
        return ("naive", k, mb, "start")
    return None


def root_of(s: Schedule, group: str) -> int | None:
    """The rank a rooted group sends from (C0, IB: copies to each rank) or reduces to (IF); None for all-reduces."""
    return {"C0": s.last_rank, "IB": s.first_rank, "IF": s.first_rank}.get(group)


def p2p_peer(s: Schedule, a: Action) -> tuple[int, tuple[str, int, int]]:
    """(peer rank, match key) of a send or receive; a send and its receive share the key."""
    st = s.stage(a.rank, a.chunk)
    if a.kind == "SF":
        return s.where(st + 1)[0], ("F", a.mb, st)
    if a.kind == "RF":
        return s.where(st - 1)[0], ("F", a.mb, st - 1)
    if a.kind == "SB":
        return s.where(st - 1)[0], ("B", a.mb, st)
    if a.kind == "RB":
        return s.where(st + 1)[0], ("B", a.mb, st + 1)
    raise AssertionError(f"{a} is not a p2p action")
