"""python -m harness.calibrate --measure [--name NAME] [--device cpu|cuda] [--reuse] [--print-name]
python -m harness.calibrate --results-dir results/smoke [--name NAME] [--out DIR/hardware/NAME.yaml]
python -m harness.calibrate --published paper_artifact --name a100_paper --overwrite-builtin [--base a100_80g]

Fits a hardware profile so that backend=sim predicts a sweep, and writes it as a config of the `hardware`
group (backend=sim hardware=NAME uses it): by default to the user's profile folder,
$VP_HARNESS_CONFIG/hardware/NAME.yaml (else $XDG_CONFIG_HOME/vp-harness/..., else ~/.config/vp-harness/...),
which conf/config.yaml puts on Hydra's config search path; or to --out. A name of a built-in profile
(conf/hardware/) is refused unless --overwrite-builtin says to refit the built-in (make calibrate-paper does).

--measure: from microbenchmarks of this machine (harness.measure, vp.cost.measure; 1-1.5 minutes on a CPU):
GEMMs over a grid of shapes and the shapes of the jobs of --shapes-from, attention, elementwise bandwidth, and
the collectives and point-to-point messages the runtime uses per group size and payload, with the groups of 2,
4 and 8 processes side by side (gloo on CPU, NCCL on a GPU node: every device at work); and at the jobs' shapes
the passes as the runtime runs them: a stage's layers and the output layer's parts (three rounds spread over the
calibration, their mean; machine.rounds says how far they disagreed), and on CPU a tensor-parallel stage's layers
in a world of its group's processes. The profile holds the measured tables, which the cost model
reads where they cover a question, and the analytical parameters fitted to them for the rest; never anything from
the runs it predicts. The default name is DEVICE_HOST_torchVERSION; --reuse keeps an existing profile of that name
measured on this host with this device, torch and dtype (make sweep measures once).

--results-dir: from real records of one machine. The cost model says what each pass computes (vp.cost.pass_work:
GEMM shapes, attention, elementwise bytes); the measured pass times give one speed multiplier per pass kind for
its GEMMs, one elementwise bandwidth and one fixed per-pass overhead (least squares on relative error), and the
link probe every real run records (env.link_probe: bytes, seconds) gives the link latency and bandwidth.

--published: from a published MFU table (harness/published/NAME.csv) and the experiment of the same name
(conf/experiment/NAME.yaml): the base profile's few free parameters (harness.published.fit.FITTED) are fitted
once for the whole table; everything else stays the base profile's. Prints the fit row by row.
"""
import argparse
import statistics
import sys
from dataclasses import replace
from pathlib import Path

from harness import profiles
from harness.records import load
from vp.config import RunConfig
from vp.cost import EFF_KINDS, PROFILES, Hardware, fit_link, pass_work
from vp.cost.fit import fit_speeds, fitted, observation
from vp.renamed import refuse_renamed_flags
from vp.schedule import build



def cpu_profile(name: str, peak: float, **fields) -> Hardware:
    """A profile for one CPU machine: no tile or wave quantization, no alignment effects, every efficiency 1
    (the calibrated multipliers and bandwidths carry the machine's speed), one flat link, no NCCL buffers (gloo)."""
    base = dict(sms=0, tile_k_overhead=0, align_penalty=0.0, gemm_efficiency=1.0, attention_efficiency=1.0,
                mem_efficiency=1.0, collective_latency=0.0, act_bytes=4, bytes_per_param=16.0, overhead_bytes=0.0,
                comm_bytes=0.0, link_comm_bytes=0.0)
    base.update(fields)
    return Hardware(name, peak, **base)


