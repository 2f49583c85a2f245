"""Freshness benchmark: from a Kafka record's production to the first consistent answer that includes it.

Pipeline (one per cell, on a fresh catalog and a fresh topic of ``PARTITIONS`` partitions)::

    topic --(root job "ingest": lakestep-kafka -> lakestep sink)--> f.raw
          --(derived job "d1": id*2+1)--> f.d1
          --(derived job "d2": v%1000)--> f.d2

in ONE local[2] Spark session for the whole run (each cell starts and stops its
own jobs). The root job is a Spark query with ``trigger(processingTime=T)``
whose sink is the ``lakestep`` sink with each commit call timed
(``lakestep-bench-timed``, benchmarks/formats.py: one line appended to a file
per commit). The derived jobs (``--derived``):

* ``driver`` (the default): :class:`lakestep.streaming.DerivedJob` threads
  (``batch.changes(source)`` through Spark's own scan, Spark's own writer, one
  barrier-layer commit per batch; ``--quiet-commit`` s for barriers without
  changes); the baseline runs :class:`PlainLoop` threads instead, the same
  reads, writes and commits of each new data version, without barriers;
* ``stream``: Spark queries, the ``lakestep`` source (``maxBarriersPerTrigger``
  ``MAX_BARRIERS``) into the timed sink; the baseline reads with
  ``lakestep-bench-plain`` (each trigger takes the table's newest data version).

A :class:`Coordinator` thread in this process seals every ``I`` seconds
(default settings otherwise: a snapshot per barrier, the newest 100 kept).
Before the grid one unreported cell warms the JVM up (``--no-warm-cell`` skips
it: the first cell after Spark's start then pays for the JIT); the grid runs
``--rounds`` times, interleaved, and the targets use each cell's median.

Measured, per cell (backend x interval I x trigger T):

* a producer thread (kafka-python, ``linger_ms=0``) sends ``--rate`` records/s,
  paced on a 5 ms tick; each value is ``"<id>,<time.time() at send>"``: that
  time is the record's production;
* a reader thread loops ``Pipeline.choose(["f.raw", "f.d1", "f.d2"],
  level="read_committed")`` (a fresh ``Catalog`` of its own; ``POLL`` s between
  calls that bring no new barrier; between two calls it polls
  ``Pipeline.change_token`` of the three tables, and calls ``choose`` again
  only once that changed) and, for each new barrier, reads the ids in
  the files of f.d2 added since the previous answer's version, up to the
  version chosen; an id's first-seen time is the time that ``choose`` returned;
* latency = first-seen - produced, for the records produced during the
  ``--seconds`` measurement window, which opens ``--warmup`` s after the first
  record came through (Spark's Python workers and the JIT warm up before).
  The producer keeps going until every measured record was seen (the load
  stays steady for the last ones; at most ``--drain`` s), then stops, and the
  cell waits (again at most ``--drain`` s) for every record produced to be
  seen: ``records seen`` / ``duplicates`` are checked against that;
* p50 / p95 / p99 / max of the latencies, the measured records still unseen
  after the drain (``unseen``: their latency exceeds the drain, the
  percentiles are then lower bounds), ``trend`` = p50 of the last third of the
  window / p50 of the first third (> 1: the pipeline falls behind; a derived
  batch carries at most ONE barrier in which its source's data changed
  (barrier/jobs.py step 1), so a derived job whose batches take longer than
  the interval between data-changing barriers never catches up), and ``lag``
  = newest sealed barrier - barrier answered, at the window's end;
* per stage, for every measured record (the stages add up to its latency),
  from the commits that carry it (``history()``: ``barrier``, ``batch_id``),
  the seals (``Pipeline.seals()``: ``sealed_at``), Spark's progress reports (a
  batch starts at its ``timestamp``; its planning takes ``durationMs.latestOffset``)
  and the timed commits (the sink's commit call, start and end)::

      kafka wait   produced               -> start of the ingest batch that read it (trigger wait)
      raw plan     ingest batch start     -> + its latestOffset (Kafka offsets)
      raw write    end of planning        -> commit call (Kafka read, Parquet write, Spark's logs)
      raw commit   the f.raw commit call (catalog transaction, retries included)
      seal wait    end of the f.raw commit -> seal of the barrier it carries (baseline: 0)
      d1 wait      seal                   -> start of the d1 batch that read it (trigger wait,
                                             and the batches ahead of it when d1 is behind)
      d1 plan      d1 batch start         -> + its latestOffset (barrier plan, trigger agreement)
      d1 write     end of planning        -> commit call; d1 commit: the f.d1 commit call
      d2 wait, d2 plan, d2 write, d2 commit: the same for d2, from the end of the f.d1 commit
      answer       end of the f.d2 commit -> the reader's first answer with it

  (the seal's time is the database clock at the start of the seal's
  transaction, which then waits for root commits in flight: a seal wait can be
  slightly negative);

  and per Spark query the medians of its batches' ``durationMs``: latestOffset
  (planning: for a derived source the barrier plan and the trigger agreement),
  addBatch (reading, writing the Parquet files, the catalog commit), the rest
  of the trigger (Spark's offset and commit logs, query planning), and
  batches/s;
* the **baseline** rows ("none" in the interval column): the same three
  queries, sinks and catalog commits, no coordinator and no barriers: the
  derived queries read with ``lakestep-bench-plain`` (benchmarks/formats.py:
  each trigger takes the table's newest data version) and the reader polls
  f.d2's newest version instead of ``choose``. Barrier row - baseline row is
  the cost of consistency.

Grid: ``--intervals`` (0.2, 1, 5 s) x ``--triggers`` (0.2, 1 s) x ``--backends``
(sqlite, postgres), plus a baseline cell per backend and trigger, ``--rounds``
times (default 3).
Targets, at interval 0.2 s and trigger 0.2 s, per backend, medians of the
rounds: p50 < 1.5 s, p99 < 3 s, and p50 within 1.2x the baseline's p50 (exit
status 1 when missed, 2 when a cell failed). ``--quick``: that cell only, per
backend, 15 s windows, one round, no baseline unless ``--baseline`` (a smoke
run, a few minutes). The full grid is 16 cells of about 70 s each on a quiet
machine (start, warm-up, window, drain, stop), three rounds: about an hour;
``--quick --baseline --rounds 3`` about 6 minutes.

Not measured: Kafka's own produce latency apart from the rest (the clock
starts at ``send()``), the reader's time to read the rows of a new answer
(the clock stops when ``choose`` returns), reads of more than the new files,
restarts, failures, back-pressure from a slow database, and anything beyond
one machine: every process (Spark, its Python workers, the tansu broker,
PostgreSQL, the producer and the reader) shares its cores, so the figures
depend on the machine's load (report the load with them).

Output: a plain-text table on stdout, every number in ``--out`` (JSON).
Run: ``python -m benchmarks.freshness [--quick]``
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import os
import platform
import statistics
import tempfile
import threading
import time
import traceback
import uuid
from pathlib import Path
from typing import Any, Callable

import pyarrow as pa

import lakestep
from lakestep import Catalog
from lakestep.barrier import Pipeline
from lakestep.catalog.reader import FRAGMENT_INDEX
from lakestep.services import Coordinator

from .barrier import new_catalog
from .commit import Check, pct, text_table
from .peers import DEFAULT_PG_DSN
from .streaming import make_spark, step

TABLES = ["f.raw", "f.d1", "f.d2"]
RAW = pa.schema([("id", pa.int64()), ("produced", pa.float64()), ("partition", pa.int32()), ("offset", pa.int64())])
D1 = pa.schema([("id", pa.int64()), ("produced", pa.float64()), ("v", pa.int64())])
D2 = pa.schema([("id", pa.int64()), ("produced", pa.float64()), ("w", pa.int64())])
PARTITIONS = 2
MAX_BARRIERS = 1000
POLL = 0.02
QUIET_COMMIT = 0.0  # DerivedJob's default
TARGET_CELL = (0.2, 0.2)
P50_TARGET, P99_TARGET = 1.5, 3.0
RATIO_TARGET = 1.2  # the cost of consistency: barrier p50 / baseline p50
STAGES = ["kafka wait", "raw plan", "raw write", "raw commit", "seal wait", "d1 wait", "d1 plan", "d1 write",
          "d1 commit", "d2 wait", "d2 plan", "d2 write", "d2 commit", "answer"]
JOBS = ["ingest", "d1", "d2"]
EXPRS = {"d1": ["id", "produced", "id * 2 + 1 AS v"], "d2": ["id", "produced", "v % 1000 AS w"]}


# ------------------------------------------------------------------- threads
class Producer(threading.Thread):
    """Sends ``rate`` records/s, ids from 0; ``produced[id]`` = ``time.time()`` at send."""

    def __init__(self, bootstrap: str, topic: str, rate: float) -> None:
        super().__init__(name="freshness-producer", daemon=True)
        self.bootstrap, self.topic, self.rate = bootstrap, topic, rate
        self.produced: dict[int, float] = {}
        self.halt = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        from kafka import KafkaProducer

        prod = None
        try:
            prod = KafkaProducer(bootstrap_servers=self.bootstrap, linger_ms=0, acks=1)
            t0, i = time.time(), 0
            while not self.halt.is_set():
                due = int((time.time() - t0) * self.rate) + 1
                while i < due:
                    t = time.time()
                    prod.send(self.topic, value=b"%d,%.6f" % (i, t), partition=i % PARTITIONS)
                    self.produced[i] = t
                    i += 1
                self.halt.wait(0.005)
            prod.flush(timeout=60)
        except BaseException as e:  # reported by the cell
            self.error = e
        finally:
            if prod is not None:
                prod.close(timeout=10)


class Reader(threading.Thread):
    """First-seen times of the ids of f.d2: in consistent answers (``barriers``), or at its newest version.
    ``probe``: each answer also counts the rows of the three tables at the versions it chose (a join of
    f.raw and f.d2 on id is right when they are equal); ``wrong``: the answers where they differ."""

    def __init__(self, url: str, barriers: bool, probe: bool = False) -> None:
        super().__init__(name="freshness-reader", daemon=True)
        self.url, self.barriers, self.probe = url, barriers, probe
        self.wrong = 0
        self.seen: dict[int, float] = {}
        self.duplicates = 0
        self.answers: list[tuple[float, int | None, int | None, int]] = []  # (time, barrier, sealed, d2 version)
        self.halt = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        cat = None
        try:
            cat = Catalog(self.url)
            p = Pipeline(cat)
            d2 = cat.load_table("f.d2")
            probed = {ident: cat.load_table(ident) for ident in TABLES} if self.probe else {}
            last_b, last_v = 0, 0
            token: Any = None
            while not self.halt.is_set():
                if self.barriers:
                    now = p.change_token(TABLES)  # cheap: choose again only when something changed
                    if now == token:
                        self.halt.wait(POLL)
                        continue
                    token = now
                    ch = p.choose(TABLES, level="read_committed")
                    t = time.time()
                    if ch.barrier is None or ch.barrier <= last_b:
                        self.halt.wait(POLL)
                        continue
                    last_b, v = ch.barrier, ch.versions["f.d2"]
                    self.answers.append((t, ch.barrier, ch.explanation.sealed, v))
                    if self.probe:
                        counts = {sum(f.record_count for f in t.files(version=ch.versions[ident]))
                                  for ident, t in probed.items()}
                        self.wrong += len(counts) > 1
                else:
                    v = d2.version
                    t = time.time()
                    if v <= last_v:
                        self.halt.wait(POLL)
                        continue
                    self.answers.append((t, None, None, v))
                if v > last_v:
                    new = [f for f in d2.files(version=v) if f.added_version > last_v]
                    for i in d2.read_files(new, columns=["id"]).column("id").to_pylist():
                        if i in self.seen:
                            self.duplicates += 1
                        else:
                            self.seen[i] = t
                    last_v = v
        except BaseException as e:
            self.error = e
        finally:
            if cat is not None:
                cat.close()


# --------------------------------------------------------------------- cells
def start_queries(spark: Any, url: str, bootstrap: str, topic: str, ck: Path, trigger: float, barriers: bool,
                  name: str, derived: str) -> list[Any]:
    from .formats import FORMAT_NAME, TIMED_NAME

    every = f"{int(round(trigger * 1000))} milliseconds"
    raw = (spark.readStream.format("lakestep-kafka").option("kafka.bootstrap.servers", bootstrap)
           .option("subscribe", topic).option("startingOffsets", "earliest").load()
           .selectExpr("CAST(split(CAST(value AS STRING), ',')[0] AS BIGINT) AS id",
                       "CAST(split(CAST(value AS STRING), ',')[1] AS DOUBLE) AS produced", "partition", "offset"))

    def source(table: str, job: str) -> Any:
        if barriers:
            return (spark.readStream.format("lakestep").option("catalog", url).option("table", table)
                    .option("job", job).option("maxBarriersPerTrigger", MAX_BARRIERS).load())
        return spark.readStream.format(FORMAT_NAME).option("catalog", url).option("table", table).load()

    def sink(df: Any, table: str, job: str) -> Any:
        return (df.writeStream.format(TIMED_NAME).option("catalog", url).option("table", table).option("job", job)
                .option("timingFile", str(ck / f"commits-{job}.jsonl"))
                .option("checkpointLocation", str(ck / job)).trigger(processingTime=every)
                .queryName(f"{name}-{job}").start())

    if derived == "driver":
        return [sink(raw, "f.raw", "ingest")]
    return [sink(raw, "f.raw", "ingest"),
            sink(source("f.raw", "d1").selectExpr(*EXPRS["d1"]), "f.d1", "d1"),
            sink(source("f.d1", "d2").selectExpr(*EXPRS["d2"]), "f.d2", "d2")]


class DriverJobs:
    """``--derived driver``: d1 and d2 as :class:`lakestep.streaming.DerivedJob` threads (barriers),
    or, for the baseline, :class:`PlainLoop` threads doing the same reads, writes and commits
    without barriers. ``timings(job)``: per commit key (the barrier; the baseline: the sink's
    version), its batch's (start, planned, commit start, commit end) wall-clock times."""

    def __init__(self, spark: Any, url: str, barriers: bool, quiet: float) -> None:
        from lakestep.streaming import DerivedJob

        self.barriers = barriers
        self.runners: dict[str, Any] = {}
        for job, src, dst in (("d1", "f.raw", "f.d1"), ("d2", "f.d1", "f.d2")):
            if barriers:
                self.runners[job] = DerivedJob(
                    spark, url, job, sources=[src], sinks=[dst], max_barriers=MAX_BARRIERS,
                    quiet_commit=quiet,
                    transform=lambda b, src=src, job=job: b.changes(src).selectExpr(*EXPRS[job])).start(poll=POLL)
            else:
                self.runners[job] = PlainLoop(spark, url, job, src, dst)

    def failed(self) -> str | None:
        for job, r in self.runners.items():
            if r.error is not None:
                return f"{job} failed: {r.error!r}"
        return None

    def stop(self) -> None:
        for r in self.runners.values():
            r.stop()

    def timings(self, job: str) -> dict[int, tuple[float, float, float, float]]:
        r = self.runners[job]
        rows = r.stats.timings if self.barriers else r.timings
        return {int(t["barrier" if self.barriers else "version"]): (t["start"], t["planned"], t["written"],
                                                                     t["committed"]) for t in rows}

    def summary(self, job: str) -> dict[str, Any]:
        t = list(self.timings(job).values())
        if not t:
            return {"batches": 0}
        span = t[-1][0] - t[0][0]
        r = self.runners[job]
        ran = [tuple(x[k] for k in ("start", "planned", "written", "committed"))
               for x in (r.stats.timings if self.barriers else r.timings) if x.get("ran", True)] or t
        # plan and commit over every batch; read+write over the batches that ran a Spark job
        med = {k: round(statistics.median((x[i + 1] - x[i]) * 1000 for x in (ran if k == "write" else t)), 1)
               for i, k in enumerate(("plan", "write", "commit"))}
        return {"batches": len(t), "batches_per_s": _r(len(t) / span if span else None, 2), "median_ms": med,
                "skipped": r.stats.skipped if self.barriers else None}


