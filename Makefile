# Every target bootstraps .venv from pyproject.toml; it is rebuilt when pyproject.toml or the
# constraints file changes.
PYTHON ?= python3
VENV ?= .venv
# CPU machines pin the local CPU build of torch; GPU CI overrides this (e.g. CONSTRAINTS=) to keep its CUDA torch.
CONSTRAINTS ?= constraints/cpu.txt
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
PYTEST_WORKERS ?= auto

.PHONY: venv test test-gpu report bench clean

venv: $(STAMP)

$(STAMP): pyproject.toml $(CONSTRAINTS)
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet $(if $(CONSTRAINTS),-c $(CONSTRAINTS)) -e .
	touch $(STAMP)

test: $(STAMP)
	$(PY) -m pytest -n $(PYTEST_WORKERS)

test-gpu: $(STAMP)
	$(PY) -m pytest -m gpu --harness-device=cuda

report: $(STAMP)
	$(PY) -m harness report

bench: $(STAMP)
	$(PY) -m harness.bench

clean:
	rm -rf $(VENV) .bench
