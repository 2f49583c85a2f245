"""Consistent reads without Spark: read plans, Arrow, DuckDB, SQL parsing (SQLite and PostgreSQL).

A small shop: ``s.orders`` (root, written by a feed), ``s.revenue`` (sum of
amounts per customer) and ``s.counts`` (orders per customer), derived by two
jobs the tests run barrier by barrier, so that one can lag the other. Every
expectation is computed from ``s.orders`` independently, in integers.
"""

from __future__ import annotations

import pickle
from collections import defaultdict

import pyarrow as pa
import pytest

from lakestep import Catalog, errors
from lakestep.barrier import OPEN_EPOCH, Pipeline
from lakestep.query import consistent_arrow, consistent_read, duckdb_connect, duckdb_query, table_refs
from lakestep.query.read import TableRef
from lakestep.services import Coordinator

ORDERS = pa.schema([("id", pa.int64()), ("customer", pa.string()), ("cents", pa.int64())])
REVENUE = pa.schema([("customer", pa.string()), ("revenue", pa.int64())])
COUNTS = pa.schema([("customer", pa.string()), ("orders", pa.int64())])


class Shop:
    def __init__(self, cat: Catalog) -> None:
        self.cat = cat
        cat.create_namespace("s")
        self.orders = cat.create_table("s.orders", ORDERS)
        cat.create_table("s.revenue", REVENUE)
        cat.create_table("s.counts", COUNTS)
        self.p = Pipeline(cat)
        self.p.register_job("feed", sinks=["s.orders"], external_input=True)
        self.p.register_job("rev", sources=["s.orders"], sinks=["s.revenue"])
        self.p.register_job("cnt", sources=["s.orders"], sinks=["s.counts"])
        self.coord = Coordinator(self.p.catalog, interval=3600)
        assert self.coord.acquire()
        self.next_id = 0

    def feed(self, *orders: tuple[str, int]) -> int:
        ids = list(range(self.next_id, self.next_id + len(orders)))
        self.next_id += len(orders)
        self.orders.append({"id": ids, "customer": [o[0] for o in orders], "cents": [o[1] for o in orders]},
                           barrier=OPEN_EPOCH)
        e = self.p.open_epoch()
        self.coord.seal()
        return e

    def run(self, job: str) -> None:
        """Process every barrier the job can, one batch each."""
        while (plan := self.p.next_batch(job, max_barriers=1)) is not None:
            rows = self.orders.to_arrow(version=plan.sources["s.orders"].to_version).to_pylist()
            agg: dict[str, int] = defaultdict(int)
            for r in rows:
                agg[r["customer"]] += r["cents"] if job == "rev" else 1
            col = "revenue" if job == "rev" else "orders"
            with self.p.batch(plan) as b:
                b.overwrite(plan.sinks[0], {"customer": list(agg), col: list(agg.values())})

    def truth(self, barrier: int) -> dict[str, tuple[int, int]]:
        """customer -> (revenue, orders) from the orders at ``barrier``."""
        rows = self.orders.to_arrow(version=self.p.version_at("s.orders", barrier)).to_pylist()
        out: dict[str, list[int]] = defaultdict(lambda: [0, 0])
        for r in rows:
            out[r["customer"]][0] += r["cents"]
            out[r["customer"]][1] += 1
        return {c: (v[0], v[1]) for c, v in out.items()}


@pytest.fixture
def shop(catalog: Catalog):  # type: ignore[no-untyped-def]
    s = Shop(catalog)
    yield s
    s.coord.release()


def lagging(shop: Shop) -> None:
    """revenue at barrier 3, counts at barrier 2."""
    shop.feed(("ann", 1000), ("bob", 250))
    shop.feed(("ann", 500))
    shop.run("rev")
    shop.run("cnt")
    shop.feed(("bob", 125), ("cy", 999))
    shop.run("rev")


JOIN = ("SELECT r.customer, r.revenue, c.orders FROM s.revenue r JOIN s.counts c ON r.customer = c.customer "
        "ORDER BY r.customer")