class PlainLoop(threading.Thread):
    """The baseline of a driver-run derived job: the same reads (Spark's scan of the files its source
    gained), writes (Spark's writer) and commits (one catalog transaction), no barriers: each pass
    takes the source's newest data version."""

    def __init__(self, spark: Any, url: str, job: str, source: str, sink: str) -> None:
        super().__init__(name=f"plain-{job}", daemon=True)
        self.spark, self.url, self.job, self.source, self.sink = spark, url, job, source, sink
        self.timings: list[dict[str, float]] = []
        self.error: BaseException | None = None
        self.halt = threading.Event()
        self.start()

    def run(self) -> None:
        from lakestep.streaming.catalog_cache import open_catalog
        from lakestep.streaming.derived import SWITCH_INTERVAL, lower_switch_interval
        from lakestep.streaming.native import write
        from lakestep.streaming.scan import spark_scan
        from lakestep.streaming.sink import SinkTarget

        lower_switch_interval(SWITCH_INTERVAL)  # as a DerivedJob does: the same driver, the same settings
        try:
            cat = open_catalog(self.url)
            src = cat.load_table(self.source)
            target = SinkTarget.open(self.url, self.sink, job=self.job, mode="append")
            last, n = 0, 0
            while not self.halt.is_set():
                t0 = time.time()
                dv = src.data_version
                if dv <= last:
                    self.halt.wait(POLL)
                    continue
                df = spark_scan(self.spark, src, src.added_files(last, dv)).selectExpr(*EXPRS[self.job])
                t1 = time.time()
                msg = write(df, target, n)
                t2 = time.time()
                with cat.transaction() as tx:
                    tx.add_files(self.sink, msg.files)
                t3 = time.time()
                self.timings.append({"version": tx.results[0].version, "start": t0, "planned": t1, "written": t2,
                                     "committed": t3})
                last, n = dv, n + 1
        except BaseException as e:  # reported by failed()
            self.error = e

    def stop(self) -> None:
        self.halt.set()
        self.join(timeout=60)


