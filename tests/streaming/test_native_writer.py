"""``foreach_batch(..., writer="spark")``: Spark's Parquet writer, the driver reading footers.

The same rows go through both writers into two tables of one schema; the
tables must hold the same rows, and the catalog must describe the files the
same way (partition values, row counts, per-column statistics), since reads
prune files by them. Every type a statistic is kept for is in the rows, after
a nested column stored as two Parquet columns, with nulls, a NaN, non-ASCII
text and a partition column with a null partition.
"""

from __future__ import annotations

import datetime as dt
import decimal
import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from lakestep.barrier import JobNotFoundError, Pipeline
from lakestep.catalog.columns import file_ids
from lakestep.catalog.files import decode_value
from lakestep.errors import InvalidArgumentError, SchemaMismatchError, StreamingJobError
from lakestep.services import Coordinator
from lakestep.streaming import foreach_batch, register
from lakestep.streaming.native import local_master

pytestmark = pytest.mark.spark

UTC = dt.timezone.utc
SCHEMA = pa.schema([
    pa.field("id", pa.int64(), nullable=False), ("small", pa.int16()),
    ("pt", pa.struct([("a", pa.int32()), ("b", pa.string())])), ("n32", pa.int32()), ("flag", pa.bool_()),
    ("x", pa.float64()), ("x32", pa.float32()), ("name", pa.string()), ("blob", pa.binary()),
    ("day", pa.date32()), ("ts", pa.timestamp("us", tz="UTC")), ("local", pa.timestamp("us")),
    ("price", pa.decimal128(10, 2)), ("big", pa.decimal128(30, 3)), ("region", pa.string()),
    ("tags", pa.list_(pa.string())),
])


def _rows(n: int) -> pa.Table:
    base = dt.datetime(2026, 1, 1, tzinfo=UTC)
    return pa.table({
        "id": list(range(n)),
        "small": [None if i % 7 == 0 else i % 300 - 150 for i in range(n)],
        "pt": [None if i % 8 == 0 else {"a": i, "b": str(i)} for i in range(n)],
        "n32": [i * 1000 for i in range(n)],
        "flag": [None if i % 5 == 0 else i % 2 == 0 for i in range(n)],
        "x": [float("nan") if i == 3 else i / 4 - 10 for i in range(n)],
        "x32": [None if i % 4 == 0 else i / 8 for i in range(n)],
        "name": [None if i % 6 == 0 else f"näme-{i:04d}-é" for i in range(n)],
        "blob": [bytes([i % 256, 255 - i % 256]) for i in range(n)],
        "day": [dt.date(2020, 1, 1) + dt.timedelta(days=i) for i in range(n)],
        "ts": [None if i % 9 == 0 else base + dt.timedelta(seconds=i, microseconds=i) for i in range(n)],
        "local": [dt.datetime(1999, 12, 31) + dt.timedelta(hours=i) for i in range(n)],
        "price": [decimal.Decimal(i * 3 - 100) / 4 for i in range(n)],
        "big": [None if i % 3 == 0 else decimal.Decimal(10**20 + i) / 1000 for i in range(n)],
        "region": [None if i % 10 == 0 else ["north", "south", "east"][i % 3] for i in range(n)],
        "tags": [None if i % 4 == 1 else [f"t{i % 3}"] for i in range(n)],
    }, schema=SCHEMA)


def _spark_df(spark: Any, table: pa.Table, partitions: int = 2) -> Any:
    from pyspark.sql import functions as F

    # Spark reads an Arrow timestamp without a zone as its TimestampType: make ``local`` wall-clock again
    df = spark.createDataFrame(table).withColumn("local", F.col("local").cast("timestamp_ntz"))
    return df.repartition(partitions)


def _by_partition(t: Any) -> dict[str, dict[str, Any]]:
    """Per partition: rows, and each column's [min, max, nulls] over the partition's files."""
    out: dict[str, dict[str, Any]] = {}
    for f in t.files():
        p = out.setdefault(f.partition_json, {"rows": 0, "stats": {}})
        p["rows"] += f.record_count
        for col, (lo, hi, nulls) in json.loads(f.stats_json).items():
            s = p["stats"].setdefault(col, [None, None, 0, True])
            lo, hi = decode_value(lo), decode_value(hi)
            s[2] += nulls
            if lo is None and hi is None:
                s[3] = s[3] and nulls == f.record_count  # bounds unknown unless the file is all nulls
                continue
            s[0] = lo if s[0] is None or lo < s[0] else s[0]
            s[1] = hi if s[1] is None or hi > s[1] else s[1]
    return out