def as_dict(t: pa.Table) -> dict[str, tuple[int, int]]:
    return {r["customer"]: (r["revenue"], r["orders"]) for r in t.to_pylist()}


# ------------------------------------------------------------------ read plans
def test_read_plan_reads_what_the_table_reads(catalog: Catalog) -> None:
    catalog.create_namespace("p")
    t = catalog.create_table("p.t", ORDERS, partition_by=["customer"])
    t.append({"id": [1, 2], "customer": ["a", "b"], "cents": [1, 2]})
    t.append({"id": [3], "customer": ["a"], "cents": [3]})
    t.delete([("id", "=", 2)])
    for v in range(t.version + 1):
        plan = pickle.loads(pickle.dumps(t.read_plan(version=v)))  # plans travel to executors
        assert plan.version == v
        assert sorted(plan.to_arrow().to_pylist(), key=lambda r: r["id"]) == \
            sorted(t.to_arrow(version=v).to_pylist(), key=lambda r: r["id"])
        parts = plan.split(8)
        assert sorted(f.path for p in parts for f in p.files) == sorted(f.path for f in plan.files)
    plan = t.read_plan(where=[("customer", "=", "a")])
    assert {f.partition["customer"] for f in plan.files} == {"a"}
    assert sorted(plan.to_arrow().column("id").to_pylist()) == [1, 3]


def test_read_plan_merges_primary_key_tables(catalog: Catalog) -> None:
    catalog.create_namespace("p")
    t = catalog.create_table("p.k", pa.schema([("k", pa.int64()), ("v", pa.string())]), primary_key=["k"])
    t.upsert({"k": [1, 2, 3], "v": ["a", "b", "c"]})
    t.upsert({"k": [2], "v": ["B"]})
    t.delete([("k", "=", 3)])
    plan = t.read_plan()
    assert plan.merge_on_read and len(plan.files) == 3
    assert sorted(map(tuple, (r.values() for r in plan.to_arrow().to_pylist()))) == [(1, "a"), (2, "B")]
    assert [p.files for p in plan.split(4)] == [plan.files]  # one key range: merged together
    with pytest.raises(errors.InvalidArgumentError):
        plan.dataset()


# ------------------------------------------------------------- consistent reads
def test_read_committed_reads_both_aggregates_at_one_barrier(shop: Shop) -> None:
    lagging(shop)
    rows, info = consistent_arrow(shop.cat, ["s.revenue", "s.counts"])
    assert info.barrier == 2 and info.level == "read_committed"
    assert info.versions == {"s.revenue": shop.p.version_at("s.revenue", 2), "s.counts": shop.p.version_at("s.counts", 2)}
    assert info.behind == {"s.revenue": 0, "s.counts": 1}
    rev = {r["customer"]: r["revenue"] for r in rows["s.revenue"].to_pylist()}
    cnt = {r["customer"]: r["orders"] for r in rows["s.counts"].to_pylist()}
    assert {c: (rev[c], cnt[c]) for c in rev} == shop.truth(2)
    assert "held back by s.counts" in info.explanation


def test_read_uncommitted_mixes_barriers(shop: Shop) -> None:
    lagging(shop)
    rows, info = consistent_arrow(shop.cat, ["s.revenue", "s.counts"], level="read_uncommitted")
    assert info.barrier is None
    assert rows["s.revenue"].num_rows == 3 and rows["s.counts"].num_rows == 2  # cy only in revenue


def test_repeatable_read_pins_until_closed(shop: Shop) -> None:
    from lakestep.catalog.lifecycle import live_locks

    lagging(shop)
    shop.coord.snapshot()
    with consistent_read(shop.cat, ["s.revenue", "s.counts"], level="repeatable_read") as cr:
        assert cr.info.barrier == 2
        assert len(live_locks(shop.cat)) == 2
        shop.run("cnt")  # the tables move on; the pinned versions do not
        assert as_dict(pa.Table.from_pylist([
            {"customer": r["customer"], "revenue": r["revenue"], "orders": c["orders"]}
            for r in cr.arrow("s.revenue").to_pylist() for c in cr.arrow("s.counts").to_pylist()
            if r["customer"] == c["customer"]])) == shop.truth(2)
    assert live_locks(shop.cat) == []


