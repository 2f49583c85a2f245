"""The endurance run: a whole pipeline in separate processes for N minutes, with faults, checked exactly.

``python -m benchmarks.soak --minutes N [--backend sqlite|postgres] [--faults] [--seal S] [--out FILE]``

1. **The pipeline**, each part a process of its own under this module's supervisor
   (restarted one second after it exits, whatever the cause):

   * ``producer``: orders to a Kafka topic (the embedded tansu broker, which the
     supervisor runs and never faults) at ``--rate`` per second, with a burst of 5x for
     5 s every minute. Order ``i``'s customer, region and amount are functions of
     ``i`` (:func:`order`): the truth is computable from the ids alone;
   * ``root``: a Structured Streaming query, the ``lakestep-kafka`` source into
     ``soak.orders`` (the ``lakestep`` sink, exactly once on its checkpoint);
   * ``customers``: a :class:`~lakestep.streaming.DerivedJob` upserting
     ``soak.customers`` (primary key ``customer``): per customer with new orders, its
     totals over all its orders;
   * ``regions``: a ``DerivedJob`` overwriting ``soak.regions`` with the customers'
     totals per region (it reads the primary-key table, merged);
   * ``coordinator`` (``lakestep coordinator``, a seal every ``--seal`` seconds),
     ``maintenance`` (``lakestep maintenance``: TTL, compaction, cleanup, and the
     Iceberg publishing it does while publishing is on), ``serve`` (``lakestep serve``);
   * ``reader``: every second the three tables joined at ``read_committed`` (DuckDB),
     every five seconds the two derived tables through the REST catalog's
     ``lakestep@consistent`` warehouse (PyIceberg); every answer is compared, exactly
     (integers), with the truth at its barrier: computed in Python from the order ids
     ``soak.orders`` holds there, read by lakestep's own reader (no code shared with
     the jobs). Its freshness: now minus the newest order's time in the answer.

2. **Faults** (``--faults``), from ``--fault-start`` seconds on, one every
   ``--fault-every`` seconds, in a seeded random order that goes through every kind before
   repeating one: SIGKILL of each process kind but the producer and the reader (its
   whole tree: Spark's JVM and Python workers too), restarted by the supervisor; the
   catalog database not answering for 10-20 s (PostgreSQL: the fault proxy every
   process reaches it through stalls; SQLite: a connection holds its write lock); a
   PostgreSQL restart (``--backend postgres``: the run's own server, stopped and
   started); a full disk under the warehouse (a tmpfs mounted for the run, filled for
   10-20 s; where mounting is not possible the fault is skipped and the summary says so).
   A killed process is **back** when its work moves again after its restart: the
   root table gets new rows (a data version; a compaction adds none), a derived
   table's frontier passes its value at the kill, the open epoch moves, a publishing
   round ends, the server answers ``/health``.

3. **Figures**: every 10 s a sample (JSON lines): per process RSS and open descriptors
   (the process tree), the catalog database's size and each ``ls_`` table's rows, live
   files and bytes, versions and Iceberg metadata files and tags per table; per minute
   the reader's freshness p50 / p99 and answers. At the end the producer stops, the
   pipeline drains, everything stops, and the run is checked: every order sent is in
   ``soak.orders`` exactly once with the fields it was sent with (lost and duplicated
   counted by id); both derived tables equal the truth at every barrier still readable
   (customers per customer, regions per region; rows missing, extra or wrong counted);
   every reader answer was right; every killed process was back within 30 s; and
   growth: the least-squares slope of RSS, descriptors, catalog size and live files
   after the warm-up (``--warmup``, default a sixth of the run, at least 10 min for runs
   of 60 min and more) must project less than its limit over an hour (``GROWTH_LIMITS``;
   judged only on runs of 20 minutes or more, reported always).

The summary is printed as tables and written as JSON (``--out``; the samples, each
process's log, the reader's answers and the faults sit in a folder beside it), with PNG
plots (matplotlib, the ``plots`` extra) of memory, descriptors, catalog size, files
and freshness over time. Exit status 0 when every check passes.

Not measured here: throughput (the producer's rate is fixed) and Spark's own restart
time beyond "back within 30 s".
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import datetime as dt
import json
import os
import platform
import random
import shutil
import signal
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Callable

REPO = Path(__file__).resolve().parents[1]
NS = "soak"
ORDERS, CUSTOMERS, REGIONS = f"{NS}.orders", f"{NS}.customers", f"{NS}.regions"
TOPIC = "orders"
N_CUSTOMERS, N_REGIONS = 1000, 8
#: the kinds of process the supervisor runs; FAULTABLE ones are killed in turn under --faults
KINDS = ("producer", "root", "customers", "regions", "coordinator", "maintenance", "serve", "reader")
FAULTABLE = ("root", "customers", "regions", "coordinator", "maintenance", "serve")
#: a killed process must be back within this many seconds (--back-within)
BACK_WITHIN = 30.0
RESTART_DELAY = 1.0
SAMPLE_EVERY = 10.0
#: growth judged per hour after the warm-up: (the sampled figure, absolute limit, relative limit of its mean)
GROWTH_LIMITS = {"rss_bytes": (64 << 20, 0.10), "fds": (16, 0.10), "catalog_bytes": (8 << 20, 0.25),
                 "live_files": (50, 0.25)}
#: shortest run whose growth is judged (shorter ones report the slopes only)
GROWTH_MIN_MINUTES = 20.0


# ------------------------------------------------------------------ the truth
def order(i: int) -> tuple[str, int, int]:
    """Order ``i``'s (customer, region, amount in cents): functions of ``i`` alone."""
    c = (i * 7919) % N_CUSTOMERS
    return f"c{c:04d}", c % N_REGIONS, 100 + (i * 104729) % 9900


@dataclass
class Totals:
    """The truth at one barrier, from the order ids (and their times) ``soak.orders`` holds there."""

    orders: int = 0
    duplicates: int = 0
    customers: dict[str, tuple[int, int, int, int]] = field(default_factory=dict)  # -> (region, cents, n, last_ms)
    regions: dict[int, tuple[int, int, int, int]] = field(default_factory=dict)  # -> (cents, n, customers, last_ms)
    last_ms: int | None = None

    @classmethod
    def of(cls, rows: Any) -> "Totals":
        """From an Arrow table of ``order_id`` and ``produced_ms``: each order's customer and amount
        computed from its id (vectorised :func:`order`; a test checks the two agree)."""
        import pyarrow as pa
        import pyarrow.compute as pc

        ids = rows.column("order_id")
        c = pc.divide(pc.subtract(pc.multiply(ids, 7919), pc.multiply(pc.divide(pc.multiply(ids, 7919), N_CUSTOMERS),
                                                                       N_CUSTOMERS)), 1)
        amount = pc.add(100, pc.subtract(pc.multiply(ids, 104729),
                                         pc.multiply(pc.divide(pc.multiply(ids, 104729), 9900), 9900)))
        per = pa.table({"c": c, "amount": amount, "ms": rows.column("produced_ms")}).group_by("c").aggregate(
            [("amount", "sum"), ("amount", "count"), ("ms", "max")])
        t = cls(orders=len(ids), duplicates=len(ids) - len(pc.unique(ids)))
        t.customers = {f"c{k:04d}": (k % N_REGIONS, s, n, m) for k, s, n, m in zip(
            per.column("c").to_pylist(), per.column("amount_sum").to_pylist(), per.column("amount_count").to_pylist(),
            per.column("ms_max").to_pylist())}
        reg: dict[int, list[int]] = {}
        for r, cents, n, last in t.customers.values():
            v = reg.setdefault(r, [0, 0, 0, 0])
            v[0] += cents
            v[1] += n
            v[2] += 1
            v[3] = max(v[3], last)
        t.regions = {r: (v[0], v[1], v[2], v[3]) for r, v in reg.items()}
        t.last_ms = pc.max(rows.column("produced_ms")).as_py()
        return t


