"""Fidelity against the papers (issue: V-Half predicted as well as 1F1B, every claim in one table): the pass
overhead's two parts (per operation, per pass; W without the per-pass part), measured and fitted; the fit sees only
the 1F1B artifact and V-Half is predicted; the squeezed V-Half order as methods of their own; the claims table built
from records."""
import json
from dataclasses import replace

import pytest
import torch

from harness import published
from harness.sim import simulate_job
from vp.config import RunConfig
from vp.cost import PROFILES
from vp.cost.passes import LAYER_KERNELS, UNSYNCHRONISED, compute_times, pass_work
from vp.schedule import build, simulate, unit_costs
from vp.schedule.methods import METHODS

A100 = PROFILES["a100_80g"]


def _cfg(method: str, pp: int = 2, layers: int = 4, **kw) -> RunConfig:
    return RunConfig(method=method, pp=pp, layers=layers, hidden=256, heads=4, seq_len=128, vocab_size=1024,
                     microbatches=4, device="cuda", dtype="bf16", **kw)


@pytest.mark.parametrize("method", ["baseline", "vhalf", "vhalf-vocab-1"])
def test_fidelity_overhead_is_per_operation_and_per_pass_and_w_pays_no_per_pass_part(method):
    """Each pass pays kernel_s per operation it issues (layers x the kind's operations: B and W split them) and
    pass_overhead_s once, but a W pass (UNSYNCHRONISED) only its operations."""
    cfg = _cfg(method)
    sched = build(method, cfg.pp, cfg.microbatches, cfg.n_chunks)
    kernel, fixed = 7e-6, 3e-4
    bare, charged = (compute_times(cfg, hw, sched) for hw in (A100, replace(A100, kernel_s=kernel,
                                                                               pass_overhead_s=fixed)))
    work = pass_work(cfg, A100, sched)
    assert UNSYNCHRONISED == ("W",)
    for key, seconds in charged.items():
        if not work[key]:
            continue
        kernels = sum(w.kernels for w in work[key].values())
        per_pass = 0.0 if key[0] == "W" else fixed
        assert seconds - bare[key] == pytest.approx(per_pass + kernels * kernel, rel=1e-9), key
    layers = cfg.stage_layers[0]
    if sched.split_w:
        assert sum(w.kernels for w in work[("W", 0)].values()) == layers * LAYER_KERNELS["W"]
    else:  # B holds the weight gradient: both kinds' operations, one per-pass part
        assert sum(w.kernels for w in work[("B", 1)].values()) >= layers * (LAYER_KERNELS["B"] + LAYER_KERNELS["W"])


def test_fidelity_a_measured_empty_pass_is_the_per_pass_part_and_the_layer_rows_keep_the_rest():
    """calibrate --measure times a stage pass over no layer (the per-pass part) beside the layers rows; with that
    part as pass_overhead_s, a stage of the measured shape and the rows' layer count comes out as measured."""
    from harness.measure import fitted
    from vp.cost.measure import Timer
    from vp.cost.measure_passes import empty_passes
    from vp.cost.tables import LAYERS_PER_ROW, as_text, layer_key

    (row,) = empty_passes(torch.device("cpu"), torch.float32, Timer(torch.device("cpu")), cycles=3)
    assert len(row) == 4 and all(s > 0 for s in row)
    cfg = replace(_cfg("baseline", pp=1, layers=LAYERS_PER_ROW), device="cpu", dtype="fp32")
    measured_layer = [4e-3, 6e-3, 3e-3, 8e-3]  # seconds per layer of F, B, W, BW, as a row holds them
    cpu = replace(A100, sms=0, tile_k_overhead=0, align_penalty=0.0, act_bytes=4, pass_overhead_s=5e-4,
                  measured={"layers": as_text([list(layer_key(cfg)) + measured_layer])})
    sched = build("baseline", 1, cfg.microbatches, 1)
    layers_only = {"F": measured_layer[0], "B": measured_layer[3]}
    times = compute_times(cfg, cpu, sched)
    for kind in ("F", "B"):
        vocab = sum(v for k, v in _vocab_parts(cfg, cpu, sched, kind).items())
        assert times[(kind, 0)] == pytest.approx(LAYERS_PER_ROW * layers_only[kind] + vocab, rel=1e-9)
    # the measured profile takes its per-pass part from the empty passes (F, B, W)
    here = {"cores": 2}
    hw = fitted("x", torch.device("cpu"), "fp32", 1e10, _tables(row), here)
    assert hw.pass_overhead_s == pytest.approx(sorted(row[:3])[1])


def _vocab_parts(cfg, hw, sched, kind):
    """Seconds of the first stage's vocabulary-layer parts of pass `kind` (composed, factor 1, no per-pass part)."""
    from vp.cost.passes import work_seconds

    parts = pass_work(cfg, hw, sched)[(kind, 0)]
    return {k: work_seconds(hw, {k: w}).total(hw) - hw.pass_overhead_s for k, w in parts.items() if k not in ("F", "B")}


def _tables(fixed_row):
    """The smallest tables harness.measure.fitted reads, with the empty passes' row."""
    return {"gemm": [[256, 256, 256, 1e-3]], "attention": [], "elementwise": [[1024, 1e-6, 0], [2**21, 1e-3, 0]],
            "optimizer": [[16, 1024, 1e-3]], "collectives": [], "pass_fixed": [list(fixed_row)]}


