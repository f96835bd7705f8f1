"""What the planner keeps on disk between processes (vp.disk_cache) is what it would work out again: values
read back only by the code that wrote them, a search from a warm cache equal to one from an empty cache, a cache
that cannot be read or written never in the way; and the peaks of held activations taken at the top held-count
vectors equal the peaks over all of them."""
import pickle
import random
from dataclasses import replace

import numpy as np
import pytest

from vp.config import RunConfig
from vp.cost import PROFILES
from vp.plan import Problem, search
from vp.plan import bounds as B
from vp.plan import memo as memo_module
from vp import disk_cache as D
from vp.schedule import Costs
from vp.schedule.methods import METHODS

SMALL = RunConfig(layers=8, hidden=512, heads=8, seq_len=256, vocab_size=32000, device="cuda", dtype="bf16")


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    folder = tmp_path / "cache"
    monkeypatch.setenv(D.ENV, str(folder))
    return folder


def test_planner_disk_cache_reads_back_only_what_this_code_wrote(cache_dir, monkeypatch):
    cache = D.DiskCache("t")
    assert cache.get(("a", 1)) is None
    cache.put(("a", 1), {"x": [1.5]})
    assert cache.get(("a", 1)) == {"x": [1.5]} and cache.get(("a", 2)) is None
    (path,) = (cache_dir / "t").glob("*/a_1.pkl")
    assert path.parent.name == D.code_version() and not list(path.parent.glob(".tmp-*"))
    path.write_bytes(pickle.dumps({"x": [1.5]})[:5])  # cut short: a miss, written again
    assert cache.get(("a", 1)) is None
    cache.put(("a", 1), 7)
    assert cache.get(("a", 1)) == 7
    monkeypatch.setattr(D, "code_version", lambda: "other")  # another version of the code: nothing of the first
    assert cache.get(("a", 1)) is None
    cache.put(("b", 2), 8)  # its first write removes the other versions
    assert [p.name for p in (cache_dir / "t").iterdir()] == ["other"] and cache.get(("b", 2)) == 8
    cache.put(("c", 3), lambda: 0)  # a value pickle refuses: left unwritten, nothing half-written
    assert cache.get(("c", 3)) is None and not list((cache_dir / "t" / "other").glob(".tmp-*"))
    with pytest.raises(ValueError, match="names and integers"):
        cache.get(("a/b",))


def test_planner_disk_cache_off_or_unwritable_is_never_in_the_way(tmp_path, monkeypatch):
    cache = D.DiskCache("t")
    monkeypatch.setenv(D.ENV, "")  # off
    cache.put(("a", 1), 1)
    assert cache.get(("a", 1)) is None and D.cache_root() is None
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    monkeypatch.setenv(D.ENV, str(blocker))  # nothing can be written under a file
    cache.put(("a", 1), 1)
    assert cache.get(("a", 1)) is None
    plan = search(Problem(SMALL, 8, 8, methods=("vocab-1",)), PROFILES["h100"])
    assert plan.rows


def test_planner_code_version_covers_every_module_of_the_package(cache_dir):
    """The version reads every module of vp (a change anywhere starts a new folder), and the orders' and tables'
    keys name what their values are functions of."""
    assert D.VP.name == "vp" and (D.VP / "schedule" / "vhalf.py").exists() and len(D.code_version()) == 16
    hw = PROFILES["h100"]
    assert D.kept_tables(replace(hw, peak_flops=hw.peak_flops * 2)).key != D.kept_tables(hw).key


def _plan_figures(plan) -> tuple:
    return ([r.to_dict() for r in plan.rows], plan.candidates, plan.feasible, plan.simulated, plan.pruned,
            plan.rejected, plan.examples, [(c.run, c.message) for c in plan.closest])


