"""Spark batch reads and writes, and consistent SQL in Spark and DuckDB, in real Spark.

The last test is the payoff: two derived tables written by two streaming jobs
running at different speeds, read by a Spark SQL join and a DuckDB join over
and over while they run: every read equals the truth computed from the orders
at the barrier it reports.
"""

from __future__ import annotations

import datetime as dt
import time
from collections import defaultdict
from typing import Any

import pyarrow as pa
import pytest

from lakestep import errors
from lakestep.barrier import OPEN_EPOCH, Pipeline
from lakestep.query import duckdb_query, spark_sql
from lakestep.services import Coordinator
from lakestep.streaming import register, register_job
from tests.waiting import wait_until

pytestmark = pytest.mark.spark

ORDERS = pa.schema([("id", pa.int64()), ("customer", pa.string()), ("cents", pa.int64())])


def _ids(df: Any) -> list[int]:
    return sorted(r["id"] for r in df.collect())


def test_batch_read_options(spark, catalog_spec) -> None:  # type: ignore[no-untyped-def]
    cat = catalog_spec.open()
    cat.create_namespace("s")
    t = cat.create_table("s.t", ORDERS, partition_by=["customer"])
    p = Pipeline(cat)
    p.register_job("feed", sinks=["s.t"], external_input=True)
    coord = Coordinator(p.catalog, interval=3600)
    assert coord.acquire()
    t.append({"id": [1, 2], "customer": ["a", "b"], "cents": [1, 2]}, barrier=OPEN_EPOCH)
    coord.seal()
    coord.snapshot()
    t.append({"id": [3], "customer": ["a"], "cents": [3]}, barrier=OPEN_EPOCH)
    at = time.time()
    t.append({"id": [4], "customer": ["c"], "cents": [4]}, barrier=OPEN_EPOCH)
    register(spark)
    url = catalog_spec.url

    def read(**opts: str) -> Any:
        r = spark.read.format("lakestep").option("catalog", url).option("table", "s.t")
        for k, v in opts.items():
            r = r.option(k, v)
        return r.load()

    assert _ids(read()) == [1, 2, 3, 4]
    assert _ids(read(versionAsOf="1")) == [1, 2]
    assert _ids(read(timestampAsOf=dt.datetime.fromtimestamp(at, dt.timezone.utc).isoformat())) == [1, 2, 3]
    assert _ids(read(barrier="1")) == [1, 2]
    assert _ids(read(snapshot="lakestep-barrier-1")) == [1, 2]
    assert _ids(read(level="read_committed")) == [1, 2]  # barrier 2 is open: not read
    assert _ids(read(level="read_uncommitted")) == [1, 2, 3, 4]
    assert read().rdd.getNumPartitions() == 4  # one per file
    assert _ids(read(maxPartitions="2")) == [1, 2, 3, 4]
    with pytest.raises(Exception, match="at most one"):
        read(versionAsOf="1", barrier="1").collect()
    coord.release()
    cat.close()


def test_batch_read_merges_primary_keys_on_executors(spark, catalog_spec) -> None:  # type: ignore[no-untyped-def]
    cat = catalog_spec.open()
    cat.create_namespace("s")
    t = cat.create_table("s.k", pa.schema([("k", pa.int64()), ("p", pa.string()), ("v", pa.int64())]),
                         primary_key=["k", "p"], partition_by=["p"])
    t.upsert({"k": [1, 2, 3], "p": ["x", "x", "y"], "v": [1, 2, 3]})
    t.upsert({"k": [2, 3], "p": ["x", "y"], "v": [20, 30]})
    t.delete([("k", "=", 1)])
    register(spark)
    df = spark.read.format("lakestep").option("catalog", catalog_spec.url).option("table", "s.k").load()
    assert df.rdd.getNumPartitions() == 2  # one per partition value: keys never span them
    assert sorted((r["k"], r["p"], r["v"]) for r in df.collect()) == [(2, "x", 20), (3, "y", 30)]
    cat.close()


