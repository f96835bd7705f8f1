"""The predicted-vs-measured section of a report (harness.report.predicted): what its opening line says beside the
errors."""
from harness_util import fixture_records
from harness.report.frame import records_frame


def test_the_error_line_says_how_far_a_measured_profiles_rounds_disagreed():
    """A sim record whose profile was timed in rounds (machine.rounds, harness.measure.spread): the opening line
    gives that drift beside the errors; a built-in profile says nothing of it."""
    from harness.report import predicted
    from vp.cost import PROFILES

    sim = next(s for s in fixture_records("sim") if s["status"] == "ok")
    [real] = [r for r in fixture_records("real") if r["config"] == sim["config"]]
    sim["env"]["hardware"] = PROFILES["a100_80g"].to_dict()
    assert "rounds" not in predicted.errors_line(predicted.pairs(records_frame([real, sim])))
    sim["env"]["hardware"]["machine"] = {"rounds": {"layers": 0.498, "output": 0.155}}
    line = predicted.errors_line(predicted.pairs(records_frame([real, sim])))
    assert line.startswith("Over 1 runs predicted with a100_80g: iteration time median |error| ")
    pair = predicted.pairs(records_frame([real, sim])).iloc[0]
    e = pair["err_time"]  # one run: its error is the median, the largest and, with its sign, the mean
    assert f"iteration time median |error| {abs(e) * 100:.1f} %, largest {abs(e) * 100:.1f} %, " \
           f"mean error {e * 100:+.1f} %; tokens/s" in line
    assert ("The calibration of a100_80g timed the same passes in rounds spread over it, which differed by "
            "50 % (layers) and 16 % (output) (largest round over smallest") in line