class Truth:
    """The truth at a barrier, cached per version of ``soak.orders``."""

    def __init__(self, cat: Any) -> None:
        from lakestep.barrier import Pipeline

        self.cat, self.p = cat, Pipeline(cat)
        self._by_version: dict[int, Totals] = {}

    def version(self, barrier: int) -> int:
        return self.p.version_at(ORDERS, barrier)

    def at(self, barrier: int) -> Totals:
        v = self.version(barrier)
        if v not in self._by_version:
            rows = self.cat.load_table(ORDERS).to_arrow(version=v, columns=["order_id", "produced_ms"])
            self._by_version = {v: Totals.of(rows)}  # the newest only: a reader moves forward
        return self._by_version[v]


def compare(what: str, got: dict[Any, tuple[int, ...]], want: dict[Any, tuple[int, ...]]) -> dict[str, Any]:
    """Rows missing from, extra in and different in ``got`` against ``want``, with a few examples."""
    missing = sorted(set(want) - set(got), key=str)
    extra = sorted(set(got) - set(want), key=str)
    wrong = sorted((k for k in set(got) & set(want) if tuple(got[k]) != tuple(want[k])), key=str)
    out = {"what": what, "rows": len(got), "expected": len(want), "missing": len(missing), "extra": len(extra),
           "wrong": len(wrong)}
    if missing or extra or wrong:
        out["examples"] = {"missing": [str(k) for k in missing[:5]], "extra": [str(k) for k in extra[:5]],
                           "wrong": [[str(k), list(got[k]), list(want[k])] for k in wrong[:5]]}
    return out


def bad(c: dict[str, Any]) -> bool:
    return bool(c["missing"] or c["extra"] or c["wrong"])


# ------------------------------------------------------------------ the roles
def _config(path: str) -> dict[str, Any]:
    return json.loads(Path(path).read_text())


def _spark(cfg: dict[str, Any], role: str, cores: int) -> Any:
    from lakestep.streaming import register
    from lakestep.testing.spark import local_session

    spark = local_session(f"lakestep-soak-{role}", Path(cfg["dir"]) / "spark" / role, cores=cores, pythonpath=REPO,
                         conf={"spark.driver.memory": "768m",
                               "spark.sql.warehouse.dir": str(Path(cfg["dir"]) / "spark" / "warehouse"),
                               "spark.sql.streaming.stopTimeout": "30s"})
    register(spark)
    return spark


def _log(msg: str) -> None:
    print(f"{time.strftime('%H:%M:%S')} {msg}", flush=True)


def _stop_event() -> threading.Event:
    stop = threading.Event()
    for s in (signal.SIGTERM, signal.SIGINT):
        signal.signal(s, lambda *_: stop.set())
    return stop


def role_producer(cfg: dict[str, Any]) -> int:
    """Orders at ``rate``/s in batches of a tenth of a second, a 5x burst 5 s every minute; the
    next id to send is kept in ``producer.json`` after every acknowledged batch (a restart goes
    on from there; a batch sent but not recorded would be sent twice: the producer is not
    faulted)."""
    from kafka import KafkaProducer

    state = Path(cfg["dir"]) / "producer.json"
    sent = json.loads(state.read_text())["sent"] if state.exists() else 0
    stop = _stop_event()
    prod = KafkaProducer(bootstrap_servers=cfg["bootstrap"], acks="all", linger_ms=5)
    rate, began = float(cfg["rate"]), time.monotonic()
    tick = 0.1
    try:
        while not stop.is_set():
            t = time.monotonic() - began
            burst = (t % 60.0) >= 55.0
            n = max(1, round(rate * tick * (5 if burst else 1)))
            now = int(time.time() * 1000)
            futures = []
            for i in range(sent, sent + n):
                c, r, a = order(i)
                rec = {"order_id": i, "customer": c, "region": r, "amount_cents": a, "produced_ms": now}
                futures.append(prod.send(TOPIC, json.dumps(rec).encode()))
            prod.flush(timeout=60)
            for f in futures:
                f.get(timeout=60)  # raises if the broker refused one: nothing recorded, the batch is sent again
            sent += n
            tmp = state.with_suffix(".tmp")
            tmp.write_text(json.dumps({"sent": sent, "at": time.time()}))
            os.replace(tmp, state)
            stop.wait(max(0.0, tick - (time.monotonic() - began - t)))
    finally:
        prod.close(timeout=10)
    _log(f"producer stopped: {sent} orders sent")
    return 0


def role_root(cfg: dict[str, Any]) -> int:
    """Kafka -> soak.orders: a Structured Streaming query on its checkpoint (exactly once)."""
    spark = _spark(cfg, "root", 2)
    from pyspark.sql import functions as F

    raw = (spark.readStream.format("lakestep-kafka").option("kafka.bootstrap.servers", cfg["bootstrap"])
           .option("subscribe", TOPIC).option("startingOffsets", "earliest").load())
    rows = raw.select(F.from_json(F.col("value").cast("string"),
                                  "order_id long, customer string, region long, amount_cents long, "
                                  "produced_ms long").alias("o")).select("o.*")
    q = (rows.writeStream.queryName("root").format("lakestep").option("catalog", cfg["url"])
         .option("table", ORDERS).option("job", "root")
         .option("checkpointLocation", str(Path(cfg["dir"]) / "checkpoints" / "root"))
         .trigger(processingTime="500 milliseconds").start())
    stop = _stop_event()
    _log("root query started")
    while not stop.is_set():
        if not q.isActive:
            _log(f"root query stopped: {q.exception()}")
            return 1
        stop.wait(0.5)
    q.stop()
    spark.stop()
    return 0


def _customers(batch: Any) -> Any:
    """Per customer with new orders in the batch: its totals over all its orders at ``hi``."""
    from pyspark.sql import functions as F

    changed = batch.changes(ORDERS).select("customer").distinct()
    return (batch.table(ORDERS).join(changed, "customer").groupBy("customer")
            .agg(F.max("region").alias("region"), F.sum("amount_cents").cast("long").alias("revenue_cents"),
                 F.count("*").cast("long").alias("orders"), F.max("produced_ms").alias("last_ms")))


def _regions(batch: Any) -> Any:
    """The customers' totals per region."""
    from pyspark.sql import functions as F

    return (batch.table(CUSTOMERS).groupBy("region")
            .agg(F.sum("revenue_cents").cast("long").alias("revenue_cents"),
                 F.sum("orders").cast("long").alias("orders"), F.count("*").cast("long").alias("customers"),
                 F.max("last_ms").alias("last_ms")))


