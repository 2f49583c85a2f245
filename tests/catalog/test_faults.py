"""The catalog under database faults: lost answers, killed connections, silent and
refusing servers, vanished lock files. Every failure is a typed error, nothing is
committed twice, and the connection pool never leaks.

The PostgreSQL faults are real: connections killed with ``pg_terminate_backend``,
and a TCP proxy (lakestep/testing/pgproxy.py) that cuts, stalls or refuses connections.
"""

from __future__ import annotations

import dataclasses
import threading
import uuid
from typing import Any, Callable, Iterator

import pyarrow as pa
import pytest
import sqlalchemy as sa

from lakestep import Catalog, Table, _failpoints, errors
from lakestep.barrier import OPEN_EPOCH, Pipeline
from lakestep.catalog.backend import DatabaseTimeouts
from lakestep.services import Coordinator
from tests.waiting import in_thread

SCHEMA = pa.schema([("id", pa.int64()), ("v", pa.string())])


def ids(cat: Catalog, name: str) -> list[int]:
    return sorted(cat.load_table(name).to_arrow().column("id").to_pylist())


def checked_out(cat: Catalog) -> int:
    return int(cat.backend.engine.pool.checkedout())  # type: ignore[attr-defined]


@pytest.fixture
def proxied_t(pg_proxied) -> Iterator[tuple[Catalog, Table, Any]]:  # type: ignore[no-untyped-def]
    """A PostgreSQL catalog reached through the proxy, with the table s.t holding ids 1 and 2:
    the catalog, the table and the proxy."""
    spec, proxy = pg_proxied
    cat = spec.open()
    try:
        cat.create_namespace("s")
        t = cat.create_table("s.t", SCHEMA)
        t.append({"id": [1, 2], "v": ["x", "y"]})
        yield cat, t, proxy
    finally:
        cat.close()


# ------------------------------------------------------- answers lost after a commit
def test_answer_lost_after_fast_path_append_lands(pg_proxied) -> None:  # type: ignore[no-untyped-def]
    """The server commits a blind append, the connection is cut before the answer comes
    back. The writer must return the landed result (found by its uuid), never commit it
    twice, and never lose a pooled connection: 25 times, more than the pool holds."""
    spec, proxy = pg_proxied
    cat = spec.open()
    try:
        cat.create_namespace("s")
        t = cat.create_table("s.t", SCHEMA)
        for i in range(1, 26):
            proxy.cut_after(b"INSERT INTO ls_commit")
            r = t.append({"id": [i], "v": ["x"]})
            assert (r.version, r.added_rows, r.replayed) == (i, 1, False)
        assert proxy.cuts == 25
        assert ids(cat, "s.t") == list(range(1, 26))
        assert checked_out(cat) == 0
    finally:
        cat.close()


def test_answer_lost_after_multi_table_commit_lands(catalog_spec, request) -> None:  # type: ignore[no-untyped-def]
    """The general commit path: a transaction over two tables lands, then the connection
    breaks before its COMMIT is acknowledged. lakestep looks it up by uuid and returns it.
    PostgreSQL: the proxy cuts the connection after COMMIT reached the server; SQLite
    (no connection to lose): a failpoint raises the lost-connection error right after COMMIT."""
    proxy = None
    spec = catalog_spec
    if catalog_spec.backend == "postgres":
        spec, proxy = request.getfixturevalue("pg_proxied")
    cat = spec.open()
    try:
        cat.create_namespace("s")
        a, b = (cat.create_table(f"s.{n}", SCHEMA) for n in ("a", "b"))
        a.append({"id": [1], "v": ["a"]})
        b.append({"id": [1], "v": ["b"]})
        fired: list[str] = []

        def lose_answer(name: str) -> None:
            fired.append(name)
            _failpoints.disarm(name)
            raise errors.CatalogUnavailableError("the connection broke after COMMIT (failpoint)")

        if proxy is not None:
            proxy.cut_after(b"COMMIT")
        else:
            _failpoints.arm("commit.after_db_commit", lose_answer)
        try:
            with cat.transaction() as tx:
                tx.append(a, {"id": [2], "v": ["a"]})
                tx.delete(b, [("id", "=", 1)])
        finally:
            _failpoints.disarm()
        assert (proxy.cuts if proxy is not None else len(fired)) == 1
        assert [(r.table, r.version, r.replayed) for r in tx.results] == [("s.a", 2, False), ("s.b", 2, False)]
        assert ids(cat, "s.a") == [1, 2] and ids(cat, "s.b") == []
        assert [h.operation for h in a.history()] == ["APPEND", "APPEND", "CREATE"]
    finally:
        cat.close()


