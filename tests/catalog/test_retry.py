"""The one retry policy of the long-running parts (lakestep/retry.py), against real outages.

The waiting is timed by a ManualClock that the wait's own sleep moves, so the
deadline, the attempts and the backoff are exact numbers, while the database
really is away (the suite's own PostgreSQL server stopped; a SQLite catalog
whose write lock another process holds).
"""

from __future__ import annotations

import logging
import threading

import pyarrow as pa
import pytest

from lakestep import _failpoints
from lakestep.barrier import OPEN_EPOCH, Pipeline
from lakestep.catalog.backend import DatabaseTimeouts
from lakestep.clock import ManualClock
from lakestep.errors import CatalogUnavailableError, CatalogWaitExpiredError, InvalidArgumentError
from lakestep.retry import RetryPolicy, Wait, retrying
from lakestep.services import Coordinator
from tests.catalog.test_outage import PgStopped, SQLiteLocked
from tests.conftest import CatalogSpec
from tests.waiting import wait_until

KV = pa.schema([("k", pa.int64()), ("v", pa.int64())])
# SQLite: a write gives up on the foreign lock after 1 s (its busy timeout); PostgreSQL: a stopped
# server refuses at once, and statements keep their time on a loaded machine
TIMEOUTS = {"sqlite": DatabaseTimeouts(statement=1), "postgres": DatabaseTimeouts(connect=2, statement=30, grace=5)}


def test_the_backoff_doubles_up_to_its_bound() -> None:
    p = RetryPolicy(initial=0.1, factor=2.0, max_delay=1.0)
    assert [p.delay(n) for n in range(1, 8)] == [0.1, 0.2, 0.4, 0.8, 1.0, 1.0, 1.0]
    assert RetryPolicy.counted(3) == RetryPolicy(initial=0.1, factor=2.0, max_delay=2.0, deadline=None, attempts=3)
    for bad in ({"initial": 0}, {"max_delay": -1}, {"factor": 0.5}, {"deadline": -1}, {"attempts": -1}):
        with pytest.raises(InvalidArgumentError):
            RetryPolicy(**bad)  # type: ignore[arg-type]


@pytest.fixture
def away(request, tmp_path):  # type: ignore[no-untyped-def]
    """(catalog spec, fault): the database away for writes, on both backends."""
    if request.param == "postgres":
        spec = request.getfixturevalue("own_pg")
        yield spec, PgStopped(request.getfixturevalue("pg_cluster"))
        return
    wh = tmp_path / "warehouse"
    spec = CatalogSpec("sqlite", f"sqlite:///{wh}/catalog.db", str(wh))
    fault = SQLiteLocked(str(wh / "catalog.db"))
    spec.open().close()  # the file exists before another process locks it
    yield spec, fault
    fault.end()


@pytest.mark.parametrize("away", ["sqlite", "postgres"], indirect=True)
def test_a_wait_gives_up_at_its_deadline_with_the_facts(away, caplog) -> None:  # type: ignore[no-untyped-def]
    """Delays 1, 2, 4, then 3 (cut to the deadline): the fifth failure, 10 s after the first,
    gives up with CatalogWaitExpiredError. One line when the wait started, none for the end."""
    spec, fault = away
    cat = spec.open(timeouts=TIMEOUTS[spec.backend])
    clock = ManualClock()
    slept: list[float] = []

    def sleep(seconds: float) -> None:
        slept.append(seconds)
        clock.advance(seconds)

    policy = RetryPolicy(initial=1.0, factor=2.0, max_delay=8.0, deadline=10.0)
    caplog.set_level(logging.INFO, logger="lakestep")
    try:
        fault.begin()
        try:
            with pytest.raises(CatalogWaitExpiredError) as ei:
                retrying(lambda: cat.create_namespace("s"), policy=policy, what="test",
                         wait=Wait(policy, "test", clock=clock.monotonic, sleep=sleep))
        finally:
            fault.end()
        e = ei.value
        assert isinstance(e, CatalogUnavailableError)
        assert (e.what, e.waited, e.attempts, e.deadline) == ("test", 10.0, 5, 10.0)
        assert slept == [1.0, 2.0, 4.0, 3.0]
        lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("test: ")]
        assert len(lines) == 1 and "the catalog database is unavailable" in lines[0], lines

        # the database is back: the same call goes through, after one failure it logs both lines
        caplog.clear()
        fault.begin()
        w = Wait(policy, "test", clock=clock.monotonic, sleep=lambda s: (clock.advance(s), fault.end()))
        retrying(lambda: cat.create_namespace("s"), policy=policy, what="test", wait=w)
        assert cat.list_namespaces() == ["s"]
        lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("test: ")]
        assert len(lines) == 2 and "unavailable" in lines[0] and "is back after 1.0 s (1 failed" in lines[1], lines
    finally:
        cat.close()


