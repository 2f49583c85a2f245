"""Multi-table transactions, idempotent replay, and faults in the middle of a commit."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import textwrap
import threading

import pyarrow as pa
import pytest
import sqlalchemy as sa

from lakestep import Catalog, _failpoints, errors

SCHEMA = pa.schema([("id", pa.int64()), ("v", pa.string())])


def ids(cat: Catalog, ident: str) -> list[int]:
    return sorted(cat.load_table(ident).to_arrow().column("id").to_pylist())


def n_parquet_files(path: str) -> int:
    return sum(f.endswith(".parquet") for _, _, fs in os.walk(path) for f in fs)


@pytest.fixture
def two_tables(catalog: Catalog):  # type: ignore[no-untyped-def]
    catalog.create_namespace("s")
    a = catalog.create_table("s.a", SCHEMA)
    b = catalog.create_table("s.b", SCHEMA)
    a.append({"id": [1], "v": ["a"]})
    b.append({"id": [1], "v": ["b"]})
    return a, b


def test_multi_table_transaction_is_atomic(catalog: Catalog, two_tables) -> None:  # type: ignore[no-untyped-def]
    a, b = two_tables
    with catalog.transaction() as tx:
        tx.append(a, {"id": [2], "v": ["a"]})
        tx.append("s.a", {"id": [3], "v": ["a"]})  # appends to one table accumulate
        tx.delete(b, [("id", "=", 1)])
    assert [r.table for r in tx.results] == ["s.a", "s.b"]
    assert ids(catalog, "s.a") == [1, 2, 3] and ids(catalog, "s.b") == []
    # a second non-append write to the same table is refused, and the first one's files go
    tx2 = catalog.transaction()
    tx2.delete(a, [("id", "=", 2)])
    with pytest.raises(errors.InvalidArgumentError):
        tx2.overwrite(a, {"id": [9], "v": ["x"]})
    tx2.abort()
    with pytest.raises(errors.TransactionClosedError):
        tx2.append(a, {"id": [9], "v": ["x"]})
    assert ids(catalog, "s.a") == [1, 2, 3]


def test_exception_inside_the_block_aborts(catalog: Catalog, two_tables) -> None:  # type: ignore[no-untyped-def]
    a, b = two_tables
    before = n_parquet_files(a.location)
    with pytest.raises(RuntimeError):
        with catalog.transaction() as tx:
            tx.append(a, {"id": [5], "v": ["a"]})
            raise RuntimeError("user code failed")
    assert ids(catalog, "s.a") == [1]
    assert n_parquet_files(a.location) == before  # its staged file was deleted


@pytest.mark.parametrize("point", ["commit.locked", "commit.after_remove", "commit.table_done",
                                   "commit.before_db_commit"])
def test_failure_in_the_middle_of_a_multi_table_commit(catalog: Catalog, two_tables, point: str) -> None:  # type: ignore[no-untyped-def]
    a, b = two_tables
    versions = (a.version, b.version)
    _failpoints.arm(point, "raise")
    try:
        with pytest.raises(_failpoints.FailpointError):
            with catalog.transaction() as tx:
                tx.append(a, {"id": [2], "v": ["a"]})
                tx.delete(b, [("id", "=", 1)])  # not all appends: the general commit path
    finally:
        _failpoints.disarm()
    assert (a.version, b.version) == versions
    assert ids(catalog, "s.a") == [1] and ids(catalog, "s.b") == [1]
    # and the catalog works normally afterwards
    with catalog.transaction() as tx:
        tx.append(a, {"id": [2], "v": ["a"]})
        tx.append(b, {"id": [2], "v": ["b"]})
    assert ids(catalog, "s.a") == [1, 2] and ids(catalog, "s.b") == [1, 2]


def test_idempotent_replay(catalog: Catalog, two_tables) -> None:  # type: ignore[no-untyped-def]
    a, b = two_tables
    with catalog.transaction(job_id="job-1", batch_id=7) as tx:
        tx.append(a, {"id": [2], "v": ["a"]})
        tx.overwrite(b, {"id": [20], "v": ["b"]})
    first = tx.results
    # Spark replays the batch after a crash: maybe with other rows even
    with catalog.transaction(job_id="job-1", batch_id=7) as tx:
        tx.append(a, {"id": [99], "v": ["a"]})
        tx.overwrite(b, {"id": [99], "v": ["b"]})
    again = tx.results
    assert [(r.table, r.version, r.operation) for r in again] == [(r.table, r.version, r.operation) for r in first]
    assert all(r.replayed for r in again) and not any(r.replayed for r in first)
    assert ids(catalog, "s.a") == [1, 2] and ids(catalog, "s.b") == [20]
    r = a.append({"id": [3], "v": ["a"]}, job_id="job-1", batch_id=8)
    assert not r.replayed and a.append({"id": [3], "v": ["a"]}, job_id="job-1", batch_id=8).replayed
    assert ids(catalog, "s.a") == [1, 2, 3]
    assert [h.batch_id for h in a.history(limit=2)] == [8, 7]
    with pytest.raises(errors.InvalidArgumentError):
        catalog.transaction(job_id="job-1")


def test_same_key_from_two_processes_commits_once(catalog_spec, catalog, two_tables, worker_pair) -> None:  # type: ignore[no-untyped-def]
    w1, w2 = worker_pair
    w1.prepare(catalog_spec, "append", "s.a", pa.table({"id": [2], "v": ["x"]}), key=("job-2", 1))
    w2.prepare(catalog_spec, "append", "s.a", pa.table({"id": [2], "v": ["x"]}), key=("job-2", 1))
    r1, r2 = w1.commit(), w2.commit()
    assert r1[0]["version"] == r2[0]["version"] and r2[0]["replayed"]
    assert ids(catalog, "s.a") == [1, 2]


@pytest.mark.parametrize("lookup_cut", [False, True], ids=["answered", "lookup-cut"])
def test_a_same_key_commit_that_loses_the_race_at_the_key_insert_answers_the_winner(
        pg_proxied, pg_admin, lookup_cut) -> None:  # type: ignore[no-untyped-def]
    """PostgreSQL only (on SQLite one writer at a time sees the key first). Two transactions
    with one key: B finds the key free, then waits for the row lock A holds; A commits, and
    B's insert of the key fails on the unique index (IntegrityError). No attempt of B's own
    landed, so B answers A's results, marked replayed, and commits nothing; also when the
    connection breaks as B looks for its own attempt (B waits, tries again, finds the key
    taken)."""
    from tests.waiting import wait_until

    spec, proxy = pg_proxied
    if lookup_cut:
        proxy.cut_after(b"ls_txn.txn_uuid = ")  # B's lookup of its own attempt, after the IntegrityError
    cat = spec.open()
    try:
        cat.create_namespace("s")
        t = cat.create_table("s.a", SCHEMA)
        t.append({"id": [1, 2], "v": ["a", "b"]})
        with cat.backend.engine.connect() as c:
            table_oid = c.execute(sa.text("select 'ls_table'::regclass::oid")).scalar_one()
        first = cat.transaction(job_id="j", batch_id=1)
        first.delete(t, [("id", "=", 1)])
        second = cat.transaction(job_id="j", batch_id=1)
        second.delete(t, [("id", "=", 2)])
        box: dict[str, object] = {}

        def run_second() -> None:
            try:
                box["results"] = second.commit()
            except BaseException as e:  # noqa: BLE001 - handed to the test
                box["error"] = e

        def blocked() -> bool:  # a backend of this catalog (it locked our ls_table) waits for a lock
            with pg_admin.connect() as c:
                return bool(c.execute(sa.text(
                    "select count(*) from pg_stat_activity a where a.wait_event_type = 'Lock' and a.pid in "
                    "(select l.pid from pg_locks l where l.relation = :oid)"), {"oid": table_oid}).scalar())

        thread = threading.Thread(target=run_second, daemon=True)

        def let_second_wait(name: str) -> None:  # A holds the row lock and its key, uncommitted
            _failpoints.disarm(name)
            thread.start()
            wait_until(blocked, "the second transaction waiting for the first's row lock",
                       failed=lambda: None if thread.is_alive() else f"the second commit ended: {box}")

        _failpoints.arm("commit.locked", let_second_wait)
        try:
            [won] = first.commit()
        finally:
            _failpoints.disarm()
        thread.join(300)
        assert not thread.is_alive() and "error" not in box, box
        assert box["results"] == [dataclasses.replace(won, replayed=True)] and second.replayed
        assert not first.replayed and won.version == 2
        assert ids(cat, "s.a") == [2] and t.version == 2
        assert proxy.cuts == int(lookup_cut)
    finally:
        _failpoints.disarm()
        proxy.heal()
        cat.close()


CRASHER = textwrap.dedent(
    """
    import sys
    from lakestep import Catalog
    cat = Catalog(sys.argv[1], warehouse=sys.argv[2])
    with cat.transaction(job_id="crashy", batch_id=1) as tx:
        tx.append("s.a", {"id": [2], "v": ["a"]})
        tx.delete("s.b", [("id", "=", 1)])
    print("committed")
    """
)


@pytest.mark.parametrize("point", ["commit.locked", "commit.table_done", "commit.before_db_commit"])
def test_process_killed_mid_commit_leaves_nothing_visible(catalog_spec, catalog, two_tables, point) -> None:  # type: ignore[no-untyped-def]
    env = {**os.environ, "LAKESTEP_FAILPOINTS": f"{point}=exit"}
    args = [sys.executable, "-c", CRASHER, catalog_spec.url, catalog_spec.warehouse]
    proc = subprocess.run(args, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 137, proc.stderr
    assert ids(catalog, "s.a") == [1] and ids(catalog, "s.b") == [1]
    # the restarted job commits its batch exactly once
    env.pop("LAKESTEP_FAILPOINTS")
    for _ in range(2):
        proc = subprocess.run(args, env=env, capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr
    assert ids(catalog, "s.a") == [1, 2] and ids(catalog, "s.b") == []


def _kill_my_pg_connection(pg_admin: sa.Engine):  # type: ignore[no-untyped-def]
    def kill(_name: str) -> None:
        with pg_admin.connect() as c:
            killed = c.execute(sa.text(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = 'lakestep' "
                "AND state = 'idle in transaction' AND pid = ANY(:pids)"), {"pids": _my_pids}).fetchall()
            assert killed, "no connection to kill"
    return kill


_my_pids: list[int] = []


@pytest.mark.parametrize("retries", [0, 1, 3])  # 1: one retry is enough for one lost connection
def test_lost_database_connection_mid_commit(pg_spec, pg_admin, retries) -> None:  # type: ignore[no-untyped-def]
    """PostgreSQL only: a dropped connection is a client/server event (on SQLite the
    equivalent is a process dying mid-commit, tested above on both backends)."""
    cat = pg_spec.open(commit_retries=retries)
    cat.create_namespace("s")
    for name in ("a", "b"):
        cat.create_table(f"s.{name}", SCHEMA).append({"id": [1], "v": [name]})
    with cat.backend.engine.connect() as c:  # the pids of this catalog's pooled connections
        _my_pids[:] = [c.execute(sa.text("select pg_backend_pid()")).scalar()]
    hits = []

    def once(name: str) -> None:
        if not hits:
            hits.append(name)
            _kill_my_pg_connection(pg_admin)(name)

    _failpoints.arm("commit.table_done", once)
    try:
        if retries == 0:
            with pytest.raises(errors.CatalogUnavailableError) as ei:
                with cat.transaction() as tx:
                    tx.append("s.a", {"id": [2], "v": ["a"]})
                    tx.delete("s.b", [("id", "=", 1)])
            assert ei.value.outcome_unknown is False  # it looked: the commit did not land
            assert ids(cat, "s.a") == [1] and ids(cat, "s.b") == [1]
        else:
            with cat.transaction() as tx:
                tx.append("s.a", {"id": [2], "v": ["a"]})
                tx.delete("s.b", [("id", "=", 1)])
            assert ids(cat, "s.a") == [1, 2] and ids(cat, "s.b") == []
            assert [h.operation for h in cat.load_table("s.a").history()] == ["APPEND", "APPEND", "CREATE"]
        assert hits
    finally:
        _failpoints.disarm()
        cat.close()
