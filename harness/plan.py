"""python -m harness.plan model=NAME vocab=NAME hardware=NAME plan.gpus=N plan.global_batch=B [run.seq_len=S]
[plan.top=K] [method=M] [run.tp=T ...] [plan.json=true]   (--help: usage)

Plans a run before GPU hours are spent: searches every method x mesh x micro-batch size x chunks (vp.plan),
prints the top plans by predicted tokens/s with their memory, the best per method, what was rejected and why,
draws the Pareto front of throughput against peak memory, and writes the experiment file plan_<name>.yaml to the
user's config folder (on Hydra's search path, like calibrated profiles), so that
`python -m harness.sweep experiment=plan_<name>` runs the plans (backend=sim predicts them again, bit for bit).
A command-line value for an axis (method=, run.dp= run.pp= run.tp= run.tp_mode= run.tp_depth=
run.micro_batch_size= run.microbatches= run.chunks= run.redis_last_layers=, and the knobs run.zero=
run.overlap_grad_reduce= run.recompute= run.sequence_parallel=) fixes it. plan.memory_margin (default 0.05) is the
share of the device's memory every plan leaves free.
"""
import gc
import json
import os
import sys
import warnings
from pathlib import Path

from omegaconf import OmegaConf

from harness import jobs as J
from harness.plan_output import describe, experiment_text, figure, no_plan_message, readme, summary
from harness.profiles import CONF, user_conf_dir
from vp.checks import writable_path
from vp.files import write_text_atomic
from vp.plan import AXES, Problem, search

warnings.filterwarnings("ignore", r"provider=hydra\.searchpath in main, path=.* is not available\.", UserWarning)

# command-line keys that fix an axis of the search -> the RunConfig field
FIXING = {"method": "method", **{f"run.{k}": k for k in AXES if k != "method"}}
USAGE = __doc__


def compose_plan(overrides: list[str]):
    """The composed config: the sweep's tree without an experiment, plus the plan group."""
    from hydra import initialize_config_dir

    from harness.compose import JobComposer
    from harness.sweep import split_overrides

    with initialize_config_dir(str(CONF), version_base="1.3"):
        fixed, sweeps, given = split_overrides(overrides)
        if sweeps:
            raise ValueError(f"{', '.join(sweeps)}: the planner searches the axes itself; give one value to fix "
                             f"an axis (method=vocab-2), or plan.methods=[a,b] for a set of methods")
        compose = JobComposer(["~experiment", "+plan=default"] + fixed)  # the implied values below: no second
        cfg = compose([])  # composition, as a sweep's jobs (harness.compose)
        hw = J.hardware_of(cfg)  # a measured profile says where it was measured; a built-in GPU one has bf16
        gpu = hw.machine["device"] == "cuda" if hw.machine.get("device") else hw.act_bytes < 4
        implied = {"run.device": "cuda", "run.dtype": "bf16", "run.iterations": 10, "run.warmup": 3,
                   "run.timeout_s": 1800} if gpu else {"run.device": "cpu", "run.dtype": "fp32"}
        extra = [f"{k}={v}" for k, v in implied.items() if k not in given]
        if extra:
            cfg = compose(extra)
    return cfg, {FIXING[k]: v for k, v in given.items() if k in FIXING}


def problem_of(cfg, given: dict) -> tuple[Problem, object]:
    hw = J.hardware_of(cfg)
    base = J.run_config(cfg)
    fixed = {}
    for field in given:
        fixed[field] = cfg.method.name if field == "method" else OmegaConf.select(cfg, f"run.{field}")
    methods = tuple(cfg.plan.methods) if cfg.plan.methods else None
    kw = {"methods": methods} if methods else {}
    return Problem(base.with_(chunks=None, redis_last_layers=None), cfg.plan.gpus, cfg.plan.global_batch, fixed,
                   gpus_per_node=hw.gpus_per_node, tp_in_node=cfg.plan.tp_in_node,
                   tokens_per_microbatch=cfg.limits.tokens_per_microbatch, schedule_size=cfg.limits.schedule_size,
                   memory_margin=cfg.plan.memory_margin, **kw), hw


def plan_name(cfg) -> str:
    if cfg.plan.name:
        return str(cfg.plan.name)
    return f"{cfg.model.name}_{cfg.vocab.name}_{cfg.hardware.name}_{cfg.plan.gpus}".replace(".", "_")


def experiment_path(cfg, name: str) -> Path:
    if cfg.plan.out:
        path = Path(cfg.plan.out)
        if path.name != f"plan_{name}.yaml" or path.parent.name != "experiment":
            raise ValueError(f"plan.out={cfg.plan.out}: the file must be <folder>/experiment/plan_{name}.yaml, so "
                             f"that experiment=plan_{name} finds it with hydra.searchpath=[file://<folder>]")
        return path
    return user_conf_dir() / "experiment" / f"plan_{name}.yaml"


def run(argv: list[str], out=print) -> int:
    try:
        cfg, given = compose_plan(argv)
        problem, hw = problem_of(cfg, given)
        name = plan_name(cfg)
        path = experiment_path(cfg, name)
        folder = Path(cfg.plan.figures) / f"plan_{name}"
        writable_path(path.parent, "plan.out" if cfg.plan.out else "the experiment folder")
        writable_path(folder, "plan.figures")  # before the search: a refusal after it would waste it
    except ValueError as err:
        print(f"plan refused: {err}", file=sys.stderr)
        return 2
    log = None if cfg.plan.json else (lambda line: print(line, file=sys.stderr, flush=True))
    plan = search(problem, hw, top=cfg.plan.top, prune=cfg.plan.prune, log=log)
    if not plan.rows:
        print(f"no feasible plan: {no_plan_message(problem, hw, plan)}", file=sys.stderr)
        if cfg.plan.json:
            out(json.dumps(summary(plan, None), indent=1))
        return 1
    experiment = f"plan_{name}"
    folder.mkdir(parents=True, exist_ok=True)
    data = summary(plan, str(path))
    write_text_atomic(folder / "plan.json", json.dumps(data, indent=1) + "\n")
    write_text_atomic(folder / "README.md", readme(plan, hw, experiment))
    figure(plan, hw, folder / "pareto.png")
    write_text_atomic(path, experiment_text(cfg, argv, plan, experiment, hw))  # last: a sweep can use it at once
    if cfg.plan.json:
        out(json.dumps(data, indent=1))
        return 0
    out(describe(plan, hw, path, experiment, folder))
    return 0


def main() -> int:
    argv = sys.argv[1:]
    if any(a in ("-h", "--help") for a in argv):
        print(USAGE)
        return 0
    code = run(argv)
    # the process ends here: its objects are left to the exit, not walked by the cyclic collector on the way (its
    # collections at the interpreter's shutdown over what the search and its imports hold took about half a CPU
    # second at 30b on 1024 GPUs); nothing left holds a resource a finaliser must release (files are written whole)
    gc.freeze()
    return code


if __name__ == "__main__":
    try:
        sys.exit(main())
    except BrokenPipeError:  # `--help | head`: the reader left
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