def _sorted_rows(t: Any) -> list[dict[str, Any]]:
    rows = t.to_arrow().to_pylist()
    for r in rows:  # NaN != NaN: compare it as text
        r["x"] = repr(r["x"])
    return sorted(rows, key=lambda r: r["id"])


def test_spark_writer_matches_arrow_writer(spark, catalog_spec) -> None:  # type: ignore[no-untyped-def]
    """The same rows through both writers: same rows read back, same partitions and row counts, the
    same statistics (except where the footer cannot know a bound: NaN in ``x``; nested ``tags``)."""
    cat = catalog_spec.open()
    cat.create_namespace("n")
    a = cat.create_table("n.by_arrow", SCHEMA, partition_by=["region"])
    s = cat.create_table("n.by_spark", SCHEMA, partition_by=["region"])
    data = _rows(120)
    df = _spark_df(spark, data)
    foreach_batch(catalog_spec.url, "n.by_arrow", job="arrow")(df, 0)
    foreach_batch(catalog_spec.url, "n.by_spark", job="spark", writer="spark")(df, 0)

    assert _sorted_rows(s) == _sorted_rows(a)
    want, got = _by_partition(a), _by_partition(s)
    assert sorted(got) == sorted(want) and len(got) == 4  # north, south, east and the null partition
    for part in want:
        assert got[part]["rows"] == want[part]["rows"], part
        for col, w in want[part]["stats"].items():
            if col in ("tags", "pt"):  # nested: no statistics from a footer (unknown, never wrong)
                assert col not in got[part]["stats"]
                continue
            g = got[part]["stats"][col]
            if col == "x" and part == json.dumps({"region": "north"}):  # row 3, the NaN, is in "north":
                assert g[2] == w[2] and not g[3], (part, g)  # its file's bounds are unknown
                continue
            assert g == w, (part, col, g, w)
    # reads prune by those statistics and partitions: the answers must agree
    for where in ([("name", "=", "näme-0007-é")], [("ts", ">", dt.datetime(2026, 1, 1, 0, 1, tzinfo=UTC))],
                  [("region", "is_null", None)], [("price", "<", decimal.Decimal("-20"))],
                  [("day", "=", dt.date(2020, 2, 1))], [("x32", "is_null", None), ("small", ">", 100)]):
        assert sorted(s.to_arrow(where=where).column("id").to_pylist()) == \
            sorted(a.to_arrow(where=where).column("id").to_pylist()), where
    (h,) = [h for h in s.history() if h.version > 0]
    assert (h.job_id, h.batch_id, h.added_rows) == ("spark", 0, 120)
    on_disk = sorted(str(f.relative_to(s.location)) for f in Path(s.location).rglob("*") if f.is_file())
    assert on_disk == sorted(f.path for f in s.files())  # no _SUCCESS, no .crc, no empty file left
    # both writers put the catalog's column ids into the files as Parquet field ids (catalog/columns.py);
    # Spark's on every column and struct field (a list's element and a map's key and value have no
    # field of their own in Spark: no id)
    for t, every in ((a, True), (s, False)):
        want = {p: i for p, i in t.meta.column_ids.ids.items() if every or p[-1] not in ("element", "key", "value")}
        assert every or any(len(p) > 1 for p in want)  # (the schema has struct fields)
        for f in t.files():
            got = file_ids(pq.read_schema(Path(t.location) / f.path))
            assert got == want, (t.ident, f.path, got)
    # a struct field renamed (issue 35): Spark writes it under its stored name, old rows read under the new
    s.rename_column("pt.a", "alpha")
    foreach_batch(catalog_spec.url, "n.by_spark", job="spark", writer="spark")(
        spark.createDataFrame([(999, (5, "q"))], "id long, pt struct<alpha:int,b:string>"), 1)
    pts = {r["id"]: r["pt"] for r in s.refresh().to_arrow(columns=["id", "pt"]).to_pylist()}
    first = data.slice(0, 1).to_pylist()[0]
    assert pts[999] == {"alpha": 5, "b": "q"}
    assert pts[first["id"]] == (None if first["pt"] is None else {"alpha": first["pt"]["a"], "b": first["pt"]["b"]})
    cat.close()