def wait_for(cond: Callable[[], bool], timeout: float, failed: Callable[[], str | None]) -> bool:
    """Poll ``cond`` (0.1 s) until true (True) or ``timeout`` (False); raise if ``failed()`` says why."""
    deadline = time.monotonic() + timeout
    while not cond():
        why = failed()
        if why:
            raise RuntimeError(why)
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


def measure(producer: Producer, reader: Any, failed: Callable[[], str | None], params: dict[str, Any],
            out: dict[str, Any], lag: Callable[[], int | None] = lambda: None) -> list[int]:
    """The measurement of a running pipeline (the producer and the reader started): wait for the first
    record to come through, ``warmup`` s, then the ``seconds`` window; drain (the producer runs on until
    every measured record was seen, then stops; then every record produced must be seen). Fills ``out``
    with ``first_through_s``, ``lag_end`` (``lag()`` at the window's end) and ``load_1min``; returns the
    ids produced in the window, in order. Raises what ``failed()`` reports."""
    t_start = time.time()
    if not wait_for(lambda: bool(reader.seen), params["start_timeout"], failed):
        raise TimeoutError(f"no record came through within {params['start_timeout']} s")
    out["first_through_s"] = round(time.time() - t_start, 1)
    time.sleep(params["warmup"])
    t0 = time.time()
    time.sleep(params["seconds"])
    t1 = time.time()
    out["lag_end"] = lag()
    out["load_1min"] = round(os.getloadavg()[0], 2)
    # dict.copy() runs in C under the GIL: a consistent view while the producer adds ids
    ids = sorted(i for i, t in producer.produced.copy().items() if t0 <= t < t1)
    wait_for(lambda: all(i in reader.seen for i in ids), params["drain"], failed)
    producer.halt.set()
    producer.join(timeout=90)
    wait_for(lambda: len(reader.seen) >= len(producer.produced), params["drain"], failed)
    why = failed()
    if why:
        raise RuntimeError(why)
    return ids


