# Two commands do all set-up on a fresh machine:
#   make demo   the main demo
#   make test   the test suite (what CI runs)
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: demo test venv bench clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[test]'
	touch $(STAMP)

venv: $(STAMP)

demo: venv
	$(BIN)/python -m examples.demo

test: venv
	scripts/ensure-services.sh
	$(BIN)/python -m pytest -q $(PYTEST_ARGS)

bench: venv
	$(BIN)/python -m pip install -q -e '.[test,bench]'
	$(BIN)/python -m benchmarks.commit

clean:
	rm -rf $(VENV) demo-warehouse .pytest_cache
