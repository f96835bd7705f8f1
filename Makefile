# Two commands a newcomer needs: `make sweep` and `make test`. The virtual environment is made on first use.
# On a GPU machine choose the torch build, e.g.  make venv TORCH="torch==2.13.0 --index-url https://download.pytorch.org/whl/cu128"
PYTHON ?= python3
VENV ?= .venv
TORCH ?= torch==2.13.0
PY := $(VENV)/bin/python
ARGS ?=

.PHONY: venv test test-fast sweep report paper-tables paper-artifact calibrate-paper bench slurm-up slurm-down clean

venv: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check $(TORCH)
	$(PY) -m pip install --quiet --disable-pip-version-check -e ".[dev]"
	touch $@

test: venv
	$(PY) -m pytest -q tests $(ARGS)

sweep: venv
	$(PY) -m harness.sweep experiment=smoke cluster=local $(ARGS)

report: venv
	$(PY) -m harness.report $(ARGS)

# the paper's tables, predicted with the profile fitted to the official artifact (make calibrate-paper)
PAPER_HW ?= a100_paper
paper-tables: venv
	$(PY) -m harness.sweep experiment=paper_1f1b backend=sim hardware=$(PAPER_HW) logger=off report=false $(ARGS)
	$(PY) -m harness.sweep experiment=paper_vhalf backend=sim hardware=$(PAPER_HW) logger=off report=false $(ARGS)
	$(PY) -m harness.report --experiment paper_1f1b paper_vhalf

# the profile against what it was fitted to (reports/paper_artifact/) and the vocabulary-padding effect
paper-artifact: venv
	$(PY) -m harness.sweep experiment=paper_artifact backend=sim hardware=$(PAPER_HW) logger=off report=false $(ARGS)
	$(PY) -m harness.sweep experiment=vocab_padding backend=sim hardware=$(PAPER_HW) logger=off report=false $(ARGS)
	$(PY) -m harness.report --experiment paper_artifact vocab_padding

# refit conf/hardware/a100_paper.yaml to the artifact's published MFU (after a schedule or cost-model change)
calibrate-paper: venv
	$(PY) -m harness.calibrate --published paper_artifact --name a100_paper
	$(MAKE) paper-artifact

bench: venv
	$(PY) -m vp.bench vocab
	$(PY) -m vp.bench pipeline

slurm-up:
	bash scripts/slurm-up.sh

slurm-down:
	bash scripts/slurm-down.sh

clean:
	rm -rf $(VENV) .pytest_cache
