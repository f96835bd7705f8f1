"""What each action needs and what it starts: the one place the validator, the simulator and the runtime read.

Collective instances are named (Collective: group, kind, microbatch, phase). A group is one ordered channel
(one process group in the runtime); every rank must enter a group's instances in the same order. C0 and IB
are sent from a root to each rank (a receiver waits for the root alone); IF is reduced to the first stage's
rank; C1, C2 and the naive algorithm's barriers are all-reduces (everyone waits for everyone). What an
algorithm enters and waits for comes from its row (methods.VOCAB), never from its name.
"""
from dataclasses import replace
from operator import itemgetter
from typing import NamedTuple

from vp.schedule.actions import P2P, Action, Collective, Schedule

LOCAL = tuple[str, int, int]  # (kind, mb, chunk) that must come earlier on the same rank


def collective(s: Schedule, kind: str, mb: int) -> Collective:
    """The collective instance of `kind` for microbatch mb: C0 C1 C2 IF IB on their own channel, entered at the
    start of the action (IF: at its end, with the looked-up rows); the naive algorithm's S and T barriers on
    its 'naive' channel."""
    if kind in ("S", "T"):
        assert s.vocab.synchronous, f"{kind} enters no collective in algorithm {s.vocab.name}"
        return Collective("naive", kind, mb)
    return Collective(kind, kind, mb, "end" if kind == "IF" else "start")


def local_needs(s: Schedule, a: Action) -> list[LOCAL]:
    r, k, mb, c = a
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
            if s.vocab.grad_x_from == "T":  # the synchronous output layer hands grad X over in T itself
                needs.append(("T", mb, 0))
            return needs
        nr, nc = s.where(st + 1)
        return needs + ([("B", mb, nc)] if nr == r else [("RB", mb, c)])
    if k == "W":
        return [("B", mb, c)]
    if k == "S":
        return [("F", mb, s.last_chunk)] if r == s.last_rank else [("C0", mb, 0)]
    if k == "T":
        return [("S", mb, 0)] + [(c1, mb, 0) for c1 in s.vocab.after_s]
    if k == "IB":
        return [("B", mb, s.first_chunk)] if r == s.first_rank else []
    if k == "C0":
        return [("F", mb, s.last_chunk)] if r == s.last_rank else []
    if k in s.vocab.after_s:
        return [("S", mb, 0)]
    if k in s.vocab.after_t:
        return [("T", mb, 0)]
    if k == "SF":
        return [("F", mb, c)]
    if k == "SB":
        return [("B", mb, c)]
    return []  # IF, RF, RB


def waits_on(s: Schedule, a: Action) -> list[Collective]:
    """The collective instances whose completion this action waits for before it starts."""
    r, k, mb, c = a
    v = s.vocab
    if k == "S":
        waits = [] if r == s.last_rank else [collective(s, "C0", mb)]
        return waits + ([collective(s, "S", mb)] if v.synchronous else [])
    if k == "T":
        return [collective(s, "T", mb)] if v.synchronous else [collective(s, c1, mb) for c1 in v.after_s]
    if k == "B" and v.parallel and not v.synchronous and s.stage(r, c) == s.n_stages - 1:
        return [collective(s, v.grad_x_from, mb)]
    if k == "F" and v.parallel and s.stage(r, c) == 0:
        return [collective(s, "IF", mb)]
    if k == "IB" and r != s.first_rank:
        return [collective(s, "IB", mb)]
    return []


def enters(s: Schedule, a: Action) -> Collective | None:
    """The collective instance this action enters (its phase says whether at its start or end)."""
    k = a.kind
    if k in ("C0", "C1", "C2", "IF", "IB") or (k in ("S", "T") and s.vocab.synchronous):
        return collective(s, k, a.mb)
    return None


def members(s: Schedule, group: str) -> range:
    """The ranks of a collective group: today every group (C0 C1 C2 IF IB naive) spans all pipeline ranks."""
    return range(s.pp)


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


class Shape(NamedTuple):
    """What the rules above say of an action, with its microbatch left out: they depend on its rank, kind and chunk
    alone and name the action's own microbatch, so one shape serves every microbatch (shapes())."""
    needs: tuple  # (kind, chunk) of the actions of the same microbatch that must come earlier on the rank
    peer: int | None  # sends and receives: the other rank
    match: tuple | None  # sends and receives: (kind, stage) of the key a send and its receive share (with mb)
    entry: Collective | None  # the instance it enters, of microbatch 0
    waits: tuple  # the instances it waits on, of microbatch 0


def shape(s: Schedule, a: Action) -> Shape:
    mb = a.mb
    needs = local_needs(s, a)
    entry, waits = enters(s, a), waits_on(s, a)
    peer, match = p2p_peer(s, a) if a.kind in P2P else (None, None)
    assert all(n[1] == mb for n in needs) and all(c.mb == mb for c in [entry, *waits] if c), a
    assert match is None or match[1] == mb, a
    return Shape(tuple((n[0], n[2]) for n in needs), peer, match and (match[0], match[2]),
                 entry and replace(entry, mb=0), tuple(replace(w, mb=0) for w in waits))


_SHAPES: dict = {}  # (the schedule's fields but its microbatches and actions, rank, kind, chunk) -> Shape
_SHAPES_AT_MOST = 1 << 17  # emptied past this many


def shape_of(s: Schedule, rank: int, kind: str, chunk: int) -> Shape:
    """shape() of (rank, kind, chunk): it reads the schedule's method, pp, chunks, placement, vocabulary and W split,
    never its microbatches or actions, so one is worked out for every schedule that shares those (a planner builds
    one per microbatch count)."""
    key = (s.method, s.pp, s.chunks, s.placement, s.vocab, s.split_w, rank, kind, chunk)
    got = _SHAPES.get(key)
    if got is None:
        if len(_SHAPES) >= _SHAPES_AT_MOST:
            _SHAPES.clear()
        got = _SHAPES[key] = shape(s, Action(rank, kind, 0, chunk))
    return got


def rank_keys(s: Schedule) -> list[dict]:
    """Per rank, the distinct (rank, kind, chunk) of its actions, in order of first appearance (as dict keys): one
    pass in C, once per schedule object (validate()'s field check and shapes() read it)."""
    return s.memo("rank_keys", lambda s: [dict.fromkeys(map(itemgetter(0, 1, 3), acts)) for acts in s.ranks])


def shapes(s: Schedule) -> list[dict]:
    """Per rank, {(kind, chunk): Shape} of every action it runs (of the first action of each (kind, chunk), with
    microbatch 0): once per schedule object (validate() and the simulator read it)."""
    def make(s: Schedule) -> list[dict]:
        out = []
        for keys in rank_keys(s):
            seen = {}
            for rank, kind, chunk in keys:
                if (kind, chunk) not in seen:
                    seen[(kind, chunk)] = shape_of(s, rank, kind, chunk)
            out.append(seen)
        return out
    return s.memo("rule_shapes", make)
