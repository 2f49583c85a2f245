"""The catalog database goes away for 10 seconds while a pipeline runs (lakestep/retry.py).

A root writer (keyed commits into the open epoch), a derived job (one
barrier batch at a time: ``s.b = f(s.a)``), a coordinator, a maintenance loop
and a reader of consistent (``read_committed``) answers run in threads, each
with a catalog of its own, as separate processes would. Then the database
goes away for ``OUTAGE_SECONDS``:

* PostgreSQL: the suite's own server (lakestep/testing/pgcluster.py) is stopped with
  ``pg_ctl stop -m fast`` (connections cut, new ones refused) and started
  again;
* SQLite: another process holds the catalog file's exclusive lock
  (``BEGIN EXCLUSIVE``). In WAL mode that is the write lock: readers go on
  reading, every writer waits for it (busy timeout: ``DatabaseTimeouts.statement``).

What must hold: each waiting part logs exactly one line when its wait starts
and one when it ends; a query made during the outage fails fast with
:class:`CatalogUnavailableError` (on SQLite: a write; reads are answered);
afterwards every part goes on: every record of the writer is in ``s.a``
exactly once, every micro-batch key once, epochs are sealed without a gap,
and no consistent read (before, during or after) saw ``s.b != f(s.a)``.
"""

from __future__ import annotations

import collections
import functools
import logging
import subprocess
import sys
import threading
import time
from typing import Any, Callable, Iterator

import pyarrow as pa
import pytest

from lakestep import Catalog
from lakestep.barrier import OPEN_EPOCH, Pipeline
from lakestep.catalog.backend import DatabaseTimeouts
from lakestep.errors import CatalogUnavailableError
from lakestep.retry import RetryPolicy, retrying
from lakestep.services import Coordinator, MaintenanceLoop
from tests.conftest import CatalogSpec
from tests.waiting import in_thread, wait_until

pytestmark = pytest.mark.slow

OUTAGE_SECONDS = 10.0  # how long the database stays away: the fault itself, never a threshold
KV = pa.schema([("k", pa.int64()), ("v", pa.int64())])
# SQLite: a writer gives up on the foreign lock after 2 s (its busy timeout) and the part's wait retries;
# PostgreSQL: a stopped server refuses at once, and statements keep their time on a loaded machine
TIMEOUTS = {"sqlite": DatabaseTimeouts(statement=2), "postgres": DatabaseTimeouts(connect=2, statement=30, grace=5)}
PATIENT = RetryPolicy(initial=0.05, max_delay=1.0, deadline=600.0)
WRITER, DERIVED, MAINTENANCE, COORDINATOR = "writer", "derived job", "maintenance", "coordinator c1"


def derive(a: pa.Table) -> pa.Table:
    """The derived job's function: s.b = f(s.a)."""
    return pa.table({"k": a.column("k"), "v": pa.compute.multiply(a.column("v"), 10)}, schema=KV)


def pairs(t: pa.Table) -> list[tuple[int, int]]:
    return sorted(zip(t.column("k").to_pylist(), t.column("v").to_pylist()))


class WaitLines(logging.Handler):
    """The wait lines lakestep logs (lakestep/retry.py), per waiting part."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.started: collections.Counter[str] = collections.Counter()
        self.ended: collections.Counter[str] = collections.Counter()
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        msg = record.getMessage()
        for what in (WRITER, DERIVED, MAINTENANCE, COORDINATOR):
            if msg.startswith(f"{what}: the catalog database is unavailable"):
                self.started[what] += 1
                self.lines.append(msg)
            elif msg.startswith(f"{what}: the catalog database is back"):
                self.ended[what] += 1
                self.lines.append(msg)


@pytest.fixture
def wait_lines() -> Iterator[WaitLines]:
    handler = WaitLines()
    logger = logging.getLogger("lakestep")
    old = logger.level
    logger.setLevel(logging.INFO)
    logger.addHandler(handler)
    yield handler
    logger.removeHandler(handler)
    logger.setLevel(old)


# ------------------------------------------------------------------ faults
class PgStopped:
    """The suite's own PostgreSQL server, stopped and started again."""

    def __init__(self, cluster: Any) -> None:
        self.cluster = cluster

    def begin(self) -> None:
        self.cluster.stop("fast")

    def end(self) -> None:
        self.cluster.start()


_HOLDER = """
import sqlite3, sys
c = sqlite3.connect(sys.argv[1], isolation_level=None, timeout=120)
c.execute("BEGIN EXCLUSIVE")
print("LOCKED", flush=True)
sys.stdin.read()  # until the test closes stdin
c.execute("ROLLBACK")
c.close()
"""


