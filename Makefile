# Two commands a newcomer needs: `make sweep` and `make test` (`make help` lists the rest). The virtual
# environment is made on first use. On a GPU machine choose the torch build, e.g.
#   make venv TORCH="torch==2.13.0 --index-url https://download.pytorch.org/whl/cu128"
# (a different TORCH than the installed one reinstalls torch).
PYTHON ?= python3
VENV ?= .venv
TORCH ?= torch==2.13.0
PY := $(VENV)/bin/python
ARGS ?=
# one stamp per requested torch: asking for another build makes it out of date
TORCH_STAMP := $(VENV)/.torch-$(shell printf '%s' '$(TORCH)' | cksum | cut -d' ' -f1)

.PHONY: help venv test sweep plan report dashboard paper-tables claims paper-artifact gpu-check calibrate-paper plan-check model-check bench slurm-up slurm-down clean

# Make variables are the Hydra keys in capitals (EXPERIMENT= is experiment=, HARDWARE= is hardware=, ...). Renamed
# ones (vp/renamed.py MAKE_VARIABLES) are refused for one release with a pointer to the new name.
RENAMED_VARIABLES := PLAN_HW:HARDWARE PAPER_HW:HARDWARE
$(foreach r,$(RENAMED_VARIABLES),$(if $(filter-out undefined,$(origin $(firstword $(subst :, ,$(r))))),\
  $(error $(firstword $(subst :, ,$(r))) is renamed $(lastword $(subst :, ,$(r))): write $(lastword $(subst :, ,$(r)))=NAME)))

# `## ` marks a user's entry point, `##dev ` a maintainer's tool: make help lists them apart
help:  ## this list
	@echo "Entry points:"
	@awk 'BEGIN {FS = ":.*## "} /^[a-z-]+:.*## / {printf "  make %-15s %s\n", $$1, $$2}' $(MAKEFILE_LIST)
	@echo "Maintainer tools (dev):"
	@awk 'BEGIN {FS = ":.*##dev "} /^[a-z-]+:.*##dev / {printf "  make %-15s %s\n", $$1, $$2}' $(MAKEFILE_LIST)
	@echo "  (ARGS=... passes overrides or flags to the command; docs: README.md, docs/harness.md, docs/design.md)"

venv: $(TORCH_STAMP)  ## make .venv (torch from TORCH=..., then this project with its dependencies)