def test_named_barrier_and_snapshot(shop: Shop) -> None:
    lagging(shop)
    shop.coord.snapshot()
    _, info = consistent_arrow(shop.cat, ["s.revenue", "s.counts"], barrier=1)
    assert info.barrier == 1 and info.versions["s.counts"] == shop.p.version_at("s.counts", 1)
    _, info = consistent_arrow(shop.cat, ["s.revenue", "s.counts"], snapshot="lakestep-barrier-2")
    assert info.barrier == 2 and info.versions["s.revenue"] == shop.p.version_at("s.revenue", 2)
    with pytest.raises(errors.QueryError):
        consistent_arrow(shop.cat, ["s.revenue"], barrier=1, snapshot="x")
    with pytest.raises(errors.QueryError):
        consistent_arrow(shop.cat, ["s.revenue"], level="dirty")


# ------------------------------------------------------------------- SQL
def test_table_refs_from_sql() -> None:
    sql = ("WITH x AS (SELECT * FROM s.a) SELECT * FROM x JOIN s.b VERSION AS OF 3 b ON x.id = b.id "
           "JOIN s.c TIMESTAMP AS OF '2026-11-22 10:00:00' c ON c.id = x.id "
           "JOIN s.d VERSION AS OF 'month-end' d ON d.id = x.id JOIN s.e VERSION AS OF 'barrier=7' e ON e.id = x.id")
    assert sorted(table_refs(sql, "duckdb"), key=lambda r: r.ident) == [
        TableRef("s.a"), TableRef("s.b", version=3), TableRef("s.c", timestamp="2026-11-22 10:00:00"),
        TableRef("s.d", snapshot="month-end"), TableRef("s.e", barrier=7)]
    with pytest.raises(errors.QueryError):
        table_refs("SELECT FROM WHERE", "duckdb")
    with pytest.raises(errors.QueryError):
        table_refs("SELECT 1", "duckdb")


def test_duckdb_join_is_consistent(shop: Shop) -> None:
    lagging(shop)
    res = duckdb_query(shop.cat, JOIN)
    assert res.read.barrier == 2
    assert as_dict(res.table) == shop.truth(2)
    naive = duckdb_query(shop.cat, JOIN, level="read_uncommitted")
    assert as_dict(naive.table) != shop.truth(3) and naive.read.barrier is None  # mixed ages
    shop.run("cnt")
    assert as_dict(duckdb_query(shop.cat, JOIN).table) == shop.truth(3)


def test_duckdb_time_travel_in_sql(shop: Shop) -> None:
    lagging(shop)
    v1 = shop.p.version_at("s.revenue", 1)
    res = duckdb_query(shop.cat, f"SELECT sum(revenue) AS total FROM s.revenue VERSION AS OF {v1}")
    assert res.table.column("total").to_pylist() == [sum(v[0] for v in shop.truth(1).values())]
    assert res.read.versions == {f"s.revenue@v{v1}": v1}
    res = duckdb_query(shop.cat, "SELECT sum(revenue) AS total FROM s.revenue VERSION AS OF 'barrier=2'")
    assert res.table.column("total").to_pylist() == [sum(v[0] for v in shop.truth(2).values())]
    shop.coord.snapshot()
    res = duckdb_query(shop.cat, "SELECT count(*) AS n FROM s.counts VERSION AS OF 'lakestep-barrier-2'")
    assert res.table.column("n").to_pylist() == [len(shop.truth(2))]


def test_duckdb_connection_views(shop: Shop) -> None:
    lagging(shop)
    with duckdb_connect(shop.cat, ["s.revenue", "s.counts", "s.orders"]) as db:
        assert db.read.barrier == 2
        assert as_dict(db.sql(JOIN)) == shop.truth(2)
        n = db.sql("SELECT count(*) AS n FROM s.orders").column("n").to_pylist()[0]
        assert n == sum(v[1] for v in shop.truth(2).values())