def test_batch_writes(spark, catalog_spec) -> None:  # type: ignore[no-untyped-def]
    cat = catalog_spec.open()
    cat.create_namespace("s")
    t = cat.create_table("s.t", ORDERS)
    cat.create_table("s.d", ORDERS)
    p = Pipeline(cat)
    p.register_job("copy", sources=["s.t"], sinks=["s.d"])
    register(spark)
    url = catalog_spec.url
    df = spark.createDataFrame([(1, "a", 10), (2, "b", 20)], "id long, customer string, cents long")

    def write(frame: Any, mode: str, table: str = "s.t", **opts: str) -> None:
        w = frame.write.format("lakestep").option("catalog", url).option("table", table).mode(mode)
        for k, v in opts.items():
            w = w.option(k, v)
        w.save()

    write(df, "append", job="backfill", batchId="7")
    write(df, "append", job="backfill", batchId="7")  # a replay: one commit
    assert sorted(t.to_arrow().column("id").to_pylist()) == [1, 2]
    h = t.history(limit=1)[0]
    assert (h.job_id, h.batch_id, h.barrier) == ("backfill", 7, 1)  # a root job's write: the open epoch
    assert p.topology.job("backfill").external_input
    write(spark.createDataFrame([(3, "c", 30)], "id long, customer string, cents long"), "overwrite")
    assert t.to_arrow().column("id").to_pylist() == [3]
    with pytest.raises(Exception, match="derived job"):
        write(df, "append", table="s.d")
    assert cat.load_table("s.d").version == 0
    with pytest.raises(Exception, match="SchemaMismatch|not in the table"):
        write(spark.createDataFrame([(1, 2)], "id long, extra long"), "append")
    assert t.to_arrow().column("id").to_pylist() == [3]
    assert not [f for f in t.files() if f.path.startswith("data/x")]
    cat.close()


def test_spark_sql_join_and_time_travel(spark, catalog_spec) -> None:  # type: ignore[no-untyped-def]
    cat = catalog_spec.open()
    cat.create_namespace("s")
    a = cat.create_table("s.a", pa.schema([("id", pa.int64()), ("x", pa.int64())]))
    b = cat.create_table("s.b", pa.schema([("id", pa.int64()), ("y", pa.int64())]))
    a.append({"id": [1, 2], "x": [10, 20]})
    b.append({"id": [1, 2], "y": [100, 200]})
    a.append({"id": [3], "x": [30]})
    res = spark_sql(spark, catalog_spec.url, "SELECT a.id, x, y FROM s.a a JOIN s.b b ON a.id = b.id")
    assert sorted(tuple(r) for r in res.df.collect()) == [(1, 10, 100), (2, 20, 200)]
    assert res.read.versions == {"s.a": 2, "s.b": 1}
    res = spark_sql(spark, catalog_spec.url, "SELECT count(*) AS n FROM s.a VERSION AS OF 1")
    assert res.df.collect()[0]["n"] == 2
    with pytest.raises(errors.TableNotFoundError):
        spark_sql(spark, catalog_spec.url, "SELECT * FROM s.nope")
    cat.close()


