# Two commands do all set-up on a fresh machine:
#   make demo   the main demo: the streaming shopping pipeline (Kafka -> orders -> aggregates -> dashboard);
#               DEMO_ARGS='--seconds 60' reads the dashboard longer
#   make test   the test suite (what CI runs), within 25 minutes on 2 cores (tests/budget.py)
# Also: make test-long (the endurance runs make test leaves out), make compat (every Spark line, 3.5 to 4.3), make tour (a tour of the catalog, no Spark), make bench, make mutate (a mutation run; not in make test).
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: demo tour test test-long compat jars interop venv bench mutate clean

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

# The compatibility suite on every supported Spark line (lakestep/streaming/compat.py), each in a
# virtualenv of its own (.venv-spark-3.5, ...; made once, ~300 MB of pyspark each): scripts/compat.py.
# COMPAT_ARGS='--only 3.5 4.0' runs some lines.
compat: venv
	scripts/ensure-services.sh
	$(BIN)/python scripts/compat.py $(COMPAT_ARGS)

# The JVM peers' jars (jars/pom.xml: Spark's Kafka source, Iceberg's Spark runtime, Delta Lake, the JDBC
# drivers) into .jars/ with mvn, and their Spark's virtualenv (.venv-spark-4.1): scripts/jars.py. Cached.
jars: venv
	scripts/ensure-services.sh
	$(BIN)/python scripts/jars.py --peer

# Every JVM engine that reads lakestep's tables (tests/interop), on both catalog backends; Trino's
# server (scripts/trino.py: fetched and unpacked into .jars/trino-476 on first use, about 820 MB) too.
interop: jars
	LAKESTEP_TEST_TRINO=1 LAKESTEP_TEST_LANES=1 $(BIN)/python scripts/test.py -q tests/interop $(PYTEST_ARGS)

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
	rm -rf $(VENV) .venv-spark-* demo-warehouse .pytest_cache
