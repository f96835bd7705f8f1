"""A measured hardware profile: the microbenchmarks (vp.cost.measure), the tables the cost model reads where they
cover a question (vp.cost.tables) with the analytical model elsewhere, python -m harness.calibrate --measure
(written, reused), and the report's predicted-vs-measured table."""
import math
from dataclasses import replace

import pytest
import torch
from omegaconf import OmegaConf

from harness import measure as HM
from harness_util import sweep
from harness.calibrate import main as calibrate_main
from vp.config import RunConfig
from vp.cost import PROFILES, Hardware, pass_costs, pass_times, pass_work
from vp.cost import measure as M
from vp.cost import measure_crowding as MC
from vp.cost.gemm import Gemm, elementwise_time, gemm_time
from vp.cost.network import ALL_REDUCE, Network
from vp.cost.passes import compute_times
from vp.cost.tables import Tables, as_text, optimizer_key, rows
from vp.schedule import build, simulate

CPU = Hardware("cpu", 1e11, sms=0, tile_k_overhead=0, align_penalty=0.0, gemm_efficiency=0.5, act_bytes=4,
               gpus_per_node=64, link_latency=1e-4, link_bandwidth=1e9, collective_latency=0.0)


def with_tables(hw: Hardware, **measured) -> Hardware:
    return replace(hw, measured=measured)


def test_a_measured_gemm_is_read_as_measured_and_interpolated_between_shapes():
    hw = with_tables(CPU, gemm=[[256, 256, 256, 1e-3], [512, 256, 256, 4e-3]])
    assert gemm_time(hw, Gemm(256, 256, 256)) == pytest.approx(1e-3)
    # halfway in log2(m) between a shape at 2x256^3 FLOP/ms and one at 1x: the geometric mean rate
    mid = gemm_time(hw, Gemm(362, 256, 256))
    rate = 2 * 362 * 256 * 256 / mid
    assert rate == pytest.approx((2 * 256**3 / 1e-3 * 2 * 512 * 256 * 256 / 4e-3) ** 0.5, rel=0.02)
    # a batch of GEMMs of a measured shape; a speed multiplier of the pass kind still applies
    assert gemm_time(hw, Gemm(256, 256, 256, batch=3), speedup=2.0) == pytest.approx(1.5e-3)


def test_a_weight_gradient_is_timed_as_it_accumulates_in_place_where_measured_so():
    # a large product accumulated into the existing gradient (in place) is faster on a CPU than a fresh one
    hw = with_tables(CPU, gemm=[[64000, 256, 256, 0.26], [256, 256, 256, 1e-3]],
                     gemm_accumulate=[[64000, 256, 256, 0.12]])
    assert gemm_time(hw, Gemm(64000, 256, 256, accumulate=True)) == pytest.approx(0.12)
    assert gemm_time(hw, Gemm(64000, 256, 256)) == pytest.approx(0.26)  # a fresh product: the plain table
    # an accumulating GEMM far from every in-place shape: the plain table's answer
    assert gemm_time(hw, Gemm(256, 256, 256, accumulate=True)) == pytest.approx(1e-3)
    rows = M.gemms([(32, 16, 8)], torch.device("cpu"), torch.float32, M.Timer(torch.device("cpu"), max_reps=3),
                   float("inf"), accumulate=True)
    assert [r[:3] for r in rows] == [[32, 16, 8]] and rows[0][3] > 0


def test_outside_the_measured_shapes_the_analytical_model_answers():
    hw = with_tables(CPU, gemm=[[256, 256, 256, 1e-3]])
    far = Gemm(4096, 4096, 256)
    assert Tables.of(hw.measured).gemm_s(far.m, far.n, far.k) is None
    assert gemm_time(hw, far) == gemm_time(CPU, far)


def test_a_table_stored_as_text_reads_back_as_its_rows():
    table = [["all_reduce", 2, 1024, 1.5e-4], ["p2p", 2, 65536, 2e-3]]
    assert rows(as_text(table)) == table
    assert Tables.of({"collectives": as_text(table)}).collective_s("p2p", 2, 65536) == pytest.approx(2e-3)


