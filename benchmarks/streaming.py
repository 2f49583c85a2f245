"""Streaming benchmark: the lakestep Spark formats against their plain peers, in one run.

Measured, with targets (every ratio from this run, on this machine):

(a) sink throughput: ``rate-micro-batch`` source (fixed ``rowsPerBatch``, columns
    id long, ts timestamp, value double, name string) written by the ``lakestep``
    sink and by Spark's ``parquet`` file sink, the same DataFrame, trigger
    ``processingTime=0`` for ``batches + 1`` micro-batches (the first, warm-up
    batch is dropped).  rows/s = rows / sum(``durationMs.triggerExecution``) of the
    kept batches.  ``sink_rounds`` rounds, the order alternating.
    Target: median over rounds of lakestep / parquet >= 0.9.
    In the same rounds, with the same target: ``lakestep-spark``,
    ``foreachBatch(foreach_batch(..., writer="spark"))``: Spark's own Parquet
    writer writes the files and the driver commits them from their footers.
    Informational, in the same rounds: ``python-null``, a Python sink that only
    receives the Arrow batches (benchmarks/formats.py ``lakestep-bench-null``):
    its ratio to parquet is the ceiling of any sink built on pyspark's Python
    data source API on this machine.
(b) Kafka ingest: ``messages`` records (~50-byte values, 4 partitions, tansu
    broker) read by ``lakestep-kafka`` into a lakestep table (``availableNow``,
    ``maxOffsetsPerTrigger``) vs one kafka-python consumer (assign + seek to
    beginning, no group, ``poll()`` decoding ``ConsumerRecord``s as any
    application does) reading all partitions until it has every record.
    Both readers first run once on a small warm-up topic: a session's first
    Kafka query pays JVM and Python-worker start-up (10-40 s), reported as the
    ``cold`` row, not in the ratio. Then ``kafka_rounds`` rounds read the same
    records (fresh table and checkpoint each round, reader order alternating).
    Timed: kafka-python from creating its consumer to its last record;
    lakestep = sum(``durationMs.triggerExecution``) of the batches with data,
    i.e. from each trigger's offset lookup to its commit in the lakestep table
    (the query start before the first trigger is only in ``wall rows/s``).
    Each round also times kafka-python in ``--kafka-processes`` processes (default
    2: one per core, partitions split, since the Spark side uses both cores),
    the three readers in alternating order.
    Target: median over rounds of lakestep rows/s / rows/s of kafka-python in
    ``--kafka-processes`` processes >= 1.0 (the one-process ratio is reported
    as information); every round's table ends with exactly ``messages``
    distinct rows. The same rounds also run ``lakestep-spark``: the same
    Kafka stream into the table through ``foreach_batch(..., writer="spark")``,
    and ``lakestep-ingest``: :func:`lakestep.streaming.kafka.ingest`, where each
    task writes its offset range as the table's files and only the file lists
    cross Spark (rows/s counted from the table, as every batch's input rows are
    file lists there), with the same target.
(c) barrier latency: a root table appended with ``barrier=OPEN_EPOCH``, the epoch
    sealed by a Coordinator, a derived Spark job (lakestep source -> lakestep sink,
    trigger 200 ms); latency = derived commit tagged with the barrier
    (``committed_at``) - ``sealed_at``, p50 / p99 over ``barriers`` seals (one seal
    at a time, each waited for).  Spark's ~1 s micro-batch overhead dominates: no
    target, reported as is.
(d) where one Kafka trigger's time goes (``--only d``, not in the default run):
    ``stage_messages`` records read in ONE trigger into Spark's ``noop`` sink, into
    ``lakestep-bench-null`` and into the ``lakestep`` sink (its driver commit timed),
    and read by the executor's code alone in this process; ``stage_rounds`` rounds,
    order alternating. The stages are differences of the medians
    (:func:`run_kafka_stages`): Spark's fixed cost per trigger, the Kafka read in the
    Python workers up to the JVM, the hand-off to the Python sink, Parquet, the
    catalog commit. No target: it says which part to cut.

Output: a plain-text table on stdout, every number in ``--out`` (JSON).
Run: ``python -m benchmarks.streaming [--quick] [--only abcd]``
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import statistics
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any, Callable

import pyarrow as pa

import lakestep
from lakestep import Catalog

from .commit import Check, finish, text_table

REPO_ROOT = Path(__file__).resolve().parents[1]
SINK_TARGET = 0.9
KAFKA_TARGET = 1.0
BENCH_SCHEMA = pa.schema([("id", pa.int64()), ("ts", pa.timestamp("us", tz="UTC")), ("value", pa.float64()),
                          ("name", pa.string())])
KAFKA_TABLE_SCHEMA = pa.schema([("key", pa.binary()), ("value", pa.binary()), ("topic", pa.string()),
                                ("partition", pa.int32()), ("offset", pa.int64()),
                                ("timestamp", pa.timestamp("us", tz="UTC"))])
PARTITIONS = 4


def step(label: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {label}", file=sys.stderr, flush=True)


def make_spark(tmp: Path, app: str = "lakestep-bench-streaming") -> Any:
    """A local[2] session configured like tests/streaming/conftest.py (full JIT: a benchmark)."""
    from lakestep.testing.spark import local_session

    spark = local_session(app, tmp, pythonpath=REPO_ROOT,
                          conf={"spark.sql.warehouse.dir": str(tmp / "spark-warehouse"),
                                "spark.sql.streaming.forceDeleteTempCheckpointLocation": "true",
                                "spark.sql.streaming.stopTimeout": "60s"})
    from lakestep.streaming import register

    register(spark)
    return spark


def batch_stats(progress: list[dict[str, Any]], skip: int = 0) -> dict[str, Any]:
    """rows, seconds (sum of triggerExecution), rows/s and the addBatch share of the batches with data."""
    kept = [p for p in progress if p.get("numInputRows", 0) > 0][skip:]
    rows = sum(int(p["numInputRows"]) for p in kept)
    trig = sum(p["durationMs"].get("triggerExecution", 0) for p in kept) / 1000
    add = sum(p["durationMs"].get("addBatch", 0) for p in kept) / 1000
    return {"batches": len(kept), "rows": rows, "seconds": round(trig, 3), "add_batch_s": round(add, 3),
            "rows_per_s": round(rows / trig, 1) if trig else None,
            "batch_ms": [p["durationMs"].get("triggerExecution") for p in kept],
            "duration_ms_sum": {k: sum(p["durationMs"].get(k, 0) for p in kept)
                                for k in sorted({k for p in kept for k in p["durationMs"]})}}


# --------------------------------------------------------------------------- (a)
def run_sink(spark: Any, root: Path, fmt: str, rows_per_batch: int, batches: int) -> dict[str, Any]:
    """``batches`` + 1 fixed-size micro-batches from rate-micro-batch into ``fmt``; the first is warm-up."""
    df = (spark.readStream.format("rate-micro-batch").option("rowsPerBatch", rows_per_batch)
          .option("numPartitions", 2).load()
          .selectExpr("value AS id", "timestamp AS ts", "CAST(value AS DOUBLE) * 0.5 AS value",
                      "CONCAT('name-', CAST(value % 1000 AS STRING)) AS name"))
    w = df.writeStream.option("checkpointLocation", str(root / f"ck-{fmt}")).trigger(processingTime="0 seconds")
    if fmt == "lakestep":
        cat = Catalog(warehouse=str(root / "wh-sink"))
        cat.create_namespace("b")
        table = cat.create_table("b.t", BENCH_SCHEMA)
        w = w.format("lakestep").option("catalog", cat.url).option("table", "b.t").option("job", "bench")
    elif fmt == "lakestep-spark":
        from lakestep.streaming import foreach_batch

        cat = Catalog(warehouse=str(root / "wh-sink-spark"))
        cat.create_namespace("b")
        table = cat.create_table("b.t", BENCH_SCHEMA)
        w = w.foreachBatch(foreach_batch(cat.url, "b.t", job="bench", writer="spark"))
    elif fmt == "python-null":
        from .formats import NULL_NAME, NullSink

        spark.dataSource.register(NullSink)
        w = w.format(NULL_NAME)
    elif fmt == "delta":  # benchmarks.jvm_peers: in the peers' Spark (Delta Lake's jars)
        w = w.format("delta").option("path", str(root / "delta-out"))
    elif fmt != "iceberg":
        w = w.format("parquet").option("path", str(root / "parquet-out"))
    if fmt == "iceberg":  # benchmarks.jvm_peers: the peers' Spark, its Iceberg catalog ``bench``
        ident = f"bench.k.sink_{root.name.replace('-', '_')}"
        spark.sql(f"CREATE TABLE {ident} (id bigint, ts timestamp, value double, name string) USING iceberg")
        q = w.queryName(f"sink-{fmt}").toTable(ident)
    else:
        q = w.queryName(f"sink-{fmt}").start()
    try:
        deadline = time.time() + 1800
        while sum(1 for p in q.recentProgress if p.get("numInputRows", 0) > 0) < batches + 1:
            if q.exception() is not None:
                raise RuntimeError(str(q.exception()))
            if time.time() > deadline:
                raise TimeoutError("sink run took more than 30 min")
            time.sleep(0.2)
    finally:
        q.stop()
    stats = batch_stats([json.loads(p.json) for p in q.recentProgress], skip=1)
    if fmt in ("lakestep", "lakestep-spark"):
        stats["table_rows"] = table.count()
        cat.close()
    elif fmt == "delta":
        stats["table_rows"] = spark.read.format("delta").load(str(root / "delta-out")).count()
    elif fmt == "iceberg":
        stats["table_rows"] = spark.table(ident).count()
    return stats


def run_sinks(spark: Any, root: Path, params: dict[str, Any]) -> dict[str, Any]:
    """(a): ``sink_rounds`` rounds of both sinks, the order alternating; each run has its own
    checkpoint, output directory and table. The ratio is the median of the rounds' ratios."""
    rounds = []
    for i in range(params["sink_rounds"]):
        row: dict[str, Any] = {"load_1min": round(os.getloadavg()[0], 2)}
        fmts = ("parquet", "lakestep", "lakestep-spark", "python-null")
        for fmt in (fmts if i % 2 == 0 else fmts[::-1]):
            step(f"(a) round {i + 1}/{params['sink_rounds']}: sink {fmt}")
            (root / f"a{i}").mkdir(exist_ok=True)
            row[fmt] = _attempt(lambda: run_sink(spark, root / f"a{i}", fmt, params["rows_per_batch"],
                                                 params["batches"]))
        row["ratio"] = _ratio(row["lakestep"].get("rows_per_s"), row["parquet"].get("rows_per_s"))
        row["null_ratio"] = _ratio(row["python-null"].get("rows_per_s"), row["parquet"].get("rows_per_s"))
        row["spark_writer_ratio"] = _ratio(row["lakestep-spark"].get("rows_per_s"), row["parquet"].get("rows_per_s"))
        rounds.append(row)
    ratios = [r["ratio"] for r in rounds]
    out: dict[str, Any] = {"rounds": rounds,
                           "ratio_median": round(statistics.median(ratios), 3) if None not in ratios else None}
    for key in ("null_ratio", "spark_writer_ratio"):
        vals = [r[key] for r in rounds]
        out[f"{key}_median"] = round(statistics.median(vals), 3) if None not in vals else None
    for fmt in ("parquet", "lakestep", "lakestep-spark", "python-null"):
        rates = [r[fmt].get("rows_per_s") for r in rounds]
        out[f"{fmt}_rows_per_s_median"] = statistics.median(rates) if None not in rates else None
    return out