def observations(records: list[dict], skeleton: Hardware) -> tuple[list[dict], list[float]]:
    """Per (record, pass kind, rank) with a time: the GEMM+attention seconds the skeleton profile models for
    each efficiency kind at multiplier 1, the elementwise bytes under 'bytes', and the measured seconds."""
    rows, times = [], []
    for rec in records:
        cfg = RunConfig.from_dict(rec["config"])
        sched = build(cfg.method, cfg.pp, cfg.microbatches, cfg.n_chunks)
        work = pass_work(cfg, skeleton, sched)

        def row_of(parts):
            return observation(skeleton, parts)

        for kind, per_rank in (rec["metrics"].get("pass_time_s") or {}).items():
            for rank, seconds in enumerate(per_rank):  # every device of the world: dp x pp x tp
                if seconds is None or seconds <= 0 or rank >= cfg.world:
                    continue
                if kind in ("F", "B", "W"):  # a rank's mean pass: the mean over the stages its pipeline rank holds
                    p = cfg.mesh.coords(rank).p
                    parts = [row_of(work.get((kind, sched.stage(p, c)), {})) for c in range(sched.chunks)]
                    row = {k: statistics.mean(p.get(k, 0.0) for p in parts) for k in (*EFF_KINDS, "bytes", "passes")}
                else:
                    row = row_of(work.get((kind, None), {}))
                if any(v > 0 for v in row.values()):
                    rows.append(row)
                    times.append(seconds)
    return rows, times


def calibrate(records: list[dict], name: str, base: Hardware | None = None) -> Hardware:
    """A profile from real records of one machine. CPU records: the CPU skeleton (no quantization); GPU
    records: `base` (a built-in profile of the device) keeps its shape model and network, and the fit sets its
    per-kind multipliers, elementwise bandwidth, overhead and link."""
    real = [r for r in records if r.get("backend") == "real" and r.get("status") == "ok" and r.get("metrics")]
    if not real:
        raise ValueError("no ok real records to calibrate on; run a sweep first (make sweep)")
    if len({r["config"]["device"] for r in real}) > 1 or len({tuple(r["env"].get("hosts", [])) for r in real}) > 1:
        raise ValueError("records come from several devices or hosts; calibrate one machine at a time "
                         "(--results-dir results/<experiment>)")
    peak = float(statistics.median(r["metrics"]["peak_flops"] for r in real))
    cpu = real[0]["config"]["device"] == "cpu"
    skeleton = (cpu_profile("skeleton", peak, mem_bandwidth=float("inf")) if cpu
                else replace(base or PROFILES["a100_80g"], peak_flops=peak, efficiency={}, pass_overhead_s=0.0))
    speeds, bandwidth, overhead = fit_speeds(*observations(real, skeleton))
    if cpu:
        probes = [p for r in real for p in r["env"].get("link_probe") or []]
        latency, link = fit_link(probes) if len(probes) >= 2 else (10e-6, 25e9)
        ranks = max(int(r["config"]["pp"]) for r in real)
        return cpu_profile(name, peak, efficiency=speeds, mem_bandwidth=bandwidth, pass_overhead_s=overhead,
                           gpus_per_node=ranks, link_latency=latency, link_bandwidth=link, ib_latency=latency,
                           ib_bandwidth=link, memory_bytes=_machine_memory())
    return fitted(skeleton, name, speeds, bandwidth, overhead)