def test_an_unknown_outcome_is_not_redone_unless_that_is_safe() -> None:
    calls: list[int] = []

    def unknown() -> None:
        calls.append(1)
        if len(calls) < 3:
            raise CatalogUnavailableError("the answer of a commit was lost", outcome_unknown=True)

    with pytest.raises(CatalogUnavailableError):
        retrying(unknown, policy=RetryPolicy(initial=0.001), what="sink")
    assert len(calls) == 1
    retrying(unknown, policy=RetryPolicy(initial=0.001), what="maintenance", redo_unknown=True)
    assert len(calls) == 3


def test_a_stopped_service_stops_waiting(own_pg, pg_cluster) -> None:  # type: ignore[no-untyped-def]
    """A service's stop event ends its wait at once: the last error is raised."""
    cat = own_pg.open(timeouts=TIMEOUTS["postgres"])
    stop = threading.Event()
    box: list[BaseException] = []

    def run() -> None:
        try:
            retrying(lambda: cat.list_namespaces(), policy=RetryPolicy(initial=3600.0, max_delay=3600.0),
                     what="service", stop=stop)
        except BaseException as e:  # noqa: BLE001
            box.append(e)

    try:
        pg_cluster.stop()
        t = threading.Thread(target=run, daemon=True)
        t.start()
        stop.set()
        t.join(120)
        assert not t.is_alive()
        assert len(box) == 1 and type(box[0]) is CatalogUnavailableError
    finally:
        pg_cluster.start()
        cat.close()


@pytest.mark.parametrize("kind", ["keyed append", "barrier batch"])
def test_a_commit_whose_answer_was_lost_while_the_server_went_down_is_not_a_replay(
        kind, own_pg, pg_cluster, caplog) -> None:  # type: ignore[no-untyped-def]
    """The commit lands; the server goes down before the answer comes back, so the lookup by
    uuid fails too. The next attempt, once the server is back, finds the commit done: its
    idempotency key taken (a keyed append), or its barrier precommitted (the guard of a derived
    job's batch). Both are this very commit, so it is returned as landed, not as a replay whose
    files would be deleted. PostgreSQL only: a lost answer is a client/server event."""
    cat = own_pg.open(timeouts=TIMEOUTS["postgres"])
    try:
        cat.create_namespace("s")
        t = cat.create_table("s.t", KV)
        u = cat.create_table("s.u", KV)
        t.append({"k": [0], "v": [0]})
        p = Pipeline(cat)
        p.register_job("feed", sinks=["s.t"], external_input=True)
        p.register_job("derive", sources=["s.t"], sinks=["s.u"])
        target = t if kind == "keyed append" else u
        if kind == "barrier batch":
            t.append({"k": [1], "v": [1]}, barrier=OPEN_EPOCH)
            coord = Coordinator(p.catalog, interval=3600)
            coord.seal()
            coord.release()
        caplog.set_level(logging.INFO, logger="lakestep")
        restarted = threading.Event()

        def start_when_waiting() -> None:
            wait_until(lambda: any("writer: the catalog database is unavailable" in r.getMessage()
                                   for r in caplog.records), "the writer's wait")
            pg_cluster.start()
            restarted.set()

        def lose_answer(name: str) -> None:
            _failpoints.disarm(name)
            pg_cluster.stop("fast")
            threading.Thread(target=start_when_waiting, daemon=True).start()
            raise CatalogUnavailableError("the server went down after COMMIT (failpoint)")

        def once() -> list:  # type: ignore[type-arg]
            if kind == "keyed append":
                with cat.transaction(job_id="feed", batch_id=1) as tx:
                    tx.append(t, {"k": [1], "v": [1]}, barrier=OPEN_EPOCH)
                return tx.results
            plan = p.next_batch("derive")
            assert plan is not None and plan.hi == 1
            with p.batch(plan, job_id="derive", batch_id=1) as b:
                b.append("s.u", {"k": [1], "v": [10]})
            assert b.result is not None
            return b.result.results

        _failpoints.arm("commit.after_db_commit", lose_answer)
        try:
            results = retrying(once, policy=RetryPolicy(initial=0.05, max_delay=0.5, deadline=300), what="writer")
        finally:
            _failpoints.disarm()
        # the commit went through once the server was back; the thread that restarted it
        # sets the flag after start() returns, which may be a moment after the commit
        wait_until(restarted.is_set, "the thread that restarted the server", timeout=120)
        assert [(r.version, r.replayed) for r in results] == [(2 if kind == "keyed append" else 1, False)]
        assert sorted(target.to_arrow().column("k").to_pylist()) == ([0, 1] if kind == "keyed append" else [1])
        assert len([h for h in target.history() if h.job_id is not None]) == 1
    finally:
        if not pg_cluster.running:
            pg_cluster.start()
        cat.close()
