"""The compatibility suite: what every supported Spark line runs (lakestep/streaming/compat.py).

`make test` runs it on the newest Spark with the rest of the Spark lane; `make compat`
(scripts/compat.py) runs this same file on every line of ``compat.TESTED``, each in a virtualenv
of its own. A feature a line lacks is checked there too: its first call raises
:class:`~lakestep.errors.SparkVersionError` naming the version it needs, and the test says which
rule of compat.py it follows. Every check is exact: rows compared as integers and strings.
"""

from __future__ import annotations

import collections
import json
from pathlib import Path
from typing import TYPE_CHECKING, Callable

import pyarrow as pa
import pytest

from lakestep import Catalog
from lakestep.errors import SparkVersionError
from lakestep.query import spark_sql
from lakestep.streaming import compat, foreach_batch
from tests.streaming.test_derived_job import ORDERS, Feed, check_every_barrier, jobs, rows, setup

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from lakestep.testing import TansuBroker

pytestmark = pytest.mark.spark

RAW = pa.schema([("id", pa.int64()), ("name", pa.string())])
HERE = compat.pyspark_version()


def _lacks(feature: str) -> str:
    """The skip reason of a test of ``feature`` on a line that lacks it (compat.FEATURES)."""
    needs, what, _ = compat.FEATURES[feature]
    return f"compat rule {feature!r}: {what} needs Spark {needs[0]}.{needs[1]}; this is {HERE}"


def _refused(excinfo: pytest.ExceptionInfo[BaseException], feature: str) -> None:
    needs = compat.FEATURES[feature][0]
    assert f"needs Spark {needs[0]}.{needs[1]} or newer" in str(excinfo.value), str(excinfo.value)[:2000]


# ------------------------------------------------------------------ every line
def test_derived_levels_and_a_consistent_join_exact_at_every_barrier(spark: SparkSession, tmp_path: Path) -> None:
    """Two roots, two derived levels of DerivedJobs (a join of two aligned sources, a primary-key
    upsert, an overwriting aggregate), every barrier exact; then spark_sql joins a derived table
    with the primary-key one (merged on read) at several barriers, each against plain Python."""
    cat = Catalog(warehouse=str(tmp_path / "wh"))
    p = setup(cat)
    feed, js = Feed(cat, p), jobs(spark, cat)
    for i in range(5):
        feed.step(i)
        for j in js:
            j.run_available()
    last = p.open_epoch() - 1
    assert check_every_barrier(cat, last) == last >= 5
    sql = ("SELECT e.tier, l.customer, SUM(e.cents) AS cents, COUNT(*) AS n FROM s.enriched e "
           "JOIN s.latest l ON e.customer = l.customer GROUP BY e.tier, l.customer")
    for b in (2, 4, last):
        res = spark_sql(spark, cat, sql, barrier=b)
        got = collections.Counter((r["tier"], r["customer"], int(r["cents"]), int(r["n"])) for r in res.df.collect())
        enriched = cat.load_table("s.enriched").to_arrow(version=p.version_at("s.enriched", b)).to_pylist()
        latest = {r["customer"] for r in cat.load_table("s.latest").to_arrow(
            version=p.version_at("s.latest", b)).to_pylist()}
        want: dict[tuple[str, str], list[int]] = {}
        for r in enriched:
            if r["customer"] in latest:
                acc = want.setdefault((r["tier"], r["customer"]), [0, 0])
                acc[0] += r["cents"]
                acc[1] += 1
        assert got == collections.Counter((t, c, s, n) for (t, c), (s, n) in want.items()), f"barrier {b}"
        assert res.paths == {"s.enriched": "native", "s.latest": "python (a primary-key table, merged on read)"}
        res.release()


def _json_files(folder: Path, first: int, count: int, per_file: int = 4) -> list[tuple[int, str]]:
    folder.mkdir(parents=True, exist_ok=True)
    made = []
    for f in range(first, first + count):
        ids = range(f * per_file, (f + 1) * per_file)
        (folder / f"part-{f:04d}.json").write_text("".join(json.dumps({"id": i, "name": f"n{i}"}) + "\n" for i in ids))
        made += [(i, f"n{i}") for i in ids]
    return made