def test_attention_is_read_per_sequence_and_head_dim_and_scales_with_batch_x_heads():
    t = Tables.of({"attention": [[4, 64, 16, 1e-4, 3e-4], [8, 64, 16, 2e-4, 5e-4]]})
    assert t.attention_s(6, 64, 16, False) == pytest.approx(1.5e-4)
    assert t.attention_s(16, 64, 16, True) == pytest.approx(1e-3)
    assert t.attention_s(2, 64, 16, False) == pytest.approx(1e-4)
    assert t.attention_s(4, 128, 16, False) is None


def test_pass_times_follow_the_measured_tables():
    cfg = RunConfig(method="vocab-2", pp=2, layers=4, hidden=64, heads=4, seq_len=32, micro_batch_size=4,
                    vocab_size=2000, microbatches=4, device="cpu", dtype="fp32")
    sched = build("vocab-2", 2, 4, 1)
    from vp.cost import pass_work

    shapes = {(g.m, g.n, g.k) for parts in pass_work(cfg, CPU, sched).values() for w in parts.values()
              for g in w.gemms}
    slow, fast = ([[*s, seconds] for s in shapes] for seconds in (2e-3, 1e-3))
    t_slow, t_fast = (pass_times(cfg, with_tables(CPU, gemm=rows), sched) for rows in (slow, fast))
    gemms_f = 4 * 2  # 4 GEMMs per layer, 2 layers per stage
    assert t_slow[("F", 0)] - t_fast[("F", 0)] == pytest.approx(gemms_f * 1e-3, rel=1e-6)


def test_ranks_beyond_the_cores_share_them():
    # tp 4 on 2 cores, one stage: the 4 devices always compute at once, so every pass's own work takes twice its
    # time alone and its tensor-parallel collectives their own time (tests/test_sim_sharing.py: the general case)
    cfg = RunConfig(method="baseline", pp=1, tp=4, tp_mode="1d", layers=2, hidden=64, heads=4, seq_len=32,
                    vocab_size=2000, microbatches=2, device="cpu", dtype="fp32")
    sched = build("baseline", 1, 2, 1)
    costs = pass_costs(cfg, replace(CPU, cores=2), sched)
    assert costs.compute == pass_times(cfg, CPU, sched)  # the pass times stay those of a device alone
    assert costs.sharing.devices == 4 and costs.sharing.cpu == compute_times(cfg, CPU, sched)
    alone, shared = simulate(sched, replace(costs, sharing=None)), simulate(sched, costs)
    assert shared.makespan == pytest.approx(alone.makespan + sum(costs.sharing.cpu[(k, 0)] for k in "FB") * 2)
    assert replace(CPU, cores=2).contention(4) == 2.0 and CPU.contention(4) == 1.0  # the optimizer step's tail


def test_builtin_profiles_have_no_tables_and_keep_their_numbers():
    for hw in PROFILES.values():
        assert not hw.tables and hw.kernel_s == 0.0 and hw.cores == 0


def test_microbenchmarks_time_what_they_say():
    timer = M.Timer(torch.device("cpu"), target_s=0.002, max_reps=3)
    rows = M.gemms([(64, 32, 16), (128, 128, 128)], torch.device("cpu"), torch.float32, timer, float("inf"))
    assert [r[:3] for r in rows] == [[64, 32, 16], [128, 128, 128]] and all(r[3] > 0 for r in rows)
    [att] = M.attention([(2, 16, 8)], torch.device("cpu"), torch.float32, timer)
    assert att[:3] == [2, 16, 8] and att[3] > 0 and att[4] >= 0
    elem = M.elementwise(torch.device("cpu"), torch.float32, timer, sizes=[64, 4096])
    assert [r[0] for r in elem] == [3 * 64 * 4, 3 * 4096 * 4]
    act = M.activation(torch.device("cpu"), torch.float32, timer, sizes=[4096, 64])
    assert [r[0] for r in act] == [64, 4096] and all(r[1] > 0 and r[2] > 0 for r in act)


def test_a_cold_timer_clears_the_caches_before_every_sample_outside_the_time():
    timer = M.Timer(torch.device("cpu"), target_s=0.0, min_reps=4, max_reps=4, cold=True)
    assert timer.flush.numel() * 4 == M.cache_bytes(torch.device("cpu")) >= 64 * 2**20
    seen = []

    def op():  # what the buffer holds when the operation starts: written again before each of 5 samples
        seen.append(float(timer.flush[-1]))
        timer.flush[-1] = 0.0

    timer(op)
    assert seen == [1.0] * 5
    assert M.Timer(torch.device("cpu")).flush is None  # warm by default (elementwise steps, attention)