def _machine_memory() -> float:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            return float(line.split()[1]) * 1024
    return 16 * 1024**3


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m harness.calibrate", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    what = ap.add_mutually_exclusive_group(required=True)
    what.add_argument("--results-dir", help="a folder of records of one machine, e.g. results/smoke")
    what.add_argument("--measure", action="store_true", help="microbenchmarks of this machine (see above)")
    what.add_argument("--published", help="a published MFU table: harness/published/NAME.csv with the experiment "
                                          "conf/experiment/NAME.yaml, e.g. paper_artifact")
    ap.add_argument("--name", default=None, help="the profile's name, hardware=NAME (default: the stem of --out, "
                                                 "else 'calibrated')")
    ap.add_argument("--base", default="a100_80g", help="the built-in profile the fit starts from (--published, or "
                                                       f"--results-dir of GPU runs): {', '.join(PROFILES)}")
    ap.add_argument("--out", default=None, help="an explicit file NAME.yaml (default: "
                                                "<user config folder>/hardware/NAME.yaml, on the sweep's search path)")
    ap.add_argument("--overwrite-builtin", action="store_true",
                    help="allow --name to be a built-in profile of conf/hardware/ and replace that file")
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="--measure: the device measured")
    ap.add_argument("--dtype", choices=("fp32", "bf16", "fp16"), default=None,
                    help="--measure: the runs' dtype (default fp32 on cpu, bf16 on cuda)")
    ap.add_argument("--shapes-from", nargs="+", default=["smoke", "tp_smoke"], metavar="EXPERIMENT",
                    help="--measure: also measure every GEMM and attention shape of these experiments' jobs")
    ap.add_argument("--budget-s", type=float, default=30.0, help="--measure: seconds for the GEMM tables at most; "
                    "the jobs' own shapes are always measured, then the grid (at least a quarter of the budget); grid "
                    "shapes left over go to the analytical model")
    ap.add_argument("--reuse", action="store_true", help="--measure: keep the profile NAME when it was measured "
                    "on this host, device, torch version and dtype, timed the same way")
    ap.add_argument("--print-name", action="store_true", help="--measure: print only the profile's name on stdout "
                                                              "(for scripts: hardware=$(...))")
    args = refuse_renamed_flags(ap).parse_args(argv)
    if args.measure:
        return measure_main(args)
    given = [flag for flag, value in (("--device", args.device != "cpu"), ("--dtype", args.dtype),
                                      ("--shapes-from", args.shapes_from != ["smoke", "tp_smoke"]),
                                      ("--budget-s", args.budget_s != 30.0), ("--reuse", args.reuse),
                                      ("--print-name", args.print_name)) if value]
    if given:
        ap.error(f"{', '.join(given)} only apply to --measure (microbenchmarks of this machine); "
                 f"with --results-dir or --published, leave them out")
    name = args.name or (Path(args.out).stem if args.out else "calibrated")
    try:
        out = profiles.destination(name, args.out, args.overwrite_builtin)
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    args.name = name
    if args.published:
        from harness.published.calibrate import calibrate_published

        try:
            return calibrate_published(args.published, args.name, args.base, out)
        except ValueError as err:
            print(f"error: {err}", file=sys.stderr)
            return 2
    if not Path(args.results_dir).is_dir():
        print(f"error: --results-dir {args.results_dir} is not a folder of records", file=sys.stderr)
        return 2
    try:
        hw = replace(calibrate(load(Path(args.results_dir)), args.name, PROFILES.get(args.base)),
                     fitted_to=str(args.results_dir))
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    out = profiles.write_profile(hw, out, args.results_dir)
    print(f"use it with: {profiles.usage(out, hw.name)}")
    print(f"wrote {out}: peak {hw.peak_flops:.3g} FLOP/s, GEMM speed multiplier "
          + ", ".join(f"{k} {v:.3f}" for k, v in hw.efficiency.items())
          + f", elementwise {hw.mem_bandwidth / 1e9:.2f} GB/s, pass overhead {hw.pass_overhead_s * 1e3:.3f} ms, "
          f"link {hw.link_latency * 1e6:.0f} us + {hw.link_bandwidth / 1e9:.2f} GB/s")
    return 0


def measure_main(args) -> int:
    from harness.measure import default_name, measure_profile, same_machine, summary

    dtype = args.dtype or ("fp32" if args.device == "cpu" else "bf16")
    name = args.name or (Path(args.out).stem if args.out else default_name(args.device))
    try:
        out = profiles.destination(name, args.out, False)
        if args.budget_s <= 0:
            raise ValueError(f"--budget-s {args.budget_s}: give a positive number of seconds")
        if args.reuse and out.is_file():
            have = profiles.read_profile(out)
            if same_machine(have, args.device, dtype):
                print(f"reusing {out} (measured {have['machine'].get('date')} on this host, device, torch and "
                      f"dtype)", file=sys.stderr)
                print(name if args.print_name else f"use it with: {profiles.usage(out, name)}")
                return 0
        hw = measure_profile(name, args.device, dtype, args.shapes_from, args.budget_s)
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    out = profiles.write_profile(hw, out, f"microbenchmarks of {hw.machine['device_name']} on {hw.machine['host']} "
                                 f"({hw.machine['date']})")
    print(f"wrote {out}: {summary(hw)}", file=sys.stderr)
    print(name if args.print_name else f"use it with: {profiles.usage(out, name)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