def role_derived(cfg: dict[str, Any], job: str) -> int:
    """One derived job (``customers`` or ``regions``) as a DerivedJob loop until SIGTERM."""
    spark = _spark(cfg, job, 1)
    from lakestep.streaming import DerivedJob

    if job == "customers":
        dj = DerivedJob(spark, cfg["url"], job, sources=[ORDERS], sinks={CUSTOMERS: "upsert"}, transform=_customers)
    else:
        dj = DerivedJob(spark, cfg["url"], job, sources=[CUSTOMERS], sinks={REGIONS: "overwrite"}, transform=_regions)
    every = float(cfg["derived_every"])
    running = dj.start(every=every or None)
    stop = _stop_event()
    _log(f"derived job {job} started")
    shown, began, first = time.monotonic(), time.time(), False
    while not stop.is_set():
        if not running.is_active:
            _log(f"derived job {job} stopped: {running.error!r}")
            return 1
        stop.wait(0.5)
        if not first and running.stats.timings:  # what a restart costs before the first commit
            first, t = True, running.stats.timings[0]
            _log(f"{job}: first batch (barrier {t['barrier']}) committed {t['committed'] - began:.1f} s after "
                 f"the start; plan {round((t['planned'] - t['start']) * 1000)} ms, read+write "
                 f"{round((t['written'] - t['planned']) * 1000)} ms, commit "
                 f"{round((t['committed'] - t['written']) * 1000)} ms, waited "
                 f"{max(0.0, t['start'] - began):.1f} s for it")
        if time.monotonic() - shown >= 30:
            shown = time.monotonic()
            st = running.stats
            recent = [t for t in st.timings[-30:] if t["ran"]]

            def ms(a: str, b: str) -> int:
                return round(statistics.median([t[b] - t[a] for t in recent]) * 1000) if recent else -1

            at = st.timings[-1]["barrier"] if st.timings else None
            _log(f"{job}: {st.batches} batches ({st.skipped} skipped, {st.replayed} replayed); the last 30 that "
                 f"ran a Spark job: plan {ms('start', 'planned')} ms, read+write {ms('planned', 'written')} ms, "
                 f"commit {ms('written', 'committed')} ms (medians); at barrier {at}")
    running.stop()
    spark.stop()
    return 0


READ_SQL = (
    "SELECT coalesce(r.region, c.region, o.region) AS region, "
    "r.revenue_cents, r.orders, r.customers, r.last_ms, "
    "c.revenue_cents AS c_revenue, c.orders AS c_orders, c.customers AS c_customers, c.last_ms AS c_last, "
    "o.revenue_cents AS o_revenue, o.orders AS o_orders, o.last_ms AS o_last "
    f"FROM {REGIONS} AS r "
    "FULL JOIN (SELECT region, sum(revenue_cents) AS revenue_cents, sum(orders) AS orders, count(*) AS customers, "
    f"max(last_ms) AS last_ms FROM {CUSTOMERS} GROUP BY region) AS c ON r.region = c.region "
    "FULL JOIN (SELECT region, sum(amount_cents) AS revenue_cents, count(*) AS orders, max(produced_ms) AS last_ms "
    f"FROM {ORDERS} GROUP BY region) AS o ON coalesce(r.region, c.region) = o.region")


def check_read(rows: list[dict[str, Any]], truth: Totals) -> list[dict[str, Any]]:
    """One read_committed answer of READ_SQL against the truth at its barrier: three comparisons."""
    want = truth.regions

    def pick(*cols: str) -> dict[Any, tuple[int, ...]]:  # one side of the join: its rows' values per region
        return {r["region"]: tuple(int(r[c]) for c in cols) for r in rows if r[cols[0]] is not None}

    regions = pick("revenue_cents", "orders", "customers", "last_ms")
    customers = pick("c_revenue", "c_orders", "c_customers", "c_last")
    orders = pick("o_revenue", "o_orders", "o_last")
    return [compare("regions", regions, want), compare("customers per region", customers, want),
            compare("orders per region", orders, {r: (v[0], v[1], v[3]) for r, v in want.items()})]


def role_reader(cfg: dict[str, Any]) -> int:
    """The checking reader: read_committed every second, lakestep@consistent every five (module docstring)."""
    from pyiceberg.catalog.rest import RestCatalog

    from lakestep import Catalog
    from lakestep.query import duckdb_query

    cat = Catalog(cfg["url"])
    truth = Truth(cat)
    out = open(Path(cfg["dir"]) / "answers.jsonl", "a", buffering=1)
    stop = _stop_event()
    last_rest = 0.0
    while not stop.is_set():
        t0 = time.time()
        rec: dict[str, Any] = {"t": t0, "kind": "read_committed"}
        try:
            res = duckdb_query(cat, READ_SQL, level="read_committed")
            b = res.read.barrier
            rows = res.table.to_pylist()
            if b is not None and rows:
                rec["barrier"], rec["open"] = b, res.read.open_epoch
                want = truth.at(b)
                checks = check_read(rows, want)
                rec["ok"] = not any(bad(c) for c in checks)
                if not rec["ok"]:
                    rec["checks"] = checks
                newest = max((r["last_ms"] for r in rows if r["last_ms"] is not None), default=None)
                if newest is not None:
                    rec["freshness_ms"] = int(t0 * 1000) - int(newest)
        except Exception as e:  # noqa: BLE001 - a failed read is recorded (an outage is no wrong answer)
            rec["error"] = f"{type(e).__name__}: {e}"[:300]
        if "barrier" in rec or "error" in rec:
            out.write(json.dumps(rec) + "\n")
        if time.time() - last_rest >= 5.0:
            last_rest = time.time()
            rec = {"t": last_rest, "kind": "rest_consistent"}
            try:
                rc = RestCatalog("soak", uri=cfg["serve_uri"], warehouse="lakestep@consistent")
                n = int(rc.properties["prefix"].split("=")[1])
                cust = {r["customer"]: (int(r["region"]), int(r["revenue_cents"]), int(r["orders"]), int(r["last_ms"]))
                        for r in rc.load_table(CUSTOMERS).scan().to_arrow().to_pylist()}
                reg = {int(r["region"]): (int(r["revenue_cents"]), int(r["orders"]), int(r["customers"]),
                                          int(r["last_ms"]))
                       for r in rc.load_table(REGIONS).scan().to_arrow().to_pylist()}
                want = truth.at(n)
                checks = [compare("customers", cust, want.customers), compare("regions", reg, want.regions)]
                rec.update(barrier=n, ok=not any(bad(c) for c in checks))
                if not rec["ok"]:
                    rec["checks"] = checks
            except Exception as e:  # noqa: BLE001 - e.g. serve restarting, nothing published yet
                rec["error"] = f"{type(e).__name__}: {e}"[:300]
            out.write(json.dumps(rec) + "\n")
        stop.wait(max(0.0, 1.0 - (time.time() - t0)))
    cat.close()
    return 0


# ------------------------------------------------------------- the supervisor
@dataclass
class Proc:
    kind: str
    cmd: list[str]
    log: Path
    popen: subprocess.Popen[bytes] | None = None
    started_at: float = 0.0
    restarts: int = 0
    exits: list[dict[str, Any]] = field(default_factory=list)
    due: float | None = 0.0  # when to (re)start; None: not scheduled
    killed: bool = False
    retired: bool = False  # stopped for good (the producer at the drain, everything at the end)

    def start(self, env: dict[str, str]) -> None:
        out: IO[bytes] = open(self.log, "ab")
        out.write(f"\n==== {time.strftime('%H:%M:%S')} start #{self.restarts}\n".encode())
        out.flush()
        self.popen = subprocess.Popen(self.cmd, stdout=out, stderr=subprocess.STDOUT, cwd=REPO, env=env,
                                      start_new_session=True)
        out.close()
        self.started_at, self.due = time.time(), None

    @property
    def pid(self) -> int | None:
        return None if self.popen is None or self.popen.poll() is not None else self.popen.pid


@dataclass
class Fault:
    kind: str  # kill:<process kind> | stall | pg_restart | disk_full
    at: float
    ended_at: float | None = None
    back_at: float | None = None
    baseline: Any = None
    note: str = ""

    @property
    def back_s(self) -> float | None:
        return None if self.back_at is None else round(self.back_at - self.at, 2)