class SQLiteLocked:
    """Another process holds the SQLite catalog file's exclusive lock."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.proc: subprocess.Popen[str] | None = None

    def begin(self) -> None:
        self.proc = subprocess.Popen([sys.executable, "-c", _HOLDER, self.path], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout is not None
        assert self.proc.stdout.readline().strip() == "LOCKED"

    def end(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            assert self.proc.stdin is not None
            self.proc.stdin.close()
            self.proc.wait(60)
        self.proc = None


# ------------------------------------------------------------------ the parts
class Parts:
    """The pipeline's parts in threads, each on its own catalog."""

    def __init__(self, spec: CatalogSpec) -> None:
        self.spec = spec
        self.stop = threading.Event()
        self.errors: list[BaseException] = []
        self.written: list[int] = []
        self.batches = 0
        self.reads = 0
        self.failed_reads = 0
        self.inconsistent: list[str] = []
        self.catalogs: list[Catalog] = []
        self.threads: list[threading.Thread] = []
        self.coord: Coordinator | None = None
        self.maint: MaintenanceLoop | None = None

    def open(self) -> Catalog:
        cat = self.spec.open(timeouts=TIMEOUTS[self.spec.backend])
        self.catalogs.append(cat)
        return cat

    def _thread(self, name: str, fn: Callable[[], None]) -> None:
        def run() -> None:
            try:
                fn()
            except BaseException as e:  # noqa: BLE001 - reported by the test
                self.errors.append(e)
                self.stop.set()

        t = threading.Thread(target=run, name=name, daemon=True)
        t.start()
        self.threads.append(t)

    def start(self) -> None:
        self._thread("writer", self._writer)
        self._thread("derived", self._derived)
        self._thread("reader", self._reader)
        self.coord = Coordinator(self.open(), interval=0.3, lease_seconds=5.0, holder="c1",
                                 retry=RetryPolicy(initial=0.05, max_delay=1.0, deadline=None))
        self.coord.start()
        self.maint = MaintenanceLoop(self.open(), ["s.a", "s.b"], interval=0.3, min_files=2,
                                     retry=RetryPolicy(initial=0.05, max_delay=1.0, deadline=None))
        self.maint.start()

    def _writer(self) -> None:
        cat = self.open()
        i = 0
        while not self.stop.is_set():
            i += 1

            def once(i: int = i) -> None:
                with cat.transaction(job_id="feed", batch_id=i) as tx:
                    tx.append("s.a", {"k": [i], "v": [i]}, barrier=OPEN_EPOCH)

            retrying(once, policy=PATIENT, what=WRITER)
            self.written.append(i)
            self.stop.wait(0.02)

    def _derived(self) -> None:
        cat = self.open()
        p = Pipeline(cat)

        def step() -> bool:
            plan = p.next_batch("derive")
            if plan is None:
                return False
            a = cat.load_table("s.a").to_arrow(version=plan.sources["s.a"].to_version)
            with p.batch(plan) as b:
                b.overwrite("s.b", derive(a))
            return True

        while not self.stop.is_set():
            # a batch redone after a lost answer is recognised by (job, barrier) at commit
            if retrying(step, policy=PATIENT, what=DERIVED, redo_unknown=True):
                self.batches += 1
            else:
                self.stop.wait(0.05)

    def _reader(self) -> None:
        cat = self.open()
        p = Pipeline(cat)
        while not self.stop.is_set():
            try:
                ch = p.choose(["s.a", "s.b"])  # read_committed
                if ch.barrier is not None:
                    a, b = ch.read("s.a"), ch.read("s.b")
                    self.reads += 1
                    if pairs(b) != pairs(derive(a)):
                        self.inconsistent.append(f"barrier {ch.barrier}: {ch.versions}")
            except CatalogUnavailableError:  # a query during the outage fails; the next one may not
                self.failed_reads += 1
            self.stop.wait(0.05)

    def failed(self) -> str | None:
        """For ``wait_until``: a part that failed ends the wait at once."""
        return f"a part failed: {self.errors[0]!r}" if self.errors else None

    def close(self) -> None:
        self.stop.set()
        if self.maint is not None:
            self.maint.stop(60)
        if self.coord is not None:
            self.coord.stop(60)
        for t in self.threads:
            t.join(120)
        for cat in self.catalogs:
            cat.close()


