"""The lakestep format's output modes, primary-key sources, Trigger.AvailableNow and foreach_batch, in real Spark.

The upstream tables are written with the catalog API and sealed by a real
coordinator before each query runs with ``Trigger.AvailableNow``: the query
must stop by itself once it has processed every barrier that was ready, one
barrier per micro-batch, and a derived table must equal its function of the
source at every barrier.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from lakestep.barrier import OPEN_EPOCH, Pipeline
from lakestep.services import Coordinator
from lakestep.streaming import foreach_batch, register, register_job

pytestmark = pytest.mark.spark

ORDERS = pa.schema([pa.field("id", pa.int64(), nullable=False), ("customer", pa.string()), ("amount", pa.int64())])


def _setup(catalog_spec: Any, *, pk: bool) -> tuple[Any, Pipeline, Any, Any]:
    cat = catalog_spec.open()
    cat.create_namespace("s")
    orders = cat.create_table("s.orders", ORDERS, primary_key=["id"] if pk else ())
    p = Pipeline(cat)
    p.register_job("feed", sinks=["s.orders"], external_input=True)
    coord = Coordinator(p.catalog, interval=3600)
    assert coord.acquire()
    return cat, p, coord, orders


def _run_available_now(spark: Any, df: Any, ck: str, output_mode: str = "append", **sink: Any) -> None:
    """Run a query with Trigger.AvailableNow to its end (it must stop by itself)."""
    w = df.writeStream.option("checkpointLocation", ck).trigger(availableNow=True).outputMode(output_mode)
    if "foreach" in sink:
        q = w.foreachBatch(sink.pop("foreach")).start()
    else:
        for k, v in sink.items():
            w = w.option(k, v)
        q = w.format("lakestep").start()
    try:
        assert q.awaitTermination(240), "an availableNow query did not stop by itself"
    finally:
        q.stop()
    assert q.exception() is None, q.exception()


def _source(spark: Any, url: str, table: str, job: str) -> Any:
    return spark.readStream.format("lakestep").option("catalog", url).option("table", table).option("job", job).load()


def _rows(t: Any, **at: Any) -> list[dict[str, Any]]:
    return sorted(t.to_arrow(**at).to_pylist(), key=lambda r: tuple(str(v) for v in r.values()))


def _barrier_commits(t: Any) -> dict[int, list[Any]]:
    out: dict[int, list[Any]] = defaultdict(list)
    for h in t.history():
        if h.version > 0:
            out[h.barrier].append(h)
    return dict(out)


def test_primary_key_source_emits_upserts_into_update_mode(spark, catalog_spec, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A derived job reading a primary-key table gets, per barrier, the rows upserted in it;
    the sink's update mode upserts them into a primary-key table, which then mirrors the source.
    (Spark's own outputMode("update") never reaches a Python sink; see sink.py.)"""
    cat, p, coord, orders = _setup(catalog_spec, pk=True)
    mirror = cat.create_table("s.mirror", pa.schema([pa.field("id", pa.int64(), nullable=False),
                                                     ("customer", pa.string()), ("amount2", pa.int64())]),
                              primary_key=["id"])
    register_job(catalog_spec.url, "mirror", sources=["s.orders"], sinks=["s.mirror"])
    register(spark)
    url, ck = catalog_spec.url, str(tmp_path / "ck")

    def f(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return sorted(({"id": r["id"], "customer": r["customer"].upper(), "amount2": 2 * r["amount"]} for r in rows),
                      key=lambda r: tuple(str(v) for v in r.values()))

    def run() -> None:
        src = _source(spark, url, "s.orders", "mirror").selectExpr("id", "upper(customer) AS customer",
                                                                  "amount * 2 AS amount2")
        _run_available_now(spark, src, ck, mode="update", catalog=url, table="s.mirror", job="mirror")

    orders.upsert({"id": [1, 2, 3], "customer": ["ann", "bob", "cy"], "amount": [10, 20, 30]}, barrier=OPEN_EPOCH)
    coord.seal()  # barrier 1
    orders.upsert({"id": [2, 4], "customer": ["bob", "dee"], "amount": [25, 40]}, barrier=OPEN_EPOCH)
    coord.seal()  # barrier 2
    orders.upsert({"id": [5], "customer": ["eve"], "amount": [50]}, barrier=OPEN_EPOCH)  # barrier 3: not sealed
    run()
    assert p.frontier("s.mirror") == 2  # stopped at what was ready when it started
    by_barrier = _barrier_commits(mirror)
    assert sorted(by_barrier) == [1, 2]
    # barrier 2 emitted the two rows upserted in it, not the whole table
    assert sum(h.added_rows for h in by_barrier[2]) == 2
    for e in (1, 2):
        assert _rows(mirror, version=p.version_at("s.mirror", e)) == f(_rows(orders, version=p.version_at("s.orders", e)))

    coord.seal()  # barrier 3
    orders.upsert({"id": [1], "customer": ["ann"], "amount": [11]}, barrier=OPEN_EPOCH)
    coord.seal()  # barrier 4
    run()  # the same checkpoint: continues at barrier 3
    assert p.frontier("s.mirror") == 4
    assert sorted(_barrier_commits(mirror)) == [1, 2, 3, 4]
    for e in (3, 4):
        assert _rows(mirror, version=p.version_at("s.mirror", e)) == f(_rows(orders, version=p.version_at("s.orders", e)))
    coord.release()
    cat.close()


# Spark's output modes are the point; the sink's PostgreSQL statements run in test_native_writer
@pytest.mark.parametrize("catalog_spec", ["sqlite"], indirect=True)
def test_complete_and_update_aggregates_match_the_source_at_every_barrier(spark, catalog_spec, tmp_path) -> None:  # type: ignore[no-untyped-def]
    cat, p, coord, orders = _setup(catalog_spec, pk=False)
    agg_schema = pa.schema([pa.field("customer", pa.string(), nullable=False), ("n", pa.int64()), ("total", pa.int64())])
    full = cat.create_table("s.by_customer_full", agg_schema)
    upd = cat.create_table("s.by_customer_upd", agg_schema, primary_key=["customer"])
    register_job(catalog_spec.url, "full", sources=["s.orders"], sinks=["s.by_customer_full"])
    register_job(catalog_spec.url, "upd", sources=["s.orders"], sinks=["s.by_customer_upd"])
    register(spark)
    url = catalog_spec.url
    batches = [
        {"id": [1, 2, 3], "customer": ["ann", "bob", "ann"], "amount": [1, 2, 3]},
        {"id": [4], "customer": ["cy"], "amount": [4]},
        {"id": [], "customer": [], "amount": []},  # an empty barrier
        {"id": [5, 6], "customer": ["bob", "cy"], "amount": [5, 6]},
    ]
    for b in batches:
        orders.append(pa.table(b, schema=ORDERS), barrier=OPEN_EPOCH)
        coord.seal()

    def agg(job: str) -> Any:
        return _source(spark, url, "s.orders", job).groupBy("customer").agg(
            {"*": "count", "amount": "sum"}).selectExpr("customer", "`count(1)` AS n", "`sum(amount)` AS total")

    _run_available_now(spark, agg("full"), str(tmp_path / "ck-full"), "complete", catalog=url,
                       table="s.by_customer_full", job="full")
    # Spark hands update-mode output only to foreachBatch (not to Python sinks): the helper upserts it
    _run_available_now(spark, agg("upd"), str(tmp_path / "ck-upd"), "update",
                       foreach=foreach_batch(url, "s.by_customer_upd", job="upd", mode="update"))

    for t in (full, upd):
        assert p.frontier(t.ident) == len(batches)
        assert sorted(_barrier_commits(t)) == [1, 2, 3, 4]  # one micro-batch per barrier, the empty one too
        for e in range(1, len(batches) + 1):
            src = orders.to_arrow(version=p.version_at("s.orders", e)).to_pylist()
            want: dict[str, list[int]] = {}
            for r in src:
                n, s = want.get(r["customer"], [0, 0])
                want[r["customer"]] = [n + 1, s + r["amount"]]
            got = {r["customer"]: [r["n"], r["total"]] for r in t.to_arrow(version=p.version_at(t.ident, e)).to_pylist()}
            assert got == want, (t.ident, e)
    # complete mode replaces the rows; update mode upserts only the groups that changed
    assert [h.operation for h in full.history()[:1]] == ["OVERWRITE"]
    assert sum(h.added_rows for h in _barrier_commits(upd)[2]) == 1
    coord.release()
    cat.close()


def test_foreach_batch_root_and_derived(spark, catalog_spec, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """The foreachBatch helper: executors write, the driver commits once per (job, batchId),
    with dead letters in the same transaction; a derived job's batches carry their barriers."""
    cat, p, coord, orders = _setup(catalog_spec, pk=False)
    dead = cat.create_table("s.dead", pa.schema([("id", pa.int64()), ("_ls_error", pa.string())]))
    copy = cat.create_table("s.copy", ORDERS)
    url = catalog_spec.url
    ingest = foreach_batch(url, "s.orders", job="feed", dead_letter_table="s.dead")

    rows = [(1, "ann", 5, None), (2, "bob", None, "amount is not a number"), (3, "cy", 7, None)]
    df = spark.createDataFrame(rows, "id long, customer string, amount long, _ls_error string").repartition(2)
    ingest(df, 0)
    ingest(df, 0)  # Spark replays batch 0 after a crash: not committed twice
    assert sorted(orders.to_arrow().column("id").to_pylist()) == [1, 3]
    assert dead.to_arrow().to_pylist() == [{"id": 2, "_ls_error": "amount is not a number"}]
    (h,) = [h for h in orders.history() if h.version > 0]
    assert (h.job_id, h.batch_id, h.barrier) == ("feed", 0, 1)  # idempotency key, the open epoch
    on_disk = sorted(str(f.relative_to(orders.location)) for f in Path(orders.location).rglob("*.parquet"))
    assert on_disk == sorted(f.path for f in orders.files())  # the replay's second copy was deleted
    ingest(spark.createDataFrame([(4, "dee", 9, None)], df.schema), 1)
    coord.seal()  # barrier 1
    coord.seal()  # barrier 2: nothing in it

    register_job(url, "copy", sources=["s.orders"], sinks=["s.copy"])
    register(spark)
    _run_available_now(spark, _source(spark, url, "s.orders", "copy"), str(tmp_path / "ck"),
                       foreach=foreach_batch(url, "s.copy", job="copy"))
    assert p.frontier("s.copy") == 2  # the empty batch precommitted barrier 2
    assert _rows(copy) == _rows(orders)
    assert sorted(h.barrier for h in copy.history() if h.version > 0) == [1, 2]
    with pytest.raises(ValueError, match="primary key"):
        foreach_batch(url, "s.copy", job="copy", mode="upsert")
    coord.release()
    cat.close()


# the sink's option is the point; schema changes on PostgreSQL: tests/catalog/test_schema_property.py
@pytest.mark.parametrize("catalog_spec", ["sqlite"], indirect=True)
def test_sink_schema_evolution_is_opt_in(spark, catalog_spec, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A query with a column the table lacks is refused before it writes anything, unless
    mergeSchema=true: then the column is added (nullable) and older rows read null in it."""
    cat, p, coord, orders = _setup(catalog_spec, pk=False)
    out = cat.create_table("s.out", pa.schema([pa.field("id", pa.int64(), nullable=False), ("customer", pa.string())]))
    register_job(catalog_spec.url, "enrich", sources=["s.orders"], sinks=["s.out"])
    register(spark)
    url, ck = catalog_spec.url, str(tmp_path / "ck")
    orders.append({"id": [1], "customer": ["ann"], "amount": [3]}, barrier=OPEN_EPOCH)
    coord.seal()
    src = _source(spark, url, "s.orders", "enrich")
    _run_available_now(spark, src.select("id", "customer"), ck, catalog=url, table="s.out", job="enrich")
    orders.append({"id": [2], "customer": ["bob"], "amount": [4]}, barrier=OPEN_EPOCH)
    coord.seal()

    wider = _source(spark, url, "s.orders", "enrich").select("id", "customer", "amount")
    with pytest.raises(Exception, match="mergeSchema"):
        _run_available_now(spark, wider, ck, catalog=url, table="s.out", job="enrich")
    assert cat.load_table("s.out").schema.names == ["id", "customer"] and p.frontier("s.out") == 1

    _run_available_now(spark, _source(spark, url, "s.orders", "enrich").select("id", "customer", "amount"), ck,
                       catalog=url, table="s.out", job="enrich", mergeSchema="true")
    out = cat.load_table("s.out")
    assert out.schema.field("amount").nullable and p.frontier("s.out") == 2
    assert _rows(out) == [{"id": 1, "customer": "ann", "amount": None}, {"id": 2, "customer": "bob", "amount": 4}]

    # foreach_batch: the same rule per batch
    extra = spark.createDataFrame([(3, "cy", 5, "vip")], "id long, customer string, amount long, tier string")
    with pytest.raises(Exception, match="tier"):
        foreach_batch(url, "s.orders", job="feed")(extra, 0)
    foreach_batch(url, "s.orders", job="feed", merge_schema=True)(extra, 0)
    assert cat.load_table("s.orders").to_arrow(where=[("tier", "=", "vip")]).column("id").to_pylist() == [3]
    coord.release()
    cat.close()
