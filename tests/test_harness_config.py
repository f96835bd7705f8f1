"""Composing the harness's configuration through its real entry points: config groups, presets, Hydra's idioms
(-m sweeps, axis overrides, --help, launchers), refusals before anything is submitted, the paper grids' plans."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from harness.sweep import run
from harness_util import CONF, ROOT, TINY, cli, files_under, sweep


@pytest.mark.parametrize("group", ["model", "vocab", "method", "cluster", "logger", "hardware", "experiment"])
def test_every_config_group_option_composes_to_its_file(group):
    options = sorted(p.stem for p in (ROOT / "conf" / group).glob("*.yaml"))
    assert options
    with initialize_config_dir(CONF, version_base="1.3"):
        for option in options:
            extra = ["cluster.partition=x"] if (group, option) == ("cluster", "slurm") else []
            cfg = compose("config", overrides=[f"{group}={option}", *extra])
            values = OmegaConf.load(ROOT / "conf" / group / f"{option}.yaml")
            values = {k: v for k, v in OmegaConf.to_container(values).items() if k != "defaults"}
            node = cfg if group == "experiment" else cfg[group]
            for key, value in values.items():  # every value of the file is in the composed config, typed
                if key == "partition" and extra:
                    continue
                got = OmegaConf.to_container(node[key]) if OmegaConf.is_config(node[key]) else node[key]
                if isinstance(got, dict):
                    assert {k: got[k] for k in value} == value, (option, key)
                else:
                    assert got == value, (option, key)


@pytest.mark.parametrize("overrides,jobs", [
    ([], 12),
    (["experiment=paper_1f1b", "cluster=slurm", "cluster.partition=gpu"], 192),  # backend=sim plans the same jobs
    (["experiment=gpu", "cluster=slurm", "cluster.partition=gpu"], 40),  # make sweep CLUSTER=slurm PARTITION=gpu
    (["experiment=paper_vhalf", "backend=sim"], 96),
    (["experiment=vocab_padding", "backend=sim"], 4),
])
def test_presets_dry_run(tmp_path, monkeypatch, overrides, jobs):
    monkeypatch.setattr("harness.slurm.slurm_here", lambda: False)  # as on a laptop, whether SLURM runs here or not
    code, lines = sweep(tmp_path, "dry_run=true", *overrides)
    assert code == 0
    assert f": {jobs} jobs, 0 done, {jobs} to run" in lines[0]
    slurm = "cluster=slurm" in overrides  # a line on the partition, and each job's request
    assert len(lines) == jobs + 1 + slurm
    if slurm:  # 4 and 8 ranks on part of a node or one node of 8 GPUs; 16 and 32 spanning nodes of 8
        assert "partition not queried" in lines[1]
        asks = {line.split("  ")[-1].strip() for line in lines[2:]}
        rest = "GPUs/node, CPUs/task from the partition, the partition's time limit"
        assert asks == {f"1 node x 4 tasks, 4 {rest}", f"1 node x 8 tasks, 8 {rest}"} if jobs == 40 else \
            {f"1 node x 8 tasks, 8 {rest}", f"2 nodes x 8 tasks, 8 {rest}", f"4 nodes x 8 tasks, 8 {rest}"}, asks
    assert not (tmp_path / "results").exists()


def test_a_value_for_a_grid_axis_replaces_the_axis(tmp_path):
    code, lines = sweep(tmp_path, "dry_run=true", "method=vocab-1", "vocab=8k")
    assert code == 0 and ": 1 jobs, 0 done, 1 to run" in lines[0]
    assert lines[1].split()[-2:] == ["method=vocab-1", "vocab=8k"]
    code, lines = sweep(tmp_path, "dry_run=true", "experiment=paper_1f1b", "backend=sim", "model=10b",
                        "method=vocab-1")  # one method: composing 4 group choices, not 32
    assert code == 0 and ": 8 jobs" in lines[0]  # the 4 setups of model=10b (with its 16 ranks) of the 12, x 2 seq
    assert all(" model=10b method=vocab-1 run.pp=16 " in line for line in lines[1:])
    assert sorted(line.split("vocab=")[1].split()[0] for line in lines[1:]) == ["128k", "128k", "256k", "256k",
                                                                               "32k", "32k", "64k", "64k"]
    code, lines = sweep(tmp_path, "dry_run=true", "~grid")  # no grid: the base config is the one job
    assert code == 0 and ": 1 jobs" in lines[0] and "(base config)" in lines[1]
    # end to end through the command line: the one job runs and is the only record
    out = cli("backend=sim", "logger=off", "report=false", f"results_dir={tmp_path}/e2e", "method=vocab-1", "vocab=8k")
    assert out.returncode == 0 and "1 jobs, 0 done, 1 to run" in out.stdout, out.stderr
    [rec] = [json.loads(p.read_text()) for p in (tmp_path / "e2e" / "smoke").glob("*.json")]
    assert rec["config"]["method"] == "vocab-1" and rec["config"]["vocab_size"] == 8000


def test_multirun_sweeps_exactly_the_given_values_end_to_end(tmp_path):
    """-m through Hydra's command line: two values give two jobs, checked, dispatched, then skipped as done."""
    args = ["-m", "experiment=paper_1f1b", "backend=sim", "logger=off", "report=false", f"results_dir={tmp_path}",
            "grid.setups=[{model: 4b, run.pp: 8}]", "run.seq_len=2048", "vocab=32k", "method=baseline,vocab-2"]
    out = cli(*args)
    assert out.returncode == 0, out.stderr
    assert "2 jobs, 0 done, 2 to run" in out.stdout
    recs = [json.loads(p.read_text()) for p in (tmp_path / "paper_1f1b").glob("*.json")]
    assert sorted(r["config"]["method"] for r in recs) == ["baseline", "vocab-2"]
    assert cli(*args).stdout.startswith("experiment paper_1f1b: 2 jobs, 2 done, 0 to run")
    bad = cli(*args[:-1], "method=vocab-2,nope")
    assert bad.returncode == 2 and "Could not find 'method/nope'" in bad.stderr
    assert len(list((tmp_path / "paper_1f1b").glob("*.json"))) == 2  # nothing more written


