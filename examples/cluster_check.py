"""Does lakestep work on this Spark cluster? (README, "On a cluster")

    python -m zipfile -c lakestep.zip lakestep/
    PYTHONPATH=lakestep.zip spark-submit --master spark://HOST:7077 --py-files lakestep.zip \\
        examples/cluster_check.py --catalog postgresql://user@db/lake --warehouse s3://bucket/lake

1. ``register(spark)`` checks that every executor imports the driver's lakestep
   (lakestep/streaming/executors.py) and prints where they found it;
2. the driver creates ``cluster_check.squares`` in the catalog (once);
3. the executors write ``id, id * id`` for ``--rows`` ids in 4 tasks
   (``format("lakestep")``, overwrite) and the driver commits their files;
4. the executors read the table back, and the exact count and sums are compared.

Only the driver talks to the catalog database; the executors only read and
write files in the warehouse (with their own AWS settings, or the
``storage.<name>`` options the driver hands them). Exits 0 and prints ``ok``
when everything matched, 1 otherwise; safe to run again.
"""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--catalog", required=True, help="the catalog database URL (postgresql://...)")
    ap.add_argument("--warehouse", required=True, help="where tables are created (s3://bucket/path, or a shared path)")
    ap.add_argument("--rows", type=int, default=10_000)
    args = ap.parse_args(argv)

    import pyarrow as pa
    from pyspark.sql import SparkSession

    from lakestep import Catalog
    from lakestep.streaming import register

    spark = SparkSession.builder.appName("lakestep-cluster-check").getOrCreate()
    found = register(spark)  # step 1
    print(f"executors run lakestep: {found if found is not None else 'not checked (local mode)'}")

    cat = Catalog(args.catalog, warehouse=args.warehouse)  # step 2
    cat.create_namespace("cluster_check", exist_ok=True)
    table = cat.create_table("cluster_check.squares", pa.schema([("id", pa.int64()), ("square", pa.int64())]),
                             exist_ok=True)

    def lakestep_format(io):  # type: ignore[no-untyped-def]
        return io.format("lakestep").option("catalog", args.catalog).option("table", table.ident)

    (lakestep_format(spark.range(args.rows).repartition(4).selectExpr("id", "id * id AS square").write)  # step 3
     .mode("overwrite").save())
    row = (lakestep_format(spark.read).load()  # step 4
           .selectExpr("count(*) AS n", "sum(id) AS ids", "sum(square) AS squares").first())
    n = args.rows
    want = (n, n * (n - 1) // 2, (n - 1) * n * (2 * n - 1) // 6)
    got = (row["n"], row["ids"], row["squares"])
    version = table.refresh().version
    spark.stop()
    if got != want:
        print(f"MISMATCH: {table.ident} version {version} has (count, sum of ids, sum of squares) {got}, "
              f"expected {want}")
        return 1
    print(f"ok: {table.ident} version {version}: {n} rows written and read back by the executors, sums exact")
    return 0


if __name__ == "__main__":
    sys.exit(main())
