"""Query-helper benchmark: what a consistent read costs on top of a plain read of the same files.

A small shop, per backend (SQLite and PostgreSQL): ``q.orders`` (root, written
by a feed, ``--files`` Parquet files of ``--rows`` rows), and two derived
tables ``q.revenue`` / ``q.counts`` (one small file each) kept up by two jobs,
with ``--barriers`` sealed barriers of history. A query joins the two derived
tables and sums ``q.orders``.

Each reader is timed two ways, interleaved round by round (so both see the
same machine):

* **plain**: the same data files, listed once before timing, read without
  lakestep (``pyarrow.parquet.read_table``; DuckDB ``read_parquet``; Spark
  ``spark.read.parquet``);
* **helper**: the lakestep helper, which chooses the barrier
  (``read_committed``, scope ``query``), plans each table at its version,
  checks the files and reads them (``consistent_arrow``; ``duckdb_query``;
  ``spark_sql``, with ``--spark``).

The overhead is p50(helper) - p50(plain), per reader and backend. Target:
under 10 ms. Output: a plain-text table on stdout and every number as JSON
(``--out``).

Run: ``python -m benchmarks.query [--backends sqlite,postgres] [--rounds 60] [--spark]``
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any, Callable, Iterator

import pyarrow as pa
import pyarrow.parquet as pq

from lakestep import Catalog
from lakestep.barrier import OPEN_EPOCH, Pipeline
from lakestep.query import consistent_arrow, duckdb_query
from lakestep.services import Coordinator

from .peers import DEFAULT_PG_DSN, fresh_pg_url

TARGET_MS = 10.0
ORDERS = pa.schema([("id", pa.int64()), ("customer", pa.string()), ("cents", pa.int64())])
REVENUE = pa.schema([("customer", pa.string()), ("revenue", pa.int64())])
COUNTS = pa.schema([("customer", pa.string()), ("orders", pa.int64())])
TABLES = ["q.orders", "q.revenue", "q.counts"]
SQL = ("SELECT r.customer, r.revenue, c.orders, (SELECT sum(cents) FROM q.orders) AS total "
       "FROM q.revenue r JOIN q.counts c ON r.customer = c.customer ORDER BY r.customer")


def _plain_sql(files: dict[str, list[str]], reader: str) -> str:
    def src(t: str) -> str:
        if reader == "duckdb":
            return "read_parquet([" + ", ".join(f"'{f}'" for f in files[t]) + "])"
        return "q_" + t.split(".")[1]
    return (f"SELECT r.customer, r.revenue, c.orders, (SELECT sum(cents) FROM {src('q.orders')}) AS total "
            f"FROM {src('q.revenue')} r JOIN {src('q.counts')} c ON r.customer = c.customer ORDER BY r.customer")


@contextlib.contextmanager
def shop(workdir: Path, backend: str, pg_dsn: str, n_files: int, rows: int, barriers: int) -> Iterator[Catalog]:
    """The catalog with its history built (see the module docstring)."""
    with contextlib.ExitStack() as stack:
        if backend == "sqlite":
            url = f"sqlite:///{workdir}/{backend}/catalog.db"
        else:
            url = stack.enter_context(fresh_pg_url(pg_dsn, "bench_query"))
        cat = Catalog(url, warehouse=str(workdir / backend))
        stack.callback(cat.close)
        cat.create_namespace("q")
        orders = cat.create_table("q.orders", ORDERS)
        cat.create_table("q.revenue", REVENUE)
        cat.create_table("q.counts", COUNTS)
        p = Pipeline(cat)
        p.register_job("feed", sinks=["q.orders"], external_input=True)
        p.register_job("rev", sources=["q.orders"], sinks=["q.revenue"])
        p.register_job("cnt", sources=["q.orders"], sinks=["q.counts"])
        coord = Coordinator(p.catalog, interval=3600)
        assert coord.acquire()
        stack.callback(coord.release)
        per_barrier = max(1, n_files // barriers)
        next_id = 0
        totals: dict[str, list[int]] = defaultdict(lambda: [0, 0])
        for f in range(n_files):
            ids = list(range(next_id, next_id + rows))
            next_id += rows
            customers = [f"c{i % 50}" for i in ids]
            cents = [(i * 37) % 10_000 for i in ids]
            orders.append({"id": ids, "customer": customers, "cents": cents}, barrier=OPEN_EPOCH)
            for c, v in zip(customers, cents):
                totals[c][0] += v
                totals[c][1] += 1
            if (f + 1) % per_barrier == 0 or f == n_files - 1:
                coord.seal()
                for job, col, i in (("rev", "revenue", 0), ("cnt", "orders", 1)):
                    while (plan := p.next_batch(job, max_barriers=1)) is not None:
                        with p.batch(plan) as b:
                            b.overwrite(plan.sinks[0], {"customer": list(totals), col: [v[i] for v in totals.values()]})
        yield cat


def time_ms(fn: Callable[[], Any]) -> float:
    t0 = time.perf_counter()
    fn()
    return (time.perf_counter() - t0) * 1000.0


def measure(cat: Catalog, rounds: int, spark: Any) -> dict[str, dict[str, Any]]:
    import duckdb

    _, info = consistent_arrow(cat, TABLES)
    files = {t: [f.uri for f in cat.load_table(t).read_plan(version=info.versions[t]).files] for t in TABLES}
    con = duckdb.connect()

    def plain_duckdb() -> pa.Table:  # materialized, as duckdb_query's rows are (.arrow() may be a lazy reader)
        rel = con.sql(_plain_sql(files, "duckdb"))
        return (getattr(rel, "to_arrow_table", None) or rel.fetch_arrow_table)()

    expected = duckdb_query(cat, SQL).table
    assert plain_duckdb().equals(expected), "the plain read and the helper disagree: the benchmark would compare different work"
    readers: dict[str, tuple[Callable[[], Any], Callable[[], Any]]] = {
        "arrow": (lambda: [pq.read_table(files[t]) for t in TABLES], lambda: consistent_arrow(cat, TABLES)),
        "duckdb": (plain_duckdb, lambda: duckdb_query(cat, SQL)),
    }
    if spark is not None:
        from lakestep.query import spark_sql

        def plain_spark() -> Any:
            for t in TABLES:
                spark.read.parquet(*files[t]).createOrReplaceTempView("q_" + t.split(".")[1])
            return spark.sql(_plain_sql(files, "spark")).collect()

        def helper_spark() -> Any:
            with spark_sql(spark, cat, SQL) as r:
                return r.df.collect()

        readers["spark"] = (plain_spark, helper_spark)
    out: dict[str, dict[str, Any]] = {}
    for name, (plain, helper) in readers.items():
        for _ in range(3):  # warm up both (imports, caches, JIT of the JVM)
            plain()
            helper()
        p_ms: list[float] = []
        h_ms: list[float] = []
        for i in range(rounds):
            order = (plain, helper) if i % 2 == 0 else (helper, plain)
            for fn in order:
                (p_ms if fn is plain else h_ms).append(time_ms(fn))
        p50p, p50h = statistics.median(p_ms), statistics.median(h_ms)
        out[name] = {"plain_p50_ms": round(p50p, 3), "helper_p50_ms": round(p50h, 3),
                     "overhead_p50_ms": round(p50h - p50p, 3), "rounds": rounds,
                     "target_ms": TARGET_MS, "met": p50h - p50p < TARGET_MS}
    con.close()
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--backends", default="sqlite,postgres")
    ap.add_argument("--rounds", type=int, default=60)
    ap.add_argument("--files", type=int, default=40)
    ap.add_argument("--rows", type=int, default=2_000)
    ap.add_argument("--barriers", type=int, default=20)
    ap.add_argument("--spark", action="store_true", help="also time spark_sql (starts a local Spark)")
    ap.add_argument("--pg-dsn", default=DEFAULT_PG_DSN)
    ap.add_argument("--out", default="benchmarks/results/query.json")
    args = ap.parse_args(argv)
    spark = None
    if args.spark:
        from pyspark.sql import SparkSession

        spark = (SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false")
                 .config("spark.sql.shuffle.partitions", "2").getOrCreate())
        spark.sparkContext.setLogLevel("ERROR")
    results: dict[str, Any] = {"config": vars(args), "results": {}}
    with tempfile.TemporaryDirectory(prefix="lakestep-bench-query-") as tmp:
        for backend in args.backends.split(","):
            with shop(Path(tmp), backend, args.pg_dsn, args.files, args.rows, args.barriers) as cat:
                results["results"][backend] = measure(cat, args.rounds, spark)
    print(f"{'backend':<10} {'reader':<8} {'plain p50 ms':>13} {'helper p50 ms':>14} {'overhead ms':>12}  target < {TARGET_MS:g} ms")
    for backend, by_reader in results["results"].items():
        for reader, r in by_reader.items():
            print(f"{backend:<10} {reader:<8} {r['plain_p50_ms']:>13.2f} {r['helper_p50_ms']:>14.2f} "
                  f"{r['overhead_p50_ms']:>12.2f}  {'met' if r['met'] else 'MISSED'}")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2))
    print(f"results: {out}")
    if spark is not None:
        spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
