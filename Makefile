# minimodel: `make demo` runs the bundled demo end to end, `make test` runs the tests.
# Both create .venv and install what they need (a pinned CPU-or-CUDA torch first, then the package).

PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
TORCH_SPEC ?= torch==2.13.0
EXP ?= experiments/tiny.yaml
ARGS ?=

.PHONY: setup test test-fast demo tiny clean-runs help

help:
	@echo "make demo   - tiny MiniJoint on the bundled real English corpus (CPU, minutes)"
	@echo "make test   - the test suite (CPU)"
	@echo "make setup  - create $(VENV) and install minimodel with its dev and hf extras"

$(BIN)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q "$(TORCH_SPEC)"
	$(BIN)/python -m pip install -q -e ".[dev,hf]"
	@touch $@

setup: $(BIN)/.installed

test: setup
	$(BIN)/python -m pytest -q tests

test-fast: setup
	$(BIN)/python -m pytest -q -m "not slow" tests

demo: setup
	$(BIN)/minimodel prepare $(EXP) --langs en $(ARGS)
	$(BIN)/minimodel pretrain $(EXP) $(ARGS)

clean-runs:
	rm -rf runs/tiny runs/prepared/tiny
