"""NCCL's rules emulated on gloo (vp.nccl): every method trains under them with eager creation and one communicator
per point-to-point link, and the emulation fails where NCCL would: lazy creation in the old order, crossed
collectives on one queue, a missing warm-up, point-to-point on whole-pipeline communicators."""
import functools
import re
from pathlib import Path

import pytest
import torch

from vp.channels import channels, run_links
from vp.comm import Comm, make_groups
from vp.config import RunConfig
from vp.nccl import Emulation, Watchdog, WatchdogTimeout
from vp.reference import train_reference
from vp.run import build_rank_model, train_rank
from vp.runtime.loop import RankFailure, Runtime
from vp.schedule import Schedule, build
from vp.schedule.methods import METHODS
from vp.schedule.validate import ScheduleError, check_collective_order

FIXTURES = Path(__file__).parent / "fixtures"
CPU = torch.device("cpu")


def tiny(method: str, pp: int, **kw) -> RunConfig:
    spec = METHODS[method]
    chunks = spec.family.chunks or 2
    base = dict(method=method, pp=pp, layers=pp * chunks, hidden=16, heads=2, seq_len=8, vocab_size=101,
                microbatches=2 * pp, iterations=3, warmup=1, timeout_s=60.0)
    base.update(kw)
    return RunConfig(**base)


def emulated(rank, world, cfg, form, links=True, schedule_text=None, whole_pipeline_p2p=False):
    """Train under the emulation form; ('ok', losses, communicators, lazily created) or ('failed', report).
    links: True creates every communicator eagerly (groups and pairs), 'groups' only the groups, False none;
    whole_pipeline_p2p: the former layout, every point-to-point transfer of a channel on the channel's one group."""
    sched = Schedule.from_text(schedule_text) if schedule_text else build(cfg.method, cfg.pp, cfg.microbatches,
                                                                          cfg.n_chunks)
    groups = channels(cfg) if whole_pipeline_p2p else channels(cfg, sched)
    comm = Comm(make_groups(groups, rank, 2 * cfg.timeout_s), CPU, Emulation.of(form), cfg.timeout_s, rank)
    failed = False
    try:
        if links:
            comm.connect(run_links(sched) if links is True else ())
        runtime = Runtime(cfg, sched, rank, build_rank_model(cfg, sched, rank, CPU), comm, CPU)
        losses = [runtime.iteration(it)["loss"] for it in range(cfg.iterations)]
        return "ok", losses, comm.communicators(), list(comm.lazily)
    except RankFailure as err:
        failed = True
        return "failed", str(err)
    finally:
        comm.close(failed=failed)


@pytest.mark.parametrize("pp", [2, 4])
@pytest.mark.parametrize("method", list(METHODS))
def test_every_method_trains_under_every_rule_at_once(pools, method, pp):
    """Loss parity with the reference under form `all`: lazy creation (communicators made eagerly, none lazily), one
    queue for all collectives of a rank, and each communicator's transfers and collectives in one order with sends
    that end when received; waits end only by the watchdog. Each rule only takes concurrency away, so a run that
    passes them all passes each alone (the tests below show each can fail)."""
    cfg = tiny(method, pp)
    results = pools(pp).run(emulated, cfg, "all")
    assert all(r[0] == "ok" for r in results), "\n".join(r[1] for r in results if r[0] != "ok")
    losses = next(r[1] for r in results if all(x is not None for x in r[1]))
    torch.testing.assert_close(torch.tensor(losses), torch.tensor(reference_losses(cfg)), rtol=1e-5, atol=0)
    assert all(not r[3] for r in results), f"communicators created lazily: {[r[3] for r in results]}"


@pytest.mark.parametrize("method", ["interleaved-vocab-1", "interleaved-vocab-2", "vhalf-vocab-1", "vhalf-vocab-2"])
def test_the_methods_that_deadlocked_at_pp_8_train_under_every_rule(pools, method):
    """The methods a stream model of NCCL found deadlocking at pp 8 with point-to-point on whole-pipeline
    communicators train at pp 8 with one communicator per link (one iteration, loss parity)."""
    cfg = tiny(method, 8, microbatches=8, iterations=1, warmup=0)
    results = pools(8).run(emulated, cfg, "all")
    assert all(r[0] == "ok" for r in results), "\n".join(r[1] for r in results if r[0] != "ok")
    losses = next(r[1] for r in results if all(x is not None for x in r[1]))
    torch.testing.assert_close(torch.tensor(losses), torch.tensor(reference_losses(cfg)), rtol=1e-5, atol=0)