@pytest.mark.parametrize("catalog_spec", ["sqlite"], indirect=True)  # Spark's scan: the backend is not the point
def test_spark_sql_reads_with_sparks_own_scan(spark, catalog_spec) -> None:  # type: ignore[no-untyped-def]
    """spark_sql and spark_table read plain tables with Spark's Parquet scan: partitions (a null
    one too), a column added later (null in older files), time travel by version, barrier and
    snapshot; a primary-key table through the Python path (merged on read), said in the result;
    a file changed or deleted outside lakestep is an error naming it."""
    import collections
    import decimal
    import os

    from lakestep.query import spark_table

    cat = catalog_spec.open()
    cat.create_namespace("s")
    t = cat.create_table("s.t", pa.schema([("id", pa.int64()), ("day", pa.date32()), ("c", pa.string()),
                                            ("cents", pa.decimal128(12, 2))]), partition_by=["day", "c"])
    k = cat.create_table("s.k", pa.schema([("k", pa.int64()), ("v", pa.int64())]), primary_key=["k"])
    p = Pipeline(cat)
    p.register_job("feed", sinks=["s.t", "s.k"], external_input=True)
    coord = Coordinator(p.catalog, interval=3600)
    assert coord.acquire()
    day = dt.date(2026, 1, 1)
    cents = pa.array([decimal.Decimal("1.25"), decimal.Decimal("2.00"), decimal.Decimal("-3.10")], pa.decimal128(12, 2))
    t.append({"id": [1, 2, 3], "day": [day, day, None], "c": ["a", None, "b"], "cents": cents}, barrier=OPEN_EPOCH)
    k.upsert({"k": [1, 2], "v": [1, 2]}, barrier=OPEN_EPOCH)
    coord.seal()
    coord.snapshot()
    t.add_columns(pa.field("note", pa.string()))
    t.append({"id": [4], "day": [day], "c": ["a"], "cents": pa.array([decimal.Decimal(4)], pa.decimal128(12, 2)),
              "note": ["new"]},
             barrier=OPEN_EPOCH)
    k.upsert({"k": [2], "v": [20]}, barrier=OPEN_EPOCH)
    coord.seal()
    url = catalog_spec.url

    def rows(df: Any) -> collections.Counter:
        return collections.Counter(tuple(r) for r in df.collect())

    def lakestep_rows(table: Any, version: int) -> collections.Counter:
        return collections.Counter(tuple(r.values()) for r in table.to_arrow(version=version).to_pylist())

    res = spark_table(spark, url, "s.t")
    assert res.paths == {"s.t": "native"} and res.read.barrier == 2
    assert "FileScan parquet" in res.df._jdf.queryExecution().executedPlan().toString()
    assert rows(res.df) == lakestep_rows(t, res.read.versions["s.t"])  # the null partition, the new column
    # (the snapshot holds the version the seal tagged, before add_columns; the barrier's version is
    # the newest of the same data, the ALTER: each read with its version's schema)
    snap = {s.name: s.version for s in t.snapshots()}["lakestep-barrier-1"]
    for kwargs, version in (({"version": 1}, 1), ({"barrier": 1}, p.version_at("s.t", 1)),
                            ({"snapshot": "lakestep-barrier-1"}, snap)):
        got = spark_table(spark, url, "s.t", **kwargs)
        assert got.paths["s.t" if "version" not in kwargs else "s.t@v1"] == "native"
        assert rows(got.df) == lakestep_rows(t, version), kwargs
    joined = spark_sql(spark, url, "SELECT t.id, k.v FROM s.t t JOIN s.k k ON t.id = k.k")
    assert joined.paths == {"s.t": "native", "s.k": "python (a primary-key table, merged on read)"}
    assert sorted(tuple(r) for r in joined.df.collect()) == [(1, 1), (2, 20)]
    # a file changed behind lakestep's back: refused before Spark reads anything
    victim = t.files()[0]
    path = os.path.join(t.location, victim.path)
    with open(path, "ab") as f:
        f.write(b"garbage")
    with pytest.raises(errors.DataFileCorruptError, match=victim.path):
        spark_table(spark, url, "s.t")
    os.remove(path)
    with pytest.raises(errors.DataFileCorruptError, match="missing"):
        spark_table(spark, url, "s.t")
    coord.release()
    cat.close()