@pytest.mark.parametrize("writer", ["arrow", "spark"])
def test_foreach_batch_exactly_once_across_a_restart(spark: SparkSession, tmp_path: Path, writer: str) -> None:
    """A file stream into ``foreach_batch`` (root job), stopped; the last batch's entry removed
    from Spark's commit log, as when the driver dies between lakestep's commit and Spark's; more
    files; restarted: Spark replays that batch and lakestep does not commit it twice."""
    cat = Catalog(warehouse=str(tmp_path / "wh"))
    cat.create_namespace("s")
    table = cat.create_table("s.raw", RAW)
    src, ck = tmp_path / "in", tmp_path / "ck"
    want = _json_files(src, 0, 3)

    def run() -> None:
        df = spark.readStream.schema("id long, name string").option("maxFilesPerTrigger", 1).json(str(src))
        q = (df.writeStream.foreachBatch(foreach_batch(cat.connection_url(), "s.raw", job="files", writer=writer))
             .option("checkpointLocation", str(ck)).trigger(availableNow=True).start())
        q.awaitTermination(300)
        assert q.exception() is None

    run()
    commits = sorted(ck.glob("commits/[0-9]*"), key=lambda f: int(f.name))
    assert [int(c.name) for c in commits] == [0, 1, 2]
    commits[-1].unlink()  # Spark forgets it finished batch 2; lakestep committed it
    (ck / "commits" / ".2.crc").unlink(missing_ok=True)  # and the checksum Hadoop wrote beside it
    want += _json_files(src, 3, 2)
    run()
    got = table.refresh().to_arrow().to_pylist()
    assert collections.Counter((r["id"], r["name"]) for r in got) == collections.Counter(want)
    assert sorted(c.batch_id for c in table.history() if c.job_id == "files") == [0, 1, 2, 3, 4]


# ------------------------------------------------------------------ by line
def test_register_and_the_lakestep_format(spark: SparkSession, tmp_path: Path) -> None:
    """From Spark 4.0 ``register`` makes ``format("lakestep")`` (batch write, read, time travel);
    on 3.5 it raises SparkVersionError naming 4.0 and what to use instead (compat rule 'format')."""
    from lakestep.streaming import register

    cat = Catalog(warehouse=str(tmp_path / "wh"))
    cat.create_namespace("s")
    cat.create_table("s.t", RAW)
    if not compat.supports("format"):
        with pytest.raises(SparkVersionError) as e:
            register(spark)
        _refused(e, "format")
        assert e.value.feature == "format" and e.value.needs == "4.0" and e.value.found == HERE
        assert "DerivedJob" in str(e.value) and "foreach_batch" in str(e.value)
        return
    register(spark)
    url = cat.connection_url()
    df = spark.createDataFrame([(i, f"n{i}") for i in range(6)], "id long, name string")
    df.write.format("lakestep").option("catalog", url).option("table", "s.t").mode("append").save()
    df.limit(2).write.format("lakestep").option("catalog", url).option("table", "s.t").mode("append").save()
    read = spark.read.format("lakestep").option("catalog", url).option("table", "s.t")
    assert sorted((r.id, r.name) for r in read.load().collect()) == sorted(
        [(i, f"n{i}") for i in range(6)] + [(0, "n0"), (1, "n1")])
    assert sorted(r.id for r in read.option("versionAsOf", "1").load().collect()) == list(range(6))


def test_streaming_sink(spark: SparkSession, tmp_path: Path) -> None:
    """From Spark 4.1 the ``lakestep`` streaming sink commits each micro-batch; on 4.0 a query
    writing to it fails as it starts, with SparkVersionError's message naming 4.1 (rule 'sink')."""
    if not compat.supports("format"):
        pytest.skip(_lacks("format"))
    from lakestep.streaming import register

    register(spark)
    cat = Catalog(warehouse=str(tmp_path / "wh"))
    cat.create_namespace("s")
    table = cat.create_table("s.raw", RAW)
    want = _json_files(tmp_path / "in", 0, 3)
    df = spark.readStream.schema("id long, name string").option("maxFilesPerTrigger", 1).json(str(tmp_path / "in"))
    writer = (df.writeStream.format("lakestep").option("catalog", cat.connection_url()).option("table", "s.raw")
              .option("job", "files").option("checkpointLocation", str(tmp_path / "ck")).trigger(availableNow=True))
    if not compat.supports("sink"):
        with pytest.raises(Exception) as e:
            q = writer.start()
            q.awaitTermination(300)
            if q.exception() is not None:
                raise q.exception()  # type: ignore[misc]
        _refused(e, "sink")
        assert table.refresh().to_arrow().num_rows == 0
        return
    q = writer.start()
    q.awaitTermination(300)
    assert q.exception() is None
    assert collections.Counter((r["id"], r["name"]) for r in table.refresh().to_arrow().to_pylist()) == \
        collections.Counter(want)
    assert sorted(c.batch_id for c in table.history() if c.job_id == "files") == [0, 1, 2]


