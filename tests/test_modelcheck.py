"""The model check (harness.model_check, make model-check): the cost model against this machine's real runs, each run's
repeats over rounds, the errors against the targets."""
import json

import pytest

from harness_util import TINY, fixture_records


def test_model_check_says_which_profile_and_sets_it_needs(user_conf, capsys):
    from harness import model_check

    assert model_check.main([]) == 2
    assert "calibrate --measure" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        model_check.main(["--rounds", "0"])
    assert "--rounds 0: every run goes at least once" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        model_check.main(["--sets", "smoke", "dp4"])
    assert "--sets dp4: no such set; the sets are smoke, tp_smoke, dp2_pp2" in capsys.readouterr().err
    assert model_check.main(["--hardware", "nosuchbox", "--sets", "smoke"]) == 2  # the sweep refuses it, says why
    assert "Could not find 'hardware/nosuchbox'" in capsys.readouterr().err
    assert not (user_conf / "results").exists()  # nothing ran


def _write(folder, rec):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{rec['run_id']}.json").write_text(json.dumps(rec))


def test_each_run_is_judged_by_the_median_of_its_rounds(tmp_path, monkeypatch):
    """Rounds 2 and 3 measured every run 1.5x and 4x slower: the error reads against the median of the rounds
    (not their mean), the least-most spans them; a run failed in round 2 keeps its other rounds; a run never
    measured ok is left out and counted missing."""
    from harness import model_check

    monkeypatch.setitem(model_check.SETS, "mini", ("the fixture records", []))
    sim = next(s for s in fixture_records("sim") if s["status"] == "ok")
    [real] = [r for r in fixture_records("real") if r["config"] == sim["config"]]
    pairs = []
    for i in range(3):  # three configs apart by their seed, measured 1, 2 and 3 times the fixture's time
        r, s = json.loads(json.dumps(real)), json.loads(json.dumps(sim))
        for rec, tag in ((r, "a"), (s, "b")):
            rec["config"]["seed"], rec["run_id"] = 1000 + i, f"{tag}{i:011d}"
        r["metrics"]["iteration_time_s"] *= i + 1
        pairs.append((r, s))
    (first, first_sim), (second, _), (never, _) = pairs
    for real, sim in pairs:
        _write(tmp_path / "sim" / "mini" / "mini", sim)
        for r, slower in ((1, 1.0), (2, 1.5), (3, 4.0)):
            rec = json.loads(json.dumps(real))
            if real is never or (real is second and r == 2):
                rec["status"], rec["metrics"], rec["error"] = "failed", None, "killed"
            else:
                rec["metrics"]["iteration_time_s"] *= slower
            _write(tmp_path / f"round{r}" / "mini" / "mini", rec)

    for r, slower in ((1, 1.0), (3, 4.0)):  # the rounds' speed timed, as slow as the runs; round 2 has none
        (tmp_path / f"round{r}" / model_check.SPEED).write_text(json.dumps({"before": slower, "after": slower}))

    rows = model_check.gather(tmp_path, ["mini"], 3)
    assert len(rows) == 2
    by_time = {r["measured"][0]: r for r in rows}
    t, t2 = first["metrics"]["iteration_time_s"], second["metrics"]["iteration_time_s"]
    assert by_time[t]["measured"] == [t, 1.5 * t, 4 * t] and by_time[t]["median"] == pytest.approx(1.5 * t)
    assert by_time[t]["err_time"] == pytest.approx(first_sim["metrics"]["iteration_time_s"] / (1.5 * t) - 1)
    assert by_time[t2]["measured"] == [t2, 4 * t2] and by_time[t2]["median"] == pytest.approx(2.5 * t2)
    # at each round's own speed the slowdown is taken out: rounds 1 and 3 give round 1's error, round 2 none
    assert by_time[t]["err_at_speed"] == pytest.approx(first_sim["metrics"]["iteration_time_s"] / t - 1)
    assert model_check.read_speed(tmp_path / "round3") == 4.0 and model_check.read_speed(tmp_path / "round2") is None
    assert model_check._missing(tmp_path, ["mini"], rows) == 1  # `never` was predicted but not measured ok
    assert len(model_check.gather(tmp_path, ["mini"], 1)) == 2  # round 1 alone

    assert "speed" not in model_check.render(rows, ["mini"], "a100_80g", 3).split("Targets:")[1]
    text = model_check.render(rows, ["mini"], "a100_80g", 3, {1: 1.0, 3: 4.0})
    assert "took x1.00 (round 1), x4.00 (round 3) their profile's time" in text
    assert "At each round's speed (the prediction times that) the error is median |error| " in text
    assert f"| {1.5 * t:.4g} | {t:.4g}-{4 * t:.4g} |" in text
    assert "- mini (the fixture records): 2 runs" in text and "a run's rounds apart by 300.0 % (median" in text
    assert "Targets: iteration time median |error| at most 10.0 %: " in text
    assert "NOT met" in text  # a100_80g against CPU runs: far off


