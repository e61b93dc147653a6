# finnlite: every target creates/uses its own virtual environment in .venv; nothing is assumed installed.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
JOBS   ?= auto
# the lower bounds of pyproject.toml's dependencies, installed exactly, in a virtual environment of their own
LOWER_VENV ?= .venv-lower
# the quick tests: the core, the ops and the rules, without the zoo and the slow ones (about a minute)
QUICK_TESTS := tests/core tests/custom_ops tests/streamline -m "not slow and not zoo"

.PHONY: install run test test-quick test-lower-bounds notebooks bench clean

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

test-quick: $(STAMP)
	$(PY) -m pytest -q $(QUICK_TESTS)

# Install the dependencies at exactly their declared lower bounds (.ci/lower_bounds.py) and run the quick tests.
test-lower-bounds:
	rm -rf $(LOWER_VENV)
	$(PYTHON) -m venv $(LOWER_VENV)
	$(LOWER_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(LOWER_VENV)/bin/python .ci/lower_bounds.py pyproject.toml > $(LOWER_VENV)/constraints.txt
	$(LOWER_VENV)/bin/python -m pip install --quiet -c $(LOWER_VENV)/constraints.txt -e . "pytest>=8" "hypothesis>=6.100"
	$(LOWER_VENV)/bin/python -m pip list --format=freeze | grep -iE "^(qonnx|onnx|onnx-ir|onnx_ir|onnxruntime|numpy|networkx|pyyaml)=="
	$(LOWER_VENV)/bin/python -m pytest -q -p no:cacheprovider $(QUICK_TESTS)

# Execute the notebooks and store their outputs in them (on the zoo's models where FINNLITE_ZOO has them).
notebooks: $(STAMP)
	$(PY) notebooks/execute.py notebooks/*.ipynb

bench: $(STAMP)
	$(PY) -m bench

clean:
	rm -rf $(VENV) $(LOWER_VENV) build .pytest_cache