def test_an_analytic_suite_through_spark_sql_equals_native_spark(spark, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """TPC-H at scale factor 0.01 (benchmarks/tpch.py, DuckDB's tpch extension) loaded into lakestep:
    six queries through spark_sql, Spark scanning the files itself, give exactly the answers of the
    same SQL over spark.read.parquet of the same files (the benchmark's exact check, small)."""
    from benchmarks import tpch

    cat, files = tpch.generate(0.01, tmp_path, rows_per_file=20_000)
    for name, paths in files.items():
        spark.read.parquet(*paths).createOrReplaceTempView(f"native_{name}")
    for q, sql in tpch.QUERIES.items():
        res = spark_sql(spark, cat.connection_url(), sql)
        assert set(res.paths.values()) == {"native"}, res.paths
        assert res.df.collect() == spark.sql(tpch.native_sql(sql)).collect(), q
    cat.close()


def test_sql_joins_over_concurrent_streaming_jobs_are_consistent(spark, catalog_spec, tmp_path) -> None:  # type: ignore[no-untyped-def]
    from pyspark.sql import functions as F

    cat = catalog_spec.open()
    cat.create_namespace("s")
    orders = cat.create_table("s.orders", ORDERS)
    cat.create_table("s.revenue", pa.schema([("customer", pa.string()), ("revenue", pa.int64())]))
    cat.create_table("s.counts", pa.schema([("customer", pa.string()), ("orders", pa.int64())]))
    p = Pipeline(cat)
    p.register_job("feed", sinks=["s.orders"], external_input=True)
    url = catalog_spec.url
    register_job(url, "rev", sources=["s.orders"], sinks=["s.revenue"])
    register_job(url, "cnt", sources=["s.orders"], sinks=["s.counts"])
    coord = Coordinator(p.catalog, interval=3600)
    assert coord.acquire()
    register(spark)

    def start(job: str, table: str, agg: Any, every: str) -> Any:
        src = spark.readStream.format("lakestep").option("catalog", url).option("table", "s.orders") \
            .option("job", job).load()
        return (src.groupBy("customer").agg(agg).writeStream.outputMode("complete").format("lakestep")
                .option("catalog", url).option("table", table).option("job", job)
                .option("checkpointLocation", str(tmp_path / job)).trigger(processingTime=every).start())

    queries = [start("rev", "s.revenue", F.sum("cents").alias("revenue"), "200 milliseconds"),
               start("cnt", "s.counts", F.count("*").alias("orders"), "1500 milliseconds")]

    def truth(barrier: int) -> dict[str, tuple[int, int]]:
        rows = orders.to_arrow(version=p.version_at("s.orders", barrier)).to_pylist()
        out: dict[str, list[int]] = defaultdict(lambda: [0, 0])
        for r in rows:
            out[r["customer"]][0] += r["cents"]
            out[r["customer"]][1] += 1
        return {c: (v[0], v[1]) for c, v in out.items()}

    join = ("SELECT r.customer, r.revenue, c.orders FROM s.revenue r JOIN s.counts c "
            "ON r.customer = c.customer")
    checked = {"spark": 0, "duckdb": 0}
    barriers: set[int] = set()
    try:
        next_id = 0
        for e in range(1, 9):
            ids = list(range(next_id, next_id + 4))
            next_id += 4
            orders.append({"id": ids, "customer": [f"c{i % 3}" for i in ids], "cents": [100 + i for i in ids]},
                          barrier=OPEN_EPOCH)
            coord.seal()
            for engine in ("duckdb", "spark"):
                for q in queries:
                    assert q.exception() is None, q.exception()
                if engine == "duckdb":
                    res = duckdb_query(cat, join)
                    got = {r["customer"]: (r["revenue"], r["orders"]) for r in res.table.to_pylist()}
                    barrier = res.read.barrier
                else:
                    sres = spark_sql(spark, url, join)
                    got = {r["customer"]: (r["revenue"], r["orders"]) for r in sres.df.collect()}
                    barrier = sres.read.barrier
                assert barrier is not None
                want = {c: v for c, v in truth(barrier).items()} if barrier > 0 else {}
                assert got == want, f"{engine} read at barrier {barrier}: {got} != {want}"
                checked[engine] += 1
                barriers.add(barrier)
        wait_until(
            lambda: min(p.frontier("s.revenue") or 0, p.frontier("s.counts") or 0) >= 8,
            "the streaming jobs to reach barrier 8", timeout=180, interval=0.2,
            failed=lambda: next((f"a query died ({q.exception()})" for q in queries if q.exception()), None),
        )
        final = duckdb_query(cat, join)
        assert final.read.barrier == 8
        assert {r["customer"]: (r["revenue"], r["orders"]) for r in final.table.to_pylist()} == truth(8)
    finally:
        for q in queries:
            q.stop()
        coord.release()
        cat.close()
    assert checked == {"spark": 8, "duckdb": 8}


@pytest.mark.parametrize("catalog_spec", ["sqlite"], indirect=True)  # Spark's scan: the backend is not the point
def test_spark_reads_widened_columns(spark, catalog_spec) -> None:  # type: ignore[no-untyped-def]
    """Files written before Table.update_column widened their columns (issue 35) read as the
    new types through Spark's own Parquet scan and through spark_sql, beside files written after."""
    import decimal

    cat = catalog_spec.open()
    cat.create_namespace("w")
    old = pa.schema([pa.field("id", pa.int32(), nullable=False), ("x", pa.float32()), ("p", pa.decimal128(5, 2)),
                     pa.field("note", pa.string(), nullable=False)])
    t = cat.create_table("w.t", old)
    t.append(pa.table({"id": [1, 2], "x": [0.5, 1.5], "p": [decimal.Decimal("1.25"), None], "note": ["a", "b"]},
                      schema=old))
    t.update_column("id", type=pa.int64())
    t.update_column("x", type=pa.float64())
    t.update_column("p", type=pa.decimal128(12, 2))
    t.update_column("note", nullable=True)
    t.append(pa.table({"id": [2 ** 40], "x": [1e300], "p": [decimal.Decimal("1234567890.12")], "note": [None]},
                      schema=t.schema))
    t.reorder_columns(["note", "p", "x", "id"])  # files of the old order, read by name in the new one
    register(spark)
    df = spark.read.format("lakestep").option("catalog", catalog_spec.url).option("table", "w.t").load()
    assert [(f.name, f.dataType.simpleString()) for f in df.schema.fields] == [
        ("note", "string"), ("p", "decimal(12,2)"), ("x", "double"), ("id", "bigint")]
    got = sorted((r["id"], r["x"], r["p"], r["note"]) for r in df.collect())
    assert got == [(1, 0.5, decimal.Decimal("1.25"), "a"), (2, 1.5, None, "b"),
                   (2 ** 40, 1e300, decimal.Decimal("1234567890.12"), None)]
    q = spark_sql(spark, cat, "SELECT sum(id) AS s, count(note) AS n FROM w.t", level="read_uncommitted")
    r = q.df.collect()
    assert (r[0]["s"], r[0]["n"]) == (2 ** 40 + 3, 2) and q.paths == {"w.t": "native"}
    # a rename and a drop (issue 35): Spark's own scan reads the stored names, returns the new ones
    before = t.version
    t.rename_column("x", "ratio")
    t.drop_column("p")
    t.append(pa.table({"note": ["c"], "ratio": [2.5], "id": [7]}, schema=t.schema))
    df = spark.read.format("lakestep").option("catalog", catalog_spec.url).option("table", "w.t").load()
    assert df.columns == ["note", "ratio", "id"]
    assert sorted((r["id"], r["ratio"]) for r in df.collect()) == [(1, 0.5), (2, 1.5), (7, 2.5), (2 ** 40, 1e300)]
    q = spark_sql(spark, cat, "SELECT id, ratio FROM w.t WHERE ratio >= 1.5 ORDER BY id", level="read_uncommitted")
    assert [(r["id"], r["ratio"]) for r in q.df.collect()] == [(2, 1.5), (7, 2.5), (2 ** 40, 1e300)]
    assert q.paths == {"w.t": "native"}
    old_df = (spark.read.format("lakestep").option("catalog", catalog_spec.url).option("table", "w.t")
              .option("versionAsOf", str(before)).load())  # time travel: that version's names
    assert old_df.columns == ["note", "p", "x", "id"] and old_df.count() == 3
    cat.close()