def test_planner_search_from_a_warm_disk_cache_equals_one_from_an_empty_one(cache_dir, monkeypatch):
    """Each search as a new process runs it (no orders in memory, a profile without tables): the second reads what
    the first kept, and every figure of the plan is the same."""
    from vp.cost import gemm
    from vp.schedule import program

    problem = Problem(SMALL, 16, 16, methods=("vocab-1", "vhalf-vocab-2", "interleaved", "redis", "interlaced"))

    def fresh_process():
        B._generated_order.cache_clear()
        monkeypatch.setattr(program, "_TABLES", {})
        return replace(PROFILES["h100"])  # a fresh profile: its tables empty

    cold = search(problem, fresh_process())
    warm = search(problem, fresh_process())
    assert _plan_figures(cold) == _plan_figures(warm) and cold.rows
    kept = {p.parent.parent.name for p in cache_dir.glob("*/*/*.pkl")}
    assert kept == {"orders", "shapes", "tables", "communicators"}
    made = []
    monkeypatch.setattr(B, "_from_order", lambda *key: made.append(key))
    monkeypatch.setattr(program, "_make_table", lambda *key: made.append(key))
    monkeypatch.setattr(memo_module, "rank_communicators", lambda *a: made.append(a))
    monkeypatch.setattr(gemm, "_gemm_time", lambda *a: made.append(a))  # the profile's GEMM times: read back too
    hw = fresh_process()
    assert _plan_figures(search(problem, hw)) == _plan_figures(cold) and not made
    B._generated_order.cache_clear()


def _random_costs(sk, rng: random.Random, negative_w: bool) -> Costs:
    f = {("F", st): rng.choice([0.0, rng.uniform(1, 1e9)]) for st in range(sk.n_stages - 1)}
    f[("F", sk.n_stages - 1)] = rng.uniform(1, 1e9)
    b = {("B", st): (10 if negative_w else rng.uniform(-1, 1)) * f[("F", st)]
         for st in range(sk.n_stages)} if sk.split_w else {}
    return Costs({}, {}, {**f, **b, ("S", None): rng.uniform(0, 1e8)})


@pytest.mark.parametrize("method", sorted(METHODS))
def test_planner_peaks_at_the_top_held_vectors_equal_the_peaks_over_all(method):
    """_peaks reads only each rank's top vectors where no column's bytes are negative, and every vector where one is
    (a split B freeing more than F holds, so W frees less than nothing): both equal, to the bit, the largest product
    over every vector."""
    from vp.plan.search import skeleton

    rng = random.Random(method)
    for pp, m in ((2, 4), (4, 8), (4, 12)):
        sk = skeleton(SMALL.with_(method=method, pp=pp, microbatches=m))
        points = B.generated_points(method, pp, m, sk.chunks)
        every = points.every
        assert len(points.top.rows) < len(every.rows) or len(every.rows) == pp
        rank = every.rank
        for negative in (False, True) if sk.split_w else (False,):
            costs = _random_costs(sk, rng, negative)
            f = [costs.mem("F", st) for st in range(sk.n_stages)]
            per_count = np.array(f + [costs.mem("W", st) for st in range(sk.n_stages)] + [costs.mem("S", None)])
            assert (per_count.min() < 0) == negative
            held = np.einsum("ij,ij->i", every.rows.astype(float), per_count[points.columns[rank]])
            want = [0.0 if points.empty[r] else float(held[rank == r].max()) for r in range(pp)]
            assert B._peaks(points, sk, costs) == want, (method, pp, m, negative)


def test_planner_peaks_read_every_vector_where_a_column_frees_less_than_nothing():
    """A vector at least as large as another in every column holds less where W's column is negative: the peak is
    then at the smaller one, which only the full set holds."""
    from vp.schedule import Schedule
    from vp.schedule.methods import VOCAB

    rows = (np.array([[1.0, 0.0, 0.0], [1.0, 1.0, 0.0]]), np.array([[2.0, 0.0, 0.0]]))  # (F, W, S) counts per rank
    points = B._stacked(rows, "loop", 2, 1)
    assert points.top.rows.tolist() == [[1.0, 1.0, 0.0], [2.0, 0.0, 0.0]]
    sk = Schedule("vhalf", 2, 2, 1, "loop", VOCAB["local"], True)
    freeing = Costs({}, {}, {("F", 0): 10.0, ("B", 0): 15.0, ("F", 1): 1.0, ("B", 1): 0.0})  # W of stage 0: -5
    assert B._peaks(points, sk, freeing) == [10.0, 2.0]
    holding = Costs({}, {}, {("F", 0): 10.0, ("B", 0): 4.0, ("F", 1): 1.0, ("B", 1): 0.0})
    assert B._peaks(points, sk, holding) == [16.0, 2.0]
