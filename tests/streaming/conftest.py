"""Fixtures for the Spark / Kafka tests.

* ``spark``: one local Spark session (``local[2]``) for the whole test run,
  shared by every streaming test. Tests must not stop it or change its global
  configuration; use unique query names / temp directories per test.
* ``kafka_broker``: one in-memory tansu broker (:class:`TansuBroker`) for the
  whole run. Tests create their own uniquely named topics
  (``kafka_topic_name``) so they never see each other's records.
"""

from __future__ import annotations

import os
import shutil
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterator

import pytest

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from lakestep.testing import TansuBroker

REPO_ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def spark(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SparkSession]:
    """A quiet local Spark session: 2 cores, 2 shuffle partitions, no UI, UTC."""
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        pytest.fail("Spark tests need Java 17+ (java on PATH or JAVA_HOME)")
    from lakestep.testing.spark import local_session

    # Python workers must run this interpreter (pyarrow, kafka-python) and be able
    # to import lakestep, which Python data sources are pickled by reference to.
    base = tmp_path_factory.mktemp("spark")
    session = local_session(
        "lakestep-tests", base, pythonpath=REPO_ROOT,
        # C1-only JIT: a test run is short-lived, so quick warm-up beats peak speed.
        jvm_options="-XX:TieredStopAtLevel=1 -XX:+UseSerialGC",
        conf={"spark.sql.warehouse.dir": str(base / "warehouse"),
              "spark.sql.streaming.forceDeleteTempCheckpointLocation": "true",
              "spark.sql.streaming.stopTimeout": "30s"})
    try:
        yield session
    finally:
        for query in session.streams.active:
            query.stop()
        session.stop()


@pytest.fixture(scope="session")
def kafka_spark(spark: SparkSession) -> SparkSession:
    """The ``spark`` session with the ``lakestep-kafka`` source registered."""
    from lakestep.streaming.kafka.source import register_kafka_source

    register_kafka_source(spark)
    return spark


@pytest.fixture
def every_trigger(spark: SparkSession) -> Iterator[SparkSession]:
    """The shared session, ``lakestep`` and ``lakestep-kafka`` registered, whose streaming queries
    started during the test put every trigger in their progress, also the ones that plan no
    batch (Spark reports those at most every 10 s by default); the setting is put back after.
    (Not a session of its own: a session made by ``newSession()`` after ``lakestep`` was
    registered refuses it as existing yet does not find ``lakestep-kafka``, Spark 4.3.)"""
    from lakestep.streaming import register

    key = "spark.sql.streaming.noDataProgressEventInterval"
    register(spark)
    old = spark.conf.get(key, None)
    spark.conf.set(key, "0")
    try:
        yield spark
    finally:
        if old is None:
            spark.conf.unset(key)
        else:
            spark.conf.set(key, old)


@pytest.fixture(scope="session")
def kafka_broker() -> Iterator[TansuBroker]:
    """An in-memory tansu broker on a free loopback port, for the whole run."""
    from lakestep.testing import TansuBroker

    with TansuBroker() as broker:
        yield broker


@pytest.fixture
def own_broker() -> Iterator[TansuBroker]:
    """A broker of this test's own: tansu creates a topic that any Fetch names, so a consumer
    left polling by another test of the session could bring a deleted topic back."""
    from lakestep.testing import TansuBroker

    with TansuBroker() as broker:
        yield broker


@pytest.fixture
def kafka_topic_name(request: pytest.FixtureRequest) -> Callable[[], str]:
    """Returns a function making topic names unique to this test."""
    base = "".join(c if c.isalnum() else "-" for c in request.node.name)[:40]

    def make() -> str:
        return f"{base}-{uuid.uuid4().hex[:8]}"

    return make
