"""The suite's time budget: what `make test` may spend, and the tests allowed to be slow.

`make test` (scripts/test.py) must finish within 25 minutes on the 2-core machine. To keep it
there, no single test may take more than :data:`LIMIT_S` seconds (setup, call and teardown added up,
as pytest measured them in that run), unless :data:`ALLOWED` names it with the reason it must be
slow. tests/test_budget.py checks every run's durations against this after the lanes finish.

Long endurance runs do not belong in `make test` at all: they are marked ``long`` and run by
`make test-long`; `make test` runs a short version of each.
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

LIMIT_S = 60.0
"""No test outside :data:`ALLOWED` may take longer than this (seconds, all phases)."""

BUDGET_MIN = 25
"""`make test`'s budget in minutes, wall time, on the 2-core machine (README, "Two commands")."""

ALLOWED: dict[str, str] = {
    # nodeid (or a prefix of it, ending before the parameters) -> why it must take over LIMIT_S.
    "tests/test_habits.py::test_mypy_passes":
        "mypy type-checks every module of lakestep/ and what they import: ~30 s alone from an empty cache "
        "(a fresh clone); about 1 s once .mypy_cache holds the last run",
    # Spark applications started, killed and started again: each start is a JVM of its own.
    "tests/streaming/test_exactly_once.py::test_exactly_once_across_crashes":
        "two Spark applications per backend, the first SIGKILLed between a commit and Spark's commit log",
    "tests/streaming/test_derived_job.py::test_killed_and_restarted_exactly_once":
        "three Spark applications in a row, two killed by failpoints at different commit steps",
    "tests/streaming/test_outage.py::test_a_streaming_pipeline_survives_its_catalog_database_going_away":
        "a Spark pipeline keeps running through a 12 s outage of its database, then drains",
    "tests/streaming/test_cluster.py::test_readme_cluster_commands_run":
        "the README's cluster commands as written: spark-submit to a standalone cluster, a three-level pipeline",
    "tests/streaming/test_cluster.py::test_exactly_once_when_a_worker_dies_mid_batch":
        "a three-level pipeline on a standalone cluster, a worker SIGKILLed mid-batch and replaced",
    "tests/streaming/test_cluster.py::test_spark_writer_counts_rows_on_a_cluster":
        "the first test of the module starts the standalone cluster (a master and two workers)",
    # Restarts are the point: a streaming join stopped and started again in the shared session, each
    # start planning its lakestep sources anew (measured 51 s and, with three restarts, 67 s here).
    "tests/streaming/test_restarts.py::test_restart_after_the_old_run_asked_more_often":
        "the join query started twice, the first run held until it asked four times at barrier 0",
    "tests/streaming/test_restarts.py::test_join_survives_restarts_at_random_moments":
        "the join query stopped and started again at two random moments, each barrier then checked",
    # The entry points a user runs, run as a user runs them: a Spark application each.
    "tests/test_demo.py::test_shopping_demo_end_to_end":
        "make demo's pipeline in its short mode: Spark, Kafka, three jobs, Iceberg publishing",
    "tests/test_benchmarks.py::test_streaming_benchmark_runs":
        "benchmarks.streaming's sink and barrier sections in one Spark application: queries started and stopped",
    "tests/test_benchmarks.py::test_freshness_benchmark_runs":
        "a three-level Kafka pipeline in a Spark application of its own, measured until every record is seen",
    "tests/test_benchmarks.py::test_scale_benchmark_runs":
        "every curve of benchmarks.scale on both backends: fixed costs (processes, peers) dominate, not sizes",
    "tests/test_benchmarks.py::test_publish_benchmark_runs":
        "benchmarks.publish --quick on both backends: publisher rounds and readers, measured 48 s here",
    "tests/test_soak.py::test_a_three_minute_run_with_faults_passes":
        "benchmarks.soak's 3-minute run with faults (issue 46): eight processes, three Spark applications, "
        "every kind of fault once; measured 188 s in a fresh clone's make test",
    "tests/test_benchmarks.py::test_jvm_peers_benchmark_runs":
        "two Spark applications (lakestep's and the JVM peers' Spark 4.1 with Delta and Iceberg), five ingest runs",
    "tests/test_docs.py::test_readme_python_blocks_run":
        "every README and docs/iceberg.md Python block, each twice in a process of its own (re-runnable)",
    "tests/test_compat_lane.py::test_the_compatibility_suite_passes_on_spark_3_5":
        "a Spark 3.5 application in a virtualenv of its own (made once, ~60 s; the download first)",
    # The first test of the module asks the JVM peer's Spark (its own virtualenv and jars) every query once,
    # after publishing a shop on each backend.
    "tests/interop/test_spark_iceberg.py::test_rest_catalog_pinned_warehouses_give_lakesteps_rows":
        "a Spark 4.1 application with Iceberg's runtime reading both backends' shops through REST and JDBC",
    # Property tests whose example counts are their strength (kept unless a smaller count is
    # shown to kill the same mutants, scripts/mutate.py).
    "tests/barrier/test_simulation.py::test_simulation_sqlite":
        "200 generated programs against the real catalog, each checking every isolation level",
    "tests/barrier/test_rules.py::test_fast_paths_agree_with_the_rules_sqlite":
        "40 generated topologies and programs, each answer of the fast paths checked against the rules "
        "at every scope (measured 44-67 s)",
    "tests/barrier/test_simulation.py::test_simulation_postgres":
        "20 generated programs, each on a fresh PostgreSQL catalog schema",
    "tests/iceberg/test_publish.py::test_every_kind_of_change":
        "every kind of change published and read back on S3 (moto's server): an HTTP request per object",
    # Crash-recovery matrices: a process per kill point.
    "tests/iceberg/test_crash.py::test_killed_at_every_step_then_rerun":
        "half of the publisher's kill points per backend, each a killed process and a rerun process",
}


def load(files: list[Path]) -> dict[str, float]:
    """Each test's total duration (setup + call + teardown) from the lanes' duration files
    (tests/conftest.py ``pytest_runtest_logreport``)."""
    totals: dict[str, float] = defaultdict(float)
    for path in files:
        for line in path.read_text().splitlines():
            if line.strip():
                row = json.loads(line)
                totals[row["nodeid"]] += float(row["duration"])
    return dict(totals)


def allowed(nodeid: str) -> bool:
    return any(nodeid == key or nodeid.startswith(key + "[") for key in ALLOWED)


def over_budget(totals: dict[str, float], limit: float = LIMIT_S) -> list[tuple[str, float]]:
    """The tests that took longer than ``limit`` and are not allowed to, slowest first."""
    return sorted(((n, d) for n, d in totals.items() if d > limit and not allowed(n)),
                  key=lambda nd: -nd[1])