def latency_stats(ids: list[int], producer: Producer, reader: Any) -> dict[str, Any]:
    """Record-to-answer latencies of the measured ``ids`` and what was seen against what was produced
    (``reader``: ``seen`` id -> first-seen time, ``duplicates``, ``answers``)."""
    produced, seen = producer.produced, reader.seen
    lat = [seen[i] - produced[i] for i in ids if i in seen]
    third = len(ids) // 3
    early = [seen[i] - produced[i] for i in ids[:third] if i in seen]
    late = [seen[i] - produced[i] for i in ids[len(ids) - third:] if i in seen]
    return {
        "records": len(ids), "unseen": sum(1 for i in ids if i not in seen),
        "p50_s": _r(pct(lat, 0.5)), "p95_s": _r(pct(lat, 0.95)), "p99_s": _r(pct(lat, 0.99)),
        "max_s": _r(max(lat, default=None)), "min_s": _r(min(lat, default=None)),
        "trend": _r(statistics.median(late) / statistics.median(early)) if early and late else None,
        "produced": len(produced), "seen": len(seen), "duplicates": reader.duplicates,
        "unexpected": len(set(seen) - set(produced)), "missing": len(set(produced) - set(seen)),
        "answers": len(reader.answers),
    }


def run_cell(spark: Any, broker: Any, root: Path, backend: str, pg_dsn: str, interval: float | None,
             trigger: float, params: dict[str, Any], tag: str = "r1") -> dict[str, Any]:
    barriers = interval is not None
    name = f"{backend}-{'i%g' % interval if barriers else 'none'}-t{trigger:g}-{tag}".replace(".", "p")
    with new_catalog(root, backend, pg_dsn, name.replace("-", "_"), bench="freshness") as cat:
        url = cat.connection_url()
        cat.create_namespace("f")
        tables = {ident: cat.create_table(ident, schema) for ident, schema in zip(TABLES, (RAW, D1, D2))}
        p = Pipeline(cat)
        topic = f"fresh-{name}-{uuid.uuid4().hex[:6]}"
        broker.create_topic(topic, partitions=PARTITIONS)
        coord = None
        if barriers:
            p.register_job("d1", sources=["f.raw"], sinks=["f.d1"])
            p.register_job("d2", sources=["f.d1"], sinks=["f.d2"])
            coord = Coordinator(p.catalog, interval=interval)
            coord.start()
        ck = root / name / "ck"
        ck.mkdir(parents=True, exist_ok=True)
        derived = params["derived"]
        queries = start_queries(spark, url, broker.bootstrap_servers, topic, ck, trigger, barriers, name, derived)
        jobs = DriverJobs(spark, url, barriers, params["quiet_commit_s"]) if derived == "driver" else None
        producer, reader = (Producer(broker.bootstrap_servers, topic, params["rate"]),
                            Reader(url, barriers, probe=params.get("probe", False)))
        reader.start()
        producer.start()

        def failed() -> str | None:
            for q in queries:
                if q.exception() is not None:
                    return f"query {q.name} failed: {str(q.exception())[:2000]}"
            for th in (producer, reader):
                if th.error is not None:
                    return f"{th.name} failed: {th.error!r}"
            return jobs.failed() if jobs is not None else None

        out: dict[str, Any] = {"backend": backend, "interval": interval, "trigger": trigger, "derived": derived}
        try:
            ids = measure(producer, reader, failed, params, out,
                          lag=lambda: (reader.answers[-1][2] - reader.answers[-1][1])
                          if barriers and reader.answers else None)
        finally:
            producer.halt.set()
            reader.halt.set()
            reader.join(timeout=60)
            for q in queries:
                with contextlib.suppress(Exception):
                    q.stop()
            if jobs is not None:
                jobs.stop()
            if coord is not None:
                coord.stop()
        progress = {job: [json.loads(x.json) for x in q.recentProgress] for job, q in zip(JOBS, queries)}
        driver = {job: jobs.timings(job) for job in JOBS[1:]} if jobs is not None else {}
        out.update(latency_stats(ids, producer, reader))
        out["seals"] = len(p.seals()) if barriers else 0
        if reader.probe:
            out["probes_wrong"] = reader.wrong
        produced, seen = producer.produced, reader.seen
        timed = {job: commit_times(ck / f"commits-{job}.jsonl") for job in JOBS}
        out["stages_ms"], out["barriers_backwards"] = stage_breakdown(tables, p, barriers, ids, produced, seen,
                                                                   progress, timed, driver)
        out["spark"] = {job: spark_summary(progress[job], timed[job]) for job in JOBS if job in progress}
        out["driver_jobs"] = {job: jobs.summary(job) for job in driver} if jobs is not None else {}
    return out