def test_spark_writer_conforms_replays_and_refuses(spark, catalog_spec) -> None:  # type: ignore[no-untyped-def]
    """Column order, widening and a missing nullable column are accepted as by the arrow writer; a
    replayed batch is committed once; what the table cannot take is refused with nothing committed."""
    cat = catalog_spec.open()
    cat.create_namespace("n")
    schema = pa.schema([pa.field("id", pa.int64(), nullable=False), ("amount", pa.int64()), ("note", pa.string())])
    t = cat.create_table("n.t", schema)
    url = catalog_spec.url
    ingest = foreach_batch(url, "n.t", job="feed", writer="spark")
    df = spark.createDataFrame([(5, 1), (7, 2), (9, 3)], "amount int, id long")  # int -> long, no note
    ingest(df, 0)
    ingest(df, 0)  # Spark replays batch 0 after a crash: committed once, the second copy deleted
    assert sorted(t.to_arrow().to_pylist(), key=lambda r: r["id"]) == [
        {"id": 1, "amount": 5, "note": None}, {"id": 2, "amount": 7, "note": None},
        {"id": 3, "amount": 9, "note": None}]
    assert [(h.job_id, h.batch_id) for h in t.history() if h.version > 0] == [("feed", 0)]
    on_disk = sorted(str(f.relative_to(t.location)) for f in Path(t.location).rglob("*") if f.is_file())
    assert on_disk == sorted(f.path for f in t.files())

    version = t.refresh().version
    with pytest.raises(SchemaMismatchError, match="'amount' is string"):
        ingest(spark.createDataFrame([(1, "x")], "id long, amount string"), 1)
    with pytest.raises(SchemaMismatchError, match="not nullable but has 1 null"):
        ingest(spark.createDataFrame([(None, 1), (4, 2)], "id long, amount long"), 2)
    assert t.refresh().version == version  # nothing committed, and no file of either batch left
    on_disk = sorted(str(f.relative_to(t.location)) for f in Path(t.location).rglob("*") if f.is_file())
    assert on_disk == sorted(f.path for f in t.files())
    with pytest.raises(SchemaMismatchError, match="_ls_error.*dead-letter"):
        ingest(spark.createDataFrame([(1, None)], "id long, _ls_error string"), 2)
    ingest(spark.createDataFrame([], "id long, amount long"), 3)  # an empty batch commits no file
    assert t.count() == 3

    # a file lost before the driver lists it: in local mode Spark does not count the rows (its executors
    # are the driver's threads), so the batch commits what is there; on a cluster the count refuses it
    # (tests/streaming/test_cluster.py::test_spark_writer_counts_rows_on_a_cluster)
    assert local_master(spark.conf.get("spark.master"))

    # merge_schema: a new column is added to the table (nullable) before Spark writes
    foreach_batch(url, "n.t", job="feed", writer="spark", merge_schema=True)(
        spark.createDataFrame([(20, 5, "vip")], "id long, amount long, tier string"), 5)
    t = cat.load_table("n.t")
    assert t.schema.field("tier").nullable
    assert t.to_arrow(where=[("tier", "=", "vip")]).column("id").to_pylist() == [20]
    # a renamed column (issue 35): Spark writes it under its stored name, with its statistics
    t.rename_column("amount", "qty")
    foreach_batch(url, "n.t", job="feed", writer="spark")(
        spark.createDataFrame([(30, 6)], "id long, qty long"), 6)
    t.refresh()
    assert t.files()[-1].stats["amount"].max == 6  # stored under the name the column was written with
    assert t.to_arrow(where=[("qty", "=", 6)]).column("id").to_pylist() == [30]
    assert sorted(t.to_arrow().column("qty").to_pylist()) == [5, 5, 6, 7, 9]

    pk = cat.create_table("n.pk", schema, primary_key=["id"])
    with pytest.raises(StreamingJobError, match="primary key"):
        foreach_batch(url, pk.ident, job="pk", writer="spark")
    with pytest.raises(JobNotFoundError):  # refused before the job was registered
        Pipeline(cat).topology.job("pk")
    cat.create_table("n.dead", pa.schema([("id", pa.int64()), ("_ls_error", pa.string())]))
    with pytest.raises(StreamingJobError, match="dead-letter"):
        foreach_batch(url, "n.t", job="feed", dead_letter_table="n.dead", writer="spark")
    with pytest.raises(InvalidArgumentError, match="writer"):
        foreach_batch(url, "n.t", job="feed", writer="jvm")
    cat.close()


