# Two commands do all set-up on a fresh machine:
#   make demo   the main demo: the streaming shopping pipeline (Kafka -> orders -> aggregates -> dashboard);
#               DEMO_ARGS='--seconds 60' reads the dashboard longer
#   make test   the test suite (what CI runs), within 25 minutes on 2 cores (tests/budget.py)
# Also: make test-long (the endurance runs make test leaves out), make tour (a tour of the catalog, no Spark), make bench, make mutate (a mutation run; not in make test).
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: demo tour test test-long venv bench mutate clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[test]'
	touch $(STAMP)

venv: $(STAMP)

demo: venv
	scripts/ensure-services.sh --java-only
	$(BIN)/python -m examples.shopping $(DEMO_ARGS)

tour: venv
	$(BIN)/python -m examples.demo

test: venv
	scripts/ensure-services.sh
	$(BIN)/python scripts/test.py -q $(PYTEST_ARGS)

# The endurance runs `make test` leaves out (marked `long`: soaks, torture runs, the biggest scale
# curves, crash runs with more kills); `make test` runs a short version of each.
test-long: venv
	scripts/ensure-services.sh
	$(BIN)/python scripts/test.py --long -q $(PYTEST_ARGS)

# A mutation run over catalog/commit.py, catalog/resolver.py, catalog/predicates.py, barrier/rules.py and barrier/facts.py
# (scripts/mutate.py):
# long (minutes per target), not part of `make test`. MUTATE_ARGS='--target lakestep/barrier/rules.py'.
mutate: venv
	$(BIN)/python scripts/mutate.py $(MUTATE_ARGS)

bench: venv
	$(BIN)/python -m pip install -q -e '.[test,bench]'
	$(BIN)/python -m benchmarks.commit
	$(BIN)/python -m benchmarks.lifecycle
	$(BIN)/python -m benchmarks.barrier
	$(BIN)/python -m benchmarks.streaming
	$(BIN)/python -m benchmarks.query
	$(BIN)/python -m benchmarks.freshness
	$(BIN)/python -m benchmarks.publish
	$(BIN)/python -m benchmarks.tpch
	# last: it exits 1 when a scale target is missed (2 cores miss the 32-writer latencies)
	$(BIN)/python -m benchmarks.scale

clean:
	rm -rf $(VENV) demo-warehouse .pytest_cache
