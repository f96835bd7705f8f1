"""What the planner and the simulator derive from the code and the profile alone, kept on disk between processes: a
planner is run again and again while a user decides, and the generators' orders of a problem's pipeline shapes, the
simulator's tables of its schedules' shapes and the cost model's figures of its layer shapes on one profile are the
same every time.

A DiskCache is a folder of pickles, one per key, under the cache root (VP_CACHE_DIR; else $XDG_CACHE_HOME/vp-harness,
else ~/.cache/vp-harness; VP_CACHE_DIR set empty turns the cache off) in a folder named by the code version: a hash
of every module of the vp package and of the Python, numpy and machine they run on. A change to any of them starts
an empty folder, and the first write there removes the other versions' folders. So a value is read back only where
the code that made it is the code that would make it again (as numba's cache of the simulator's compiled loops is).
The cache is never needed: a file that cannot be read (missing, cut short, from another format) is a miss and the
value is made again, and one that cannot be written (a read-only or full disk) is left unwritten. Files are written
whole or not at all (a temporary file renamed), so processes that share the folder never read half a file; where two
write one key, the last one's stays.

Kept: "orders" (vp.plan.bounds: per pipeline shape, what the search reads of the generator's order), "shapes"
(vp.schedule.program: the table of a kind of schedule's shapes, what the simulator's program reads besides its
steps), "tables" (a profile's cost tables, vp.cost.profiles.cost_table, and its GEMM times: figures of the profile
and their keys alone, under the profile's hash) and "communicators" (what device 0 of each stage holds,
vp.plan.memo.StageCommunicators, under the problem's fixed fields).
"""
import contextlib
import hashlib
import os
import pickle
import platform
import re
import shutil
import sys
import tempfile
from dataclasses import fields
from functools import lru_cache
from pathlib import Path

import numpy as np

ENV = "VP_CACHE_DIR"
VP = Path(__file__).resolve().parent  # the package: its every module is part of the code version
_KEY = re.compile(r"[\w.+-]+")


def cache_root() -> Path | None:
    """The folder all caches live under, or None where VP_CACHE_DIR is set empty (no cache)."""
    value = os.environ.get(ENV)
    if value is not None:
        return Path(value).expanduser() if value else None
    return Path(os.environ.get("XDG_CACHE_HOME") or "~/.cache").expanduser() / "vp-harness"


@lru_cache(maxsize=1)
def code_version() -> str:
    """A hash of every module of the vp package (its path and contents) and of the Python, numpy and machine the
    values are made with (16 hex digits; about 5 ms)."""
    h = hashlib.sha1(f"{sys.version} numpy {np.__version__} {platform.machine()}".encode())
    for path in sorted(VP.rglob("*.py")):
        h.update(path.relative_to(VP).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()[:16]


class DiskCache:
    """get(key) / put(key, value): one pickle per key (a tuple of names and integers) in <root>/<name>/<version>."""

    def __init__(self, name: str):
        self.name = name

    def _path(self, key: tuple) -> Path | None:
        root = cache_root()
        if root is None:
            return None
        stem = "_".join(map(str, key))
        if not _KEY.fullmatch(stem):
            raise ValueError(f"{self.name} cache key {key!r}: names and integers only (letters, digits, . + - _)")
        return root / self.name / code_version() / f"{stem}.pkl"

    def get(self, key: tuple):
        """The value put under key by this code version, or None."""
        path = self._path(key)
        if path is None:
            return None
        try:
            with open(path, "rb") as f:
                return pickle.load(f)
        except Exception:  # noqa: BLE001 - missing, cut short or unreadable: a miss, made again
            return None

    def put(self, key: tuple, value) -> None:
        """Write value under key (whole, or not at all); the first write of a version removes the other versions."""
        path = self._path(key)
        if path is None:
            return
        try:
            if not path.parent.is_dir():
                path.parent.mkdir(parents=True, exist_ok=True)
                for old in path.parent.parent.iterdir():
                    if old != path.parent and old.is_dir():
                        shutil.rmtree(old, ignore_errors=True)
            fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=".pkl")
            try:
                with os.fdopen(fd, "wb") as f:
                    pickle.dump(value, f, protocol=pickle.HIGHEST_PROTOCOL)
                os.replace(tmp, path)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
                raise
        except Exception:  # noqa: BLE001 - a read-only or full disk, a value pickle refuses: made again next time
            pass


TABLES = DiskCache("tables")
COMMUNICATORS = DiskCache("communicators")


class Kept:
    """Dicts a search fills, read from a DiskCache under key() where they are all empty, and written back by save()
    where they grew (size: how many values they hold; the whole dicts are written again, once per search that added
    to them). Nothing is hashed, read or written where the cache is off."""

    def __init__(self, cache: DiskCache, key, dicts: tuple, size=lambda dicts: sum(map(len, dicts))):
        self.cache, self.dicts, self.count = cache, dicts, size
        self.key = key() if cache_root() is not None else None
        if self.key is not None and not any(dicts):
            got = cache.get(self.key)
            if isinstance(got, tuple) and len(got) == len(dicts):
                for d, value in zip(dicts, got):
                    d.update(value)
        self.size = size(dicts)

    def save(self) -> None:
        size = self.count(self.dicts)
        if self.key is not None and size != self.size:
            self.cache.put(self.key, self.dicts)
            self.size = size


def kept_tables(hw) -> Kept:
    """A profile's cost tables (hw.cost_memo: vp.cost.profiles.cost_table) and GEMM times (hw.gemm_memo), each
    figure a function of the profile (every field: the key is their hash) and of its keys alone."""
    return Kept(TABLES, lambda: (_hash(hw.to_dict()),), (hw.cost_memo, hw.gemm_memo),
                lambda d: sum(map(len, d[0].values())) + len(d[1]))


def kept_communicators(held, base) -> Kept:
    """vp.plan.memo.StageCommunicators' values (held.held), under the problem's every field but those the search
    sets (base: vp.plan.space.Problem.base, hashed): within it, its own key holds all it reads."""
    return Kept(COMMUNICATORS, lambda: (_hash(tuple(getattr(base, f.name) for f in fields(base))),), (held.held,))


def _hash(value) -> str:
    return hashlib.sha1(pickle.dumps(value, protocol=4)).hexdigest()[:16]
