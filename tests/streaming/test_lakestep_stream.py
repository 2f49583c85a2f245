"""The lakestep format in real Spark: root sink, derived jobs, aligned sources."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pytest
import sqlalchemy as sa
from pyspark.errors import StreamingQueryException

from lakestep.barrier import OPEN_EPOCH, Pipeline
from lakestep.catalog import schema as S
from lakestep.services import Coordinator
from lakestep.streaming import register, register_job
from lakestep.testing.spark import root_and_derived
from tests.waiting import died, wait_until

pytestmark = pytest.mark.spark


def test_root_sink_exactly_once_with_epochs(spark, catalog_spec, tmp_path) -> None:  # type: ignore[no-untyped-def]
    cat = catalog_spec.open()
    cat.create_namespace("s")
    raw = cat.create_table("s.raw", pa.schema([("id", pa.int64()), ("v", pa.string())]))
    register(spark)
    df = spark.readStream.format("rate").option("rowsPerSecond", 50).load().selectExpr(
        "value AS id", "CAST(value AS STRING) AS v")
    q = (df.writeStream.format("lakestep").option("catalog", catalog_spec.url).option("table", "s.raw")
         .option("job", "ingest").option("checkpointLocation", str(tmp_path / "ck"))
         .trigger(processingTime="500 milliseconds").start())
    try:
        wait_until(lambda: raw.count() >= 100, "100 rows", interval=0.3, failed=died(q))
    finally:
        q.stop()
    ids = raw.to_arrow().column("id").to_pylist()
    assert len(ids) == len(set(ids)) and sorted(ids) == list(range(len(ids)))
    hist = [h for h in raw.history() if h.operation == "APPEND"]
    assert hist and all(h.barrier == 1 and h.job_id == "ingest" for h in hist)  # the open epoch, idempotent key
    assert Pipeline(cat).topology.job("ingest").external_input
    cat.close()


def test_schema_mismatch_is_refused(spark, catalog_spec, tmp_path) -> None:  # type: ignore[no-untyped-def]
    cat = catalog_spec.open()
    cat.create_namespace("s")
    t = cat.create_table("s.typed", pa.schema([("id", pa.int64()), ("when", pa.timestamp("us", tz="UTC"))]))
    register(spark)
    df = spark.readStream.format("rate").option("rowsPerSecond", 5).load().selectExpr(
        "value AS id", "CAST(value AS STRING) AS when")
    q = (df.writeStream.format("lakestep").option("catalog", catalog_spec.url).option("table", "s.typed")
         .option("checkpointLocation", str(tmp_path / "ck")).start())
    with pytest.raises(StreamingQueryException, match="SchemaMismatchError"):  # the sink's typed error, in Spark's
        q.awaitTermination(120)
    assert t.version == 0  # nothing committed
    cat.close()


# the alignment in Spark is the point; the source on PostgreSQL: test_consistent_queries' concurrent jobs
@pytest.mark.parametrize("catalog_spec", ["sqlite"], indirect=True)
def test_join_of_two_sources_processes_matching_barriers(spark, catalog_spec, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Table a is a root; b is derived from a by a slow job. A join of a and b must see
    barrier e from both in the same micro-batch, and only once b has precommitted e."""
    cat = catalog_spec.open()
    cat.create_namespace("s")
    schema = pa.schema([("id", pa.int64()), ("e", pa.int64())])
    a = cat.create_table("s.a", schema)
    cat.create_table("s.b", schema)
    j = cat.create_table("s.j", pa.schema([("id", pa.int64()), ("e", pa.int64()), ("e_b", pa.int64())]))
    p = Pipeline(cat)
    p.register_job("feed", sinks=["s.a"], external_input=True)
    p.register_job("slow", sources=["s.a"], sinks=["s.b"])
    register_job(catalog_spec.url, "joined", sources=["s.a", "s.b"], sinks=["s.j"])
    coord = Coordinator(p.catalog, interval=3600)
    assert coord.acquire()
    register(spark)

    def read(table: str):  # type: ignore[no-untyped-def]
        return (spark.readStream.format("lakestep").option("catalog", catalog_spec.url).option("table", table)
                .option("job", "joined").load())

    def start():  # type: ignore[no-untyped-def]
        joined = read("s.a").join(read("s.b").withColumnRenamed("e", "e_b"), "id")
        return (joined.writeStream.format("lakestep").option("catalog", catalog_spec.url).option("table", "s.j")
                .option("job", "joined").option("checkpointLocation", str(tmp_path / "ck"))
                .trigger(processingTime="300 milliseconds").start())

    def decisions() -> int:
        d = S.trigger_decisions.c
        with cat.backend.read() as conn:
            return int(conn.execute(sa.select(sa.func.max(d.decision_id)).where(d.job_id == "joined")).scalar() or 0)

    q = start()
    try:
        for e in range(1, 5):
            if e == 3:  # a restarted query (same checkpoint) must not follow the first run's decisions
                wait_until(lambda: (p.frontier("s.j") or 0) >= 2, "the join job to reach barrier 2", interval=0.3,
                           failed=died(q))
                q.stop()
                q = start()
            a.append({"id": [e * 100 + i for i in range(3)], "e": [e] * 3}, barrier=OPEN_EPOCH)
            coord.seal()
            # the join job asks twice while s.b lags: it must not run ahead of the slow job
            asked = decisions()
            wait_until(lambda: decisions() >= asked + 2, "two triggers of the join job", interval=0.3,
                       failed=died(q))
            plan = p.next_batch("slow")
            assert plan is not None
            rows = a.to_arrow(version=plan.sources["s.a"].to_version,
                              where=[("e", ">=", plan.lo), ("e", "<=", plan.hi)])
            with p.batch(plan) as batch:
                batch.append("s.b", rows)
        wait_until(lambda: (p.frontier("s.j") or 0) >= 4, "the join job to reach barrier 4", interval=0.3,
                   failed=died(q))
    finally:
        q.stop()
        coord.release()
    got = j.to_arrow().to_pylist()
    assert sorted(r["id"] for r in got) == sorted(e * 100 + i for e in range(1, 5) for i in range(3))
    assert all(r["e"] == r["e_b"] for r in got)
    # every joined row was committed tagged with the barrier it belongs to
    for h in j.history():
        if h.added_rows:
            rows = j.to_arrow(version=h.version).to_pylist()
            new = [r for r in rows if r["e"] == h.barrier]
            assert len(new) == h.added_rows, (h.version, h.barrier)
    cat.close()