def test_spark_writer_in_a_streaming_query(spark, catalog_spec, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A streaming query (file source, Trigger.AvailableNow) through foreachBatch with writer="spark":
    one commit per micro-batch, keyed by (job, batchId), every row once; a restart from the checkpoint
    reads only the new input."""
    register(spark)
    cat = catalog_spec.open()
    cat.create_namespace("n")
    t = cat.create_table("n.events", pa.schema([("id", pa.int64()), ("at", pa.timestamp("us", tz="UTC"))]))
    src = tmp_path / "in"
    src.mkdir()
    ck = str(tmp_path / "ck")

    def run() -> None:
        df = spark.readStream.schema("id long, at timestamp").option("maxFilesPerTrigger", 1).json(str(src))
        q = (df.writeStream.option("checkpointLocation", ck).trigger(availableNow=True)
             .foreachBatch(foreach_batch(catalog_spec.url, "n.events", job="events", writer="spark")).start())
        try:
            assert q.awaitTermination(240), "an availableNow query did not stop by itself"
        finally:
            q.stop()

    for k in range(3):
        (src / f"f{k}.json").write_text("".join(f'{{"id": {k * 10 + i}, "at": "2026-11-2{k}T10:00:0{i}Z"}}\n'
                                                for i in range(4)))
    run()
    (src / "f3.json").write_text('{"id": 99, "at": "2026-11-23T00:00:00Z"}\n')
    run()
    rows = t.to_arrow().to_pylist()
    assert sorted(r["id"] for r in rows) == [0, 1, 2, 3, 10, 11, 12, 13, 20, 21, 22, 23, 99]
    assert min(r["at"] for r in rows) == dt.datetime(2026, 11, 20, 10, 0, tzinfo=UTC)
    assert [h.batch_id for h in t.history() if h.version > 0] == [3, 2, 1, 0]  # newest first
    cat.close()


def test_spark_writer_for_a_derived_job_and_complete_mode(spark, catalog_spec, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A derived job (lakestep source -> writer="spark") commits each barrier's batch tagged with
    it, the empty barrier too; complete mode replaces the table's rows with the batch's."""
    from lakestep.barrier import OPEN_EPOCH
    from lakestep.streaming import register_job

    cat = catalog_spec.open()
    cat.create_namespace("n")
    schema = pa.schema([("id", pa.int64()), ("cents", pa.int64())])
    src, copy, last = (cat.create_table(f"n.{x}", schema) for x in ("src", "copy", "last"))
    p = Pipeline(cat)
    p.register_job("feed", sinks=["n.src"], external_input=True)
    coord = Coordinator(p.catalog, interval=3600)
    assert coord.acquire()
    try:
        src.append({"id": [1, 2], "cents": [10, 20]}, barrier=OPEN_EPOCH)
        coord.seal()  # barrier 1
        src.append({"id": [3], "cents": [30]}, barrier=OPEN_EPOCH)
        coord.seal()  # barrier 2
        coord.seal()  # barrier 3: nothing in it
        url = catalog_spec.url
        register_job(url, "copy", sources=["n.src"], sinks=["n.copy"])
        register(spark)
        df = spark.readStream.format("lakestep").option("catalog", url).option("table", "n.src") \
            .option("job", "copy").load()
        q = (df.writeStream.option("checkpointLocation", str(tmp_path / "ck")).trigger(availableNow=True)
             .foreachBatch(foreach_batch(url, "n.copy", job="copy", writer="spark")).start())
        try:
            assert q.awaitTermination(240), "an availableNow query did not stop by itself"
        finally:
            q.stop()
        assert p.frontier("n.copy") == 3  # the empty batch precommitted barrier 3
        assert sorted(h.barrier for h in copy.history() if h.version > 0) == [1, 2, 3]
        for e in (1, 2, 3):
            assert sorted(copy.to_arrow(version=p.version_at("n.copy", e)).to_pylist(), key=lambda r: r["id"]) == \
                sorted(src.to_arrow(version=p.version_at("n.src", e)).to_pylist(), key=lambda r: r["id"])
    finally:
        coord.release()

    replace = foreach_batch(url, "n.last", job="last", mode="complete", writer="spark")
    replace(spark.createDataFrame([(1, 5), (2, 6)], "id long, cents long"), 0)
    replace(spark.createDataFrame([(7, 70)], "id long, cents long"), 1)
    assert last.to_arrow().to_pylist() == [{"id": 7, "cents": 70}]
    assert [h.operation for h in last.history()[:1]] == ["OVERWRITE"]
    cat.close()


@pytest.mark.parametrize("master,local", [
    ("local", True), ("local[2]", True), ("local[*]", True), ("local[4,2]", True),
    ("local-cluster[2,1,1024]", False), ("spark://127.0.0.1:7077", False), ("yarn", False), ("k8s://h:443", False),
    ("", False)])
def test_rows_are_counted_except_in_local_mode(master: str, local: bool) -> None:
    """Spark counts the rows it writes unless its executors are the driver's own threads."""
    assert local_master(master) is local