class Supervisor:
    def __init__(self, args: argparse.Namespace, work: Path) -> None:
        self.args, self.work = args, work
        self.procs: dict[str, Proc] = {}
        self.faults: list[Fault] = []
        self.samples: list[dict[str, Any]] = []
        self.lock = threading.Lock()
        self.stopping = threading.Event()
        self.rng = random.Random(args.seed)
        self.env = dict(os.environ)
        self.env["PYTHONPATH"] = os.pathsep.join([str(REPO), *[p for p in self.env.get("PYTHONPATH", "").split(
            os.pathsep) if p]])
        if not self.env.get("LAKESTEP_SPARK_CLASS_ARCHIVE"):
            self.env["LAKESTEP_SPARK_CLASS_ARCHIVE"] = _class_archive()
        self.env.setdefault("JAVA_TOOL_OPTIONS", "-XX:TieredStopAtLevel=1")
        # what docs/operations.md tells operators to give long-running drivers and readers (the
        # lakestep command sets it itself: lakestep/_memory.py)
        self.env.setdefault("ARROW_DEFAULT_MEMORY_POOL", "jemalloc")
        self.mount: Path | None = None
        self.pg: Any = None
        self.proxy: Any = None
        self.broker: Any = None

    # ------------------------------------------------------------ set-up
    def setup(self) -> dict[str, Any]:
        from lakestep import Catalog
        from lakestep.testing import TansuBroker

        wh = self.work / "warehouse"
        wh.mkdir(parents=True)
        self.mount = self._mount(wh) if self.args.faults else None
        if self.args.backend == "postgres":
            from lakestep.testing.pgcluster import PgCluster
            from lakestep.testing.pgproxy import PgProxy

            self.pg = PgCluster()
            self.pg.stop()  # room for every process's pool and Spark's Python workers (the suite's 60 is not)
            with open(self.pg.data / "postgresql.conf", "a") as conf:
                conf.write("\nmax_connections = 300\n")
            self.pg.start()
            direct = self.pg.create_database("soak")
            self.proxy = PgProxy(("127.0.0.1", self.pg.port))
            url = self.proxy.url_for(direct)
        else:
            direct = url = f"sqlite:///{self.work / 'catalog.db'}"
        self.direct_url = direct
        cat = Catalog(direct, warehouse=str(wh))
        cat.create_namespace(NS)
        import pyarrow as pa

        cat.create_table(ORDERS, pa.schema([("order_id", pa.int64()), ("customer", pa.string()),
                                            ("region", pa.int64()), ("amount_cents", pa.int64()),
                                            ("produced_ms", pa.int64())]))
        cat.create_table(CUSTOMERS, pa.schema([pa.field("customer", pa.string(), nullable=False),
                                               ("region", pa.int64()), ("revenue_cents", pa.int64()),
                                               ("orders", pa.int64()), ("last_ms", pa.int64())]),
                         primary_key=["customer"])
        cat.create_table(REGIONS, pa.schema([("region", pa.int64()), ("revenue_cents", pa.int64()),
                                             ("orders", pa.int64()), ("customers", pa.int64()),
                                             ("last_ms", pa.int64())]))
        for t in (ORDERS, CUSTOMERS, REGIONS):  # cleanup prunes within the run: growth is judged within retention
            cat.load_table(t).set_properties({"lakestep.retention-seconds": self.args.retention})
        from lakestep.barrier import Pipeline
        from lakestep.iceberg import enable

        p = Pipeline(cat)  # the derived jobs, as their DerivedJobs register them (the root job: its sink does)
        p.register_job("customers", sources=[ORDERS], sinks=[CUSTOMERS])
        p.register_job("regions", sources=[CUSTOMERS], sinks=[REGIONS])
        enable(cat)
        self.cat = cat
        self.broker = TansuBroker()
        self.broker.start()
        self.broker.create_topic(TOPIC, partitions=2)
        from lakestep.testing.ports import free_port

        port = free_port()
        cfg = {"dir": str(self.work), "url": url, "bootstrap": self.broker.bootstrap_servers, "rate": self.args.rate,
               "serve_uri": f"http://127.0.0.1:{port}", "derived_every": self.args.derived_every}
        (self.work / "config.json").write_text(json.dumps(cfg))
        self.cfg = cfg
        me = [sys.executable, "-m", "benchmarks.soak", "--config", str(self.work / "config.json"), "--role"]
        ls = [sys.executable, "-m", "lakestep"]
        cmds = {
            "producer": me + ["producer"], "root": me + ["root"], "customers": me + ["customers"],
            "regions": me + ["regions"], "reader": me + ["reader"],
            "coordinator": ls + ["coordinator", "--catalog", url, "--interval", str(self.args.seal), "--lease", "5",
                                 "--retain-count", str(self.args.retain)],
            "maintenance": ls + ["maintenance", "--catalog", url, "--interval", str(self.args.maintenance_every),
                                 "--major-every", "5", "--json"],
            "serve": ls + ["serve", "--catalog", url, "--port", str(port)],
        }
        (self.work / "logs").mkdir()
        for kind in KINDS:
            self.procs[kind] = Proc(kind, cmds[kind], self.work / "logs" / f"{kind}.log")
        return cfg

    def _mount(self, wh: Path) -> Path | None:
        """A tmpfs of ``--disk-mb`` under the warehouse (the disk-full fault fills it); None where
        this machine cannot mount one (not root, no CAP_SYS_ADMIN)."""
        try:
            r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={self.args.disk_mb}m", "tmpfs", str(wh)],
                               capture_output=True, text=True, timeout=60)
            why = r.stderr.strip() or f"status {r.returncode}"
        except (OSError, subprocess.TimeoutExpired) as e:  # no mount command
            r, why = None, str(e)
        if r is None or r.returncode != 0:
            _log(f"no tmpfs for the warehouse ({why}): the disk-full fault is skipped")
            return None
        return wh

    # ----------------------------------------------------------- running
    def reap_and_restart(self) -> None:
        now = time.time()
        for p in self.procs.values():
            if p.popen is not None and p.popen.poll() is not None and p.due is None:
                p.exits.append({"at": now, "code": p.popen.returncode, "killed": p.killed})
                if not p.killed and not p.retired:
                    _log(f"{p.kind} exited ({p.popen.returncode}): restarting (its log: {p.log})")
                p.killed = False
                p.popen = None
                if not self.stopping.is_set() and not p.retired:
                    p.due = now + RESTART_DELAY
            if p.popen is None and p.due is not None and now >= p.due and not self.stopping.is_set() \
                    and not p.retired:
                if p.started_at:
                    p.restarts += 1
                p.start(self.env)

    def kill(self, kind: str) -> None:
        from lakestep.testing.processes import kill_tree

        p = self.procs[kind]
        if p.popen is None:
            return
        p.killed = True
        kill_tree(p.popen.pid)
        p.popen.wait()

    def progress(self) -> dict[str, Any]:
        """What says each kind of process is working (the ``back`` probes), read on the direct URL."""
        import urllib.request

        from lakestep.barrier import Pipeline
        from lakestep.iceberg import status

        p = Pipeline(self.cat)
        out: dict[str, Any] = {"coordinator": p.open_epoch(), "root": self.cat.load_table(ORDERS).data_version,
                               "customers": p.frontier(CUSTOMERS), "regions": p.frontier(REGIONS),
                               "maintenance": status(self.cat).round_at}
        try:
            with urllib.request.urlopen(f"{self.cfg['serve_uri']}/health", timeout=2) as r:
                out["serve"] = time.time() if r.status == 200 else None
        except OSError:
            out["serve"] = None
        return out

    def _moved(self, kind: str, before: Any, now: Any, since: float) -> bool:
        if now is None:
            return False
        if kind in ("maintenance", "serve"):
            return now > since
        return before is None or now > before

    def watch(self) -> None:
        """Thread: the ``back`` probes of the faults not yet recovered, every half second."""
        while not self.stopping.is_set():
            with self.lock:
                pending = [f for f in self.faults if f.kind.startswith("kill:") and f.back_at is None]
            if pending:
                try:
                    prog = self.progress()
                except Exception:  # noqa: BLE001 - probes are retried; the catalog may be faulted
                    prog = None
                if prog is not None:
                    for f in pending:
                        kind = f.kind.split(":", 1)[1]
                        p = self.procs[kind]
                        restarted = p.popen is not None and p.started_at > f.at
                        if restarted and self._moved(kind, f.baseline, prog.get(kind), p.started_at):
                            f.back_at = time.time()
                            _log(f"{kind} back {f.back_s:.1f} s after its kill")
            self.stopping.wait(0.5)

    def faults_loop(self, until: float) -> None:
        """Thread: one fault every --fault-every seconds from --fault-start on, in rounds of every kind."""
        kinds = [f"kill:{k}" for k in FAULTABLE] + ["stall", "disk_full"]
        if self.args.backend == "postgres":
            kinds.append("pg_restart")
        queue: list[str] = []
        t = time.time() + self.args.fault_start
        while not self.stopping.wait(max(0.0, t - time.time())):
            if time.time() >= until - BACK_WITHIN - 15:  # the last fault's process is back before the drain
                return
            if not queue:
                queue = kinds[:]
                self.rng.shuffle(queue)
            kind = queue.pop(0)
            try:
                self.fault(kind)
            except Exception as e:  # noqa: BLE001 - a fault that could not be made is recorded as such
                with self.lock:
                    self.faults.append(Fault(kind, time.time(), note=f"not made: {type(e).__name__}: {e}"))
            t = time.time() + self.args.fault_every

    def fault(self, kind: str) -> None:
        hold = self.rng.uniform(10, 20)
        _log(f"fault: {kind}" + ("" if kind.startswith("kill:") else f" for {hold:.0f} s"))
        if kind.startswith("kill:"):
            target = kind.split(":", 1)[1]
            f = Fault(kind, time.time())
            self.kill(target)
            f.ended_at = time.time()
            # The baseline is read once the process is dead, so that no commit of its own lands
            # after it (read before the kill, a batch committing meanwhile made a kill "back" in
            # 1.2 s). Nothing else moves a killed process's probe, and its restart commits
            # nothing for seconds: a few tries outlast a slow catalog.
            for _ in range(10):
                try:
                    f.baseline = self.progress().get(target)
                    break
                except Exception:  # noqa: BLE001 - retried
                    self.stopping.wait(0.3)
            else:
                f.note = "no baseline could be read after the kill"
            with self.lock:
                self.faults.append(f)
            return
        f = Fault(kind, time.time())
        with self.lock:
            self.faults.append(f)
        if kind == "stall":
            if self.proxy is not None:
                self.proxy.stall()
                self.stopping.wait(hold)
                self.proxy.heal()
                f.note = "the fault proxy stalled every connection"
            else:
                con = sqlite3.connect(str(self.work / "catalog.db"), timeout=60, isolation_level=None)
                con.execute("BEGIN IMMEDIATE")
                self.stopping.wait(hold)
                con.execute("ROLLBACK")
                con.close()
                f.note = "a connection held SQLite's write lock"
        elif kind == "pg_restart":
            self.pg.stop("fast")
            self.stopping.wait(min(hold, 5.0))
            self.pg.start()
            f.note = "pg_ctl stop -m fast; start"
        elif kind == "disk_full":
            if self.mount is None:
                f.note = "skipped: no tmpfs could be mounted on this machine"
            else:
                filler = self.mount / "filler"
                written = _fill(filler)
                self.stopping.wait(hold)
                filler.unlink()
                f.note = f"the warehouse's tmpfs filled ({written >> 20} MiB)"
        f.ended_at = time.time()

    # ---------------------------------------------------------- sampling
    def sample(self, t0: float) -> dict[str, Any]:
        import sqlalchemy as sa

        from lakestep.testing.processes import open_fds, rss_bytes, tree

        s: dict[str, Any] = {"t": round(time.time() - t0, 1), "processes": {}}
        for kind, p in self.procs.items():
            pids = tree(p.pid) if p.pid is not None else set()
            s["processes"][kind] = {"rss_bytes": rss_bytes(pids), "fds": open_fds(pids), "pids": len(pids),
                                    "up_s": round(time.time() - p.started_at, 1) if pids else 0.0}
        s["rss_bytes"] = sum(v["rss_bytes"] for k, v in s["processes"].items() if k in FAULTABLE)
        s["fds"] = sum(v["fds"] for k, v in s["processes"].items() if k in FAULTABLE)
        eng = self.cat.backend.engine
        with eng.connect() as c:
            if self.args.backend == "postgres":
                s["catalog_bytes"] = int(c.execute(sa.text("SELECT pg_database_size(current_database())")).scalar())
            else:
                s["catalog_bytes"] = sum(f.stat().st_size for f in self.work.glob("catalog.db*"))
            names = [n for n in sa.inspect(c).get_table_names() if n.startswith("ls_")]
            s["catalog_rows"] = {n: int(c.execute(sa.text(f'SELECT count(*) FROM "{n}"')).scalar()) for n in names}
        s["tables"] = {}
        for t in (ORDERS, CUSTOMERS, REGIONS):
            table = self.cat.load_table(t)
            files = table.files()
            meta = _iceberg_metadata(Path(table.location) / "metadata") if "://" not in table.location else {}
            s["tables"][t] = {"live_files": len(files), "live_bytes": sum(f.file_size for f in files),
                              "version": table.version, **meta}
        s["live_files"] = sum(v["live_files"] for v in s["tables"].values())
        s["versions"] = s["catalog_rows"].get("ls_commit")
        return s

    def sampler(self, t0: float, out: IO[str]) -> None:
        while not self.stopping.wait(SAMPLE_EVERY):
            try:
                s = self.sample(t0)
            except Exception as e:  # noqa: BLE001 - a sample during an outage: recorded as missing
                s = {"t": round(time.time() - t0, 1), "error": f"{type(e).__name__}: {e}"[:300]}
            with self.lock:
                self.samples.append(s)
            out.write(json.dumps(s) + "\n")
            out.flush()

    # -------------------------------------------------------------- run
    def run(self) -> dict[str, Any]:
        args = self.args
        self.setup()
        t0 = time.time()
        until = t0 + args.minutes * 60
        _log(f"soak: {args.minutes:g} min on {args.backend}, faults {'on' if args.faults else 'off'}; "
             f"work folder {self.work}")
        threads = [threading.Thread(target=self.watch, daemon=True, name="watch")]
        samples = open(self.work / "samples.jsonl", "w")
        threads.append(threading.Thread(target=self.sampler, args=(t0, samples), daemon=True, name="sampler"))
        if args.faults:
            threads.append(threading.Thread(target=self.faults_loop, args=(until,), daemon=True, name="faults"))
        for th in threads:
            th.start()
        status = "ran"
        try:
            while time.time() < until:
                self.reap_and_restart()
                time.sleep(0.2)
            drained = self.drain()
        except KeyboardInterrupt:
            status, drained = "interrupted", {}
        finally:
            self.stopping.set()
            for th in threads:
                th.join(timeout=60)
            self.stop_all()
            samples.close()
        result = self.check(t0, drained)
        result["status"] = status
        return result

    def drain(self) -> dict[str, Any]:
        """Stop the producer; wait until soak.orders holds every order sent, a barrier seals them,
        and both derived tables have precommitted it (faults have stopped by now)."""
        prod = self.procs["producer"]
        prod.retired, prod.due = True, None
        if prod.popen is not None:
            prod.popen.send_signal(signal.SIGTERM)
            prod.popen.wait(timeout=60)
        sent = json.loads((self.work / "producer.json").read_text())["sent"]
        from lakestep.barrier import Pipeline

        p = Pipeline(self.cat)
        began = time.time()

        def waiting(cond: Callable[[], bool], what: str) -> bool:
            while time.time() - began < self.args.drain:
                self.reap_and_restart()
                try:
                    if cond():
                        return True
                except Exception:  # noqa: BLE001 - e.g. the catalog restarting
                    pass
                time.sleep(0.5)
            _log(f"drain: {what} did not happen within {self.args.drain:g} s")
            return False

        ok = waiting(lambda: self.cat.load_table(ORDERS).count() >= sent, "every order in soak.orders")
        opened = p.open_epoch()
        ok = ok and waiting(lambda: p.open_epoch() > opened, f"the seal of epoch {opened}")
        ok = ok and waiting(lambda: min(p.frontier(CUSTOMERS) or 0, p.frontier(REGIONS) or 0) >= opened,
                            f"both derived tables at barrier {opened}")
        _log(f"drained in {time.time() - began:.1f} s" if ok else "not drained")
        return {"sent": sent, "drained": ok, "barrier": opened, "drain_s": round(time.time() - began, 1)}

    def stop_all(self) -> None:
        for p in self.procs.values():
            p.retired, p.due = True, None
            if p.popen is not None and p.popen.poll() is None:
                p.popen.send_signal(signal.SIGTERM)
        deadline = time.time() + 60
        for p in self.procs.values():
            if p.popen is not None:
                try:
                    p.popen.wait(timeout=max(1.0, deadline - time.time()))
                except subprocess.TimeoutExpired:
                    from lakestep.testing.processes import kill_tree

                    kill_tree(p.popen.pid)
                    p.popen.wait()

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.cat.close()
        if self.broker is not None:
            self.broker.stop()
        if self.proxy is not None:
            self.proxy.close()
        if self.pg is not None:
            self.pg.destroy()
        if self.mount is not None:
            subprocess.run(["umount", "-l", str(self.mount)], check=False)

    # ------------------------------------------------------------ checks
    def check(self, t0: float, drained: dict[str, Any]) -> dict[str, Any]:
        from lakestep.barrier import Pipeline

        sent = drained.get("sent", 0)
        res: dict[str, Any] = {"drain": drained}
        # 1. soak.orders: every id sent, exactly once, as sent
        rows = self.cat.load_table(ORDERS).to_arrow(columns=["order_id", "customer", "region", "amount_cents"])
        ids = rows.column("order_id").to_pylist()
        counts = collections.Counter(ids)
        not_as_sent = [[i, c, r, a] for i, c, r, a in zip(ids, rows.column("customer").to_pylist(),
                                                          rows.column("region").to_pylist(),
                                                          rows.column("amount_cents").to_pylist())
                       if order(i) != (c, r, a)]
        res["orders"] = {"sent": sent, "rows": len(ids), "lost": sum(1 for i in range(sent) if i not in counts),
                         "duplicated": sum(n - 1 for n in counts.values() if n > 1),
                         "unknown": sum(1 for i in counts if not 0 <= i < sent), "not_as_sent": len(not_as_sent),
                         "examples": not_as_sent[:5]}
        # 2. both derived tables at every barrier still readable
        p = Pipeline(self.cat)
        truth = Truth(self.cat)
        last = min(p.frontier(CUSTOMERS) or 0, p.frontier(REGIONS) or 0)
        barriers, problems = 0, []
        for b in range(max(1, last - self.args.retain + 1), last + 1):
            try:
                want = truth.at(b)
                cv, rv = p.version_at(CUSTOMERS, b), p.version_at(REGIONS, b)
            except Exception:  # noqa: BLE001 - a barrier expired by retention: not readable
                continue
            cust = {r["customer"]: (r["region"], r["revenue_cents"], r["orders"], r["last_ms"])
                    for r in self.cat.load_table(CUSTOMERS).to_arrow(version=cv).to_pylist()}
            reg = {r["region"]: (r["revenue_cents"], r["orders"], r["customers"], r["last_ms"])
                   for r in self.cat.load_table(REGIONS).to_arrow(version=rv).to_pylist()}
            barriers += 1
            for c in (compare("customers", cust, want.customers), compare("regions", reg, want.regions)):
                if bad(c):
                    problems.append({"barrier": b, **c})
        res["barriers"] = {"checked": barriers, "last": last, "wrong": len(problems), "examples": problems[:5]}
        # 3. the reader's answers
        answers = [json.loads(line) for line in (self.work / "answers.jsonl").read_text().splitlines()
                   ] if (self.work / "answers.jsonl").exists() else []
        by: dict[str, dict[str, int]] = collections.defaultdict(lambda: {"checked": 0, "wrong": 0, "errors": 0})
        for a in answers:
            d = by[a["kind"]]
            if "error" in a:
                d["errors"] += 1
            else:
                d["checked"] += 1
                d["wrong"] += not a["ok"]
        res["answers"] = dict(by)
        res["wrong_examples"] = [a for a in answers if a.get("ok") is False][:5]
        res["freshness"] = _per_minute(answers, t0)
        # 4. faults
        res["faults"] = [{"kind": f.kind, "at_s": round(f.at - t0, 1), "lasted_s": None if f.ended_at is None
                          else round(f.ended_at - f.at, 1), "back_s": f.back_s, "note": f.note} for f in self.faults]
        res["processes"] = {k: {"restarts": p.restarts, "exits": [{"at_s": round(e["at"] - t0, 1), "code": e["code"],
                                                                   "killed": e["killed"]} for e in p.exits]}
                            for k, p in self.procs.items()}
        # 5. growth
        res["growth"] = growth(self.samples, self.args.minutes, self.args.warmup)
        res["back_within"] = self.args.back_within
        res["samples"] = len(self.samples)
        res["checks"] = verdict(res)
        return res