def _setup(spec: CatalogSpec) -> None:
    with spec.open() as cat:
        cat.create_namespace("s")
        cat.create_table("s.a", KV)
        cat.create_table("s.b", KV)
        p = Pipeline(cat)
        p.register_job("feed", sinks=["s.a"], external_input=True)
        p.register_job("derive", sources=["s.a"], sinks=["s.b"])


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_the_catalog_database_goes_away_for_10_seconds(backend, request, tmp_path, wait_lines) -> None:  # type: ignore[no-untyped-def]
    if backend == "postgres":
        spec = request.getfixturevalue("own_pg")
        fault: Any = PgStopped(request.getfixturevalue("pg_cluster"))
        # every part reads and writes the database: every one waits
        waiting = (WRITER, DERIVED, MAINTENANCE, COORDINATOR)
    else:
        wh = tmp_path / "warehouse"
        spec = CatalogSpec("sqlite", f"sqlite:///{wh}/catalog.db", str(wh))
        fault = SQLiteLocked(str(wh / "catalog.db"))
        # readers are not blocked (WAL): the derived job plans nothing new (no seal) and does not wait
        waiting = (WRITER, MAINTENANCE, COORDINATOR)
    _setup(spec)
    parts = Parts(spec)
    p = Pipeline(parts.open())
    q = spec.open(timeouts=TIMEOUTS[backend], commit_retries=0)
    parts.catalogs.append(q)
    # a part that failed ends a wait at once; the test's own catalog may not reach the database either
    wait = functools.partial(wait_until, timeout=300.0, failed=parts.failed, ignoring=(CatalogUnavailableError,))
    try:
        parts.start()
        wait(lambda: len(parts.written) >= 10 and parts.batches >= 2 and parts.reads >= 3
             and parts.maint is not None and parts.maint.rounds >= 1, "running pipeline")
        written_before = len(parts.written)
        fault.begin()
        began = time.monotonic()
        try:
            wait(lambda: all(wait_lines.started[w] >= 1 for w in waiting), "wait of every part")
            # a query now fails fast (on SQLite a write: reads are answered in WAL mode)
            # (the query's catalog: commit_retries=0, so a SQLite write waits one busy timeout, not six)
            query: Callable[[], Any] = (lambda: p.choose(["s.a", "s.b"])) if backend == "postgres" else (
                lambda: q.load_table("s.a").append({"k": [-1], "v": [-1]}))
            with pytest.raises(CatalogUnavailableError):
                in_thread(query)
            time.sleep(max(0.0, OUTAGE_SECONDS - (time.monotonic() - began)))
        finally:
            fault.end()
        outage = time.monotonic() - began
        wait(lambda: all(wait_lines.ended[w] >= 1 for w in waiting), "end of every wait")
        wait(lambda: len(parts.written) >= written_before + 10, "writes after the outage")
        sealed = p.open_epoch() - 1
        wait(lambda: (p.frontier("s.b") or 0) >= sealed, f"s.b at barrier {sealed}")
        reads_after = parts.reads
        wait(lambda: parts.reads >= reads_after + 3, "reads after the outage")
    finally:
        parts.close()
    assert not parts.errors, parts.errors

    # nothing lost, nothing duplicated: every record of the writer once, every key once
    with spec.open() as cat:
        a = cat.load_table("s.a")
        ks = collections.Counter(a.to_arrow().column("k").to_pylist())
        lost = sorted(set(parts.written) - set(ks))
        duplicated = sorted(k for k, n in ks.items() if n > 1)
        keys = collections.Counter(h.batch_id for h in a.history() if h.job_id == "feed")
        assert not lost and not duplicated, (lost, duplicated)
        assert set(ks) == set(parts.written)
        assert all(n == 1 for n in keys.values()), keys
        # epochs sealed without a gap; s.b = f(s.a) at every barrier s.b precommitted
        q = Pipeline(cat)
        seals = [s.barrier for s in q.seals()]
        assert seals == list(range(1, len(seals) + 1))
        frontier = q.frontier("s.b") or 0
        for e in range(1, frontier + 1):
            b_rows = pairs(cat.load_table("s.b").to_arrow(version=q.version_at("s.b", e)))
            assert b_rows == pairs(derive(a.to_arrow(version=q.version_at("s.a", e)))), f"barrier {e}"
    assert parts.inconsistent == []
    # one line when each wait started, one when it ended
    for w in waiting:
        assert (wait_lines.started[w], wait_lines.ended[w]) == (1, 1), (w, wait_lines.lines)
    print(f"\nFAULT {backend} outage {outage:.0f}s: {len(parts.written)} records, lost {len(lost)}, duplicated "
          f"{len(duplicated)}, inconsistent reads {len(parts.inconsistent)} of {parts.reads} "
          f"({parts.failed_reads} failed fast during the outage), {len(seals)} epochs sealed\n  "
          + "\n  ".join(wait_lines.lines))