def _r(x: float | None, nd: int = 3) -> float | None:
    return None if x is None else round(x, nd)


# ------------------------------------------------------------------ analysis
def commit_of(table: Any) -> dict[int, Any]:
    """id -> the CommitInfo of the commit that added it (no compaction runs here)."""
    hist = {h.version: h for h in table.history()}
    files = table.files()
    data = table.read_files(files, columns=["id", FRAGMENT_INDEX])
    return {i: hist[files[k].added_version]
            for i, k in zip(data.column("id").to_pylist(), data.column(FRAGMENT_INDEX).to_pylist())}


def commit_times(path: Path) -> dict[int, tuple[float, float]]:
    """batch id -> (start, end) of the sink's commit call (benchmarks/formats.py)."""
    if not path.exists():
        return {}
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return {int(r["batch"]): (float(r["start"]), float(r["end"])) for r in rows}


def batch_starts(progress: list[dict[str, Any]]) -> dict[int, float]:
    return {int(b["batchId"]): dt.datetime.fromisoformat(b["timestamp"].replace("Z", "+00:00")).timestamp()
            for b in progress}


def stage_breakdown(tables: dict[str, Any], p: Pipeline, barriers: bool, ids: list[int], produced: dict[int, float],
                    seen: dict[int, float], progress: dict[str, list[dict[str, Any]]],
                    timed: dict[str, dict[int, tuple[float, float]]],
                    driver: dict[str, dict[int, tuple[float, float, float, float]]] | None = None,
                    ) -> tuple[dict[str, dict[str, float | None]], int | None]:
    """Per stage (module docstring), p50 / p95 / mean in ms over the measured records seen (``n``: the
    records traced through their three commits); and, with barriers, how many records a derived table
    holds at a lower barrier than its source (0: barriers never go backwards along the pipeline)."""
    c = {t: commit_of(tables[t]) for t in TABLES}
    driver = driver or {}
    starts = {job: batch_starts(progress[job]) for job in JOBS if job in progress}
    planning = {job: {int(b["batchId"]): b["durationMs"].get("latestOffset", 0) / 1000 for b in progress[job]}
                for job in JOBS if job in progress}
    sealed = {s.barrier: s.sealed_at for s in p.seals()} if barriers else {}
    per: dict[str, list[float]] = {s: [] for s in STAGES}
    backwards = 0
    for i in ids:
        if i not in seen or any(i not in c[t] for t in TABLES):
            continue
        marks = [produced[i]]
        if barriers and not c["f.raw"][i].barrier <= c["f.d1"][i].barrier <= c["f.d2"][i].barrier:
            backwards += 1
        try:
            for job, table in zip(JOBS, TABLES):
                commit = c[table][i]
                if job in driver:  # a DerivedJob (by barrier) or the baseline's loop (by version)
                    marks += list(driver[job][commit.barrier if barriers else commit.version])
                    continue
                b = commit.batch_id
                start = starts[job][b]
                marks += [start, start + planning[job][b], *timed[job][b]]
                if job == "ingest":
                    marks.append(sealed[commit.barrier] if barriers else marks[-1])
        except KeyError:  # a batch Spark's progress or the timing file lacks (none should)
            continue
        marks.append(seen[i])
        for name, a, b in zip(STAGES, marks, marks[1:]):
            per[name].append((b - a) * 1000)
    return ({s: {"p50": _r(pct(v, 0.5), 1), "p95": _r(pct(v, 0.95), 1),
                 "mean": _r(statistics.fmean(v), 1) if v else None, "n": len(v)} for s, v in per.items()},
            backwards if barriers else None)