$(TORCH_STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	if [ -e $@ ]; then :; elif ls $(VENV)/.torch-* >/dev/null 2>&1; then \
	    rm -f $(VENV)/.torch-*; \
	    $(PY) -m pip install --quiet --disable-pip-version-check --force-reinstall $(TORCH); \
	else \
	    $(PY) -m pip install --quiet --disable-pip-version-check $(TORCH); \
	fi
	$(PY) -m pip install --quiet --disable-pip-version-check -e ".[dev]"
	$(PY) -m vp.schedule compile
	touch $@

# the suite on 3 pytest-xdist processes (2 cores: tests spend much of their time waiting on the processes they start;
# the SLURM tests, the gloo-pool tests and the tests sharing a module's fixture each stay on one of them, one after
# another: tests/conftest.py GROUPS); TEST_WORKERS=0 runs it in this process, one test at a time
TEST_WORKERS ?= 3
test: venv  ## the test suite on 3 processes (ARGS="-k name" to pick; TEST_WORKERS=0: one process)
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadgroup tests $(ARGS)

# make sweep: the CPU smoke sweep here, run for real and predicted with this machine's measured profile (measured once,
# then reused); make sweep CLUSTER=slurm PARTITION=NAME (or ARGS="cluster=slurm ..."): the GPU default experiment
# (gpu) through SLURM; EXPERIMENT=NAME picks another
CLUSTER ?= local
PARTITION ?=
SLURM_SWEEP := $(filter slurm,$(CLUSTER))$(filter cluster=slurm,$(ARGS))
EXPERIMENT ?= $(if $(SLURM_SWEEP),gpu,smoke)
# refused before anything starts (the local sweep calibrates first): a cluster name that does not exist, and PARTITION
# without CLUSTER=slurm (it would be ignored)
SWEEP_REFUSAL := $(if $(filter-out local slurm,$(CLUSTER)),CLUSTER=$(CLUSTER) is not a cluster: use CLUSTER=local \
  (the default) or CLUSTER=slurm PARTITION=NAME,$(if $(and $(PARTITION),$(if $(SLURM_SWEEP),,x)),PARTITION=$(PARTITION) \
  applies to SLURM sweeps only: add CLUSTER=slurm or drop PARTITION))
sweep: venv  ## the first sweep: experiment=smoke on CPU processes beside its prediction, then reports/smoke/; CLUSTER=slurm PARTITION=NAME: experiment=gpu
ifneq ($(SWEEP_REFUSAL),)
	@echo "make sweep refused, nothing was started: $(SWEEP_REFUSAL)" >&2; exit 2
else ifneq ($(SLURM_SWEEP),)
	$(PY) -m harness.sweep experiment=$(EXPERIMENT) cluster=$(CLUSTER) $(if $(PARTITION),cluster.partition=$(PARTITION)) $(ARGS)
else
	profile=$$($(PY) -m harness.calibrate --measure --reuse --print-name) && \
	$(PY) -m harness.sweep experiment=$(EXPERIMENT) cluster=$(CLUSTER) backend=both hardware=$$profile $(ARGS)
endif

LOGGER ?= wandb
report: venv  ## rebuild every report from results/, log it and the records W&B lacks to W&B (LOGGER=off: not)
	$(PY) -m harness.report --logger $(LOGGER) $(ARGS)

dashboard: venv  ## save the W&B workspace of an experiment (EXPERIMENT=smoke); online only: wandb login, wandb sync first
	$(PY) -m harness.dashboard experiment=$(EXPERIMENT) $(ARGS)

# HARDWARE=NAME: the profile of the predicting targets (paper-tables, paper-artifact: a100_paper; plan-check,
# model-check: this machine's measured one; plan: the plan's hardware=)
HARDWARE ?=
PAPER_HARDWARE := $(or $(HARDWARE),a100_paper)

plan: venv  ## plan a run before GPU hours are spent (ARGS="model=70b vocab=256k plan.gpus=64 plan.global_batch=512", HARDWARE=h100)
	$(PY) -m harness.plan $(if $(HARDWARE),hardware=$(HARDWARE)) $(ARGS)

paper-tables: venv  ## the papers' grids predicted with the cost model (paper_1f1b, paper_vhalf, vp_tp, tp_scaling), and their reports
	$(MAKE) --no-print-directory -j2 sim-paper_1f1b sim-paper_vhalf sim-vp_tp sim-tp_scaling
	$(PY) -m harness.report --experiment paper_1f1b paper_vhalf vp_tp tp_scaling

# one simulated sweep per experiment, two at a time (independent processes and result folders); paper_1f1b, the
# largest, stays whole: its jobs share group choices in pairs (run.seq_len), which halves its composing
sim-paper_1f1b sim-paper_vhalf sim-vp_tp sim-paper_artifact sim-vocab_padding: sim-%: venv
	$(PY) -m harness.sweep experiment=$* backend=sim hardware=$(PAPER_HARDWARE) logger=off report=false $(ARGS)
sim-tp_scaling: venv
	$(PY) -m harness.sweep experiment=tp_scaling backend=sim logger=off report=false $(ARGS)

claims: venv  ## every reproducible claim of both papers beside the simulated figure (reports/claims/README.md)
	$(MAKE) --no-print-directory -j2 sim-paper_1f1b sim-paper_vhalf sim-paper_artifact sim-vocab_padding sim-tp_scaling \
		sim-tp_scaling-4pn
	$(PY) -m harness.report.claims

# the 2.5-D paper's testbed is not known: its grid also on A100s 4 to a node (tp_scaling has 8 to a node)
sim-tp_scaling-4pn: venv
	$(PY) -m harness.sweep experiment=tp_scaling backend=sim logger=off report=false 'grid.product.hardware=[a100_4pn]' $(ARGS)

paper-artifact: venv  ## a100_paper against the published artifact MFU, and the vocabulary-padding effect
	$(PY) -m harness.sweep experiment=paper_artifact backend=sim hardware=$(PAPER_HARDWARE) logger=off report=false $(ARGS)
	$(PY) -m harness.sweep experiment=vocab_padding backend=sim hardware=$(PAPER_HARDWARE) logger=off report=false $(ARGS)
	$(PY) -m harness.report --experiment paper_artifact vocab_padding

calibrate-paper: venv  ##dev refit conf/hardware/a100_paper.yaml to the published artifact MFU, then paper-artifact
	$(PY) -m harness.calibrate --published paper_artifact --name a100_paper --overwrite-builtin
	$(MAKE) paper-artifact

plan-check: venv  ##dev plan a small GPT on 4 CPU processes, run the top 5 and bottom 2 for real, print Spearman (HARDWARE=profile)
	$(PY) -m harness.plan_check $(if $(HARDWARE),--hardware $(HARDWARE)) $(ARGS)

model-check: venv  ##dev the cost model against this machine: smoke, tp_smoke and dp 2 x pp 2 measured and predicted, errors against the targets (ARGS="--rounds 3")
	profile=$(or $(HARDWARE),$$($(PY) -m harness.calibrate --measure --reuse --print-name)) && \
	$(PY) -m harness.model_check --hardware $$profile $(ARGS)

bench: venv  ##dev vocabulary-layer and pipeline benchmarks (printed, never asserted)
	$(PY) -m vp.bench vocab
	$(PY) -m vp.bench pipeline

gpu-check:  ## the GPU check (docs/gpu-path.md): scripts/gpu-check.sh with .venv's python if made, else python3
	PYTHON=$(if $(wildcard $(PY)),$(PY),python3) bash scripts/gpu-check.sh $(ARGS)

slurm-up:  ##dev start SLURM here with two emulated nodes (root; installs slurm-wlm and munge when missing)
	bash scripts/slurm-up.sh

slurm-down:  ##dev stop it
	bash scripts/slurm-down.sh

clean:  ##dev remove .venv and pytest's cache
	rm -rf $(VENV) .pytest_cache