def test_a_keyed_commit_whose_answer_and_lookup_were_lost_is_found_as_its_own(proxied_t) -> None:  # type: ignore[no-untyped-def]
    """A keyed transaction lands; its answer is lost, and so is the lookup by uuid that would
    have found it. The next attempt finds the key taken: by this very transaction (its uuid),
    so it returns its own results as committed (not replayed), and nothing commits twice."""
    cat, t, proxy = proxied_t

    def lose_answer_and_lookup(name: str) -> None:
        _failpoints.disarm(name)
        proxy.cut_after(b"ls_txn.txn_uuid = ")  # the lookup by uuid: its answer is cut too
        raise errors.CatalogUnavailableError("the connection broke after COMMIT (failpoint)")

    _failpoints.arm("commit.after_db_commit", lose_answer_and_lookup)
    try:
        tx = cat.transaction(job_id="j", batch_id=1)
        tx.delete(t, [("id", "=", 1)])
        [r] = in_thread(tx.commit)
    finally:
        _failpoints.disarm()
        proxy.heal()
    assert proxy.cuts == 1
    assert (r.version, r.operation, r.replayed, tx.replayed) == (2, "DELETE", False, False)
    assert ids(cat, "s.t") == [2] and t.version == 2
    assert checked_out(cat) == 0


def test_a_replay_whose_lookup_is_lost_waits_and_answers_the_first_commit(proxied_t) -> None:  # type: ignore[no-untyped-def]
    """A transaction replays a recorded key, and the connection breaks while it looks up the
    first commit's result: it does not land (its uuid is not recorded), so the commit waits,
    tries again and answers the first commit's result, marked replayed."""
    cat, t, proxy = proxied_t
    with cat.transaction(job_id="j", batch_id=1) as first:
        first.delete(t, [("id", "=", 1)])
    again = cat.transaction(job_id="j", batch_id=1)
    again.delete(t, [("id", "=", 2)])
    proxy.cut_after(b"ls_txn.batch_id = ")  # the lookup by key (the key check says batch_id >=)
    try:
        [r] = in_thread(again.commit)
    finally:
        proxy.heal()
    assert proxy.cuts == 1
    assert again.replayed and r == dataclasses.replace(first.results[0], replayed=True)
    assert ids(cat, "s.t") == [2] and t.version == 2
    assert checked_out(cat) == 0


