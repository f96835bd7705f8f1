# Two commands a newcomer needs: `make sweep` and `make test`. The virtual environment is made on first use.
# On a GPU machine choose the torch build, e.g.  make venv TORCH="torch==2.13.0 --index-url https://download.pytorch.org/whl/cu128"
PYTHON ?= python3
VENV ?= .venv
TORCH ?= torch==2.13.0
PY := $(VENV)/bin/python
ARGS ?=

.PHONY: venv test test-fast sweep report paper-tables bench gpu-check slurm-up slurm-down clean

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

paper-tables: venv
	$(PY) -m harness.sweep experiment=paper_1f1b backend=sim logger=off report=false $(ARGS)
	$(PY) -m harness.sweep experiment=paper_vhalf backend=sim logger=off report=false $(ARGS)
	$(PY) -m harness.report --experiment paper_1f1b paper_vhalf

bench: venv
	$(PY) -m vp.bench vocab
	$(PY) -m vp.bench pipeline

# the prepared check of the GPU path (docs/gpu-path.md): needs a CUDA build of torch (TORCH=... above)
gpu-check: venv
	$(PY) -m harness.gpucheck $(ARGS)

slurm-up:
	bash scripts/slurm-up.sh

slurm-down:
	bash scripts/slurm-down.sh

clean:
	rm -rf $(VENV) .pytest_cache
