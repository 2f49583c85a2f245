"""The shopping pipeline (``make demo``): Kafka -> orders -> two aggregates -> a dashboard.

1. An embedded Kafka-protocol broker (tansu) receives orders as JSON, amounts
   in integer cents.
2. Root job ``ingest`` (Spark, lakestep-kafka source -> lakestep sink) commits
   them to ``shop.orders`` on the open epoch; a coordinator seals an epoch
   every 3 seconds.
3. Two derived jobs read ``shop.orders`` barrier by barrier, at different
   speeds: ``revenue`` (fast) sums the cents per customer, ``counts`` (slow)
   counts the orders per customer. Each is a ``DerivedJob``
   (lakestep.streaming.derived): a loop on the driver whose batches are plain
   Spark jobs (Spark's own Parquet scan of the orders at the batch's barrier,
   a groupBy, Spark's own writer replacing the aggregate), each committed with
   its barrier.
4. The dashboard computes the average order per customer by joining the two
   aggregates, twice: reading each table's newest version (what a plain
   lakehouse gives you) and with ``read_committed`` (both at the same barrier).
   Each answer is compared with the truth computed from ``shop.orders``.
5. Open tables: the maintenance loop publishes every table as an Iceberg table
   (lakestep.iceberg), with a tag ``barrier-N`` per committed barrier. An
   outside reader, PyIceberg, reads both aggregates at their newest common
   tag, computes the same averages, and compares them with the truth there.
6. Then the producer stops, the pipeline drains, and the demo checks what it
   promised: every order sent is in ``shop.orders`` exactly once, at every
   sealed barrier both aggregates equal the aggregate of ``shop.orders`` at
   that barrier, and so does every tag PyIceberg reads.

Every check is exact: amounts are integer cents (``int64``) end to end, sums
and counts are integers, and an average is a :class:`fractions.Fraction`
(rounded to the cent for display only). The truth is computed here, in plain
Python, from the rows of ``shop.orders``: it shares no code with the Spark
jobs that wrote the aggregates. Anything that differs is printed with its
table, barrier and rows, and the demo exits with status 1.

Everything runs locally: a SQLite catalog in ./demo-warehouse, Spark in local
mode (its own log goes to ./demo-warehouse/spark.log). Spark gives the Python
process of a streaming source a fixed 10 s to start; on a busy machine it can
miss that and the ingest query stops: the demo then restarts that query on its
checkpoint (safe: every commit is exactly once) and says so.

``python -m examples.shopping [--seconds N]``: N seconds of dashboard reads
(default 25).
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import random
import shutil
import sys
import time
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Sequence

import pyarrow as pa

from lakestep import Catalog
from lakestep.barrier import Pipeline
from lakestep.services import Coordinator
from lakestep.testing.spark import class_archive_option, log4j2_properties

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

WAREHOUSE = Path("demo-warehouse").resolve()
CUSTOMERS = ["ann", "bob", "cy", "dee", "eve"]
ORDERS, REVENUE, COUNTS = "shop.orders", "shop.revenue", "shop.counts"
ORDERS_SCHEMA = pa.schema([("order_id", pa.int64()), ("customer", pa.string()), ("amount_cents", pa.int64())])
COORDINATOR_INTERVAL = 3.0  # seconds between seals
DRAIN_TIMEOUT = 120.0  # seconds for the pipeline to catch up once the producer stops
WORKER_TIMEOUT = "Python worker failed to connect back"  # Spark's error when a worker misses its start-up time
MAX_RESTARTS = 5  # per query, after WORKER_TIMEOUT only


def say(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


# --------------------------------------------------------------------- the truth
# Computed from the rows of shop.orders in plain Python integers: independent of
# the Spark jobs that write the aggregates.

Totals = dict[str, tuple[int, int]]  # customer -> (sum of amount_cents, number of orders)


def totals_of(orders: pa.Table) -> Totals:
    """Per customer: the sum of the cents and the number of orders."""
    out: Totals = {}
    for c, a in zip(orders.column("customer").to_pylist(), orders.column("amount_cents").to_pylist()):
        s, n = out.get(c, (0, 0))
        out[c] = (s + a, n + 1)
    return out


# Each derived table: its value column, and that value computed from a customer's totals.
AGGREGATES: dict[str, tuple[str, Callable[[int, int], int]]] = {
    REVENUE: ("revenue_cents", lambda cents, n: cents),
    COUNTS: ("orders", lambda cents, n: n),
}


class Truth:
    """The totals of shop.orders at a barrier, read at ``version_at("shop.orders", e)`` (cached per version)."""

    def __init__(self, cat: Catalog, p: Pipeline) -> None:
        self.cat, self.p = cat, p
        self._by_version: dict[int, Totals] = {}

    def version(self, barrier: int) -> int:
        return self.p.version_at(ORDERS, barrier)

    def at(self, barrier: int) -> Totals:
        v = self.version(barrier)
        if v not in self._by_version:
            rows = self.cat.load_table(ORDERS).to_arrow(version=v, columns=["customer", "amount_cents"])
            self._by_version[v] = totals_of(rows)
        return self._by_version[v]

    def averages(self, barrier: int) -> dict[str, Fraction]:
        return {c: Fraction(s, n) for c, (s, n) in self.at(barrier).items()}


# ------------------------------------------------------------ the dashboard read
# What the dashboard asks, in SQL; read_dashboard answers it.
DASHBOARD_TABLES = (REVENUE, COUNTS)
DASHBOARD_SQL = ("SELECT r.customer, r.revenue_cents, c.orders "
                 "FROM shop.revenue AS r JOIN shop.counts AS c ON r.customer = c.customer")


@dataclass(frozen=True)
class DashboardRead:
    """The answer to DASHBOARD_SQL at one consistency level, and what was read."""

    level: str
    barrier: int | None  # the common barrier (None for read_uncommitted)
    read_at: dict[str, int | None]  # the barrier each table's rows are at
    versions: dict[str, int]
    rows: list[tuple[str, int, int]]  # (customer, revenue_cents, orders)
    explanation: str


def read_dashboard(p: Pipeline, level: str) -> DashboardRead:
    """Run the dashboard's query (DASHBOARD_SQL) over shop.revenue and shop.counts at ``level``,
    in SQL, the way a user would: lakestep's DuckDB helper reads every table the SQL names at
    one consistent barrier (``read_committed``), or each at its newest version
    (``read_uncommitted``), and says what it read."""
    from lakestep.query import duckdb_query

    result = duckdb_query(p.catalog, DASHBOARD_SQL, level=level)
    read = result.read
    sealed = (read.open_epoch or 1) - 1
    read_at = {t: read.barrier if read.barrier is not None else
               (None if read.behind.get(t) is None else sealed - read.behind[t]) for t in DASHBOARD_TABLES}
    rows = [(r["customer"], r["revenue_cents"], r["orders"]) for r in result.table.to_pylist()]
    return DashboardRead(level, read.barrier, read_at, dict(read.versions), rows, read.explanation)


def averages(rows: Sequence[tuple[str, int, int]]) -> dict[str, Fraction]:
    """The exact average order per customer, in cents."""
    return {c: Fraction(cents, n) for c, cents, n in rows if n}


def dollars(cents: Fraction | None) -> str:
    """For display only: exact cents rounded half-to-even to the cent, as dollars."""
    if cents is None:
        return "    -  "
    q = round(cents)  # exact on a Fraction
    return f"{'-' if q < 0 else ''}{abs(q) // 100:4d}.{abs(q) % 100:02d}"


# ----------------------------------------------------------- the outside reader
def read_iceberg(cat: Catalog) -> tuple[int, list[tuple[str, int, int]]] | None:
    """What an engine outside lakestep sees: both aggregates through PyIceberg (its SqlCatalog on
    the catalog's database), at their newest common tag ``barrier-N``; None before the first."""
    from lakestep.iceberg import sql_catalog

    ice = sql_catalog(cat)
    tables = {t: ice.load_table(t) for t in DASHBOARD_TABLES}
    tags = [{int(n.split("-", 1)[1]) for n in t.metadata.refs if n.startswith("barrier-")} for t in tables.values()]
    common = set.intersection(*tags)
    if not common:
        return None
    b = max(common)
    rows = {name: t.scan(snapshot_id=t.snapshot_by_name(f"barrier-{b}").snapshot_id).to_arrow().to_pylist()
            for name, t in tables.items()}
    orders = {r["customer"]: r["orders"] for r in rows[COUNTS]}
    return b, [(r["customer"], r["revenue_cents"], orders[r["customer"]]) for r in rows[REVENUE]
               if r["customer"] in orders]


def check_iceberg_tags(cat: Catalog) -> tuple[int, list[str]]:
    """Every tag of both aggregates, read through PyIceberg, against the truth at its barrier."""
    from lakestep.iceberg import sql_catalog

    p = Pipeline(cat)
    truth = Truth(cat, p)
    ice = sql_catalog(cat)
    problems, n = [], 0
    for table in AGGREGATES:
        col, value = AGGREGATES[table]
        t = ice.load_table(table)
        for name, ref in sorted(t.metadata.refs.items()):
            if not name.startswith("barrier-"):
                continue
            b = int(name.split("-", 1)[1])
            got = {r["customer"]: r[col] for r in t.scan(snapshot_id=ref.snapshot_id).to_arrow().to_pylist()}
            want = {c: value(cents, k) for c, (cents, k) in truth.at(b).items()}
            n += 1
            if got != want:
                problems.append(f"{table} read through Iceberg at tag {name} differs from the aggregate of "
                                f"{ORDERS} there: {sorted(got.items())[:5]} against {sorted(want.items())[:5]}")
    return n, problems


# ------------------------------------------------------------------ the checks
@dataclass(frozen=True)
class Mismatch:
    """A derived table whose rows at a barrier differ from the aggregate of shop.orders there."""

    table: str
    barrier: int
    version: int
    orders_version: int
    rows: list[tuple[str, list[int], list[int]]]  # (customer, the table's values, the expected values)

    def report(self, limit: int = 20) -> str:
        col = AGGREGATES[self.table][0]
        out = [(f"INCONSISTENT: {self.table} at barrier {self.barrier} (version {self.version}) differs from "
                f"the aggregate of {ORDERS} at barrier {self.barrier} (version {self.orders_version}):"),
               f"    {'customer':<10} {self.table + '.' + col:<24} expected from {ORDERS}"]

        def show(values: list[int]) -> str:
            return ", ".join(map(str, values)) if values else "(no row)"

        for c, got, want in self.rows[:limit]:
            out.append(f"    {c:<10} {show(got):<24} {show(want)}")
        if len(self.rows) > limit:
            out.append(f"    ... and {len(self.rows) - limit} more customer(s)")
        return "\n".join(out)


def check_barrier(cat: Catalog, p: Pipeline, truth: Truth, table: str, barrier: int) -> Mismatch | None:
    """``table`` at ``version_at(table, barrier)`` against the aggregate of shop.orders at the same barrier."""
    col, value = AGGREGATES[table]
    version = p.version_at(table, barrier)
    got: dict[str, list[int]] = collections.defaultdict(list)
    for r in cat.load_table(table).to_arrow(version=version, columns=["customer", col]).to_pylist():
        got[r["customer"]].append(r[col])
    want = {c: [value(cents, n)] for c, (cents, n) in truth.at(barrier).items()}
    diff = [(c, sorted(got.get(c, [])), want.get(c, [])) for c in sorted(got.keys() | want.keys(), key=str)
            if sorted(got.get(c, [])) != want.get(c, [])]
    return Mismatch(table, barrier, version, truth.version(barrier), diff) if diff else None


def check_every_barrier(cat: Catalog, last: int, tables: Sequence[str] = tuple(AGGREGATES)) -> list[Mismatch]:
    """Every barrier 1..``last``: each derived table equals the aggregate of shop.orders, exactly."""
    p = Pipeline(cat)
    truth = Truth(cat, p)
    out = []
    for e in range(1, last + 1):
        for t in tables:
            m = check_barrier(cat, p, truth, t, e)
            if m is not None:
                out.append(m)
    return out


def check_orders(cat: Catalog, sent: dict[int, tuple[str, int]]) -> list[str]:
    """shop.orders holds every order sent to Kafka exactly once, as sent. Returns the problems."""
    rows = cat.load_table(ORDERS).to_arrow().to_pylist()
    got = collections.Counter((r["order_id"], r["customer"], r["amount_cents"]) for r in rows)
    want = collections.Counter((i, c, a) for i, (c, a) in sent.items())
    problems = []
    for what, diff in (("missing from", want - got), ("in", got - want)):
        if diff:
            keys = sorted(diff)
            label = "extra or duplicated rows" if what == "in" else "orders sent but"
            problems.append(f"{len(keys)} {label} {what} {ORDERS}: {keys[:10]}" + (" ..." if len(keys) > 10 else ""))
    return problems


# ------------------------------------------------------------------------ Spark
def spark_session(log: Path) -> "SparkSession":
    """A local Spark session whose JVM writes its output (log4j, JVM warnings) to ``log``, not the console."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")  # no "hostname resolves to a loopback address"
    root = str(Path(__file__).resolve().parents[1])  # Spark's Python workers import lakestep from here
    os.environ["PYTHONPATH"] = os.pathsep.join([root, *[p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep)
                                                         if p and p != root]])
    from pyspark import SparkConf, SparkContext
    from pyspark.java_gateway import launch_gateway
    from pyspark.sql import SparkSession

    log4j = log.with_name("log4j2.properties")
    log4j.write_text(log4j2_properties("warn"))
    conf = SparkConf().setMaster("local[2]").setAppName("lakestep-shopping").setAll([
        ("spark.ui.enabled", "false"),
        ("spark.ui.showConsoleProgress", "false"),
        ("spark.sql.shuffle.partitions", "2"),
        ("spark.sql.session.timeZone", "UTC"),
        ("spark.driver.host", "127.0.0.1"),
        ("spark.driver.bindAddress", "127.0.0.1"),
        ("spark.sql.adaptive.enabled", "false"),  # unsupported by streaming; it warns
        ("spark.sql.warehouse.dir", str(log.parent / "spark-warehouse")),
        # the test run's class-data archive when it has one (lakestep.testing.spark): "" otherwise
        ("spark.driver.extraJavaOptions", f"-Dlog4j2.configurationFile=file:{log4j} {class_archive_option()}".strip()),
    ])
    # The JVM prints before any log configuration applies (JVM warnings, the log4j
    # banner): its stdout and stderr go to the log file from the start.
    with log.open("ab") as out:
        try:
            gateway = launch_gateway(conf, popen_kwargs={"stdout": out, "stderr": out})
        except Exception:
            print(f"Spark did not start; the end of {log}:\n{tail(log)}", file=sys.stderr)
            raise
    SparkContext(conf=conf, gateway=gateway)
    spark = SparkSession.builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def wait_for(cond: Callable[[], bool], timeout: float, poll: float = 0.3) -> bool:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            return False
        time.sleep(poll)
    return True


# ------------------------------------------------------------------------- main
def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m examples.shopping", description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=25.0, help="seconds of dashboard reads (default 25)")
    args = ap.parse_args(argv)

    from lakestep.streaming import DerivedJob, register, register_job
    from lakestep.testing import TansuBroker

    shutil.rmtree(WAREHOUSE, ignore_errors=True)
    cat = Catalog(warehouse=str(WAREHOUSE))
    cat.create_namespace("shop")
    cat.create_table(ORDERS, ORDERS_SCHEMA)
    cat.create_table(REVENUE, pa.schema([("customer", pa.string()), ("revenue_cents", pa.int64())]))
    cat.create_table(COUNTS, pa.schema([("customer", pa.string()), ("orders", pa.int64())]))
    url = cat.url
    p = Pipeline(cat)
    register_job(url, "revenue", sources=[ORDERS], sinks=[REVENUE])
    register_job(url, "counts", sources=[ORDERS], sinks=[COUNTS])

    sent: dict[int, tuple[str, int]] = {}  # order_id -> (customer, amount_cents), as sent to Kafka
    reads = naive_wrong = strong_wrong = ice_reads = ice_wrong = 0
    ice_shown: int | None = None
    last_read: DashboardRead | None = None
    problems: list[str] = []
    restarts: list[str] = []  # queries restarted after a Python worker start-up timeout
    with TansuBroker() as broker:
        broker.create_topic("orders", partitions=2)
        say(f"broker on {broker.bootstrap_servers}; starting Spark (local mode)...")
        t0 = time.monotonic()
        log = WAREHOUSE / "spark.log"
        spark = spark_session(log)
        say(f"Spark ready in {time.monotonic() - t0:.1f} s (its own log: {os.path.relpath(log)})")
        register(spark)
        from pyspark.sql import functions as F

        ck = WAREHOUSE / "_checkpoints"

        def ingest() -> Any:
            raw = (spark.readStream.format("lakestep-kafka")
                   .option("kafka.bootstrap.servers", broker.bootstrap_servers)
                   .option("subscribe", "orders").option("startingOffsets", "earliest").load())
            orders = raw.select(F.from_json(F.col("value").cast("string"),
                                            "order_id long, customer string, amount_cents long").alias("o"))
            return (orders.select("o.*").writeStream.queryName("ingest").format("lakestep")
                    .option("catalog", url).option("table", ORDERS).option("job", "ingest")
                    .option("checkpointLocation", str(ck / "ingest")).trigger(processingTime="500 milliseconds")
                    .start())

        def aggregate(agg: Any) -> Callable[[Any], Any]:
            """A derived job's transform: all orders at the batch's barrier, per customer."""
            return lambda batch: batch.table(ORDERS).groupBy("customer").agg(agg)

        # The derived jobs: each batch one Spark job, committed with its barrier; "every" spaces them
        # like a processing-time trigger (revenue keeps close to the orders, counts lags behind).
        jobs = {
            "revenue": DerivedJob(spark, url, "revenue", sources=[ORDERS], sinks={REVENUE: "overwrite"},
                                  transform=aggregate(F.sum("amount_cents").cast("long").alias("revenue_cents"))
                                  ).start(every=0.3),
            "counts": DerivedJob(spark, url, "counts", sources=[ORDERS], sinks={COUNTS: "overwrite"},
                                 transform=aggregate(F.count("*").cast("long").alias("orders"))).start(every=2.0),
        }
        starters: dict[str, Callable[[], Any]] = {"ingest": ingest}
        queries = {job: start() for job, start in starters.items()}

        def check_queries() -> None:
            """Raise if a derived job or the ingest query failed. Spark gives the Python process of a
            streaming source 10 s to start (not configurable); on a busy machine it can miss that,
            and the query stops. Such a query is restarted on its checkpoint (a restart is safe:
            exactly once), at most MAX_RESTARTS times, and the restart is reported."""
            for job, running in jobs.items():
                if running.error is not None:
                    raise RuntimeError(f"derived job {job} failed: {running.error!r}")
            for job, q in list(queries.items()):
                if q.isActive:
                    continue
                error = str(q.exception())
                if WORKER_TIMEOUT in error and restarts.count(job) < MAX_RESTARTS:
                    restarts.append(job)
                    say(f"query {job} stopped: {WORKER_TIMEOUT} (Spark allows 10 s; the machine is busy). "
                        "Restarting it on its checkpoint")
                    queries[job] = starters[job]()
                    continue
                raise RuntimeError(f"streaming query {job} failed: {error}")

        # Every barrier of the run stays readable (retain_count=None): the check reads them all at the end.
        coord = Coordinator(p.catalog, interval=COORDINATOR_INTERVAL, retain_count=None)
        coord.start()
        from lakestep.iceberg import enable
        from lakestep.services import MaintenanceLoop

        enable(cat)  # the maintenance loop publishes every table to Iceberg (lakestep.iceberg)
        upkeep = MaintenanceLoop(cat, interval=1.0)
        upkeep.start()
        say(f"pipeline running: ingest -> {ORDERS} -> {REVENUE} (fast), {COUNTS} (slow); "
            f"a barrier is sealed every {COORDINATOR_INTERVAL:g} s")
        rng = random.Random(1)
        truth = Truth(cat, p)
        deadline = time.time() + 300.0  # Spark's start-up first; then ``seconds`` of dashboard reads
        shown: tuple[Any, ...] | None = None
        try:
            while time.time() < deadline:
                check_queries()
                batch = [(len(sent) + i, rng.choice(CUSTOMERS), rng.randint(100, 10_000)) for i in range(20)]
                broker.produce("orders", [json.dumps({"order_id": i, "customer": c, "amount_cents": a})
                                          for i, c, a in batch])
                sent.update((i, (c, a)) for i, c, a in batch)
                time.sleep(0.5)
                naive = read_dashboard(p, "read_uncommitted")
                strong = read_dashboard(p, "read_committed")
                if not naive.rows or not strong.rows or strong.barrier is None:
                    continue  # no orders have reached both aggregates yet
                if reads == 0:
                    say("both aggregates have data: the dashboard starts reading")
                    deadline = time.time() + args.seconds
                reads += 1
                last_read = strong

                # read_committed: exactly the truth at its barrier
                want = truth.averages(strong.barrier)
                got = averages(strong.rows)
                strong_ok = got == want
                # newest versions: the truth at some barrier? Each table's rows are at its
                # read_at barrier; the answer is right if it is the truth at one between them.
                at = [b for b in naive.read_at.values() if b is not None]
                naive_avg = averages(naive.rows)
                naive_ok = bool(at) and any(naive_avg == truth.averages(e) for e in range(min(at), max(at) + 1))
                naive_wrong += not naive_ok
                strong_wrong += not strong_ok

                differs = [c for c in CUSTOMERS if c in want and naive_avg.get(c) != want.get(c)]
                who = next(iter(differs), next((c for c in CUSTOMERS if c in want), CUSTOMERS[0]))
                key = (strong.barrier, tuple(naive.read_at.values()), strong_ok, naive_ok)
                if key != shown or not strong_ok:
                    shown = key
                    r, n = naive.read_at[REVENUE], naive.read_at[COUNTS]
                    where = f"both at {r}" if r == n else f"revenue at {r}, counts at {n}"
                    strong_says = "ok" if strong_ok else f"WRONG (truth {dollars(want.get(who)).strip()})"
                    say(f"barrier {strong.barrier:>3} | avg order of {who:<3}: read_committed "
                        f"{dollars(got.get(who))} {strong_says} | newest versions {dollars(naive_avg.get(who))} "
                        f"{'ok' if naive_ok else 'WRONG'} ({where})")
                outside = read_iceberg(cat)  # an engine outside lakestep, at the newest common tag
                if outside is not None:
                    ice_reads += 1
                    ice_ok = averages(outside[1]) == truth.averages(outside[0])
                    ice_wrong += not ice_ok
                    if outside[0] != ice_shown or not ice_ok:
                        ice_shown = outside[0]
                        say(f"Iceberg tag barrier-{outside[0]} read by PyIceberg: the averages "
                            f"{'equal' if ice_ok else 'DIFFER FROM'} the truth at barrier {outside[0]}")
                if not strong_ok:
                    print(f"  read_committed at barrier {strong.barrier} differs from the truth of {ORDERS} "
                          f"(version {truth.version(strong.barrier)}), exact averages in cents:")
                    for c in sorted(got.keys() | want.keys()):
                        if got.get(c) != want.get(c):
                            print(f"    {c:<6} read {got.get(c)}  truth {want.get(c)}")
                    print("  what was read:\n    " + strong.explanation.replace("\n", "\n    "))

            # Drain: the producer has stopped; everything sent reaches shop.orders, a
            # barrier seals it, and both aggregates precommit every sealed barrier.
            say(f"producer stopped after {len(sent)} orders; waiting for the pipeline to drain")

            def ingested() -> int:
                check_queries()
                return cat.load_table(ORDERS).to_arrow(columns=["order_id"]).num_rows

            def precommitted() -> int:
                check_queries()
                return min(p.frontier(t) or 0 for t in AGGREGATES)

            if not wait_for(lambda: ingested() >= len(sent), DRAIN_TIMEOUT):
                problems.append(f"only {ingested()} of the {len(sent)} orders sent reached {ORDERS} "
                                f"in {DRAIN_TIMEOUT:g} s")
            opened = p.open_epoch()  # it holds the last orders: wait for its seal
            if not wait_for(lambda: p.open_epoch() > opened, 3 * COORDINATOR_INTERVAL + 30):
                problems.append(f"the coordinator did not seal epoch {opened} (the last orders') in time")
            coord.stop()
            sealed = p.open_epoch() - 1
            if not wait_for(lambda: precommitted() >= sealed, DRAIN_TIMEOUT):
                problems.append(f"the aggregates did not precommit every sealed barrier in {DRAIN_TIMEOUT:g} s: "
                                + ", ".join(f"{t} up to {p.frontier(t)}" for t in AGGREGATES)
                                + f" of {sealed}")
            else:
                say(f"drained: {ingested()} orders in {ORDERS}; barrier {sealed}, the last sealed, "
                    "is precommitted by both aggregates")
            upkeep.stop()
            from lakestep.iceberg import Publisher

            publisher = Publisher(cat)
            publisher.publish_once()  # the last barriers' tags, main moved to them
            publisher.close()
        finally:
            coord.stop()
            upkeep.stop()
            spark.sparkContext.setLogLevel("OFF")  # stopping a query cancels its running tasks: not errors
            for running in jobs.values():
                running.stop()
            for q in queries.values():
                q.stop()
            spark.stop()

    print()
    print(f"{reads} dashboard reads: newest versions matched no barrier {naive_wrong} time(s); "
          f"read_committed differed from the truth at its barrier {strong_wrong} time(s)")
    print(f"{ice_reads} reads through Iceberg (PyIceberg, newest common tag): {ice_wrong} differed from the truth "
          "at their tag")
    if restarts:
        print(f"restarted after a Python worker start-up timeout: {', '.join(restarts)}")
    if last_read is not None:
        print(f"why the last consistent read used barrier {last_read.barrier}:")
        print(last_read.explanation)
    print()

    # 1. Kafka -> shop.orders: exactly once.
    problems += check_orders(cat, sent)
    if not problems:
        print(f"{ORDERS} holds the {len(sent)} orders sent to Kafka, each exactly once, as sent")
    # 2. Every sealed barrier, in every derived table.
    sealed = p.open_epoch() - 1
    last = min(p.frontier(t) or 0 for t in AGGREGATES)
    print(f"checking every barrier 1..{last} ({sealed} sealed): {', '.join(AGGREGATES)} against the aggregates "
          f"of {ORDERS}, exactly")
    mismatches = check_every_barrier(cat, last)
    for m in mismatches[:10]:
        print(m.report())
    if len(mismatches) > 10:
        print(f"... and {len(mismatches) - 10} more inconsistent (table, barrier) pairs")
    if mismatches:
        print(f"checked {last} barriers: {len({m.barrier for m in mismatches})} inconsistent")
    elif last:
        print(f"checked {last} barriers: all consistent")
    # 3. Every Iceberg tag of both aggregates, as an outside engine reads it.
    tagged, ice_problems = check_iceberg_tags(cat)
    for msg in ice_problems[:10]:
        print(msg)
    print(f"checked {tagged} Iceberg tags of {', '.join(AGGREGATES)} through PyIceberg: "
          + (f"{len(ice_problems)} inconsistent" if ice_problems else "all consistent"))
    cat.close()

    if not reads:
        problems.append("the pipeline produced no aggregates in time: the dashboard never read")
    if not last:
        problems.append("no barrier was precommitted by both aggregates: nothing to check")
    if strong_wrong:
        problems.append(f"read_committed returned an answer that is not the truth at its barrier "
                        f"{strong_wrong} time(s)")
    if mismatches:
        problems.append(f"{len(mismatches)} (table, barrier) pair(s) differ from the aggregate of {ORDERS}")
    if ice_wrong or ice_problems:
        problems.append(f"an Iceberg reader saw aggregates that are not the truth at their tag "
                        f"({ice_wrong} read(s), {len(ice_problems)} tag(s))")
    if not tagged:
        problems.append("no barrier was published to Iceberg: nothing to check")
    for msg in problems:
        print(f"FAILED: {msg}")
    if problems:
        print("lakestep returned inconsistent data or the pipeline failed: see above (this is a bug)")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