def _fill(path: Path) -> int:
    """Fill the file system under ``path`` until it refuses: returns the bytes written."""
    chunk, n = b"\0" * (1 << 20), 0
    with open(path, "wb") as f:
        try:
            while True:
                f.write(chunk)
                n += len(chunk)
        except OSError:
            pass
        with contextlib.suppress(OSError):
            f.flush()
    return n


def _iceberg_metadata(folder: Path) -> dict[str, Any]:
    """Iceberg metadata files of a table and the tags its newest metadata JSON holds."""
    if not folder.is_dir():
        return {"iceberg_files": 0, "iceberg_tags": 0}
    files = [f for f in folder.iterdir() if f.is_file()]
    metas = sorted((f for f in files if f.name.endswith(".metadata.json")), key=lambda f: f.stat().st_mtime)
    tags = 0
    if metas:
        with contextlib.suppress(OSError, ValueError):
            refs = json.loads(metas[-1].read_text()).get("refs", {})
            tags = sum(1 for r in refs.values() if r.get("type") == "tag")
    return {"iceberg_files": len(files), "iceberg_tags": tags}


def _class_archive() -> str:
    """The class-data archive the Spark processes' JVMs map (lakestep/testing/spark.py; as `make test`
    makes it, under the virtualenv): made first when missing (about a minute, once), so that a killed
    Spark process restarts in about half the time. "" when it cannot be made."""
    from lakestep.testing.spark import class_archive_path, make_class_archive

    try:
        path = class_archive_path(Path(sys.prefix) / "spark-class-archive")
    except Exception:  # noqa: BLE001 - no java or pyspark: the processes say so themselves
        return ""
    if not path.is_file():
        _log(f"making the Spark class-data archive {path.name} (once per virtualenv)")
        make_class_archive(path)
    return str(path) if path.is_file() else ""