def test_cpu_microbenchmarks_count_the_cpu_time_of_their_thread_not_the_wall_clock():
    # a loaded machine's other processes take time slices from a long operation: the wall clock counts them, the
    # thread's CPU time does not (sleeping stands for being descheduled)
    import time

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        cpu, wall = M.Timer(torch.device("cpu")), M.Timer(torch.device("cpu"), wall=True)
    finally:
        torch.set_num_threads(threads)
    assert cpu.sample(lambda: time.sleep(0.05)) < 0.01 <= 0.05 <= wall.sample(lambda: time.sleep(0.05))
    assert cpu.sample(lambda: sum(range(200_000))) > 0
    # a profile timed otherwise (the wall clock before) is measured again by --reuse
    here = HM.machine(torch.device("cpu"), "fp32", 1)
    assert here["clock"] == "thread_time" and HM.same_machine({"machine": here}, "cpu", "fp32")
    assert not HM.same_machine({"machine": {k: v for k, v in here.items() if k != "clock"}}, "cpu", "fp32")
    # and one whose GEMMs were timed with warm caches (no "caches" entry) too
    assert here["caches"] == HM.CACHES
    for key in ("caches", "collectives"):  # measured otherwise: measured again
        assert not HM.same_machine({"machine": {k: v for k, v in here.items() if k != key}}, "cpu", "fp32")