def test_duckdb_primary_key_table(catalog: Catalog) -> None:
    catalog.create_namespace("p")
    t = catalog.create_table("p.k", pa.schema([("k", pa.int64()), ("v", pa.string())]), primary_key=["k"])
    t.upsert({"k": [1, 2], "v": ["a", "b"]})
    t.upsert({"k": [2], "v": ["B"]})
    res = duckdb_query(catalog, "SELECT k, v FROM p.k ORDER BY k")
    assert res.table.to_pylist() == [{"k": 1, "v": "a"}, {"k": 2, "v": "B"}]


def test_duckdb_errors(shop: Shop) -> None:
    with pytest.raises(errors.TableNotFoundError):
        duckdb_query(shop.cat, "SELECT * FROM s.nope")
    with pytest.raises(errors.QueryError):
        duckdb_query(shop.cat, "SELECT no_such_column FROM s.orders")


def test_duckdb_reads_files_written_before_a_schema_change(catalog: Catalog) -> None:
    """DuckDB scans Parquet itself only for never re-schemed tables; older files of a table
    that gained a column read as the table's columns, the new one null."""
    catalog.create_namespace("e")
    t = catalog.create_table("e.t", pa.schema([("k", pa.int64())]))
    t.append({"k": [1]})
    assert t.read_plan().native_paths() is not None
    t.add_columns(pa.field("note", pa.string()))
    t.append({"k": [2], "note": ["x"]})
    assert catalog.load_table("e.t").read_plan().native_paths() is None
    res = duckdb_query(catalog, "SELECT k, note FROM e.t ORDER BY k")
    assert res.table.to_pylist() == [{"k": 1, "note": None}, {"k": 2, "note": "x"}]


def test_duckdb_checks_file_sizes_on_its_own_scan(catalog: Catalog) -> None:
    """A data file of another size than recorded is a typed error naming it, not rows."""
    catalog.create_namespace("c")
    t = catalog.create_table("c.t", pa.schema([("k", pa.int64())]))
    t.append({"k": [1, 2, 3]})
    (path,) = t.read_plan().native_paths()
    with open(path, "ab") as f:
        f.write(b"junk")
    with pytest.raises(errors.DataFileCorruptError) as ei:
        duckdb_query(catalog, "SELECT sum(k) AS s FROM c.t")
    assert ei.value.path == t.read_plan().files[0].path


def test_duckdb_query_keeps_no_file_contents_between_queries(catalog: Catalog) -> None:
    """The per-process database of duckdb_query lives as long as the process: a reader that
    queries a table for days reads ever new files, and DuckDB's external file cache kept every
    one of them (evicted only near its memory limit). It is off: after queries over a
    hundred files, the database holds none of their bytes."""
    import duckdb

    from lakestep.query import duck

    catalog.create_namespace("m")
    t = catalog.create_table("m.t", pa.schema([("k", pa.int64()), ("v", pa.string())]))
    for i in range(100):
        t.append({"k": list(range(i * 100, i * 100 + 100)), "v": [f"v{j}" for j in range(100)]})
        assert duckdb_query(catalog, "SELECT count(*) AS n FROM m.t").table.column("n").to_pylist() == [i * 100 + 100]
    assert t.read_plan().native_paths() is not None  # DuckDB scanned the files itself

    def cached(con: object) -> int:
        rows = con.sql("SELECT memory_usage_bytes FROM duckdb_memory() WHERE tag = 'EXTERNAL_FILE_CACHE'")  # type: ignore[attr-defined]
        return int(rows.fetchall()[0][0])

    con = duck._cursor()
    try:
        assert cached(con) == 0
    finally:
        con.close()
    # the setting is what keeps it so: a database with DuckDB's default cached those files
    (path, *_) = t.read_plan().native_paths() or []
    plain = duckdb.connect()
    try:
        plain.sql(f"SELECT count(*) FROM read_parquet('{path}')").fetchall()
        assert cached(plain) > 0
    finally:
        plain.close()