def _pct(values: list[int], q: float) -> int | None:
    if not values:
        return None
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))]


def _per_minute(answers: list[dict[str, Any]], t0: float) -> list[dict[str, Any]]:
    by: dict[int, list[int]] = collections.defaultdict(list)
    n: collections.Counter[int] = collections.Counter()
    for a in answers:
        if a["kind"] == "read_committed" and "freshness_ms" in a:
            m = int((a["t"] - t0) // 60)
            by[m].append(a["freshness_ms"])
            n[m] += 1
    return [{"minute": m, "answers": n[m], "p50_ms": _pct(v, 0.5), "p99_ms": _pct(v, 0.99)}
            for m, v in sorted(by.items())]


def _slope(points: list[tuple[float, float]]) -> float:
    """Least-squares slope of (t, y), per second."""
    n = len(points)
    mt = sum(t for t, _ in points) / n
    my = sum(y for _, y in points) / n
    den = sum((t - mt) ** 2 for t, _ in points)
    return 0.0 if den == 0 else sum((t - mt) * (y - my) for t, y in points) / den


def growth(samples: list[dict[str, Any]], minutes: float, warmup: float | None) -> dict[str, Any]:
    """Per figure of GROWTH_LIMITS: the slope after the warm-up, per hour, against its limit."""
    w = warmup if warmup is not None else (10.0 if minutes >= 60 else minutes / 6)
    kept = [s for s in samples if "error" not in s and s["t"] >= w * 60]
    out: dict[str, Any] = {"warmup_min": round(w, 2), "samples": len(kept), "judged": minutes >= GROWTH_MIN_MINUTES,
                           "figures": {}}
    if len(kept) < 3:
        out["judged"] = False
        return out
    for name, (absolute, relative) in GROWTH_LIMITS.items():
        pts = [(s["t"], float(s[name])) for s in kept]
        mean = statistics.fmean(y for _, y in pts)
        per_hour = _slope(pts) * 3600
        limit = max(absolute, relative * mean)
        out["figures"][name] = {"first": pts[0][1], "last": pts[-1][1], "mean": round(mean, 1),
                                "slope_per_hour": round(per_hour, 1), "limit_per_hour": round(limit, 1),
                                "flat": per_hour < limit}
    out["per_process"] = {kind: lives(kept, kind) for kind in KINDS}
    return out


def lives(samples: list[dict[str, Any]], kind: str, settle: float = 120.0) -> dict[str, Any]:
    """One process kind's RSS and descriptor slopes per hour within each of its lives (restart to
    kill; the first ``settle`` seconds of each left out: a JVM grows its heap as it starts), averaged
    weighted by each life's length. Reported, not judged: under faults a life is a few minutes."""
    segments: list[list[dict[str, Any]]] = []
    last_up = None
    for s in samples:
        p = s.get("processes", {}).get(kind)
        if p is None or "up_s" not in p:
            continue
        if last_up is None or p["up_s"] < last_up:
            segments.append([])
        last_up = p["up_s"]
        if p["up_s"] >= settle:
            segments[-1].append(p)
    out: dict[str, Any] = {"lives": len(segments)}
    for key in ("rss_bytes", "fds"):
        num = den = 0.0
        for seg in segments:
            if len(seg) >= 5:
                span = seg[-1]["up_s"] - seg[0]["up_s"]
                num += _slope([(p["up_s"], float(p[key])) for p in seg]) * 3600 * span
                den += span
        out[f"{key}_slope_per_hour"] = round(num / den, 1) if den else None
    return out


def verdict(res: dict[str, Any]) -> list[dict[str, Any]]:
    o = res["orders"]
    checks = [("every order drained through the pipeline", res["drain"].get("drained", False)),
              ("orders lost", o["lost"] == 0, o["lost"]), ("orders duplicated", o["duplicated"] == 0, o["duplicated"]),
              ("orders not as sent or never sent", o["not_as_sent"] == 0 and o["unknown"] == 0,
               o["not_as_sent"] + o["unknown"]),
              ("derived tables wrong at a barrier", res["barriers"]["wrong"] == 0 and res["barriers"]["checked"] > 0,
               f"{res['barriers']['wrong']} of {res['barriers']['checked']}")]
    for kind, d in sorted(res["answers"].items()):
        checks.append((f"{kind} answers wrong", d["wrong"] == 0 and d["checked"] > 0,
                       f"{d['wrong']} of {d['checked']} ({d['errors']} failed reads)"))
    if not res["answers"]:
        checks.append(("reader answers", False, "none"))
    kills = [f for f in res["faults"] if f["kind"].startswith("kill:")]
    within = res.get("back_within", BACK_WITHIN)
    slow = [f for f in kills if f["back_s"] is None or f["back_s"] > within]
    if kills:
        checks.append((f"killed processes back within {within:g} s", not slow,
                       f"{len(kills) - len(slow)} of {len(kills)}; max "
                       f"{max((f['back_s'] for f in kills if f['back_s'] is not None), default=None)} s"))
    g = res["growth"]
    for name, f in g["figures"].items():
        checks.append((f"growth of {name} per hour (judged: {g['judged']})", f["flat"] or not g["judged"],
                       f"{f['slope_per_hour']:g} (limit {f['limit_per_hour']:g})"))
    return [{"check": c[0], "pass": bool(c[1]), **({"value": c[2]} if len(c) > 2 else {})} for c in checks]


# ---------------------------------------------------------------- reporting
def report(res: dict[str, Any]) -> str:
    from .commit import text_table

    parts = [text_table("Checks", ["check", "value", "result"],
                        [[c["check"], c.get("value", ""), "PASS" if c["pass"] else "FAIL"] for c in res["checks"]])]
    if res["faults"]:
        parts.append(text_table("\nFaults", ["at s", "fault", "lasted s", "back s", "note"],
                                [[f["at_s"], f["kind"], f["lasted_s"], f["back_s"], f["note"]] for f in res["faults"]]))
    parts.append(text_table("\nFreshness of read_committed answers (ms, now minus the newest order in the answer)",
                            ["minute", "answers", "p50", "p99"],
                            [[m["minute"], m["answers"], m["p50_ms"], m["p99_ms"]] for m in res["freshness"]]))
    g = res["growth"]
    parts.append(text_table(f"\nGrowth after {g['warmup_min']} min ({g['samples']} samples; judged: {g['judged']})",
                            ["figure", "first", "last", "mean", "slope/h", "limit/h", "flat"],
                            [[k, f["first"], f["last"], f["mean"], f["slope_per_hour"], f["limit_per_hour"], f["flat"]]
                             for k, f in g["figures"].items()]))
    per = g.get("per_process", {})

    def mib(v: float | None) -> str:
        return "-" if v is None else f"{v / (1 << 20):.1f}"

    parts.append(text_table("\nProcesses (RSS and descriptor slopes per hour within each life, after its first 2 min)",
                            ["process", "restarts", "lives", "RSS MiB/h", "fds/h", "exits (s: code)"],
                            [[k, v["restarts"], per.get(k, {}).get("lives", "-"),
                              mib(per.get(k, {}).get("rss_bytes_slope_per_hour")),
                              per.get(k, {}).get("fds_slope_per_hour", "-"),
                              ", ".join(f"{e['at_s']}: {e['code']}" + (" kill" if e["killed"] else "")
                                        for e in v["exits"])[:60]]
                             for k, v in res["processes"].items()]))
    n = sum(c["pass"] for c in res["checks"])
    parts.append(f"\n{n}/{len(res['checks'])} checks passed")
    return "\n".join(parts)


def plots(samples: list[dict[str, Any]], res: dict[str, Any], folder: Path) -> list[str]:
    """PNG plots beside the JSON (matplotlib, the ``plots`` extra); [] without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return []
    ok = [s for s in samples if "error" not in s]
    if not ok:
        return []
    t = [s["t"] / 60 for s in ok]
    made = []

    def save(fig: Any, name: str) -> None:
        path = folder / f"{name}.png"
        fig.tight_layout()
        fig.savefig(path, dpi=90)
        plt.close(fig)
        made.append(str(path))

    kills = [f["at_s"] / 60 for f in res["faults"]]
    for name, key, scale, unit in (("memory", "rss_bytes", 1 << 20, "MiB"), ("descriptors", "fds", 1, "open fds")):
        fig, ax = plt.subplots(figsize=(9, 4))
        for kind in KINDS:
            ax.plot(t, [s["processes"][kind][key] / scale for s in ok], label=kind)
        for k in kills:
            ax.axvline(k, color="grey", lw=0.5, ls=":")
        ax.set_xlabel("minutes")
        ax.set_ylabel(unit)
        ax.set_title(f"{name} per process tree (dotted: faults)")
        ax.legend(fontsize=7, ncol=4)
        save(fig, name)
    fig, axes = plt.subplots(1, 3, figsize=(13, 4))
    axes[0].plot(t, [s["catalog_bytes"] / (1 << 20) for s in ok])
    axes[0].set_title("catalog database, MiB")
    for tbl in (ORDERS, CUSTOMERS, REGIONS):
        axes[1].plot(t, [s["tables"][tbl]["live_files"] for s in ok], label=tbl)
        axes[2].plot(t, [s["tables"][tbl].get("iceberg_files", 0) for s in ok], label=tbl)
    axes[1].set_title("live data files")
    axes[2].set_title("Iceberg metadata files")
    for ax in axes:
        ax.set_xlabel("minutes")
    axes[1].legend(fontsize=7)
    save(fig, "catalog")
    fr = res["freshness"]
    if fr:
        fig, ax = plt.subplots(figsize=(9, 4))
        ax.plot([m["minute"] for m in fr], [m["p50_ms"] for m in fr], label="p50")
        ax.plot([m["minute"] for m in fr], [m["p99_ms"] for m in fr], label="p99")
        for k in kills:
            ax.axvline(k, color="grey", lw=0.5, ls=":")
        ax.set_xlabel("minute")
        ax.set_ylabel("ms")
        ax.set_title("freshness of read_committed answers (dotted: faults)")
        ax.legend()
        save(fig, "freshness")
    return made


# --------------------------------------------------------------------- main
def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.soak", description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--minutes", type=float, default=60.0, help="how long the producer runs (default 60)")
    ap.add_argument("--backend", choices=["sqlite", "postgres"], default="sqlite",
                    help="the catalog database (postgres: a server of the run's own, reached through a fault proxy)")
    ap.add_argument("--faults", action="store_true", help="kills, catalog stalls, restarts and a full disk")
    ap.add_argument("--seal", type=float, default=1.0, help="seconds between seals (default 1)")
    ap.add_argument("--rate", type=float, default=50.0, help="orders per second (default 50; 5x in bursts)")
    ap.add_argument("--seed", type=int, default=1, help="the faults' order and durations")
    ap.add_argument("--fault-start", type=float, default=None, help="seconds before the first fault "
                    "(default: a tenth of the run, at most 120)")
    ap.add_argument("--fault-every", type=float, default=None, help="seconds between faults (default: 90, less "
                    "where that fits no fault of each kind in the run)")
    ap.add_argument("--derived-every", type=float, default=0.0,
                    help="each derived job's batch interval, s (default 0: a batch as soon as one is ready)")
    ap.add_argument("--maintenance-every", type=float, default=10.0, help="seconds between maintenance rounds")
    ap.add_argument("--retain", type=int, default=100, help="barrier snapshots the coordinator keeps")
    ap.add_argument("--retention", type=float, default=300.0,
                    help="the tables' retention window, s (lakestep.retention-seconds; default 300: cleanup prunes "
                         "within the run)")
    ap.add_argument("--warmup", type=float, default=None, help="minutes not judged for growth")
    ap.add_argument("--back-within", type=float, default=BACK_WITHIN,
                    help=f"seconds a killed process has to be back (default {BACK_WITHIN:g}; the suite, sharing the "
                         "machine with its other lane, gives it more: no wall-clock threshold in a test)")
    ap.add_argument("--drain", type=float, default=180.0, help="max seconds for the pipeline to drain at the end")
    ap.add_argument("--disk-mb", type=int, default=1024, help="size of the warehouse's tmpfs (--faults)")
    ap.add_argument("--out", default="benchmarks/results/soak.json")
    ap.add_argument("--config", help=argparse.SUPPRESS)
    ap.add_argument("--role", choices=["producer", "root", "customers", "regions", "reader"], help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.role:
        cfg = _config(args.config)
        if args.role in ("customers", "regions"):
            return role_derived(cfg, args.role)
        return {"producer": role_producer, "root": role_root, "reader": role_reader}[args.role](cfg)
    if args.fault_start is None:
        args.fault_start = min(120.0, args.minutes * 6)
    if args.fault_every is None:  # 90 s; a short run fits every kind of fault once
        held = 2 + (args.backend == "postgres")  # the stall, the full disk (, the restart): up to 20 s each
        kinds = len(FAULTABLE) + held
        window = args.minutes * 60 - args.fault_start - BACK_WITHIN - 15 - 20 * held
        args.fault_every = max(5.0, min(90.0, window / kinds))
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    folder = out.with_suffix("")
    shutil.rmtree(folder, ignore_errors=True)
    work = Path(tempfile.mkdtemp(prefix="lakestep-soak-"))
    sup = Supervisor(args, work)

    def interrupt(*_: Any) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # once: the clean-up below must not be interrupted
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, interrupt)  # a stopped run still stops its processes and unmounts
    signal.signal(signal.SIGINT, interrupt)
    try:
        res = sup.run()
    finally:
        sup.close()
    import lakestep

    res["params"] = {k: v for k, v in vars(args).items() if k not in ("config", "role")}
    res["machine"] = {"date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
                      "cpu_count": os.cpu_count(), "python": platform.python_version(),
                      "lakestep": lakestep.__version__}
    # the run's folder beside the JSON: samples, answers, logs, plots
    folder.mkdir(parents=True)
    for name in ("samples.jsonl", "answers.jsonl", "producer.json"):
        if (work / name).exists():
            shutil.copy(work / name, folder / name)
    shutil.copytree(work / "logs", folder / "logs")
    res["plots"] = plots(sup.samples, res, folder)
    res["folder"] = str(folder)
    out.write_text(json.dumps(res, indent=1, default=str))
    print(report(res))
    print(f"results: {out}; samples, answers, logs and plots: {folder}")
    shutil.rmtree(work, ignore_errors=True)
    return 0 if all(c["pass"] for c in res["checks"]) else 1


if __name__ == "__main__":
    sys.exit(main())