def spark_summary(progress: list[dict[str, Any]], timed: dict[int, tuple[float, float]]) -> dict[str, Any]:
    """Medians (ms) of the batches' durationMs and of the sink's commit calls, and batches per second."""
    if not progress:
        return {"batches": 0}
    d = [b["durationMs"] for b in progress]
    med = {k: round(float(statistics.median(x.get(k, 0) for x in d)), 1)
           for k in ("triggerExecution", "latestOffset", "addBatch", "queryPlanning", "walCommit", "commitOffsets",
                     "getBatch")}
    span = batch_starts(progress)
    secs = max(span.values()) - min(span.values()) if len(span) > 1 else 0
    return {"batches": len(progress), "batches_with_rows": sum(1 for b in progress if b.get("numInputRows", 0)),
            "batches_per_s": _r(len(progress) / secs if secs else None, 2), "median_ms": med,
            "commits": len(timed),
            "commit_median_ms": _r(statistics.median(e - s for s, e in timed.values()) * 1000, 1) if timed else None,
            "other_ms": round(med["triggerExecution"] - med["latestOffset"] - med["addBatch"], 1)}


# -------------------------------------------------------------------- report
def report(r: dict[str, Any], checks: list[Check]) -> str:
    m, prm = r["machine"], r["params"]
    cells = r["cells"]

    def iv(c: dict[str, Any]) -> str:
        return "none" if c.get("interval") is None else f"{c['interval']:g}"

    main = [[c.get("round"), c.get("backend"), iv(c), f"{c.get('trigger'):g}", c.get("records"), c.get("p50_s"), c.get("p95_s"),
             c.get("p99_s"), c.get("max_s"), c.get("unseen"), c.get("trend"), c.get("lag_end"), c.get("load_1min"),
             c.get("error")] for c in cells]
    st = [[c.get("backend"), iv(c), f"{c.get('trigger'):g}"]
          + [(c.get("stages_ms") or {}).get(s, {}).get("p50") for s in STAGES] for c in cells if "error" not in c]
    sp, dj = [], []
    for c in cells:
        if "error" in c:
            continue
        for job, s in (c.get("driver_jobs") or {}).items():
            md = s.get("median_ms", {})
            dj.append([f"{c['backend']} {iv(c)} {job}", s.get("batches"), s.get("skipped"), s.get("batches_per_s"),
                       md.get("plan"), md.get("write"), md.get("commit")])
        for job in JOBS:
            if job not in c["spark"]:
                continue
            s = c["spark"][job]
            md = s.get("median_ms", {})
            sp.append([f"{c['backend']} {iv(c)}/{c['trigger']:g} {job}", s.get("batches"), s.get("batches_per_s"),
                       md.get("triggerExecution"), md.get("latestOffset"), md.get("addBatch"),
                       s.get("commit_median_ms"), s.get("other_ms")])
    return "\n".join([
        f"lakestep {m['lakestep']} freshness benchmark  {m['date']}  cpus={m['cpu_count']}  python {m['python']}"
        f"  pyspark {m['pyspark']}  load(1 min) at start {m['load_1min']}",
        text_table(f"\nLatency, Kafka send -> first read_committed answer over f.raw, f.d1, f.d2 with the record "
                   f"(s); {prm['rate']:g} records/s, {prm['seconds']:g} s windows after {prm['warmup']:g} s warm-up; "
                   "interval 'none' = no barriers (the baseline)",
                   ["round", "backend", "interval", "trigger", "records", "p50", "p95", "p99", "max", "unseen",
                    "trend", "lag", "load", "error"], main),
        text_table("\nWhere the time goes: p50 per stage (ms; the stages of a record add up to its latency)",
                   ["backend", "interval", "trigger", *STAGES], st),
        text_table("\nSpark queries: batches, batches/s, median ms per batch (latestOffset = planning and trigger "
                   "agreement; addBatch = read, write, commit; commit = the sink's commit call, within addBatch)",
                   ["query", "batches", "per s", "trigger", "latestOffset", "addBatch", "commit", "other"], sp),
        text_table("\nDerived jobs run from the driver (DerivedJob; baseline: the same loop without barriers): "
                   "batches, skipped (no source changed: no Spark job), batches/s, median ms per batch (read+write: "
                   "the batches that ran a Spark job)",
                   ["job", "batches", "skipped", "per s", "plan", "read+write", "commit"], dj) if dj else "",
        text_table("\nTargets", ["check", "value", "target", "result"],
                   [[k.name, k.value, f"{k.op} {k.target:g}", k.result] for k in checks]),
    ])