# --------------------------------------------------------------------------- (b)
def produce(broker: Any, topic: str, n: int) -> dict[str, Any]:
    from kafka import KafkaProducer

    broker.create_topic(topic, partitions=PARTITIONS)
    prod = KafkaProducer(bootstrap_servers=broker.bootstrap_servers, linger_ms=20, batch_size=512 * 1024,
                         acks=1)
    t0 = time.perf_counter()
    for i in range(n):
        v = b'{"id":%d,"kind":"click","v":%d,"pad":"xxxxxxxxxx"}' % (i, i % 997)
        prod.send(topic, value=v, key=b"k%d" % (i % 100), partition=i % PARTITIONS)
    prod.flush(timeout=600)
    el = time.perf_counter() - t0
    prod.close()
    return {"messages": n, "seconds": round(el, 2), "msgs_per_s": round(n / el, 1)}


def _consume(bootstrap: str, topic: str, partitions: list[int], n: int) -> tuple[int, float, float]:
    """kafka-python as a plain application uses it: one consumer, no group, assign + seek to the
    beginning, ``poll()`` (records decoded into ``ConsumerRecord``s) until ``n`` records.
    Returns (records, start, end) on the ``time.perf_counter`` clock, timed from creating the consumer."""
    from kafka import KafkaConsumer, TopicPartition

    t0 = time.perf_counter()
    c = KafkaConsumer(bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False)
    tps = [TopicPartition(topic, p) for p in partitions]
    c.assign(tps)
    c.seek_to_beginning(*tps)
    got, last = 0, time.perf_counter()
    while got < n:  # tansu's end_offsets can be short: count against what was produced
        polled = c.poll(timeout_ms=200, max_records=10_000)
        k = sum(len(v) for v in polled.values())
        got += k
        if k:
            last = time.perf_counter()
        elif time.perf_counter() - last > 60:
            raise TimeoutError(f"plain consumer stuck at {got}/{n}")
    el = time.perf_counter()
    c.close()
    return got, t0, el