def test_streaming_source(spark: SparkSession, tmp_path: Path) -> None:
    """From Spark 4.2 the ``lakestep`` streaming source reads a table barrier by barrier into the
    sink; on 4.0 and 4.1 ``register_job`` of a job with sources raises SparkVersionError naming
    4.2, and a query reading the source anyway fails as it starts, naming 4.2 (rule 'source')."""
    if not compat.supports("format"):
        pytest.skip(_lacks("format"))
    from lakestep.streaming import register, register_job

    register(spark)
    cat = Catalog(warehouse=str(tmp_path / "wh"))
    p = setup(cat)
    cat.create_table("s.copy", ORDERS)
    feed = Feed(cat, p)
    for i in range(4):
        feed.step(i)
    url = cat.connection_url()
    src = spark.readStream.format("lakestep").option("catalog", url).option("table", "s.orders").option("job", "copy")
    if not compat.supports("source"):
        with pytest.raises(SparkVersionError) as refused:  # the first call of ours: typed
            register_job(url, "copy", sources=["s.orders"], sinks=["s.copy"])
        _refused(refused, "source")
        assert refused.value.needs == "4.2" and "DerivedJob" in str(refused.value)
        p.register_job("copy", sources=["s.orders"], sinks=["s.copy"])  # and a query started anyway
        with pytest.raises(Exception) as e:
            q = (src.load().writeStream.foreachBatch(lambda df, b: None)
                 .option("checkpointLocation", str(tmp_path / "ck")).trigger(availableNow=True).start())
            q.awaitTermination(300)
            if q.exception() is not None:
                raise q.exception()  # type: ignore[misc]
        _refused(e, "source")
        return
    register_job(url, "copy", sources=["s.orders"], sinks=["s.copy"])
    q = (src.load().writeStream.format("lakestep").option("catalog", url).option("table", "s.copy")
         .option("job", "copy").option("checkpointLocation", str(tmp_path / "ck")).trigger(availableNow=True).start())
    q.awaitTermination(300)
    assert q.exception() is None
    last = p.open_epoch() - 1
    assert p.job_frontier("copy") == last
    orders = cat.load_table("s.orders").to_arrow(version=p.version_at("s.orders", last))
    assert rows(cat.load_table("s.copy").to_arrow(), ORDERS.names) == rows(orders, ORDERS.names)


@pytest.mark.kafka
def test_kafka(spark: SparkSession, kafka_broker: TansuBroker, kafka_topic_name: Callable[[], str],
               tmp_path: Path) -> None:
    """From Spark 4.2 ``ingest`` lands every record of a topic once; before, ``ingest`` raises
    SparkVersionError naming 4.2 (rule 'kafka'); on 4.0 and 4.1 a batch read of
    ``lakestep-kafka`` still reads every record (batch reads need no admission control)."""
    from lakestep.streaming.kafka import ingest
    from tests.streaming.kafka_helpers import produce_per_partition

    topic = kafka_topic_name()
    kafka_broker.create_topic(topic, partitions=2)
    expected = produce_per_partition(kafka_broker, topic, [30, 17])
    cat = Catalog(warehouse=str(tmp_path / "wh"))
    cat.create_namespace("k")
    schema = pa.schema([("value", pa.binary()), ("partition", pa.int64()), ("offset", pa.int64())])
    table = cat.create_table("k.events", schema)
    options = {"kafka.bootstrap.servers": kafka_broker.bootstrap_servers, "subscribe": topic,
               "startingOffsets": "earliest", "maxOffsetsPerTrigger": 20}
    if not compat.supports("kafka"):
        with pytest.raises(SparkVersionError) as e:
            ingest(spark, cat.connection_url(), "k.events", options, job="raw")
        _refused(e, "kafka")
        assert e.value.needs == "4.2" and "spark-sql-kafka" in str(e.value)
        if compat.supports("format"):
            from lakestep.streaming.kafka import register_kafka_source

            register_kafka_source(spark)
            got = spark.read.format("lakestep-kafka").option("kafka.bootstrap.servers", kafka_broker.bootstrap_servers) \
                .option("subscribe", topic).load().collect()
            assert {(r.partition, r.offset): bytes(r.value) for r in got} == expected
        return
    q = (ingest(spark, cat.connection_url(), "k.events", options, job="raw")
         .option("checkpointLocation", str(tmp_path / "ck")).trigger(availableNow=True).start())
    q.awaitTermination(300)
    assert q.exception() is None
    landed = table.refresh().to_arrow().to_pylist()
    assert {(r["partition"], r["offset"]): r["value"] for r in landed} == expected and len(landed) == 47
