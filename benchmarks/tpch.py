"""An analytic suite through lakestep's consistent readers against the same engines reading the
same Parquet files natively (issue: Spark at native speed).

TPC-H data is generated with DuckDB's tpch extension (the ``duckdb-extension-tpch`` wheel,
``LOAD``-ed from its folder) at scale factor ``--sf`` and loaded into lakestep tables
(``tpch.*``, SQLite catalog, files of at most ``--rows-per-file`` rows). Six queries (TPC-H
Q1, Q3, Q5, Q6, Q10, Q14) then run, interleaved round by round:

* **Spark**: ``spark_sql`` (lakestep chooses the versions, Spark scans the files) against
  the same SQL over ``spark.read.parquet`` of the same files;
* **DuckDB**: ``duckdb_query`` against the same SQL over ``read_parquet`` of the same files.

Every answer through lakestep must equal the native one exactly (same engine, same SQL);
the times are per-query medians over ``--rounds`` rounds, and the suite's sum. Targets:
spark_sql within 1.15x of native Spark, duckdb_query within 1.1x of native DuckDB. Prints
a table, writes JSON (``--out``); exits 1 when an answer differs (``--strict``: or a
target is missed).

    python -m benchmarks.tpch [--sf 1] [--rounds 3] [--engines spark,duckdb]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

import pyarrow as pa

ROOT = Path(__file__).resolve().parents[1]
TABLES = ("lineitem", "orders", "customer", "supplier", "nation", "region", "part")
TARGETS = {"spark": 1.15, "duckdb": 1.1}

QUERIES = {
    "q1": """
        SELECT l_returnflag, l_linestatus, sum(l_quantity) AS sum_qty, sum(l_extendedprice) AS sum_base_price,
               sum(l_extendedprice * (1 - l_discount)) AS sum_disc_price,
               sum(l_extendedprice * (1 - l_discount) * (1 + l_tax)) AS sum_charge, count(*) AS count_order
          FROM tpch.lineitem
         WHERE l_shipdate <= DATE '1998-09-02'
         GROUP BY l_returnflag, l_linestatus ORDER BY l_returnflag, l_linestatus""",
    "q3": """
        SELECT l_orderkey, sum(l_extendedprice * (1 - l_discount)) AS revenue, o_orderdate, o_shippriority
          FROM tpch.customer c JOIN tpch.orders o ON c.c_custkey = o.o_custkey
               JOIN tpch.lineitem l ON l.l_orderkey = o.o_orderkey
         WHERE c_mktsegment = 'BUILDING' AND o_orderdate < DATE '1995-03-15' AND l_shipdate > DATE '1995-03-15'
         GROUP BY l_orderkey, o_orderdate, o_shippriority
         ORDER BY revenue DESC, o_orderdate, l_orderkey LIMIT 10""",
    "q5": """
        SELECT n_name, sum(l_extendedprice * (1 - l_discount)) AS revenue
          FROM tpch.customer c JOIN tpch.orders o ON c.c_custkey = o.o_custkey
               JOIN tpch.lineitem l ON l.l_orderkey = o.o_orderkey
               JOIN tpch.supplier s ON l.l_suppkey = s.s_suppkey AND c.c_nationkey = s.s_nationkey
               JOIN tpch.nation n ON s.s_nationkey = n.n_nationkey
               JOIN tpch.region r ON n.n_regionkey = r.r_regionkey
         WHERE r_name = 'ASIA' AND o_orderdate >= DATE '1994-01-01' AND o_orderdate < DATE '1995-01-01'
         GROUP BY n_name ORDER BY revenue DESC, n_name""",
    "q6": """
        SELECT sum(l_extendedprice * l_discount) AS revenue
          FROM tpch.lineitem
         WHERE l_shipdate >= DATE '1994-01-01' AND l_shipdate < DATE '1995-01-01'
           AND l_discount BETWEEN 0.05 AND 0.07 AND l_quantity < 24""",
    "q10": """
        SELECT c_custkey, c_name, sum(l_extendedprice * (1 - l_discount)) AS revenue, c_acctbal, n_name
          FROM tpch.customer c JOIN tpch.orders o ON c.c_custkey = o.o_custkey
               JOIN tpch.lineitem l ON l.l_orderkey = o.o_orderkey
               JOIN tpch.nation n ON c.c_nationkey = n.n_nationkey
         WHERE o_orderdate >= DATE '1993-10-01' AND o_orderdate < DATE '1994-01-01' AND l_returnflag = 'R'
         GROUP BY c_custkey, c_name, c_acctbal, n_name
         ORDER BY revenue DESC, c_custkey LIMIT 20""",
    "q14": """
        SELECT sum(CASE WHEN p_type LIKE 'PROMO%' THEN l_extendedprice * (1 - l_discount) ELSE 0 END) AS promo,
               sum(l_extendedprice * (1 - l_discount)) AS total
          FROM tpch.lineitem l JOIN tpch.part p ON l.l_partkey = p.p_partkey
         WHERE l_shipdate >= DATE '1995-09-01' AND l_shipdate < DATE '1995-10-01'""",
}


def generate(sf: float, workdir: Path, rows_per_file: int) -> tuple[Any, dict[str, list[str]]]:
    """TPC-H at ``sf`` in a lakestep catalog under ``workdir``; (catalog, table -> its file paths)."""
    import duckdb

    from lakestep import Catalog
    from lakestep.query.duck import load_extensions

    con = duckdb.connect()
    load_extensions(con, "tpch")
    con.execute(f"CALL dbgen(sf={sf})")
    cat = Catalog(warehouse=str(workdir / "wh"))
    cat.create_namespace("tpch", exist_ok=True)
    files: dict[str, list[str]] = {}
    for name in TABLES:
        data: pa.Table = con.execute(f"SELECT * FROM {name}").to_arrow_table()
        data = data.cast(pa.schema([f.with_nullable(True) for f in data.schema]))
        t = cat.create_table(f"tpch.{name}", data.schema, exist_ok=True)
        with cat.transaction() as tx:
            for start in range(0, max(data.num_rows, 1), rows_per_file):
                tx.append(t, data.slice(start, rows_per_file))
        plan = t.read_plan()
        files[name] = [plan.store().full_path(f.path) for f in plan.files]
    con.close()
    return cat, files


def native_sql(sql: str) -> str:
    return sql.replace("tpch.", "native_")


def spark_session(workdir: Path) -> Any:
    from pyspark.sql import SparkSession

    from lakestep.testing.spark import log4j2_properties

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    log4j = workdir / "log4j2.properties"
    log4j.write_text(log4j2_properties("error"))
    spark = (SparkSession.builder.master("local[2]").appName("lakestep-tpch")
             .config("spark.ui.enabled", "false").config("spark.sql.session.timeZone", "UTC")
             .config("spark.sql.shuffle.partitions", "4").config("spark.driver.memory", "6g")
             .config("spark.driver.extraJavaOptions", f"-Dlog4j2.configurationFile=file:{log4j}")
             .getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def run(sf: float, rounds: int, engines: list[str], rows_per_file: int, workdir: Path) -> dict[str, Any]:
    t0 = time.perf_counter()
    cat, files = generate(sf, workdir, rows_per_file)
    out: dict[str, Any] = {"sf": sf, "rounds": rounds, "load_s": time.perf_counter() - t0, "engines": {}}
    print(f"TPC-H sf {sf} loaded into lakestep in {out['load_s']:.1f} s "
          f"({sum(len(v) for v in files.values())} files)", flush=True)
    runners: dict[str, tuple[Callable[[str], Any], Callable[[str], Any]]] = {}
    spark = None
    if "spark" in engines:
        from lakestep.query import spark_sql

        spark = spark_session(workdir)
        for name, paths in files.items():
            spark.read.parquet(*paths).createOrReplaceTempView(f"native_{name}")
        url = cat.connection_url()
        runners["spark"] = (lambda q: spark.sql(native_sql(q)).collect(),
                            lambda q: spark_sql(spark, url, q).df.collect())
    if "duckdb" in engines:
        import duckdb

        from lakestep.query import duckdb_query

        con = duckdb.connect()
        for name, paths in files.items():
            con.execute(f"CREATE VIEW native_{name} AS SELECT * FROM read_parquet({paths!r})")
        runners["duckdb"] = (lambda q: con.execute(native_sql(q)).fetchall(),
                             lambda q: [tuple(r.values()) for r in duckdb_query(cat, q).table.to_pylist()])
    wrong: list[str] = []
    for engine, (native, helper) in runners.items():
        times: dict[str, dict[str, list[float]]] = {q: {"native": [], "lakestep": []} for q in QUERIES}
        for q, sql in QUERIES.items():  # warm-up, and the exact check
            a, b = native(sql), helper(sql)
            if [tuple(r) for r in a] != [tuple(r) for r in b]:
                wrong.append(f"{engine} {q}: lakestep {b[:3]} against native {a[:3]}")
        for r in range(rounds):
            for q, sql in QUERIES.items():
                order = (("native", native), ("lakestep", helper)) if r % 2 == 0 else \
                    (("lakestep", helper), ("native", native))
                for kind, fn in order:
                    times[q][kind].append(timed(lambda: fn(sql))[0])
        med = {q: {k: statistics.median(v) for k, v in t.items()} for q, t in times.items()}
        total = {k: sum(m[k] for m in med.values()) for k in ("native", "lakestep")}
        out["engines"][engine] = {"queries": med, "total": total,
                                  "ratio": total["lakestep"] / total["native"],
                                  "worst_query_ratio": max(m["lakestep"] / m["native"] for m in med.values())}
        for q, m in med.items():
            print(f"  {engine:<6} {q:<4} native {m['native'] * 1000:8.1f} ms   lakestep {m['lakestep'] * 1000:8.1f} ms"
                  f"   {m['lakestep'] / m['native']:.2f}x", flush=True)
        print(f"  {engine:<6} suite native {total['native']:.2f} s, lakestep {total['lakestep']:.2f} s: "
              f"{out['engines'][engine]['ratio']:.2f}x (target {TARGETS[engine]}x)", flush=True)
    if spark is not None:
        spark.stop()
    cat.close()
    out["wrong"] = wrong
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.tpch", description=__doc__.splitlines()[0])
    ap.add_argument("--sf", type=float, default=1.0)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--engines", default="spark,duckdb")
    ap.add_argument("--rows-per-file", type=int, default=1_000_000)
    ap.add_argument("--strict", action="store_true", help="exit 1 when a target is missed too")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "tpch.json"))
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="bench-tpch-") as d:
        res = run(args.sf, args.rounds, args.engines.split(","), args.rows_per_file, Path(d))
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"targets": TARGETS, **res}, indent=2, default=str))
    for w in res["wrong"]:
        print(f"WRONG: {w}")
    missed = [e for e, r in res["engines"].items() if r["ratio"] > TARGETS[e]]
    for e in missed:
        print(f"MISSED: {e} suite at {res['engines'][e]['ratio']:.2f}x of native (target {TARGETS[e]}x)")
    return 1 if res["wrong"] or (args.strict and missed) else 0


if __name__ == "__main__":
    sys.exit(main())
