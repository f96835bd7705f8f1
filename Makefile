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

.PHONY: help venv test sweep report paper-tables claims paper-artifact calibrate-paper plan-check model-check bench gpu-check slurm-up slurm-down clean

help:  ## this list
	@awk 'BEGIN {FS = ":.*## "} /^[a-z-]+:.*## / {printf "  make %-13s %s\n", $$1, $$2}' $(MAKEFILE_LIST)
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
sweep: venv  ## the first sweep: experiment=smoke on CPU processes beside its prediction, then reports/smoke/; CLUSTER=slurm PARTITION=NAME: experiment=gpu
ifneq ($(SLURM_SWEEP),)
	$(PY) -m harness.sweep experiment=$(EXPERIMENT) cluster=$(CLUSTER) \
	    $(if $(PARTITION),cluster.partition=$(PARTITION)) $(ARGS)
else
	profile=$$($(PY) -m harness.calibrate --measure --reuse --print-name) && \
	$(PY) -m harness.sweep experiment=$(EXPERIMENT) cluster=$(CLUSTER) backend=both hardware=$$profile $(ARGS)
endif

report: venv  ## rebuild every report from results/
	$(PY) -m harness.report $(ARGS)

PAPER_HW ?= a100_paper
paper-tables: venv  ## the papers' grids predicted with the cost model (paper_1f1b, paper_vhalf, vp_tp, tp_scaling), and their reports
	$(MAKE) --no-print-directory -j2 sim-paper_1f1b sim-paper_vhalf sim-vp_tp sim-tp_scaling
	$(PY) -m harness.report --experiment paper_1f1b paper_vhalf vp_tp tp_scaling

# one simulated sweep per experiment, two at a time (independent processes and result folders); paper_1f1b, the
# largest, stays whole: its jobs share group choices in pairs (run.seq_len), which halves its composing
sim-paper_1f1b sim-paper_vhalf sim-vp_tp sim-paper_artifact sim-vocab_padding: sim-%: venv
	$(PY) -m harness.sweep experiment=$* backend=sim hardware=$(PAPER_HW) logger=off report=false $(ARGS)
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
	$(PY) -m harness.sweep experiment=paper_artifact backend=sim hardware=$(PAPER_HW) logger=off report=false $(ARGS)
	$(PY) -m harness.sweep experiment=vocab_padding backend=sim hardware=$(PAPER_HW) logger=off report=false $(ARGS)
	$(PY) -m harness.report --experiment paper_artifact vocab_padding

calibrate-paper: venv  ## refit conf/hardware/a100_paper.yaml to the published artifact MFU, then paper-artifact
	$(PY) -m harness.calibrate --published paper_artifact --name a100_paper --overwrite-builtin
	$(MAKE) paper-artifact

PLAN_HW ?=
plan-check: venv  ## plan a small GPT on 4 CPU processes, run the top 5 and bottom 2 for real, print Spearman (PLAN_HW=profile)
	$(PY) -m harness.plancheck $(if $(PLAN_HW),--hardware $(PLAN_HW)) $(ARGS)

model-check: venv  ## the cost model against this machine: smoke, tp_smoke and dp 2 x pp 2 measured and predicted, errors against the targets (ARGS="--rounds 3")
	profile=$$($(PY) -m harness.calibrate --measure --reuse --print-name) && \
	$(PY) -m harness.modelcheck --hardware $$profile $(ARGS)

bench: venv  ## vocabulary-layer and pipeline benchmarks (printed, never asserted)
	$(PY) -m vp.bench vocab
	$(PY) -m vp.bench pipeline

gpu-check:  ## the GPU check (docs/gpu-path.md): scripts/gpu-check.sh with .venv's python if made, else python3
	PYTHON=$(if $(wildcard $(PY)),$(PY),python3) bash scripts/gpu-check.sh $(ARGS)

slurm-up:  ## start SLURM here with two emulated nodes (root; installs slurm-wlm and munge when missing)
	bash scripts/slurm-up.sh

slurm-down:  ## stop it
	bash scripts/slurm-down.sh

clean:  ## remove .venv and pytest's cache
	rm -rf $(VENV) .pytest_cache