def test_help_shows_the_projects_usage_and_closed_pipes_are_quiet():
    out = cli("--help")
    assert out.returncode == 0 and out.stdout.startswith("python -m harness.sweep [-m]")
    assert "-m method=baseline,vocab-2" in out.stdout and "docs/harness.md" in out.stdout
    piped = subprocess.run(f"{sys.executable} -m harness.sweep dry_run=true | head -2",
                           shell=True, capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert len(piped.stdout.splitlines()) == 2 and "Traceback" not in piped.stderr and "Broken" not in piped.stderr


SMALL = [*TINY, "grid.product.vocab=[2k]", "grid.product.method=[baseline,vocab-2]"]


@pytest.mark.parametrize("overrides,message", [
    (["grid.product.method=[baseline,nope]"], "job 1 (vocab=2k method=nope): In 'config': Could not find 'method/nope'"),
    (["run.pp=3"], "layers=4 cannot be split evenly over the 3 stages"),
    (["vocab.pad_multiple=3"], "pad_multiple=3 is not divisible by the 2 vocabulary shards"),
    (["cluster.max_local_ranks=1"], "run.dp x run.pp x run.tp = 2 local processes but cluster.max_local_ranks=1"),
    (["cluster=slurm"], "cluster.partition is not set; run with cluster=slurm cluster.partition=NAME"),
    (["cluster=slurm", "cluster.partition=debug", "cluster.tasks_per_node=3", "cluster.gpus_per_node=0"],
     "the world of 2 tasks (run.dp x run.pp x run.tp) does not split over nodes of cluster.tasks_per_node=3"),
    (["run.microbatches=0"], "microbatches=0 must be a positive integer"),
    (["run.seq_len=-1"], "seq_len=-1 must be a positive integer"),
    (["model.hidden=0"], "hidden=0 must be a positive integer"),
    (["model.heads=3"], "hidden=64 is not divisible by heads=3"),
    (["model.layers=0"], "layers=0 must be a positive integer"),
    (["model.layers=???"], "model.layers is not set; give it on the command line"),
    (["run.iterations=0"], "iterations=0 must be a positive integer"),
    (["run.warmup=9"], "warmup=9 must be 0..iterations-1"),
    (["run.device=tpu"], "device='tpu' is unknown"),
    (["run.dtype=fp8"], "dtype='fp8' is unknown"),
    (["run.dtype=bf16"], "dtype=bf16 needs device=cuda"),
    (["run.device=cuda"], "run.device=cuda needs 2 GPUs here but 0 are visible"),
    (["backend=quantum"], "backend=quantum is unknown; use one of real, sim"),
    (["logger.mode=loud"], "logger.mode=loud is unknown; use one of offline, online, disabled"),
    (["backend=sim", "hardware.name=tpu9"], "hardware=tpu9 has no built-in profile"),
    (["grid.product.method=[interleaved]", "run.microbatches=3"], "needs a multiple of pp=2; use 4"),
    (["grid.product.method=[redis]", "run.redis_last_layers=9"], "redis_last_layers=9 leaves fewer than one layer"),
    (["vocab.size=1"], "vocab_size=1 is smaller than the 2 vocabulary shards"),
    (["run.lr=0"], "lr=0.0 must be a positive finite number"),
    (["run.timeout_s=0"], "timeout_s=0.0 must be a positive finite number of seconds"),
    (["grid.product.method=[vhalf]", "run.pp=4"], "layers=4 cannot be split evenly over the 8 stages of method=vhalf"),
    (["+grid.shuffle=true"], "grid.shuffle is not a field of grid; its fields are setups, product"),
    (["grid.product.vocab=2k"], "grid.product.vocab=2k: "),
    (["grid.product.seq=[64]"], "grid.product.seq does not exist in grid.product; add it with +grid.product.seq="),
    (["forse=true"], "forse is not a field of the sweep config; did you mean force?"),
    # strings where booleans, numbers and limits belong, and keys that do not exist
    (["force=no2"], "force=no2: Value 'no2' is not a valid bool (type str); force takes a value of type bool"),
    (["dry_run=maybe"], "dry_run=maybe: Value 'maybe' is not a valid bool"),
    (["run.pp=two"], "run.pp=two: Value 'two' of type 'str' could not be converted to Integer; run.pp takes a value "
                     "of type int"),
    (["cluster.timeout_min=0"], "cluster.timeout_min=0 is out of range; use 1..10080"),
    (["cluster=slurm", "cluster.partition=p", "cluster.cpus_per_task=0"], "cluster.cpus_per_task=0 is out of range"),
    (["limits.memory_gb=0"], "limits.memory_gb=0.0 is out of range"),
    (["+run.microbatch=8"], "run.microbatch is not a field of run; did you mean run.microbatches?"),
    (["run.microbatch=8"], "run.microbatch is not a field of run; did you mean run.microbatches?"),
    (["cluster.partition=x"], "cluster.partition is not a field of cluster; its fields are name, max_local_ranks"),
    # resources and sizes
    (["run.seq_len=10000000"], "= 10000000 tokens per microbatch is above the sanity limit of 131072; use a smaller "
                               "seq_len, or raise limits.tokens_per_microbatch"),
    (["limits.memory_gb=0.5"], "GiB are available; use a smaller seq_len, micro_batch_size, microbatches, hidden or "
                               "vocabulary, or set limits.memory_gb"),
    (["backend=sim", "run.pp=1024", "run.microbatches=1024", "model.layers=1024"],
     "is above the schedule size limit of 262144"),
    # the fault spec, checked against the schedule
    (["fault={method: vocab-2, at: '7:F2'}"], "fault rank 7 does not exist: dp=1 x pp=2 has ranks 0..1"),
    (["fault={method: vocab-2, at: '1:F99'}"], "fault action 'F99' is not executed by rank 1 of method=vocab-2"),
    (["fault={method: vocab-2, at: '1:F2:explode'}"], "fault '1:F2:explode': use RANK:ACTION[:exit|raise|hang|oom]"),
    (["fault={method: vocab-2}"], "fault.at is not set"),
    # outputs and launchers
    (["results_dir=/proc/nope"], "results_dir=/proc/nope/smoke: cannot write in /proc"),
    (["grid.setups=[{model: tiny}, {model: small}]", "model=7b"], "model=7b matches none of the experiment's "
                                                                   "setups (model: small, tiny)"),
])
def test_invalid_sweeps_are_refused_before_submission(tmp_path, capsys, overrides, message):
    code, _ = sweep(tmp_path, *SMALL, *overrides)
    err = capsys.readouterr().err
    assert code == 2, err
    assert "sweep refused, nothing was submitted" in err and message in err
    assert not files_under(tmp_path)


def test_refusals_at_the_real_entry_point(tmp_path):
    """Type errors are refused before Hydra's own composition error; Hydra's launchers and sweeper parameters
    are refused with a pointer; -m sweeps only a job's axes; cluster=slurm needs its commands."""
    cases = [(["force=maybe"], "force=maybe: Value 'maybe' is not a valid bool"),
             (["hydra/launcher=submitit_slurm"], "use cluster=slurm cluster.partition=NAME"),
             (["hydra/launcher=submitit_local"], "not by a Hydra launcher"),
             (["hydra.sweeper.params={method: 'a,b'}"], "experiments list their axes in grid.product"),
             (["-m", "experiment=smoke,paper_1f1b"], "experiment is a setting of the whole sweep")]
    for args, message in cases:
        out = cli(*args, f"results_dir={tmp_path}/r", cwd=tmp_path)
        assert out.returncode == 2, (args, out.stderr)
        assert message in out.stderr and "Traceback" not in out.stderr, (args, out.stderr)
    env = {**os.environ, "PATH": str(Path(sys.executable).parent)}  # no sbatch there
    out = subprocess.run([sys.executable, "-m", "harness.sweep", "cluster=slurm", "cluster.partition=debug",
                          "cluster.gpus_per_node=0", *SMALL, f"results_dir={tmp_path}/r"], capture_output=True,
                         text=True, cwd=ROOT, env=env, timeout=120)
    assert out.returncode == 2 and "cluster=slurm needs sbatch, squeue, sinfo, scontrol, scancel on PATH" in out.stderr
    assert "make slurm-up" in out.stderr and not files_under(tmp_path)


def test_a_report_folder_of_other_results_is_not_overwritten(tmp_path):
    grid = ["experiment=paper_1f1b", "backend=sim", "grid.setups=[{model: 4b, run.pp: 8}]", "run.seq_len=2048",
            "vocab=32k", "method=vocab-2"]
    assert sweep(tmp_path, *grid, report=True)[0] == 0
    readme = tmp_path / "reports" / "paper_1f1b" / "README.md"
    before = readme.read_text()
    other = tmp_path / "other"
    code, _ = sweep(other, *grid, report=True, )
    assert code == 0 and (other / "reports" / "paper_1f1b" / "README.md").exists()
    with initialize_config_dir(CONF, version_base="1.3"):
        code = run([f"results_dir={other}/results", f"reports_dir={tmp_path}/reports", "logger=off", *grid])
    assert code == 2 and readme.read_text() == before


def _same_config(fast, full, path="cfg"):
    """The same values (as YAML) and, node by node, the same types and flags (struct, readonly)."""
    if path == "cfg":
        assert OmegaConf.to_yaml(fast) == OmegaConf.to_yaml(full)
    assert (fast._metadata.ref_type, fast._metadata.object_type) == (full._metadata.ref_type,
                                                                      full._metadata.object_type), path
    assert (OmegaConf.is_struct(fast), OmegaConf.is_readonly(fast)) == (OmegaConf.is_struct(full),
                                                                        OmegaConf.is_readonly(full)), path
    if OmegaConf.is_dict(fast):
        assert list(fast.keys()) == list(full.keys()), path
        for key in fast.keys():
            a, b = fast._get_node(key), full._get_node(key)
            assert type(a) is type(b), f"{path}.{key}"
            if OmegaConf.is_config(a) and not (a._is_none() or a._is_missing() or a._is_interpolation()):
                _same_config(a, b, f"{path}.{key}")


def test_jobs_composed_per_group_option_equal_hydras_own_composition():
    """harness.compose.JobComposer (Hydra once per option of model/vocab/method, the option's node put into the config
    of the other choices, the job's values applied as Hydra applies them) gives the config compose_checked(fixed +
    extra) gives, node types and flags included (checked here on jobs of two grids that change one, two and three
    groups at once; every job of every experiment when it was written); what it cannot apply the same way gets
    Hydra's own composition and error."""
    from harness import jobs as J
    from harness.compose import JobComposer, compose_checked

    with initialize_config_dir(CONF, version_base="1.3"):
        # paper_1f1b: job = setup x 16 + seq x 8 + method; setups 0-3 are 4b with 32k..256k, 4 is 10b with 32k,
        # 11 is 21b with 256k: from job 0, job 1 changes the method, 16 the vocabulary, 64 the model, 79 the model and
        # the method, 190 all three
        for fixed, pick in ((["experiment=vp_tp", "backend=sim"], (0, 1, 3, 7)),
                            (["experiment=paper_1f1b", "backend=sim"], (0, 1, 16, 64, 79, 190))):
            extras = [J.grid_overrides(compose_checked(fixed).get("grid"), {})[i] for i in pick]
            compose_job = JobComposer(fixed)
            for extra in extras:
                _same_config(compose_job(extra), compose_checked(fixed + extra))
            # Hydra composed the first job's choices, then once per other option of model, vocab or method
            first = dict(o.split("=", 1) for o in extras[0] if o.split("=")[0] in ("model", "vocab", "method"))
            others = {(k, v) for extra in extras for k, v in (o.split("=", 1) for o in extra) if first.get(k, v) != v}
            assert compose_job.compositions == 1 + len(others)
        compose_job = JobComposer(["experiment=smoke"])
        with pytest.raises(ValueError, match="run.pp=two: .*run.pp takes a value of type int"):
            compose_job(["model=tiny", "run.pp=two"])
        with pytest.raises(ValueError, match="run.extra is not a field of run; its fields are pp, "):
            compose_job(["model=tiny", "+run.extra=1"])
        with pytest.raises(ValueError, match="Could not find 'model/nope'"):
            compose_job(["model=nope"])


def test_a_sweep_composes_its_command_line_once(tmp_path, monkeypatch):
    """run() reads the backend from the composed command line and plans the jobs from that same config: Hydra's
    composing is most of a sweep's start-up (0.3-0.5 s of CPU each time)."""
    import harness.sweep as S

    composed, compose_checked = [], S.compose_checked
    monkeypatch.setattr(S, "compose_checked", lambda overrides: composed.append(overrides) or compose_checked(overrides))
    code, lines = sweep(tmp_path, "dry_run=true", *SMALL)
    assert code == 0 and ": 2 jobs, 0 done, 2 to run" in lines[0]
    assert len(composed) == 1, composed


def test_paper_grid_gives_redis_the_official_final_stage_layers(tmp_path):
    """paper_1f1b: redis leaves the official artifact's N = 4, 3, 2, 0 layers on the last of 8 stages for 32k..256k
    (remainders on the later stages, rank 0 never gains one); the other methods split layers evenly."""
    from harness.sweep import plan

    overrides = [f"results_dir={tmp_path}/results", "experiment=paper_1f1b", "backend=sim", "logger=off", "model=4b"]
    with initialize_config_dir(CONF, version_base="1.3"):
        _, jobs = plan(overrides)
    layers = {(j.run.method, j.run.vocab_size): j.run.stage_layers for j in jobs if j.run.pp == 8}
    assert layers[("redis", 32000)] == [4] * 8
    assert layers[("redis", 64000)] == [4] * 6 + [5, 3]
    assert layers[("redis", 128000)] == [4] * 5 + [5, 5, 2]
    assert layers[("redis", 256000)] == [4] * 3 + [5] * 4 + [0]
    assert layers[("baseline", 256000)] == [4] * 8
    assert all(j.run.redis_last_layers is None for j in jobs if j.run.method != "redis")
