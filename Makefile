# finnlite: every target creates/uses its own virtual environment in .venv; nothing is assumed installed.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
JOBS   ?= auto

.PHONY: install run test bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e ".[dev]"
	touch $(STAMP)

install: $(STAMP)

# Streamline the bundled example (a Brevitas-style TFC MLP that finnlite builds itself) and print the summary.
run: $(STAMP)
	$(PY) -m finnlite.examples build-tfc build/example_tfc.onnx
	$(VENV)/bin/finnlite streamline build/example_tfc.onnx -o build/example_tfc_streamlined.onnx

test: $(STAMP)
	$(PY) -m pytest -q -n $(JOBS) tests

bench: $(STAMP)
	$(PY) -m bench

clean:
	rm -rf $(VENV) build .pytest_cache