def test_point_to_point_on_whole_pipeline_communicators_deadlocks(pools):
    """The former layout (each channel's transfers on one whole-pipeline communicator) under the p2p rule:
    interleaved-vocab-2 at pp 4, 8 microbatches, deadlocks in iteration 0 -- a rank's send to r+1 on fwd+ waits
    for r+1 to take it, and its later receive from r-1 on the same communicator waits behind that send -- and the
    watchdog names every rank and what it waits for. The same run trains with one communicator per link
    (test_every_method_trains_under_every_rule_at_once)."""
    cfg = tiny("interleaved-vocab-2", 4, microbatches=8, iterations=1, warmup=0, timeout_s=10.0)
    results = pools(4).run(emulated, cfg, "p2p", True, None, True)
    assert all(r[0] == "failed" for r in results), results
    for rank, (_, report) in enumerate(results):
        assert f"rank {rank} failed at iteration 0" in report and "Watchdog caught" in report
    # e.g. rank 0 at RB2, rank 1 at RF7.1, rank 2 at RF6.1 behind its send to rank 3 on fwd+, rank 3 at IB1
    waits = [report.split("waiting for:")[1] for _, report in results]
    assert any(re.search(r"send to rank \d on fwd\+", w) for w in waits), waits


@functools.cache
def reference_losses(cfg: RunConfig) -> list[float]:
    return train_reference(cfg)[0]


def test_lazy_creation_in_the_old_order_deadlocks_and_the_watchdog_names_ranks_and_actions(pools):
    """Without eager creation (init_process_group without device_id), vocab-1's former order (saved) has rank 0
    create C0 at C0:0 while rank 3 creates IF at IF0: each blocks until the other arrives."""
    text = (FIXTURES / "vocab-1-crossed-order.txt").read_text()
    cfg = tiny("vocab-1", 4, microbatches=8, iterations=1, warmup=0, timeout_s=4.0)
    results = pools(4).run(emulated, cfg, "lazy", False, text)
    assert all(r[0] == "failed" for r in results)
    assert "rank 0 failed at iteration 0, step 0 (C0:0)" in results[0][1]
    assert "Watchdog caught collective operation timeout" in results[0][1]
    assert "creation of the C0 communicator" in results[0][1]
    assert "rank 3 failed at iteration 0" in results[3][1] and "creation of the IF communicator" in results[3][1]


def test_without_the_pair_warm_up_interlaced_deadlocks_at_a_lazily_created_pair(pools):
    """Groups created eagerly but point-to-point pairs lazily: the first send of a pair blocks its sender until
    the receiver reaches its first receive, which it reaches only after a collective the sender has not entered."""
    cfg = tiny("interlaced", 4, timeout_s=4.0)
    results = pools(4).run(emulated, cfg, "lazy", "groups")
    failed = [r[1] for r in results if r[0] == "failed"]
    assert failed and any("communicator with rank" in f for f in failed), results


def test_the_saved_crossed_schedule_deadlocks_on_one_queue(pools):
    """vocab-1's former order at pp 4 (saved): rank 0 enters C1:0 C0:1 IF5, rank 3 C1:0 IF5 ... C0:1; with every
    collective of a rank on one queue each waits for a collective queued behind the other's."""
    text = (FIXTURES / "vocab-1-crossed-order.txt").read_text()
    with pytest.raises(ScheduleError, match="crossed orders"):  # the validator's static check rejects it
        check_collective_order(Schedule.from_text(text))
    cfg = tiny("vocab-1", 4, microbatches=8, iterations=1, warmup=0, timeout_s=4.0)
    results = pools(4).run(emulated, cfg, "queue", True, text)
    assert all(r[0] == "failed" for r in results)
    for rank, (_, report) in enumerate(results):
        assert f"rank {rank} failed at iteration 0, step" in report and "Watchdog caught" in report
        assert "waiting for:" in report


def test_eager_creation_counts_the_communicators_of_the_channels_used(pools):
    """world + one per collective channel the schedule uses + one per point-to-point link; baseline uses no
    collectives."""
    results = pools(2).run(emulated, tiny("baseline", 2), "lazy")
    assert [r[2] for r in results] == [3, 3]  # world, the fwd+ 0>1 and bwd- 1>0 links
    results = pools(2).run(emulated, tiny("vocab-2", 2), "lazy")
    assert [r[2] for r in results] == [7, 7]  # ... and the C0 C1 IF IB groups