def test_killed_connections_never_duplicate_or_leak(pg_spec, pg_admin) -> None:  # type: ignore[no-untyped-def]
    """The reliability report's repro: the writer's backend is terminated every 150 ms
    while it appends. Each append carries a key and is replayed (with the same key) after
    a typed error: every row lands exactly once, and the pool keeps its connections."""
    app = f"lakestep-kill-{uuid.uuid4().hex[:8]}"
    sep = "&" if "?" in pg_spec.url else "?"
    cat = Catalog(f"{pg_spec.url}{sep}application_name={app}", warehouse=pg_spec.warehouse, commit_retries=2)
    stop = threading.Event()
    kills = [0]

    def killer() -> None:
        with pg_admin.connect() as c:
            while not stop.wait(0.15):
                kills[0] += len(c.execute(sa.text(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = :a"),
                    {"a": app}).fetchall())

    try:
        cat.create_namespace("s")
        t = cat.create_table("s.t", SCHEMA)
        th = threading.Thread(target=killer, daemon=True)
        th.start()
        raised: list[str] = []
        try:
            for i in range(300):
                while True:
                    try:
                        t.append({"id": [i], "v": ["x"]}, job_id="writer", batch_id=i)
                        break
                    except errors.CatalogUnavailableError as e:  # typed; replay the same key
                        raised.append(str(e))
        finally:
            stop.set()
            th.join()
        assert kills[0] > 0
        assert ids(cat, "s.t") == list(range(300))  # none lost, none twice
        assert checked_out(cat) == 0
        assert in_thread(lambda: cat.load_table("s.t").history(limit=1))[0].batch_id == 299
    finally:
        cat.close()


# ------------------------------------------------------------- the watchdog
def test_the_watchdog_sleeps_through_answered_statements_and_wakes_for_an_earlier_deadline() -> None:
    """The watchdog thread is not woken by every statement (a thread switch each, on the
    hot path of every PostgreSQL call): only by one due before what it sleeps until. Such a
    statement's socket is shut down at its deadline; answered statements' sockets never are."""
    import socket

    from lakestep.catalog.backend import _Watchdog
    from tests.waiting import wait_until

    dog = _Watchdog()
    answered, slow = socket.socketpair(), socket.socketpair()
    try:
        first = dog.arm(answered[0].fileno(), 3600)  # starts the thread
        wait_until(lambda: dog.wakeups >= 1, "the watchdog thread started")
        assert not dog.disarm(first)
        woke = dog.wakeups
        for _ in range(200):  # answered statements, each due in an hour, each a round trip
            token = dog.arm(answered[0].fileno(), 3600)
            answered[1].sendall(b"q")  # (the socket calls let the watchdog's thread run, if woken)
            assert answered[0].recv(1) == b"q"
            assert not dog.disarm(token)
        assert dog.wakeups == woke  # none of them woke it
        token = dog.arm(slow[0].fileno(), 0.05)  # due long before the hour: wakes it, then fires
        wait_until(lambda: token in dog.fired, "the slow statement's socket shut down", timeout=30)
        assert slow[0].recv(1) == b""  # shut down: the driver would see the connection drop
        assert dog.disarm(token)  # the caller learns it timed out
        answered[1].sendall(b"x")
        assert answered[0].recv(1) == b"x"  # the answered statements' socket is untouched
    finally:
        for pair in (answered, slow):
            for sock in pair:
                sock.close()


# ------------------------------------------------------------- a client stalled inside its transaction
def test_a_client_stalled_in_its_transaction_loses_its_session_and_blocks_no_one(pg_spec) -> None:  # type: ignore[no-untyped-def]
    """DatabaseTimeouts(idle_in_transaction=): a client that holds the epoch row locked and sends
    nothing more (a paused coordinator) has its session ended by the server; a root commit waiting
    for that lock then lands, and the stalled client's next statement is a typed error; nothing of
    its transaction is visible."""
    from lakestep.catalog import schema as S

    stalled = pg_spec.open(timeouts=DatabaseTimeouts(idle_in_transaction=0.5))
    other = pg_spec.open()
    try:
        other.create_namespace("s")
        t = other.create_table("s.t", SCHEMA)
        with pytest.raises(errors.CatalogUnavailableError):
            with stalled.backend.write() as conn:
                conn.execute(sa.update(S.epoch).where(S.epoch.c.id == 1).values(opened_at=-1.0))  # locks the row
                # a root commit reads the open epoch FOR SHARE: it waits until the server ends the stalled session
                t.append({"id": [1], "v": ["x"]}, barrier=OPEN_EPOCH)
                conn.execute(sa.select(1))
        assert ids(other, "s.t") == [1]
        with other.backend.read() as conn:
            assert conn.execute(sa.select(S.epoch.c.opened_at)).scalar_one() != -1.0
        with stalled.backend.read() as conn:  # the stalled catalog works again on a new connection
            assert conn.execute(sa.select(S.epoch.c.id)).scalar_one() == 1
    finally:
        stalled.close()
        other.close()


def test_the_idle_in_transaction_timeout_is_checked() -> None:
    with pytest.raises(errors.InvalidArgumentError, match="idle_in_transaction"):
        DatabaseTimeouts(idle_in_transaction=0)
    assert DatabaseTimeouts().idle_in_transaction is None


# ------------------------------------------------------------- silent and gone servers
def test_a_server_that_stops_answering_gives_a_typed_error(pg_proxied) -> None:  # type: ignore[no-untyped-def]
    spec, proxy = pg_proxied
    cat = spec.open(commit_retries=1, timeouts=DatabaseTimeouts(connect=2, statement=1, grace=1, pool=5))
    try:
        cat.create_namespace("s")
        t = cat.create_table("s.t", SCHEMA)
        t.append({"id": [1], "v": ["x"]})
        proxy.stall()
        with pytest.raises(errors.CatalogUnavailableError) as ei:
            in_thread(lambda: t.append({"id": [2], "v": ["x"]}))
        assert ei.value.outcome_unknown in (True, False)
        with pytest.raises(errors.CatalogUnavailableError):
            in_thread(lambda: t.to_arrow())
        proxy.heal()
        assert ids(cat, "s.t") in ([1], [1, 2])  # the stalled append may not have reached the server
        assert checked_out(cat) == 0
    finally:
        proxy.heal()
        cat.close()


def test_a_server_gone_after_open_gives_typed_errors_everywhere(pg_proxied) -> None:  # type: ignore[no-untyped-def]
    """Reads, writes, seals and consistent choices: CatalogUnavailableError, never a raw
    driver error; once the server is back, the same catalog object works again."""
    spec, proxy = pg_proxied
    cat = spec.open(commit_retries=0, timeouts=DatabaseTimeouts(connect=2, statement=5, grace=2, pool=5))
    try:
        cat.create_namespace("s")
        t = cat.create_table("s.t", SCHEMA)
        t.append({"id": [1], "v": ["x"]}, barrier=OPEN_EPOCH)
        p = Pipeline(cat)
        p.register_job("feed", sinks=["s.t"], external_input=True)
        coord = Coordinator(p.catalog, interval=3600)
        assert coord.acquire()
        proxy.refuse()
        calls: dict[str, Callable[[], Any]] = {
            "to_arrow": t.to_arrow,
            "history": t.history,
            "append": lambda: t.append({"id": [2], "v": ["x"]}),
            "overwrite": lambda: t.overwrite({"id": [3], "v": ["y"]}),
            "load_table": lambda: cat.load_table("s.t"),
            "list_tables": lambda: cat.list_tables("s"),
            "seal": coord.seal,
            "choose": lambda: p.choose(["s.t"]),
        }
        for name, call in calls.items():
            with pytest.raises(errors.CatalogUnavailableError):
                in_thread(call)
        proxy.heal()
        assert ids(cat, "s.t") == [1]
        coord.seal()
        assert p.choose(["s.t"]).barrier == 1
        assert checked_out(cat) == 0
        coord.release()
    finally:
        proxy.heal()
        cat.close()


# ------------------------------------------------------------- SQLite lock file
def test_coordinator_survives_its_lock_file_vanishing(tmp_path) -> None:  # type: ignore[no-untyped-def]
    wh = tmp_path / "wh"
    cat = Catalog(warehouse=str(wh))
    try:
        p = Pipeline(cat)
        coord = Coordinator(p.catalog, interval=0.01)
        assert coord.acquire()
        coord.seal()
        lock = wh / "catalog.db.lock"
        assert lock.exists()
        lock.unlink()
        coord.seal()  # the lock file is made again
        assert lock.exists()
        assert p.open_epoch() == 3
        coord.release()
    finally:
        cat.close()


def test_a_vanished_catalog_directory_is_a_typed_error(tmp_path) -> None:  # type: ignore[no-untyped-def]
    import shutil

    wh = tmp_path / "wh"
    cat = Catalog(warehouse=str(wh))
    try:
        shutil.rmtree(wh)
        with pytest.raises(errors.CatalogUnavailableError):
            cat.create_namespace("s")
    finally:
        cat.close()


def _counts(cat: Catalog, table_id: int) -> dict[str, int]:
    """What the catalog holds of a table (and its transaction records)."""
    queries = {
        "version": "SELECT version FROM ls_table WHERE table_id = :tid",
        "files": "SELECT count(*) FROM ls_file WHERE table_id = :tid",
        "stats rows": "SELECT count(*) FROM ls_file_stats WHERE table_id = :tid",
        "commits": "SELECT count(*) FROM ls_commit WHERE table_id = :tid",
        "transactions": "SELECT count(*) FROM ls_txn",
    }
    with cat.backend.read() as conn:
        return {name: int(conn.execute(sa.text(q), {"tid": table_id}).scalar_one()) for name, q in queries.items()}


def test_a_statement_refused_mid_append_commits_nothing(catalog: Catalog) -> None:  # type: ignore[no-untyped-def]
    """The blind append's last statement (the commit row) refused by the database, here by a
    trigger, after the head, the transaction, the file and its statistics rows were written in
    the same transaction (on SQLite straight on the driver's cursor, appends.py): a typed error,
    and none of it is visible; the next append, unrefused, commits one version."""
    catalog.create_namespace("s")
    t = catalog.create_table("s.t", SCHEMA)
    t.append({"id": [1, 2], "v": ["a", "b"]})
    before = _counts(catalog, t.table_id)
    sqlite = catalog.backend.name == "sqlite"
    with catalog.backend.engine.begin() as conn:
        if sqlite:
            conn.exec_driver_sql("CREATE TRIGGER ls_test_refuse BEFORE INSERT ON ls_commit "
                                 "BEGIN SELECT RAISE(ABORT, 'refused by the test'); END")
        else:
            conn.exec_driver_sql("CREATE FUNCTION ls_test_refuse() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
                                 "RAISE EXCEPTION 'refused by the test' USING ERRCODE = '23514'; END $$")
            conn.exec_driver_sql("CREATE TRIGGER ls_test_refuse BEFORE INSERT ON ls_commit "
                                 "FOR EACH ROW EXECUTE FUNCTION ls_test_refuse()")
    with pytest.raises(errors.CatalogError, match="refused by the test"):
        t.append({"id": [3], "v": ["c"]})
    assert _counts(catalog, t.table_id) == before
    assert ids(catalog, "s.t") == [1, 2]
    with catalog.backend.engine.begin() as conn:
        conn.exec_driver_sql("DROP TRIGGER ls_test_refuse" + ("" if sqlite else " ON ls_commit"))
    t.append({"id": [3], "v": ["c"]})
    after = _counts(catalog, t.table_id)
    assert after["version"] == before["version"] + 1 and after["files"] == before["files"] + 1
    assert after["stats rows"] > before["stats rows"] and after["commits"] == before["commits"] + 1
    assert ids(catalog, "s.t") == [1, 2, 3]