def test_a_measured_activation_table_prices_gelu_in_place_of_its_bytes():
    from vp.cost.passes import Shapes, activation_time, work_seconds

    sh = Shapes(tokens=256, seq=256, micro_batch=1, hidden=64, ffn=256, act=4, heads=4)
    n = 256 * 256  # GeLU's elements: [tokens, ffn]
    table = [[n // 16, 1e-5, 3e-5], [n, 2e-4, 5e-4]]
    hw = with_tables(CPU, elementwise=[[3 * 4 * 2**10, 1e-6, 1e-6], [3 * 4 * 2**20, 1e-3, 1e-3]], activation=table)
    assert hw.tables.activation_s(n, False) == pytest.approx(2e-4) and hw.tables.activation_s(n, True) == 5e-4
    assert hw.tables.activation_s(4 * n, True) == pytest.approx(2e-3)  # per element beyond the largest size
    assert hw.tables.activation_s(n // 4, False) == pytest.approx(math.sqrt(1e-5 * 2e-4))  # log-log, halfway
    plain = replace(hw, measured={k: v for k, v in hw.measured.items() if k != "activation"})
    for kind, seconds, nbytes in (("F", 2e-4, 2 * 4 * n), ("B", 5e-4, 3 * 4 * n)):
        work = sh.layer(kind)
        assert [a[:3] for a in work.activation] == [(n, kind == "B", nbytes)]
        with_gelu, without = work_seconds(hw, {kind: work}), work_seconds(plain, {kind: work})
        assert activation_time(plain, work) == 0.0
        assert with_gelu.memory - without.memory == pytest.approx(seconds - elementwise_time(hw, nbytes, 64 * 256 * 4))
        assert with_gelu.compute == without.compute and with_gelu.fixed == without.fixed
    assert sh.layer("W").activation == ()


@pytest.fixture
def quick(monkeypatch):
    """--measure with a small grid, two payloads and groups of 2: the real path, a few seconds."""
    monkeypatch.setattr(HM, "CPU_GRID", (16, 64))
    monkeypatch.setattr(HM, "COLLECTIVE_SIZES", [256, 4096])
    monkeypatch.setattr(HM, "GROUPS", (2,))


def test_passes_timed_in_rounds_keep_each_rows_mean_and_say_how_far_the_rounds_disagree():
    rounds = [[[1, 256, "alg1", 0.010, 0.020], [1, 512, "alg1", 0.040, 0.080]],
              [[1, 256, "alg1", 0.014, 0.020], [1, 512, "alg1", 0.040, 0.080]],
              [[1, 256, "alg1", 0.012, 0.026], [1, 512, "alg1", 0.046, 0.086]]]
    got = HM.mean_rows(rounds)
    assert got[0][:3] == [1, 256, "alg1"] and got[0][3:] == pytest.approx([0.012, 0.022])
    assert got[1] == [1, 512, "alg1", pytest.approx(0.042), pytest.approx(0.082)]
    # per row the largest round's total over the smallest's: 0.038 / 0.030 and 0.132 / 0.120; their median
    assert HM.spread(rounds) == pytest.approx((0.038 / 0.030 - 1 + 0.132 / 0.120 - 1) / 2)
    assert HM.spread(rounds[:1]) == 0.0 and HM.mean_rows(rounds[:1]) == rounds[0]
    with pytest.raises(ValueError, match="rounds of \\[1, 2\\] rows"):
        HM.mean_rows([rounds[0][:1], rounds[1]])
    with pytest.raises(ValueError, match="rounds disagree on a row's key"):
        HM.mean_rows([rounds[0], rounds[1][::-1]])


def test_crowding_is_the_slowest_process_at_once_over_a_process_alone():
    """gated_slowdown: per shape and pass, the mean over bursts of the slower process at once over the mean of both
    processes alone; the median over shapes and passes."""
    a, b = (16, 64, 32, "alg1"), (1, 16, 32, 2, 64)
    first = {(a, "alone"): [[1.0, 2.0]], (a, "together"): [[1.0, 2.4], [1.2, 2.0]],
             (b, "alone"): [[4.0]], (b, "together"): [[4.4]]}
    second = {(a, "alone"): [[1.0, 2.0]], (a, "together"): [[1.4, 2.0], [1.0, 2.2]],
              (b, "alone"): [[4.0]], (b, "together"): [[4.0]]}
    # a's first pass: slower of each burst 1.4 and 1.2, mean 1.3 over 1.0; its second: 2.4 and 2.2 over 2.0 (1.15);
    # b: 4.4 over 4.0
    assert MC.gated_slowdown([first, second]) == pytest.approx(1.15)
    assert MC.gated_slowdown([{}]) == 1.0
    jobs = {"layers": {b}, "output": {a}}
    assert MC.crowding(jobs, torch.float32, 1) == 1.0  # one core: no one beside
    assert MC.crowding({"layers": set(), "output": set()}, torch.float32, 2) == 1.0  # nothing to time
    # two processes of this machine, tiny shapes: a factor, whatever the machine's moment
    assert 0.3 < MC.crowding(jobs, torch.float32, 2, repeats=1, cycles=1) < 5.0


def test_calibrate_measure_writes_a_profile_that_sim_reads_and_reuses_it(quick, tmp_path, capsys, monkeypatch):
    out = tmp_path / "hardware" / "box.yaml"
    out.parent.mkdir()
    taken = []  # the layers and output rounds (tp_smoke has no tp = 1 job: made-up rows, one time per round)

    def pass_round(jobs, device, dtype, timer):
        taken.append({"layers": [[1, 32, 64, 4, 256] + [0.001 * (len(taken) + 1)] * 4], "output": []})
        return taken[-1]

    monkeypatch.setattr(HM, "pass_round", pass_round)
    argv = ["--measure", "--name", "box", "--out", str(out), "--budget-s", "5", "--shapes-from", "tp_smoke"]
    assert calibrate_main(argv + ["--print-name"]) == 0
    assert capsys.readouterr().out.strip() == "box"
    body = OmegaConf.to_container(OmegaConf.load(out))
    hw = Hardware.from_dict(body["profile"])
    assert body["name"] == "box" and hw.machine["torch"] == str(torch.__version__) and hw.machine["device"] == "cpu"
    assert hw.tables.gemm_s(16, 16, 16) is not None and hw.tables.collective_s("p2p", 2, 256) is not None
    assert isinstance(hw.measured["gemm"], str)  # one YAML string per table: Hydra loads it in one step
    # every shape of the jobs, whatever the budget, their weight gradients also in place (fp32), their GeLU calls
    jobs = HM.job_shapes(["tp_smoke"], 4)
    assert jobs["gemm"] <= {tuple(r[:3]) for r in rows(hw.measured["gemm"])}
    assert {tuple(r[:3]) for r in rows(hw.measured["gemm_accumulate"])} == jobs["gemm_accumulate"] != set()
    assert jobs["gelu"] <= {r[0] for r in rows(hw.measured["activation"])} and jobs["gelu"]
    assert {r[0] for r in rows(hw.measured["collectives"])} == {"all_reduce", "broadcast", "all_gather", "reduce",
                                                                "p2p"}
    assert {r[4] for r in rows(hw.measured["collectives"])} == {2}  # the world each was measured in
    # on a CPU each collective also costs its processes CPU time off the compute path (point-to-point: none)
    assert {len(r) for r in rows(hw.measured["collectives"]) if r[0] != "p2p"} == {6}
    assert all(r[5] >= 0 for r in rows(hw.measured["collectives"]) if r[0] != "p2p")
    assert hw.tables.collective_cpu_s("all_reduce", 2, 1024) is not None
    assert hw.machine["collectives_cpu"] == HM.COLLECTIVES_CPU
    # the optimizer step over each rank's parameter set of the jobs, read back exactly (8-digit counts included)
    assert {optimizer_key(r[0], r[2:]) for r in rows(hw.measured["optimizer_sets"])} == jobs["ranks"] != set()
    assert all(hw.tables.optimizer_set_s(n, large) > 0 for n, large in jobs["ranks"])
    assert hw.machine["collectives"] == HM.COLLECTIVES and hw.machine["passes"] == HM.PASSES
    assert 0 <= hw.wake_s < 1 and "wake_s" in body["profile"]  # measured on this 2-core machine (cores >= 2)
    assert hw.crowding == 1.0 and "crowding" in body["profile"]  # tp_smoke has no layers or output row to time
    # three rounds spread over the calibration, each row their mean, and how far they disagreed
    assert len(taken) == 3 and rows(hw.measured["layers"]) == [[1, 32, 64, 4, 256] + [pytest.approx(0.002)] * 4]
    assert hw.machine["rounds"] == {"layers": 2.0}  # an empty table (no output rows here) says nothing
    assert hw.machine["wake"] == HM.WAKE  # a CPU profile says how the wait for a core was timed
    assert hw.machine["crowding"] == HM.CROWDING  # and the slowdown of ranks computing at once
    # the jobs' tensor-parallel layers in worlds of their groups, those of the group sizes measured (2 here)
    assert set(hw.tables.tp_layers) == {k for k in jobs["tp_layers"] if k[1] == 2} == {("1d", 2, 1, 4, 32, 64, 4, 256)}
    assert set(hw.tables.tp_vocab) == {k for k in jobs["tp_vocab"] if k[1] == 2} == {("1d", 2, 1, 4, 32, 64, 2000)}
    cfg = RunConfig(method="baseline", pp=1, tp=2, tp_mode="1d", layers=4, hidden=64, heads=4, seq_len=32,
                    micro_batch_size=4, vocab_size=2000, microbatches=2, device="cpu", dtype="fp32")
    sched = build("baseline", 1, 2, 1)
    assert all(t > 0 for k, t in pass_times(cfg, hw, sched).items() if k[0] in ("F", "B"))
    measured = hw.tables.collective_s("all_reduce", 2, 1024)  # between the two payloads measured
    assert measured > 0 and Network.of(hw).collective(ALL_REDUCE, [0, 1], 1024) == measured  # not the link model
    # a second call on the same host, device, torch and dtype keeps the profile without measuring
    monkeypatch.setattr(HM, "measure_profile", lambda *a, **k: pytest.fail("measured again"))
    before = out.read_text()
    assert calibrate_main(argv + ["--reuse", "--print-name"]) == 0
    assert out.read_text() == before and "reusing" in capsys.readouterr().err


def test_calibrate_measure_refuses_a_builtin_name_and_a_missing_gpu(capsys, tmp_path):
    assert calibrate_main(["--measure", "--name", "a100_paper"]) == 2
    assert "built-in profile" in capsys.readouterr().err
    if not torch.cuda.is_available():
        assert calibrate_main(["--measure", "--name", "gpu_box", "--device", "cuda", "--out",
                               str(tmp_path / "gpu_box.yaml")]) == 2
        assert "no CUDA device" in capsys.readouterr().err and not (tmp_path / "gpu_box.yaml").exists()
    with pytest.raises(SystemExit) as end:  # a --measure option without --measure is a mistake, not ignored
        calibrate_main(["--results-dir", str(tmp_path), "--reuse", "--device", "cuda"])
    assert end.value.code == 2
    assert "--device, --reuse only apply to --measure" in capsys.readouterr().err


def test_backend_both_plans_the_real_jobs_and_their_predictions(tmp_path):
    code, lines = sweep(tmp_path, "dry_run=true", "backend=both", "hardware=a100_paper", "method=vocab-2")
    assert code == 0
    real, sim = [line for line in lines if line.startswith("experiment smoke")]
    assert "2 jobs, 0 done, 2 to run (backend=real, cluster=local)" in real
    assert "2 jobs, 0 done, 2 to run (backend=sim, hardware=a100_paper)" in sim
    ids = [line.split()[1] for line in lines if not line.startswith("experiment")]
    assert len(set(ids)) == 4 and not (tmp_path / "results").exists()
    code, _ = sweep(tmp_path, "dry_run=true", "backend=both", "hardware=no_such_profile")
    assert code == 2  # the sim half is checked before the real half runs


def test_a_gpu_profile_starts_from_the_builtin_of_every_device_model_named():
    from vp.flops import DEVICE_PEAKS

    assert set(HM.BUILTIN_OF) == set(DEVICE_PEAKS) and all(v in PROFILES for v in HM.BUILTIN_OF.values())


def test_elementwise_work_is_timed_at_the_measured_rate_of_its_tensor_size_and_fresh_outputs_at_their_cost():
    # x += y at 1 GB/s for every size; x + y as fast up to 16 MiB tensors, 4x slower at 64 MiB (page faults)
    moved = [3 * b for b in (2**20, 2**24, 2**26)]
    hw = with_tables(CPU, elementwise=[[moved[0], moved[0] / 1e9, moved[0] / 1e9],
                                       [moved[1], moved[1] / 1e9, moved[1] / 1e9],
                                       [moved[2], moved[2] / 1e9, moved[2] / 0.25e9]])
    assert hw.tables.elementwise_rate(2**22) == pytest.approx((1e9, 0.0))
    rate, fresh_s = hw.tables.elementwise_rate(2**26)
    assert rate == pytest.approx(1e9) and fresh_s * 2**26 == pytest.approx(moved[2] / 0.25e9 - moved[2] / 1e9)
    assert elementwise_time(hw, 1e6, 2**26) == pytest.approx(1e-3)  # in place: no allocation
    assert elementwise_time(hw, 1e6, 2**26, 1e6) == pytest.approx(1e-3 + 1e6 * fresh_s)
    assert elementwise_time(hw, 1e6, 2**20, 1e6) == pytest.approx(1e-3)  # below the reuse limit: free
    assert elementwise_time(CPU, 1e6, 2**26, 1e6) == pytest.approx(1e6 / (CPU.mem_bandwidth * CPU.mem_efficiency))
    cfg = RunConfig(method="baseline", pp=2, layers=4, hidden=64, heads=4, seq_len=256, micro_batch_size=1,
                    vocab_size=64000, microbatches=4, device="cpu", dtype="fp32")
    work = pass_work(cfg, CPU, build("baseline", 2, 4, 1))
    # the [tokens, vocabulary] fp32 logits: the cross entropy runs in place on the GEMM's output
    assert [(size, fresh) for size, _, fresh in work[("F", 1)]["S"].mem] == [(4 * 256 * 64000, 0.0)]


def test_a_first_stage_without_vocabulary_parallelism_pays_the_dense_embedding_gradient():
    cfg = RunConfig(method="baseline", pp=2, layers=4, hidden=64, heads=4, seq_len=32, micro_batch_size=1,
                    vocab_size=64000, microbatches=4, device="cpu", dtype="fp32")
    small = replace(cfg, vocab_size=8000)
    ib = {c.vocab_size: pass_work(c, CPU, build("baseline", 2, 4, 1))[("B", 0)]["IB"] for c in (cfg, small)}
    # F.embedding's backward: a dense [V, h] gradient zeroed and added into .grad (2 act + 8 bytes an element)
    dense = {v: (2 * 4 + 8) * RunConfig.from_dict({**cfg.to_dict(), "vocab_size": v}).padded_vocab_size * 64
             for v in ib}
    for v, work in ib.items():
        assert work.mem_bytes == pytest.approx(dense[v] + (4 + 8) * 32 * 64)
        assert sum(fresh for _, _, fresh in work.mem) == dense[v] / 4  # the zeroed [V, h] fp32 gradient
    # vocabulary parallelism adds the gradient of its tokens' rows only: no term in V
    vp = [pass_work(c, CPU, build("vocab-2", 2, 4, 1))[("IB", None)]["IB"].mem_bytes for c in (cfg, small)]
    assert vp[0] == vp[1] == (4 + 8) * 32 * 64