def test_max_barriers_per_trigger_through_the_source(spark, catalog_spec, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """The source's maxBarriersPerTrigger=3: barriers 1 and 7 bring rows, 2..6 are empty. A batch
    covers up to 3 barriers, and ends where a source's data changes: batches [1], [2..4], [5..7].
    With the option ignored (or its default, 1) the job would commit seven batches."""
    cat = catalog_spec.open()
    p, coord, a, d = root_and_derived(cat, catalog_spec.url, "s.a", "s.d", "copy3")
    for e in range(1, 8):
        if e in (1, 7):
            a.append({"id": [e * 10, e * 10 + 1], "e": [e, e]}, barrier=OPEN_EPOCH)
        coord.seal()
    coord.release()
    register(spark)
    src = (spark.readStream.format("lakestep").option("catalog", catalog_spec.url).option("table", "s.a")
           .option("job", "copy3").option("maxBarriersPerTrigger", "3").load())
    q = (src.writeStream.format("lakestep").option("catalog", catalog_spec.url).option("table", "s.d")
         .option("job", "copy3").option("checkpointLocation", str(tmp_path / "ck"))
         .trigger(availableNow=True).start())
    try:
        assert q.awaitTermination(300)
    finally:
        q.stop()
    assert [h.barrier for h in reversed(d.history()) if h.barrier is not None] == [1, 4, 7]
    assert p.frontier("s.d") == 7
    assert sorted(r["id"] for r in d.to_arrow().to_pylist()) == [10, 11, 70, 71]
    cat.close()


@pytest.mark.parametrize("catalog_spec", ["sqlite"], indirect=True)  # the source's check: the backend is not the point
def test_a_widened_source_stops_a_running_query_until_it_restarts(spark, catalog_spec, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Issue 35: a running query keeps the schema it started with; a source column widened
    (then renamed) since fails its next batch with an error naming the restart, and the
    restarted query reads the new rows with the new type (name) from the next barrier on,
    nothing lost or doubled."""
    cat = catalog_spec.open()
    cat.create_namespace("w")
    schema = pa.schema([("id", pa.int32()), ("e", pa.int64())])
    a, d = cat.create_table("w.a", schema), cat.create_table("w.d", schema)
    p = Pipeline(cat)
    p.register_job("feed", sinks=["w.a"], external_input=True)
    register_job(catalog_spec.url, "copyw", sources=["w.a"], sinks=["w.d"])
    coord = Coordinator(p.catalog, interval=3600)
    assert coord.acquire()
    a.append(pa.table({"id": [1, 2], "e": [1, 1]}, schema=schema), barrier=OPEN_EPOCH)
    coord.seal()
    register(spark)

    def start() -> Any:
        src = (spark.readStream.format("lakestep").option("catalog", catalog_spec.url).option("table", "w.a")
               .option("job", "copyw").load())
        return (src.writeStream.format("lakestep").option("catalog", catalog_spec.url).option("table", "w.d")
                .option("job", "copyw").option("checkpointLocation", str(tmp_path / "ck"))
                .trigger(processingTime="200 milliseconds").start())

    q = start()
    try:
        wait_until(lambda: p.frontier("w.d") >= 1, "the query copies barrier 1", failed=died(q))
        a.update_column("id", type=pa.int64())
        d.update_column("id", type=pa.int64())
        a.append(pa.table({"id": [2 ** 40], "e": [2]}, schema=a.schema), barrier=OPEN_EPOCH)
        coord.seal()
        with pytest.raises(StreamingQueryException, match="restart the query"):
            q.awaitTermination(300)
    finally:
        q.stop()
    assert p.frontier("w.d") == 1
    q = start()  # the restart: the new schema
    try:
        wait_until(lambda: p.frontier("w.d") >= 2, "the restarted query copies barrier 2", failed=died(q))
        a.rename_column("e", "ev")  # a rename mid-stream: the same, and the rows keep their values
        d.rename_column("e", "ev")
        a.append(pa.table({"id": [3], "ev": [3]}, schema=a.schema), barrier=OPEN_EPOCH)
        coord.seal()
        with pytest.raises(StreamingQueryException, match="column 'e' is gone"):
            q.awaitTermination(300)
    finally:
        q.stop()
    q = start()
    try:
        wait_until(lambda: p.frontier("w.d") >= 3, "the restarted query copies barrier 3", failed=died(q))
    finally:
        q.stop()
    coord.release()
    got = d.to_arrow()
    assert got.schema.field("id").type == pa.int64() and got.column_names == ["id", "ev"]
    assert sorted((r["id"], r["ev"]) for r in got.to_pylist()) == [(1, 1), (2, 1), (3, 3), (2 ** 40, 2)]
    cat.close()