def _floats(s: str) -> list[float]:
    return [float(x) for x in s.split(",") if x.strip()]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="the target cell per backend, short windows (~2 min)")
    ap.add_argument("--backends", default="sqlite,postgres")
    ap.add_argument("--intervals", default=None, help="coordinator intervals, s (default 0.2,1,5; --quick 0.2)")
    ap.add_argument("--triggers", default=None, help="processingTime triggers, s (default 0.2,1; --quick 0.2)")
    ap.add_argument("--baseline", action=argparse.BooleanOptionalAction, default=None,
                    help="also the no-barrier cells, one per backend and trigger (default: yes; --quick: no)")
    ap.add_argument("--seconds", type=float, default=None, help="measurement window per cell (default 45; quick 15)")
    ap.add_argument("--warmup", type=float, default=None,
                    help="after the first record came through (default 5; quick 3)")
    ap.add_argument("--drain", type=float, default=60.0, help="max wait for the measured / all records to be seen")
    ap.add_argument("--start-timeout", type=float, default=300.0, help="max wait for the first record")
    ap.add_argument("--rate", type=float, default=200.0, help="records per second")
    ap.add_argument("--rounds", type=int, default=None,
                    help="interleaved repeats of the grid; the targets use the medians (default 3; quick 1)")
    ap.add_argument("--warm-cell", action=argparse.BooleanOptionalAction, default=True,
                    help="run one unreported cell first (the JVM's JIT warms up; default: yes)")
    ap.add_argument("--quiet-commit", type=float, default=QUIET_COMMIT,
                    help=f"DerivedJob quiet_commit, s (default {QUIET_COMMIT:g})")
    ap.add_argument("--derived", choices=["driver", "stream"], default="driver",
                    help="d1 and d2 as DerivedJob threads (default) or as Structured Streaming queries")
    ap.add_argument("--pg-dsn", default=os.environ.get("LAKESTEP_BENCH_PG_DSN", DEFAULT_PG_DSN))
    ap.add_argument("--probe", action="store_true",
                    help="also count each consistent answer's rows of the three tables at the versions it read: "
                         "unequal counts make a wrong answer (a check: none)")
    ap.add_argument("--out", default="benchmarks/results/freshness.json")
    args = ap.parse_args(argv)
    q = args.quick
    params = {"quick": q, "backends": [b for b in args.backends.split(",") if b],
              "intervals": _floats(args.intervals or ("0.2" if q else "0.2,1,5")),
              "triggers": _floats(args.triggers or ("0.2" if q else "0.2,1")),
              "baseline": (not q) if args.baseline is None else args.baseline,
              "seconds": args.seconds or (15.0 if q else 45.0), "warmup": args.warmup if args.warmup is not None
              else (3.0 if q else 5.0), "drain": args.drain, "start_timeout": args.start_timeout, "rate": args.rate,
              "partitions": PARTITIONS, "max_barriers_per_trigger": MAX_BARRIERS, "reader_poll_s": POLL,
              "derived": args.derived, "rounds": args.rounds or (1 if q else 3), "warm_cell": args.warm_cell,
              "quiet_commit_s": args.quiet_commit, "probe": args.probe}
    import pyspark

    r: dict[str, Any] = {
        "machine": {"date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
                    "cpu_count": os.cpu_count(), "python": platform.python_version(),
                    "platform": platform.platform(), "lakestep": lakestep.__version__,
                    "pyspark": pyspark.__version__, "load_1min": round(os.getloadavg()[0], 2)},
        "params": params, "cells": [],
    }
    grid: list[tuple[float | None, float]] = [(i, t) for i in params["intervals"] for t in params["triggers"]]
    if params["baseline"]:
        grid += [(None, t) for t in params["triggers"]]
    began = time.time()
    from lakestep.testing import TansuBroker

    with tempfile.TemporaryDirectory(prefix="lakestep-bench-fresh-") as tmp, TansuBroker() as broker:
        root = Path(tmp)
        spark = make_spark(root, app="lakestep-bench-freshness")
        from .formats import PlainSource, TimedSink

        spark.dataSource.register(PlainSource)
        spark.dataSource.register(TimedSink)
        spark.conf.set("spark.sql.streaming.numRecentProgressUpdates", "100000")
        try:
            if params["warm_cell"]:  # the JVM compiles its hot paths in the first minute: not measured
                step("warm-up cell (not reported)")
                with contextlib.suppress(Exception):
                    run_cell(spark, broker, root, params["backends"][0], args.pg_dsn, *grid[0], params, "warm")
            for rnd in range(params["rounds"]):  # interleaved: every cell once per round
                for backend in params["backends"]:
                    for interval, trigger in grid:
                        step(f"round {rnd + 1}: {backend}: interval {interval}, trigger {trigger}")
                        try:
                            cell = run_cell(spark, broker, root, backend, args.pg_dsn, interval, trigger, params,
                                            f"r{rnd + 1}")
                        except Exception as exc:
                            traceback.print_exc()
                            cell = {"backend": backend, "interval": interval, "trigger": trigger,
                                    "error": f"{type(exc).__name__}: {str(exc)[:500]}"}
                        cell["round"] = rnd + 1
                        r["cells"].append(cell)
        finally:
            spark.stop()
    r["seconds_total"] = round(time.time() - began, 1)
    checks = []

    def median_of(backend: str, cell: tuple[float | None, float], key: str) -> float | None:
        xs = [c[key] for c in r["cells"] if c["backend"] == backend and (c["interval"], c["trigger"]) == cell
              and c.get(key) is not None]
        return _r(statistics.median(xs)) if xs else None

    r["medians"] = {}
    for backend in params["backends"]:
        p50, p99 = median_of(backend, TARGET_CELL, "p50_s"), median_of(backend, TARGET_CELL, "p99_s")
        base = median_of(backend, (None, TARGET_CELL[1]), "p50_s")
        ratio = _r(p50 / base) if p50 is not None and base else None
        r["medians"][backend] = {"p50_s": p50, "p99_s": p99, "baseline_p50_s": base, "p50_vs_baseline": ratio}
        if p50 is not None:
            n = params["rounds"]
            checks += [Check(f"{backend} p50 s (interval 0.2 s, trigger 0.2 s; median of {n})", p50, "<", P50_TARGET),
                       Check(f"{backend} p99 s (interval 0.2 s, trigger 0.2 s; median of {n})", p99, "<", P99_TARGET)]
        if ratio is not None:
            checks.append(Check(f"{backend} p50 with barriers / baseline p50 (trigger 0.2 s)", ratio, "<",
                                RATIO_TARGET))
    if params["probe"]:
        for backend in params["backends"]:
            mine = [c for c in r["cells"] if c["backend"] == backend and c["interval"] is not None]
            checks.append(Check(f"{backend} wrong answers (probed, every cell with barriers)",
                                sum(c["probes_wrong"] for c in mine) if all("probes_wrong" in c for c in mine)
                                else None, "==", 0))
    r["checks"] = [c.to_json() for c in checks]
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(r, indent=2) + "\n")
    print(report(r, checks))
    print(f"\n{sum(c.result == 'PASS' for c in checks)}/{len(checks)} targets met; {r['seconds_total']:g} s; "
          f"JSON: {out}")
    errors = [c for c in r["cells"] if "error" in c]
    return 2 if errors else (0 if all(c.result == "PASS" for c in checks) else 1)


if __name__ == "__main__":
    raise SystemExit(main())