def emulated_mesh(rank, world, cfg, form):
    sched = build(cfg.method, cfg.pp, cfg.microbatches, cfg.n_chunks)
    comm = Comm(make_groups(channels(cfg, sched), rank, 2 * cfg.timeout_s), CPU, Emulation.of(form), cfg.timeout_s,
                rank)
    try:
        comm.connect(run_links(sched))
        return train_rank(cfg, rank, comm, CPU), list(comm.lazily)
    finally:
        comm.close()


@pytest.mark.parametrize("world,form,mesh,communicators", [
    (4, "lazy", dict(dp=2, microbatches=4), 8),  # vocab-2's 7, and the dp group
    (4, "lazy", dict(tp=2), None),
    (8, "lazy", dict(tp=4, tp_mode="2d", micro_batch_size=2), None),
    (4, "queue", dict(tp=2, timeout_s=20.0), None),
])
def test_eager_creation_covers_every_channel_given_to_make_groups(pools, world, form, mesh, communicators):
    """The data- and tensor-parallel channels are created eagerly too (nothing lazily), and the mesh trains like
    the single process. Each rank holds the communicators the memory model counts for it (rank_communicators)."""
    from vp.metrics import replica_sum
    from vp.channels import rank_communicators

    cfg = tiny("vocab-2", 2, layers=4, **mesh)
    results = pools(world).run(emulated_mesh, cfg, form)
    assert all(not lazily for _, lazily in results)
    if communicators:
        assert [m.communicators for m, _ in results] == [communicators] * world
    model = rank_communicators(cfg, build(cfg.method, cfg.pp, cfg.microbatches, cfg.n_chunks))
    assert [(m.communicators - m.links, m.links) for m, _ in results] == [(h.groups, h.links) for h in model]
    ref = reference_losses(cfg)  # the whole model on one global batch (dp x microbatches)
    torch.testing.assert_close(torch.tensor(replica_sum([m for m, _ in results])), torch.tensor(ref), rtol=1e-5,
                               atol=0)


def test_watchdog_reports_every_wait_and_fires_once():
    import threading
    from concurrent.futures import Future

    dog = Watchdog(rank=3, timeout_s=0.2, poll_s=0.02)
    dog.where = "iteration 0, step 7 (S2)"
    slow, errors = Future(), []

    def other():
        try:
            dog.wait("C1:2", Future())
        except WatchdogTimeout as err:
            errors.append(str(err))

    t = threading.Thread(target=other)
    t.start()
    with pytest.raises(WatchdogTimeout) as info:
        dog.wait("C0:2", slow)
    t.join()
    report = str(info.value)
    assert report.startswith("[Rank 3] Watchdog caught collective operation timeout")
    assert "iteration 0, step 7 (S2)" in report and "C1:2" in report and "C0:2" in report
    assert errors == [report]  # the other wait raised the same report
    done = Future()
    done.set_result(5)
    dog2 = Watchdog(0, 10.0)
    assert dog2.wait("x", done) == 5


def test_emulation_forms_and_their_refusals():
    from vp.config import check_config

    assert Emulation.of("both") == Emulation(lazy=True, queue=True) and Emulation.of(None) is None
    assert Emulation.of("all") == Emulation(lazy=True, queue=True, p2p=True) == Emulation(True, True, True)
    assert Emulation.of("p2p") == Emulation(p2p=True)
    with pytest.raises(ValueError, match="emulate_nccl='strict' is unknown"):
        check_config(tiny("vocab-2", 2, emulate_nccl="strict"))
    with pytest.raises(ValueError, match="emulates NCCL on CPU"):
        check_config(tiny("vocab-2", 2, emulate_nccl="queue", device="cuda", dtype="bf16"))


def test_emulation_does_not_change_existing_run_ids():
    from vp.record import run_id

    cfg = tiny("vocab-2", 2)
    without = {k: v for k, v in cfg.to_dict().items() if k != "emulate_nccl"}
    assert run_id(cfg.to_dict(), "real") == run_id(without, "real")
    assert run_id(cfg.with_(emulate_nccl="queue").to_dict(), "real") != run_id(cfg.to_dict(), "real")