def test_the_machines_speed_is_the_calibrations_passes_timed_again():
    """speed_now times the profile's own pass rows again and divides: a profile that claims a tiny time reads as a
    machine far slower now, one that claims a huge time as far faster; no rows, or a GPU's, give no speed."""
    from harness.model_check import speed_now

    def profile(seconds, device="cpu"):
        return {"machine": {"device": device, "dtype": "fp32"},
                "measured": {"layers": f"1 16 32 2 64 {seconds} {seconds} {seconds} {seconds}",
                             "output": f"16 64 32 alg1 {seconds} {seconds}"}}

    assert speed_now(profile(1e-9)) > 1e3
    assert speed_now(profile(1e3)) < 1e-3
    assert speed_now(profile(1e-9, device="cuda")) is None
    assert speed_now({"machine": {"device": "cpu"}, "measured": {}}) is None


def test_a_rounds_speed_is_timed_once_before_and_once_after(tmp_path, monkeypatch):
    from harness import model_check

    timed = iter([1.2, 1.4])
    monkeypatch.setattr(model_check, "speed_now", lambda profile: next(timed))
    model_check.round_speed(tmp_path / "round1", "before", None)  # a built-in profile: nothing timed or written
    assert not (tmp_path / "round1").exists()
    for when in ("before", "before", "after", "after"):  # a resumed check keeps what it timed
        model_check.round_speed(tmp_path / "round1", when, {"measured": {}})
    assert json.loads((tmp_path / "round1" / model_check.SPEED).read_text()) == {"before": 1.2, "after": 1.4}
    assert model_check.read_speed(tmp_path / "round1") == pytest.approx(1.3)


def test_a_round_run_without_a_timing_gets_none_afterwards(tmp_path, monkeypatch):
    """Rounds 1 and 2 of an earlier check ran without the speed timed; a later `--rounds 3` must not time them now."""
    from harness import model_check

    monkeypatch.setattr(model_check, "speed_now", lambda profile: 1.0)
    (tmp_path / "round1" / "smoke").mkdir(parents=True)  # its runs are there, its speed is not
    for when in ("before", "after"):
        model_check.round_speed(tmp_path / "round1", when, {"measured": {}})
    assert model_check.read_speed(tmp_path / "round1") is None
    model_check.round_speed(tmp_path / "round3", "after", {"measured": {}})  # an "after" without its "before"
    assert not (tmp_path / "round3").exists()


def test_a_sets_line_gives_the_mean_error_with_its_sign():
    """Errors of -10, -20 and +5 %: median |error| 10 %, largest 20 %, and a mean of -8.3 %, the model too fast on
    average (a bias that the median of |error| hides)."""
    from harness.model_check import summary

    def rows(*errors):
        return [{"err_time": e, "err_memory": 0.0, "measured": [1.0], "method": "vocab-1", "mesh": "1x2x1",
                 "vocab": "8k"} for e in errors]

    line = summary(rows(-0.1, -0.2, 0.05), "smoke")
    assert line.startswith("smoke: 3 runs, iteration time median |error| 10.0 %, largest 20.0 % (vocab-1 1x2x1 8k), "
                           "mean error -8.3 % (predicted faster than measured on average); peak memory median")
    assert "mean error +10.0 % (predicted slower than measured on average)" in summary(rows(0.1, 0.1), "x")


def test_verdict_names_each_target_met_or_not():
    from harness.model_check import verdict

    def rows(*errors, memory=0.01):
        return [{"err_time": e, "err_memory": memory} for e in errors]

    assert verdict(rows(0.05, -0.08, 0.2)) == (
        "Targets: iteration time median |error| at most 10.0 %: met; largest at most 25.0 %: met; "
        "peak memory median |error| at most 10.0 %: met.")
    assert "median |error| at most 10.0 %: NOT met; largest at most 25.0 %: NOT met" in verdict(rows(0.12, -0.3, 0.2))
    assert verdict(rows(0.05, 0.05, 0.3)).count("NOT met") == 1
    assert "peak memory median |error| at most 10.0 %: NOT met" in verdict(rows(0.0, memory=-0.2))


def test_model_check_runs_predicts_and_reuses_through_the_sweep(user_conf, monkeypatch, capsys):
    """One tiny job in two rounds: measured twice, predicted once, the README written; run again, nothing reruns."""
    from harness import model_check

    monkeypatch.setattr(model_check, "SETS", {"tiny": ("one tiny run", ["experiment=smoke", *TINY,
                                                                        "grid.product.vocab=[2k]",
                                                                        "grid.product.method=[vocab-1]"])})
    argv = ["--hardware", "a100_80g", "--rounds", "2", "--extra", "run.iterations=2", "run.warmup=1"]
    assert model_check.main(argv) == 0
    out = capsys.readouterr().out
    folder = user_conf / "results" / "model_check_a100_80g"
    readme = (folder / "README.md").read_text()
    assert readme in out
    assert "| tiny | 1x2x1 | vocab-1 | 2k |" in readme and "--rounds 2" in readme
    assert "Every run measured in 2 rounds, 20" in readme  # when: the first start to the last end
    for part in ("sim", "round1", "round2"):
        assert len(list((folder / part / "tiny" / "smoke").glob("????????????.json"))) == 1
    assert model_check.main(argv) == 0
    assert out.count("0 done, 1 to run") == 3  # the prediction and the two rounds, the first time
    assert capsys.readouterr().out.count("1 done, 0 to run") == 3  # reused