def run_plain_consumer(broker: Any, topic: str, n: int) -> dict[str, Any]:
    """One kafka-python consumer, no group: all partitions from the beginning until n records."""
    got, t0, t1 = _consume(broker.bootstrap_servers, topic, list(range(PARTITIONS)), n)
    el = t1 - t0
    return {"rows": got, "seconds": round(el, 3), "rows_per_s": round(got / el, 1)}


def _consumer_process(bootstrap: str, topic: str, partitions: list[int], n: int, ready: Any, go: Any,
                      out: Any) -> None:
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        import kafka  # noqa: F401  (imported before the clock starts, as in the parent process)
    ready.put(os.getpid())
    go.wait()
    out.put(_consume(bootstrap, topic, partitions, n))


def run_plain_consumers(broker: Any, topic: str, n: int, processes: int) -> dict[str, Any]:
    """``processes`` kafka-python consumers in their own processes (one per core), the partitions
    split between them; timed from the first consumer's creation to the last one's last record
    (``perf_counter`` is the system-wide monotonic clock on Linux). Informational: the issue's
    baseline is the single consumer."""
    import multiprocessing as mp

    ctx = mp.get_context("spawn")
    ready, out, go = ctx.Queue(), ctx.Queue(), ctx.Event()
    shares = [[p for p in range(PARTITIONS) if p % processes == i] for i in range(processes)]
    counts = [sum(n // PARTITIONS + (1 if p < n % PARTITIONS else 0) for p in share) for share in shares]
    procs = [ctx.Process(target=_consumer_process, args=(broker.bootstrap_servers, topic, share, count,
                                                         ready, go, out), daemon=True)
             for share, count in zip(shares, counts)]
    for p in procs:
        p.start()
    try:
        for _ in procs:
            ready.get(timeout=120)
        go.set()
        results = [out.get(timeout=600) for _ in procs]
    finally:
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
    got = sum(r[0] for r in results)
    el = max(r[2] for r in results) - min(r[1] for r in results)
    return {"rows": got, "processes": processes, "seconds": round(el, 3), "rows_per_s": round(got / el, 1)}


def kafka_stream(spark: Any, broker: Any, topic: str, max_per_trigger: int) -> Any:
    """``lakestep-kafka`` over ``topic`` from its start, the columns of KAFKA_TABLE_SCHEMA."""
    return (spark.readStream.format("lakestep-kafka").option("kafka.bootstrap.servers", broker.bootstrap_servers)
            .option("subscribe", topic).option("startingOffsets", "earliest")
            .option("maxOffsetsPerTrigger", max_per_trigger).load()
            .select("key", "value", "topic", "partition", "offset", "timestamp"))


def await_available_now(q: Any) -> Any:
    """Wait for an ``availableNow`` query to end (30 min at most); returns it, ended without error."""
    q.awaitTermination(1800)
    if q.isActive:
        q.stop()
        raise TimeoutError("availableNow query did not finish within 30 min")
    if q.exception() is not None:
        raise RuntimeError(str(q.exception()))
    return q


def run_kafka_lakestep(spark: Any, root: Path, broker: Any, topic: str, n: int, max_per_trigger: int,
                       name: str = "kafka", writer: str | None = None) -> dict[str, Any]:
    """``lakestep-kafka`` -> ``lakestep`` table, ``availableNow``; rows/s = rows / sum(triggerExecution)
    (from each trigger's offset lookup to its table commit; the query start before the first trigger
    is in ``wall_s`` only). ``writer``: None, the ``lakestep`` sink; ``"spark"``, foreach_batch with
    Spark's Parquet writer."""
    cat = Catalog(warehouse=str(root / f"wh-{name}"))
    cat.create_namespace("k")
    table = cat.create_table("k.events", KAFKA_TABLE_SCHEMA)
    t0 = time.perf_counter()
    if writer == "ingest":
        from lakestep.streaming.kafka import ingest

        w = ingest(spark, cat.url, "k.events", {"kafka.bootstrap.servers": broker.bootstrap_servers,
                                                "subscribe": topic, "startingOffsets": "earliest",
                                                "maxOffsetsPerTrigger": max_per_trigger}, job=f"{name}-ingest")
    else:
        w = kafka_stream(spark, broker, topic, max_per_trigger).writeStream
    w = w.option("checkpointLocation", str(root / f"ck-{name}")).trigger(availableNow=True).queryName(f"{name}-ingest")
    if writer is None:
        w = w.format("lakestep").option("catalog", cat.url).option("table", "k.events").option("job", f"{name}-ingest")
    elif writer != "ingest":
        from lakestep.streaming import foreach_batch

        w = w.foreachBatch(foreach_batch(cat.url, "k.events", job=f"{name}-ingest", writer=writer))
    q = w.start()
    await_available_now(q)
    wall = time.perf_counter() - t0
    stats = batch_stats([json.loads(p.json) for p in q.recentProgress])
    stats["wall_s"] = round(wall, 3)
    stats["wall_rows_per_s"] = round(stats["rows"] / wall, 1)
    stats["table_rows"] = table.count()
    if writer == "ingest":  # its input rows are the tasks' file lists: count what landed
        stats["rows"] = stats["table_rows"]
        stats["rows_per_s"] = round(stats["rows"] / stats["seconds"], 1) if stats.get("seconds") else None
        stats["wall_rows_per_s"] = round(stats["rows"] / wall, 1)
    offs = table.to_arrow(columns=["partition", "offset"]) if stats["table_rows"] <= 5_000_000 else None
    if offs is not None:
        stats["distinct_offsets"] = len(set(zip(offs.column("partition").to_pylist(),
                                                offs.column("offset").to_pylist())))
    cat.close()
    return stats


def run_kafka(spark: Any, root: Path, params: dict[str, Any]) -> dict[str, Any]:
    """(b): produce once; a warm-up of both readers on a small topic (the session's first Kafka query
    pays JVM/Python-worker start-up, reported as ``cold``); then ``rounds`` rounds over the same
    ``messages`` records, each with a fresh table and checkpoint, the reader order alternating."""
    from lakestep.testing import TansuBroker

    n, mpt, rounds = params["messages"], params["max_offsets_per_trigger"], params["kafka_rounds"]
    warm_n = params["kafka_warmup_messages"]
    out: dict[str, Any] = {"rounds": []}
    with TansuBroker() as broker:
        topic = f"bench-{int(time.time())}"
        step(f"(b) producing {n} messages (+{warm_n} for the warm-up)")
        out["produce"] = _attempt(lambda: produce(broker, topic, n))
        produce(broker, f"{topic}-warmup", warm_n)
        step("(b) warm-up: lakestep-kafka -> lakestep (cold) and kafka-python on the warm-up topic")
        out["cold"] = _attempt(lambda: run_kafka_lakestep(spark, root, broker, f"{topic}-warmup", warm_n, mpt,
                                                          name="warmup"))
        _attempt(lambda: run_plain_consumer(broker, f"{topic}-warmup", warm_n))
        procs = params["kafka_processes"]
        readers = ["kafka-python", "lakestep", "lakestep-spark", "lakestep-ingest"] + (
            ["kafka-python-processes"] if procs > 1 else [])
        baseline = "kafka-python-processes" if procs > 1 else "kafka-python"
        for i in range(rounds):
            row: dict[str, Any] = {"load_1min": round(os.getloadavg()[0], 2)}
            for reader in (readers if i % 2 == 0 else readers[::-1]):
                step(f"(b) round {i + 1}/{rounds}: {reader}")
                if reader == "lakestep":
                    row[reader] = _attempt(lambda: run_kafka_lakestep(spark, root, broker, topic, n, mpt,
                                                                      name=f"round{i}"))
                elif reader == "lakestep-spark":
                    row[reader] = _attempt(lambda: run_kafka_lakestep(spark, root, broker, topic, n, mpt,
                                                                      name=f"round{i}-spark", writer="spark"))
                elif reader == "lakestep-ingest":
                    row[reader] = _attempt(lambda: run_kafka_lakestep(spark, root, broker, topic, n, mpt,
                                                                      name=f"round{i}-ingest", writer="ingest"))
                elif reader == "kafka-python":
                    row[reader] = _attempt(lambda: run_plain_consumer(broker, topic, n))
                else:
                    row[reader] = _attempt(lambda: run_plain_consumers(broker, topic, n, procs))
            row["ratio"] = _ratio(row["lakestep"].get("rows_per_s"), row[baseline].get("rows_per_s"))
            row["ratio_1_process"] = _ratio(row["lakestep"].get("rows_per_s"),
                                            row["kafka-python"].get("rows_per_s"))
            row["spark_writer_ratio"] = _ratio(row["lakestep-spark"].get("rows_per_s"),
                                               row[baseline].get("rows_per_s"))
            row["ingest_ratio"] = _ratio(row["lakestep-ingest"].get("rows_per_s"), row[baseline].get("rows_per_s"))
            out["rounds"].append(row)
    out["baseline"] = baseline
    for key in ("ratio", "ratio_1_process", "spark_writer_ratio", "ingest_ratio"):
        ratios = [r[key] for r in out["rounds"]]
        out[f"{key}_median"] = round(statistics.median(ratios), 3) if ratios and None not in ratios else None
    for reader in readers:
        rates = [r[reader].get("rows_per_s") for r in out["rounds"]]
        out[f"{reader}_rows_per_s_median"] = statistics.median(rates) if None not in rates else None
    tables = ("lakestep", "lakestep-spark", "lakestep-ingest")
    landed = [r[k].get("table_rows") for r in out["rounds"] for k in tables]
    out["table_rows"] = landed[0] if len(set(landed)) == 1 else None  # every round lands the same count
    distinct = [r[k].get("distinct_offsets") for r in out["rounds"] for k in tables]
    out["distinct_offsets"] = distinct[0] if len(set(distinct)) == 1 else None
    return out


# --------------------------------------------------------------------------- (d)
STAGE_SINKS = ("noop", "python-null", "lakestep", "ingest")


def run_kafka_one_trigger(spark: Any, root: Path, broker: Any, topic: str, n: int, sink: str,
                          name: str) -> dict[str, Any]:
    """All ``n`` records of ``topic`` in ONE trigger (``availableNow``, ``maxOffsetsPerTrigger=n``)
    into ``sink``: Spark's ``noop`` (nothing leaves the JVM), ``python-null`` (the Arrow batches
    are handed to a Python sink that only counts them), ``lakestep`` (the real sink, its driver
    commit timed by benchmarks/formats.py ``lakestep-bench-timed``) or ``ingest``
    (:func:`lakestep.streaming.kafka.ingest`: the tasks write the files, the sink commits lists)."""
    from .formats import NULL_NAME, TIMED_NAME, NullSink, TimedSink

    cat = table = None
    if sink in ("ingest", "lakestep"):
        cat = Catalog(warehouse=str(root / f"wh-{name}"))
        cat.create_namespace("k")
        table = cat.create_table("k.events", KAFKA_TABLE_SCHEMA)
    timing = root / f"timing-{name}.jsonl"
    if sink == "ingest":
        from lakestep.streaming.kafka import ingest

        assert cat is not None
        w = ingest(spark, cat.url, "k.events", {"kafka.bootstrap.servers": broker.bootstrap_servers,
                                                "subscribe": topic, "startingOffsets": "earliest",
                                                "maxOffsetsPerTrigger": n}, job=f"{name}-ingest")
    else:
        w = kafka_stream(spark, broker, topic, n).writeStream
        if sink == "noop":
            w = w.format("noop")
        elif sink == "python-null":
            spark.dataSource.register(NullSink)
            w = w.format(NULL_NAME)
        else:
            assert cat is not None
            spark.dataSource.register(TimedSink)
            w = (w.format(TIMED_NAME).option("catalog", cat.url).option("table", "k.events")
                 .option("job", f"{name}-ingest").option("timingFile", str(timing)))
    w = w.option("checkpointLocation", str(root / f"ck-{name}")).trigger(availableNow=True).queryName(name)
    q = await_available_now(w.start())
    stats = batch_stats([json.loads(p.json) for p in q.recentProgress])
    if table is not None and cat is not None:
        if sink == "lakestep":
            commits = [json.loads(line) for line in timing.read_text().splitlines() if line.strip()]
            stats["commit_ms"] = round(sum(c["end"] - c["start"] for c in commits) * 1000, 1)
        stats["table_rows"] = table.count()
        cat.close()
    return stats


def read_in_process(broker: Any, topic: str, counts: list[int]) -> dict[str, Any]:
    """The executor's read (``read_partition_range``: fetch, decode, Arrow batches) of every
    partition, one after the other in this process: no Spark, one core."""
    from lakestep.streaming.kafka.options import KafkaSourceOptions
    from lakestep.streaming.kafka.reader import read_partition_range

    opts = KafkaSourceOptions.from_options({"kafka.bootstrap.servers": broker.bootstrap_servers,
                                            "subscribe": topic})
    t0 = time.perf_counter()
    rows = sum(b.num_rows for p, end in enumerate(counts) for b in read_partition_range(opts, topic, p, 0, end))
    el = time.perf_counter() - t0
    return {"rows": rows, "seconds": round(el, 3), "rows_per_s": round(rows / el, 1)}


def _median(values: list[Any]) -> float | None:
    return None if not values or None in values else round(statistics.median(values), 1)


def run_kafka_stages(spark: Any, root: Path, params: dict[str, Any]) -> dict[str, Any]:
    """(d): where one trigger's time goes. ``stage_rounds`` rounds (order alternating) of the same
    ``stage_messages`` records in one trigger into each of STAGE_SINKS, and the executor's read
    alone; the stages are differences of the medians:

    * Spark's fixed cost: triggerExecution - addBatch (offsets, planning, WAL and commit logs);
    * Kafka read in Python workers -> Arrow -> JVM: addBatch of ``noop``;
    * JVM -> Python sink hand-off: addBatch of ``python-null`` - addBatch of ``noop``;
    * Parquet encoding and writing: addBatch of ``lakestep`` - addBatch of ``python-null`` - commit;
    * catalog commit on the driver (timed);
    * ``kafka.ingest``: its trigger and its addBatch (read and Parquet in the same worker; the
      lists of files cross Spark, not the rows);
    * and, for scale, the same read in this process without Spark (per core, and halved: the two
      cores Spark's tasks share)."""
    from lakestep.testing import TansuBroker

    n, rounds = params["stage_messages"], params["stage_rounds"]
    counts = [n // PARTITIONS + (1 if p < n % PARTITIONS else 0) for p in range(PARTITIONS)]
    out: dict[str, Any] = {"rounds": []}
    with TansuBroker() as broker:
        topic = f"stages-{int(time.time())}"
        step(f"(d) producing {n} messages (+ a warm-up topic)")
        produce(broker, topic, n)
        produce(broker, f"{topic}-warmup", 4 * PARTITIONS)
        for sink in STAGE_SINKS:  # a session's first query of each sink pays start-up
            _attempt(lambda: run_kafka_one_trigger(spark, root, broker, f"{topic}-warmup", 4 * PARTITIONS, sink,
                                                   f"warm-{sink}"))
        readers = [*STAGE_SINKS, "in-process"]
        for i in range(rounds):
            row: dict[str, Any] = {"load_1min": round(os.getloadavg()[0], 2)}
            for reader in (readers if i % 2 == 0 else readers[::-1]):
                step(f"(d) round {i + 1}/{rounds}: {reader}")
                if reader == "in-process":
                    row[reader] = _attempt(lambda: read_in_process(broker, topic, counts))
                else:
                    row[reader] = _attempt(lambda: run_kafka_one_trigger(spark, root, broker, topic, n, reader,
                                                                         f"d{i}-{reader}"))
            out["rounds"].append(row)

    def med(reader: str, fn: Callable[[dict[str, Any]], Any]) -> float | None:
        vals = []
        for r in out["rounds"]:
            try:
                vals.append(fn(r[reader]))
            except (KeyError, TypeError):
                vals.append(None)
        return _median(vals)

    trig = {s: med(s, lambda x: x["duration_ms_sum"]["triggerExecution"]) for s in STAGE_SINKS}
    add = {s: med(s, lambda x: x["duration_ms_sum"]["addBatch"]) for s in STAGE_SINKS}
    commit = med("lakestep", lambda x: x["commit_ms"])
    read_1core = med("in-process", lambda x: x["seconds"] * 1000)
    fixed = {k: med("lakestep", lambda x, k=k: x["duration_ms_sum"].get(k, 0))
             for k in ("latestOffset", "queryPlanning", "walCommit", "commitOffsets", "getBatch")}

    def minus(a: float | None, *b: float | None) -> float | None:
        return None if a is None or None in b else round(a - sum(x for x in b if x is not None), 1)

    out["stages_ms"] = {
        "trigger (lakestep sink)": trig["lakestep"],
        "Spark fixed cost (trigger - addBatch)": minus(trig["lakestep"], add["lakestep"]),
        **{f"  of which {k}": v for k, v in fixed.items()},
        "Kafka read in Python workers -> Arrow -> JVM (addBatch, noop sink)": add["noop"],
        "JVM -> Python sink hand-off (python-null - noop)": minus(add["python-null"], add["noop"]),
        "Parquet encoding and writing (lakestep - python-null - commit)":
            minus(add["lakestep"], add["python-null"], commit),
        "catalog commit (driver)": commit,
        "kafka.ingest: trigger": trig["ingest"],
        "kafka.ingest: addBatch (read and Parquet in each task, file lists to the sink)": add["ingest"],
        "for scale: the read without Spark, 1 core": read_1core,
        "for scale: the same, over 2 cores": None if read_1core is None else round(read_1core / 2, 1),
    }
    out["rows_per_s"] = {s: (round(n / trig[s] * 1000, 1) if trig[s] else None) for s in STAGE_SINKS}
    out["rows_per_s"]["in-process, 1 core"] = round(n / read_1core * 1000, 1) if read_1core else None
    return out


# --------------------------------------------------------------------------- (c)
def run_barrier_latency(spark: Any, root: Path, barriers: int) -> dict[str, Any]:
    from lakestep.barrier import OPEN_EPOCH
    from lakestep.testing.spark import root_and_derived

    cat = Catalog(warehouse=str(root / "wh-barrier"))
    p, coord, rt, derived = root_and_derived(cat, cat.url, "ns.root", "ns.derived", "derived")
    src = (spark.readStream.format("lakestep").option("catalog", cat.url).option("table", "ns.root")
           .option("job", "derived").load())
    q = (src.writeStream.format("lakestep").option("catalog", cat.url).option("table", "ns.derived")
         .option("job", "derived").option("checkpointLocation", str(root / "ck-barrier"))
         .trigger(processingTime="200 milliseconds").queryName("derived").start())
    lat: list[float] = []
    try:
        for i in range(barriers + 2):  # the first two: warm-up
            rt.append({"id": [i * 10 + j for j in range(10)], "e": [i] * 10}, barrier=OPEN_EPOCH)
            s = coord.seal()
            assert s is not None
            deadline = time.time() + 120
            hit = None
            while hit is None:
                if q.exception() is not None:
                    raise RuntimeError(str(q.exception()))
                if time.time() > deadline:
                    raise TimeoutError(f"derived never precommitted barrier {s.barrier}")
                hit = next((h for h in derived.history() if h.barrier == s.barrier), None)
                if hit is None:
                    time.sleep(0.01)
            if i >= 2:
                lat.append(hit.committed_at - s.sealed_at)
            time.sleep(0.05 + (i % 5) * 0.04)  # vary the phase against the trigger
    finally:
        q.stop()
        coord.release()
    seals = {s.barrier: s.sealed_at for s in p.seals()}
    rows = derived.count()
    cat.close()
    ms = sorted(x * 1000 for x in lat)
    return {"barriers": len(ms), "p50_ms": round(statistics.median(ms), 1),
            "p99_ms": round(ms[min(len(ms) - 1, int(round(0.99 * (len(ms) - 1))))], 1),
            "min_ms": round(ms[0], 1), "max_ms": round(ms[-1], 1), "seals_recorded": len(seals),
            "derived_rows": rows, "expected_rows": 10 * (barriers + 2), "latencies_ms": [round(x, 1) for x in ms]}


# ------------------------------------------------------------------------ report
def _attempt(fn: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    try:
        return fn()
    except Exception as exc:
        traceback.print_exc()
        return {"error": f"{type(exc).__name__}: {str(exc)[:500]}"}


def _ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 3) if a and b else None


def report(r: dict[str, Any], checks: list[Check]) -> str:
    p, m = r["params"], r["machine"]
    a, b, c, d = r["sink"], r["kafka"], r["barrier"], r.get("stages", {})
    sink_rows = [[f"{i}: {k}", v.get("batches"), v.get("rows"), v.get("seconds"), v.get("add_batch_s"),
                  v.get("rows_per_s"), {"lakestep": rnd.get("ratio"), "python-null": rnd.get("null_ratio"),
                                        "lakestep-spark": rnd.get("spark_writer_ratio")}.get(k),
                  rnd.get("load_1min") if k == "lakestep" else None, v.get("error")]
                 for i, rnd in enumerate(a.get("rounds", []), 1) for k, v in rnd.items() if isinstance(v, dict)]
    kafka_rows = []
    cold = b.get("cold", {})
    if cold:
        kafka_rows.append([f"warm-up, cold (first batch {cold.get('batch_ms', ['-'])[0]} ms)", cold.get("batches"),
                           cold.get("rows"), cold.get("seconds"), cold.get("rows_per_s"), cold.get("wall_rows_per_s"),
                           None, None, cold.get("error")])
    for i, rnd in enumerate(b.get("rounds", []), 1):
        kl, kp, kpp = rnd.get("lakestep", {}), rnd.get("kafka-python", {}), rnd.get("kafka-python-processes")
        kafka_rows += [[f"{i}: lakestep-kafka -> lakestep", kl.get("batches"), kl.get("rows"), kl.get("seconds"),
                        kl.get("rows_per_s"), kl.get("wall_rows_per_s"),
                        f"{rnd.get('ratio')} ({rnd.get('ratio_1_process')})", rnd.get("load_1min"),
                        kl.get("error")],
                       [f"{i}: lakestep-kafka -> lakestep, writer='spark'", rnd.get("lakestep-spark", {}).get("batches"),
                        rnd.get("lakestep-spark", {}).get("rows"), rnd.get("lakestep-spark", {}).get("seconds"),
                        rnd.get("lakestep-spark", {}).get("rows_per_s"),
                        rnd.get("lakestep-spark", {}).get("wall_rows_per_s"), rnd.get("spark_writer_ratio"), None,
                        rnd.get("lakestep-spark", {}).get("error")],
                       [f"{i}: kafka.ingest() -> lakestep", rnd.get("lakestep-ingest", {}).get("batches"),
                        rnd.get("lakestep-ingest", {}).get("rows"), rnd.get("lakestep-ingest", {}).get("seconds"),
                        rnd.get("lakestep-ingest", {}).get("rows_per_s"),
                        rnd.get("lakestep-ingest", {}).get("wall_rows_per_s"), rnd.get("ingest_ratio"), None,
                        rnd.get("lakestep-ingest", {}).get("error")],
                       [f"{i}: kafka-python, 1 process", None, kp.get("rows"), kp.get("seconds"), kp.get("rows_per_s"),
                        kp.get("rows_per_s"), None, None, kp.get("error")]]
        if kpp is not None:
            kafka_rows.append([f"{i}: kafka-python, {kpp.get('processes', '?')} processes", None, kpp.get("rows"),
                               kpp.get("seconds"), kpp.get("rows_per_s"), kpp.get("rows_per_s"), None, None,
                               kpp.get("error")])
    prod = b.get("produce", {})
    return "\n".join([
        f"lakestep {m['lakestep']} streaming benchmark  {m['date']}  cpus={m['cpu_count']}  python {m['python']}"
        f"  pyspark {m['pyspark']}",
        text_table(f"\n(a) Sink: rate-micro-batch, {p['rows_per_batch']} rows/batch x {p['batches']} batches "
                   f"(+1 warm-up); {p['sink_rounds']} rounds; median ratio {a.get('ratio_median')} (writer='spark': "
                   f"{a.get('spark_writer_ratio_median')}; a Python sink that writes nothing: "
                   f"{a.get('null_ratio_median')})",
                   ["sink", "batches", "rows", "batch s", "addBatch s", "rows/s", "ratio", "load", "error"],
                   sink_rows),
        text_table(f"\n(b) Kafka: {p['messages']} msgs, {PARTITIONS} partitions, maxOffsetsPerTrigger "
                   f"{p['max_offsets_per_trigger']} (produced at {prod.get('msgs_per_s')} msg/s); "
                   f"{p['kafka_rounds']} rounds after a warm-up on {p['kafka_warmup_messages']} msgs; median ratio "
                   f"{b.get('ratio_median')} vs {b.get('baseline')} ({b.get('ratio_1_process_median')} vs 1 process; "
                   f"writer='spark': {b.get('spark_writer_ratio_median')}; kafka.ingest(): "
                   f"{b.get('ingest_ratio_median')})",
                   ["reader", "batches", "rows", "seconds", "rows/s", "wall rows/s", "ratio (1 proc)", "load",
                    "error"],
                   kafka_rows),
        text_table(f"\n(c) Barrier latency: seal -> derived PRECOMMIT ({p['barriers']} barriers, trigger 200 ms)",
                   ["barriers", "p50 ms", "p99 ms", "min ms", "max ms", "derived rows", "error"],
                   [[c.get("barriers"), c.get("p50_ms"), c.get("p99_ms"), c.get("min_ms"), c.get("max_ms"),
                     f"{c.get('derived_rows')}/{c.get('expected_rows')}", c.get("error")]]),
        text_table(f"\n(d) One trigger of {p['stage_messages']} Kafka records, where the time goes (median of "
                   f"{p['stage_rounds']} rounds, ms; rows/s {d.get('rows_per_s')})",
                   ["stage", "ms"], [[k, v] for k, v in d.get("stages_ms", {}).items()]) if d else "",
        text_table("\nTargets", ["check", "value", "target", "result"],
                   [[k.name, k.value, f"{k.op} {k.target:g}", k.result] for k in checks]),
    ])


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="small sizes: a smoke run")
    ap.add_argument("--out", default="benchmarks/results/streaming.json")
    ap.add_argument("--only", default="abc", help="sections to run, e.g. 'ac'; 'd' (the stages of one Kafka trigger) "
                                                  "runs only when asked")
    ap.add_argument("--kafka-rounds", type=int, default=None,
                    help="(b) rounds over the same messages, median ratio reported (default 3, 1 with --quick)")
    ap.add_argument("--sink-rounds", type=int, default=None,
                    help="(a) rounds of both sinks, order alternating, median ratio reported (default 5, "
                         "1 with --quick)")
    ap.add_argument("--max-offsets-per-trigger", type=int, default=None,
                    help="(b) the lakestep-kafka query's maxOffsetsPerTrigger (default 200000, 5000 with --quick)")
    ap.add_argument("--kafka-processes", type=int, default=2,
                    help="(b) the baseline: kafka-python in this many processes (one per core, partitions "
                         "split); <2: one process")
    args = ap.parse_args(argv)
    q = args.quick
    params = {"quick": q, "rows_per_batch": 100_000 if q else 500_000, "batches": 3 if q else 6,
              "sink_rounds": args.sink_rounds or (1 if q else 5),
              "messages": 20_000 if q else 1_000_000, "max_offsets_per_trigger": args.max_offsets_per_trigger or (5_000 if q else 200_000),
              "kafka_rounds": args.kafka_rounds or (1 if q else 3),
              "kafka_warmup_messages": 4_000 if q else 20_000, "kafka_processes": args.kafka_processes,
              "barriers": 5 if q else 20, "stage_messages": 20_000 if q else 1_000_000,
              "stage_rounds": 1 if q else 3}
    import pyspark

    r: dict[str, Any] = {
        "machine": {"date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
                    "cpu_count": os.cpu_count(), "python": platform.python_version(),
                    "platform": platform.platform(), "lakestep": lakestep.__version__,
                    "pyspark": pyspark.__version__, "pyarrow": pa.__version__},
        "params": params, "sink": {}, "kafka": {}, "barrier": {}, "stages": {},
    }
    with tempfile.TemporaryDirectory(prefix="lakestep-bench-stream-") as tmp:
        root = Path(tmp)
        spark = make_spark(root)
        try:
            if "a" in args.only:
                r["sink"] = run_sinks(spark, root, params)
            if "b" in args.only:
                r["kafka"] = run_kafka(spark, root, params)
            if "c" in args.only:
                step("(c) barrier latency")
                r["barrier"] = _attempt(lambda: run_barrier_latency(spark, root, params["barriers"]))
            if "d" in args.only:
                r["stages"] = run_kafka_stages(spark, root, params)
        finally:
            spark.stop()
    kb, kd = r["kafka"], r["stages"]
    checks: list[Check] = []
    if "a" in args.only:
        checks += [Check("(a) lakestep / parquet rows/s (median)", r["sink"].get("ratio_median"), ">=", SINK_TARGET),
                   Check("(a) foreach_batch(writer='spark') / parquet rows/s (median)",
                         r["sink"].get("spark_writer_ratio_median"), ">=", SINK_TARGET)]
    if "b" in args.only:
        checks += [
            Check(f"(b) lakestep-kafka / {kb.get('baseline')} rows/s (median)", kb.get("ratio_median"), ">=",
                  KAFKA_TARGET),
            Check(f"(b) lakestep-kafka, writer='spark' / {kb.get('baseline')} rows/s (median)",
                  kb.get("spark_writer_ratio_median"), ">=", KAFKA_TARGET),
            Check(f"(b) kafka.ingest() / {kb.get('baseline')} rows/s (median)",
                  kb.get("ingest_ratio_median"), ">=", KAFKA_TARGET),
            Check("(b) lakestep table rows (every round)", kb.get("table_rows"), "==", params["messages"]),
            Check("(b) distinct (partition, offset) (every round)", kb.get("distinct_offsets"), "==",
                  params["messages"]),
        ]
    if "d" in args.only:
        landed = {rnd.get(k, {}).get("table_rows" if k in ("lakestep", "ingest") else "rows")
                  for rnd in kd.get("rounds", []) for k in ("noop", "python-null", "lakestep", "ingest", "in-process")}
        checks.append(Check("(d) rows read by every reader, every round", landed.pop() if len(landed) == 1 else None,
                            "==", params["stage_messages"]))
    finish(Path(args.out), r, checks, report(r, checks))


if __name__ == "__main__":
    main()
