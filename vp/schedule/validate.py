"""validate(schedule): every pass exactly once, dependencies in order, sends matched by receives,
collectives entered in one order by all ranks, and no deadlock. A violation names rank, step and action.
"""
from collections import Counter, defaultdict

from vp.schedule.actions import KINDS, P2P, Schedule
from vp.schedule.rules import enters, local_needs, p2p_peer
from vp.schedule.simulate import Costs, ScheduleError, simulate


def _fail(s: Schedule, r: int, i: int, msg: str):
    raise ScheduleError(f"rank {r}, step {i} ({s.ranks[r][i].text()}): {msg}\n" + s.grid((r, i), 6))


def expected_counts(s: Schedule) -> Counter:
    """How many times each (rank, kind, mb, chunk) must appear."""
    want = Counter()
    for st in range(s.n_stages):
        r, c = s.where(st)
        for mb in range(s.microbatches):
            want[(r, "F", mb, c)] += 1
            want[(r, "B", mb, c)] += 1
            if s.split_w:
                want[(r, "W", mb, c)] += 1
    if s.vocab_parallel:
        kinds = ["S", "T", "IF", "IB", "C0", *s.vocab.collectives]
        for r in range(s.pp):
            for mb in range(s.microbatches):
                for k in kinds:
                    want[(r, k, mb, 0)] += 1
    return want


def validate(s: Schedule) -> Schedule:
    if len(s.ranks) != s.pp:
        raise ScheduleError(f"schedule has {len(s.ranks)} ranks but pp={s.pp}")
    have = Counter()
    for r, acts in enumerate(s.ranks):
        for i, a in enumerate(acts):
            if a.rank != r:
                _fail(s, r, i, f"action says rank {a.rank} but sits in rank {r}'s list")
            if a.kind not in KINDS:
                _fail(s, r, i, f"unknown kind {a.kind!r}")
            if not 0 <= a.mb < s.microbatches or not 0 <= a.chunk < s.chunks:
                _fail(s, r, i, f"microbatch or chunk out of range (microbatches={s.microbatches}, chunks={s.chunks})")
            if a.kind not in P2P:
                have[tuple(a)] += 1
    want = expected_counts(s)
    for key in sorted(set(have) | set(want)):
        if have[key] != want[key]:
            r, k, mb, c = key
            where = f"rank {r}: {k}{mb}" + (f".{c}" if c else "")
            raise ScheduleError(f"{where} appears {have[key]} time(s), expected {want[key]}\n" + s.grid())

    links = defaultdict(lambda: ([], []))  # (src, dst, kind) -> (keys sent, keys received), in order
    groups = defaultdict(lambda: defaultdict(list))
    for r, acts in enumerate(s.ranks):
        seen = set()
        for i, a in enumerate(acts):
            for need in local_needs(s, a):
                if need not in seen:
                    _fail(s, r, i, f"needs {need[0]}{need[1]}" + (f".{need[2]}" if need[2] else "")
                          + f" earlier on rank {r}")
            seen.add((a.kind, a.mb, a.chunk))
            if a.kind in P2P:
                peer, key = p2p_peer(s, a)
                if peer == r:
                    _fail(s, r, i, "a send or receive between two chunks of the same rank; pass it locally")
                sender = a.kind[0] == "S"
                links[(r, peer, key[0]) if sender else (peer, r, key[0])][0 if sender else 1].append(key)
            entry = enters(s, a)
            if entry:
                groups[entry.group][r].append(entry)
    for (src, dst, kind), (sent, received) in sorted(links.items()):
        what = "activations" if kind == "F" else "gradients"
        if sorted(sent) != sorted(received):
            extra = sorted(set(sent) ^ set(received))[0]
            side = "send without a receive" if extra in sent else "receive without a send"
            raise ScheduleError(f"{side}: {what} of microbatch {extra[1]} from stage {extra[2]}, rank {src} -> "
                                f"rank {dst}\n" + s.grid())
        if sent != received:  # one channel per direction and kind is first in, first out
            i = next(i for i, (x, y) in enumerate(zip(sent, received)) if x != y)
            raise ScheduleError(f"{what} rank {src} -> rank {dst} are received in another order than sent: "
                                f"send {i} is microbatch {sent[i][1]} of stage {sent[i][2]}, receive {i} "
                                f"expects microbatch {received[i][1]} of stage {received[i][2]}\n" + s.grid())
    for group, per_rank in groups.items():
        ref = per_rank.get(0, [])
        for r in range(s.pp):
            seq = per_rank.get(r, [])
            if seq != ref:
                pos = next((i for i, (x, y) in enumerate(zip(seq, ref)) if x != y), min(len(seq), len(ref)))
                shown = [[c.text() for c in x[pos:pos + 3]] for x in (seq, ref)]
                raise ScheduleError(f"collective group {group}: rank {r} enters "
                                    f"{shown[0]} where rank 0 enters {shown[1]} (position {pos}); "
                                    f"all ranks must enter a group's collectives in the same order\n" + s.grid())
    simulate(s, Costs())  # raises ScheduleError naming each blocked rank on a deadlock
    return s
