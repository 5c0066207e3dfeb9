# etrain: two commands set up everything from nothing.
#   make demo   venv + pinned deps, then the main job on the embedded local Ray
#   make test   venv + pinned deps + dev extras, then the whole test suite
PYTHON ?= python3.11
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(VENV)/bin/pip
STAMP  := $(VENV)/.installed

.PHONY: demo test test-unit test-integration test-e2e bench clean venv

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip==26.3

# torch is installed first and on its own, pinned to the CPU build on disk; the
# project's own pin (torch==2.13.0) then keeps pip from pulling a CUDA build.
$(STAMP): pyproject.toml | $(PY)
	$(PIP) install --quiet torch==2.13.0
	$(PIP) install --quiet -e '.[dev]'
	touch $(STAMP)

venv: $(STAMP)

demo: $(STAMP)
	$(PY) examples/demo.py

test: $(STAMP)
	$(VENV)/bin/pytest -q

test-unit: $(STAMP)
	$(VENV)/bin/pytest -q tests/unit

test-integration: $(STAMP)
	$(VENV)/bin/pytest -q tests/integration

test-e2e: $(STAMP)
	$(VENV)/bin/pytest -q tests/e2e

bench: $(STAMP)
	$(PY) bench/step_overhead.py

clean:
	rm -rf $(VENV) .etrain-demo .etrain-demo.log .pytest_cache
