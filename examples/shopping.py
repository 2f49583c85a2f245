"""The shopping pipeline (``make demo``): Kafka -> orders -> two aggregates -> a dashboard.

1. An embedded Kafka-protocol broker (tansu) receives orders as JSON.
2. Root job ``ingest`` (Spark, lakestep-kafka source -> lakestep sink) commits
   them to ``shop.orders`` on the open epoch; a coordinator seals an epoch
   every second.
3. Two derived jobs read ``shop.orders`` barrier by barrier, at different
   speeds: ``revenue`` (fast) sums the amounts per customer, ``counts`` (slow)
   counts the orders per customer.
4. The dashboard computes the average order value per customer by joining
   the two aggregates, twice: reading each table's newest version (what a plain
   lakehouse gives you) and with ``read_committed`` (both at the same barrier).
   Only the consistent read always matches the truth computed from the orders.

Everything runs locally: a SQLite catalog in ./demo-warehouse, Spark in local mode.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import sys
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc

from lakestep import Catalog
from lakestep.barrier import Pipeline

WAREHOUSE = Path("demo-warehouse").resolve()
CUSTOMERS = ["ann", "bob", "cy", "dee", "eve"]


def say(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def spark_session():  # type: ignore[no-untyped-def]
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    root = str(Path(__file__).resolve().parents[1])
    os.environ["PYTHONPATH"] = root + os.pathsep + os.environ.get("PYTHONPATH", "")
    from pyspark.sql import SparkSession

    spark = (SparkSession.builder.master("local[2]").appName("lakestep-shopping")
             .config("spark.ui.enabled", "false").config("spark.sql.shuffle.partitions", "2")
             .config("spark.ui.showConsoleProgress", "false")
             .config("spark.sql.session.timeZone", "UTC").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def averages(revenue: pa.Table, counts: pa.Table) -> dict[str, float]:
    rev = dict(zip(revenue.column("customer").to_pylist(), revenue.column("revenue").to_pylist()))
    cnt = dict(zip(counts.column("customer").to_pylist(), counts.column("orders").to_pylist()))
    return {c: round(rev[c] / cnt[c], 4) for c in rev if cnt.get(c)}


def main(seconds: float = 25.0) -> None:
    from lakestep.streaming import register, register_job
    from lakestep.streaming.broker import TansuBroker

    shutil.rmtree(WAREHOUSE, ignore_errors=True)
    cat = Catalog(warehouse=str(WAREHOUSE))
    cat.create_namespace("shop")
    cat.create_table("shop.orders", pa.schema([("order_id", pa.int64()), ("customer", pa.string()),
                                               ("amount", pa.float64())]))
    cat.create_table("shop.revenue", pa.schema([("customer", pa.string()), ("revenue", pa.float64())]))
    cat.create_table("shop.counts", pa.schema([("customer", pa.string()), ("orders", pa.int64())]))
    url = cat.url
    p = Pipeline(cat)
    register_job(url, "revenue", sources=["shop.orders"], sinks=["shop.revenue"])
    register_job(url, "counts", sources=["shop.orders"], sinks=["shop.counts"])

    with TansuBroker() as broker:
        broker.create_topic("orders", partitions=2)
        say(f"broker on {broker.bootstrap_servers}; starting Spark (local mode)")
        spark = spark_session()
        register(spark)
        from pyspark.sql import functions as F

        ck = WAREHOUSE / "_checkpoints"
        raw = (spark.readStream.format("lakestep-kafka").option("kafka.bootstrap.servers", broker.bootstrap_servers)
               .option("subscribe", "orders").option("startingOffsets", "earliest").load())
        orders = raw.select(F.from_json(F.col("value").cast("string"),
                                        "order_id long, customer string, amount double").alias("o")).select("o.*")
        ingest = (orders.writeStream.format("lakestep").option("catalog", url).option("table", "shop.orders")
                  .option("job", "ingest").option("checkpointLocation", str(ck / "ingest"))
                  .trigger(processingTime="500 milliseconds").start())

        def derived(job: str, agg, table: str, every: str):  # type: ignore[no-untyped-def]
            src = (spark.readStream.format("lakestep").option("catalog", url).option("table", "shop.orders")
                   .option("job", job).option("maxBarriersPerTrigger", "50").load())
            return (agg(src.groupBy("customer")).writeStream.outputMode("complete").format("lakestep")
                    .option("catalog", url).option("table", table).option("job", job)
                    .option("checkpointLocation", str(ck / job)).trigger(processingTime=every).start())

        queries = [
            ingest,
            derived("revenue", lambda g: g.agg(F.sum("amount").alias("revenue")), "shop.revenue", "300 milliseconds"),
            derived("counts", lambda g: g.agg(F.count("*").cast("long").alias("orders")), "shop.counts", "2 seconds"),
        ]
        coord = p.coordinator(interval=3.0)
        coord.start()
        say("pipeline running: ingest -> shop.orders -> shop.revenue (fast), shop.counts (slow)")
        rng = random.Random(1)
        next_id = 0
        deadline = time.time() + 300.0  # Spark's start-up first; then ``seconds`` of dashboard reads
        weak_wrong = strong_wrong = checks = 0
        choice = None
        try:
            while time.time() < deadline:
                batch = [{"order_id": next_id + i, "customer": rng.choice(CUSTOMERS),
                          "amount": round(rng.uniform(1, 100), 2)} for i in range(20)]
                next_id += len(batch)
                broker.produce("orders", [json.dumps(o) for o in batch])
                time.sleep(0.5)
                rev_t, cnt_t = cat.load_table("shop.revenue"), cat.load_table("shop.counts")
                if rev_t.version == 0 or cnt_t.version == 0:
                    continue
                if checks == 0:
                    say("both aggregates have data: the dashboard starts reading")
                    deadline = time.time() + seconds
                weak = averages(rev_t.to_arrow(), cnt_t.to_arrow())
                choice = p.choose(["shop.revenue", "shop.counts"])
                if choice.barrier is None:
                    continue
                strong = averages(choice.read("shop.revenue"), choice.read("shop.counts"))
                orders_at = p.version_at("shop.orders", choice.barrier)
                truth_rows = cat.load_table("shop.orders").to_arrow(version=orders_at)
                truth: dict[str, float] = {}
                if truth_rows.num_rows:
                    g = truth_rows.group_by("customer").aggregate([("amount", "sum"), ("amount", "count")])
                    truth = {c: round(s / n, 4) for c, s, n in zip(g.column("customer").to_pylist(),
                                                                  g.column("amount_sum").to_pylist(),
                                                                  g.column("amount_count").to_pylist())}
                checks += 1
                weak_ok = all(abs(weak.get(c, 0) - truth.get(c, 0)) < 1e-6 for c in truth) and weak.keys() == truth.keys()
                strong_ok = strong == truth
                weak_wrong += not weak_ok
                strong_wrong += not strong_ok
                who = next((c for c in CUSTOMERS if c in truth), "ann")
                say(f"barrier {choice.barrier:>3}: avg order of {who:<3} newest versions={weak.get(who, 0):7.2f} "
                    f"{'ok   ' if weak_ok else 'WRONG'}  read_committed={strong.get(who, 0):7.2f} "
                    f"{'ok' if strong_ok else 'WRONG'}  (truth {truth.get(who, 0):7.2f})")
        finally:
            coord.stop()
            spark.sparkContext.setLogLevel("OFF")  # stopping a query cancels its running tasks: not errors
            for q in queries:
                q.stop()
            spark.stop()
    print()
    print(f"{checks} dashboard reads: newest-versions wrong {weak_wrong} time(s), read_committed wrong "
          f"{strong_wrong} time(s)")
    if choice is not None:
        print(f"why the consistent read used barrier {choice.barrier}:")
        print(choice.explanation)
    cat.close()
    if strong_wrong:
        raise SystemExit("read_committed returned an inconsistent answer: this is a bug")
    if not checks:
        raise SystemExit("the pipeline produced no aggregates in time")


if __name__ == "__main__":
    main(float(sys.argv[1]) if len(sys.argv) > 1 else 25.0)