def test_fidelity_the_fit_sees_only_the_1f1b_artifact(monkeypatch, tmp_path):
    """calibrate --published fits to the 1F1B artifact's runs only (no V-Half, nothing split into W), and refuses
    any other published table: V-Half is predicted, never fitted."""
    from harness.published import calibrate as cal
    from harness.published.fit import Fit

    seen = []

    def fake_fit(base, name, runs, mfu, **kw):
        seen.extend(runs)
        return Fit(replace(base, name=name), list(mfu), list(mfu), 0)

    monkeypatch.setattr(cal, "fit_profile", fake_fit)
    cal.calibrate_published("paper_artifact", "fid", "a100_80g", tmp_path / "fid.yaml", log=lambda _: None)
    assert len(seen) == len(published.load("paper_artifact"))
    assert all(not METHODS[r.method].split_w and METHODS[r.method].placement == "loop" for r in seen)
    for held_out in ("paper_vhalf", "vocab_padding"):
        if published.exists(held_out):
            with pytest.raises(ValueError, match="held out"):
                cal.calibrate_published(held_out, "fid", "a100_80g", tmp_path / "fid.yaml", log=lambda _: None)


def test_fidelity_vhalf_is_a_prediction_of_the_profile_fitted_on_the_artifact():
    """a100_paper was fitted to paper_artifact; its V-Half runs are none of the fitted runs, and a report says so."""
    from harness.profiles import CONF, read_profile
    from harness.report.frame import records_frame
    from harness.report.published import fitted_or_predicted
    from vp.cost import Hardware

    hw = Hardware.from_dict(read_profile(CONF / "hardware" / "a100_paper.yaml"))
    assert hw.fitted_to == "paper_artifact" and published.FITTABLE == ("paper_artifact",)
    assert hw.kernel_s > 0 and hw.pass_overhead_s > 0  # both parts fitted
    fitted_keys = {r.key for r in published.load("paper_artifact")}
    assert not any(r.key in fitted_keys for r in published.load("paper_vhalf"))
    runs = [_cfg(m, pp=4, layers=8) for m in ("vhalf", "vhalf-vocab-1")]
    records = [simulate_job(r, hw, "paper_vhalf", {}) for r in runs]
    for i, rec in enumerate(records):
        rec["run_id"] = f"{i:012x}"
    notes = fitted_or_predicted(records_frame(records))
    assert notes and "None of the 2 runs here was in the fit: all are predictions" in notes[0]


def test_fidelity_the_squeezed_vhalf_order_is_its_own_method_with_a_smaller_bubble():
    """vhalf-squeezed: the main branch's squeezed order, a method row of its own (so the planner searches it): at
    unit costs a smaller bubble than the paper's order at the same activation peak."""
    from vp.plan.space import Problem

    assert "vhalf-squeezed" in Problem.methods
    for pp, m in ((4, 8), (8, 16)):
        a, b = (simulate(s, unit_costs(s)) for s in (build("vhalf", pp, m), build("vhalf-squeezed", pp, m)))
        assert b.bubble_rate < a.bubble_rate - 0.05, (pp, m)
        assert max(b.peak_activations) == max(a.peak_activations)
    assert METHODS["vhalf-squeezed"].vocab == METHODS["vhalf"].vocab and METHODS["vhalf-squeezed"].split_w


def test_fidelity_claims_table_is_built_from_the_records(tmp_path):
    """make claims' table: the artifact's 1F1B gain of vocab-1/2 over the baseline from the records that are there,
    beside the figure computed from the published table; claims whose records are missing say what to run."""
    from harness.profiles import CONF, read_profile
    from harness.report.claims import build_claims
    from vp.cost import Hardware

    hw = Hardware.from_dict(read_profile(CONF / "hardware" / "a100_paper.yaml"))
    cell = [r for r in published.load("paper_artifact") if r.seq_len == 2048 and r.vocab_size == 32000
            and r.method in ("baseline", "redis", "vocab-1", "vocab-2")]
    folder = tmp_path / "results" / "paper_artifact"
    folder.mkdir(parents=True)
    mfu = {}
    for row in cell:  # the published run at a tenth of its microbatches: a fast stand-in with the same key
        run = RunConfig(method=row.method, pp=row.pp, layers=row.layers, hidden=row.hidden, heads=24,
                        seq_len=row.seq_len, vocab_size=row.vocab_size, microbatches=16, device="cuda",
                        dtype="bf16", redis_last_layers=row.redis_last_layers)
        rec = simulate_job(run, hw, "paper_artifact", {"hardware": "a100_paper"})
        rec["run_id"] = f"{len(mfu):012x}"
        (folder / f"{rec['run_id']}.json").write_text(json.dumps(rec))
        mfu[row.method] = rec["metrics"]["mfu"]
    rows = build_claims(tmp_path / "results", tmp_path / "claims")
    (artifact,) = [r for r in rows if r.claim.startswith("1F1B: Vocab-1/2 over the better of baseline and redis")]
    gain = max(mfu["vocab-1"], mfu["vocab-2"]) / max(mfu["baseline"], mfu["redis"]) - 1
    assert artifact.simulated == pytest.approx((gain, gain))
    pub = {r.method: r.mfu for r in cell}
    published_gain = max(pub["vocab-1"], pub["vocab-2"]) / max(pub["baseline"], pub["redis"]) - 1
    assert artifact.published[0] <= published_gain <= artifact.published[1]
    readme = (tmp_path / "claims" / "README.md").read_text()
    assert f"{gain * 100:+.1f} %" in readme and (tmp_path / "claims" / "claims.png").is_file()
    missing = [r for r in rows if r.simulated is None]
    assert any(r.paper.startswith("2.5-D") for r in missing) and "not run (make claims runs tp_scaling)" in readme
