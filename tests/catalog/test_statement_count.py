"""The commit path's cost, counted in SQL statements (issue 33), on both backends.

A commit's cost on SQLite is mostly its statements (each one a pass through
SQLAlchemy and SQLite) and on PostgreSQL its round trips; a change that adds one
per commit (a read-back of ids RETURNING gives, a write of what the table already
holds) halves the streaming hot path's throughput long before a timing notices it
on a noisy machine. These tests count every statement the catalog's engine sends
(SQLAlchemy's ``before_cursor_execute`` on PostgreSQL; on SQLite, what SQLite itself runs:
the driver's trace callback, since the blind append bypasses SQLAlchemy's execution layer)
and assert the exact numbers: no timings.

The expected numbers, per commit:

* SQLite, a blind append (``BEGIN IMMEDIATE`` ... ``COMMIT``, appends.py): the head
  update, the transaction row, ONE insert of all the new file rows (their ids by
  RETURNING), ONE insert of their statistics rows, the commit row: 7. A table's first
  append records its statistics' column set too: 8. The head update tells whether
  the set is there already, inside the write transaction: nothing is cached in the
  process, so a rolled-back commit, another process or a dropped and recreated table
  cannot make it skip a set the table lacks (tested below);
* PostgreSQL, a blind append: ONE statement in autocommit mode, always;
* an idempotency key adds the replay check on SQLite (one statement), nothing on
  PostgreSQL (a guard inside the one statement);
* several tables in one transaction: SQLite ``2 + 1 + 4 per table``; PostgreSQL
  ``BEGIN``, one statement per table, ``COMMIT``.

A derived job's batch (barrier/jobs.py; docs/design.md §3.3), once its pipeline has the
topology graph cached: the plan is ``BEGIN``, the facts with the generation and the open
epoch, the start versions with the first change after each, the versions at ``hi``, and
``ROLLBACK``: 5 on both backends. The commit of one appended file: PostgreSQL ``BEGIN``,
the generation locked, the sink rows locked, the facts, the sources' versions at ``lo-1``
and ``hi`` (one statement), the commit statement, ``COMMIT``: 7; SQLite has no row locks
(``BEGIN IMMEDIATE`` holds the file), and its commit is the append's five statements: 10.

The coordinator's tick that seals (services/coordinator.py, barrier/sealing.py), its lease
held: PostgreSQL the open epoch and the database's clock (two autocommit statements), then
``BEGIN``, the lease row locked, the clock, the facts with the generation and the open epoch
(its snapshots), ONE statement that locks and moves the epoch, records the seal and extends
the lease, ``COMMIT``: 8; SQLite reads the first two inside ``BEGIN`` ... ``ROLLBACK``, and the
epoch row read, the epoch moved, the seal row and the lease extended are four: 13.

A test failing here prints the statements sent: if the new count is right, say why
in the expected numbers.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Iterator

import pyarrow as pa
import pytest
import sqlalchemy as sa
from sqlalchemy import event

from lakestep import Catalog, _failpoints
from lakestep.catalog import stats_sql
from tests.conftest import CatalogSpec

if TYPE_CHECKING:
    from lakestep import Table
    from lakestep.barrier import Pipeline

SCHEMA = pa.schema([("id", pa.int64()), ("name", pa.string()), ("day", pa.date32())])


def rows(first: int, n: int = 3, *, names: int = 1) -> pa.Table:
    """``n`` rows of ids from ``first``; ``names`` distinct names (a partition each)."""
    import datetime as dt

    ids = list(range(first, first + n))
    return pa.table({"id": ids, "name": [f"n{i % names}" for i in ids],
                     "day": [dt.date(2026, 1, 1) + dt.timedelta(days=i % 7) for i in ids]}, schema=SCHEMA)


@contextlib.contextmanager
def statements(cat: Catalog) -> Iterator[list[str]]:
    """Every statement ``cat``'s engine sends inside the block, whitespace folded.

    PostgreSQL: SQLAlchemy's ``before_cursor_execute``. SQLite: what SQLite itself runs on
    the connections checked out in the block (the driver's trace callback), because the
    blind append sends its statements on the DB-API cursor (appends.py), past SQLAlchemy's
    events; an ``executemany`` counts once per row there."""
    seen: list[str] = []
    engine = cat.backend.engine
    if engine.dialect.name == "sqlite":
        traced: list[object] = []

        def trace(dbapi_conn, record, proxy):  # type: ignore[no-untyped-def]
            dbapi_conn.set_trace_callback(lambda statement: seen.append(" ".join(statement.split())))
            traced.append(dbapi_conn)

        event.listen(engine, "checkout", trace)
        try:
            yield seen
        finally:
            event.remove(engine, "checkout", trace)
            for c in traced:
                c.set_trace_callback(None)  # type: ignore[attr-defined]
        return

    def record(conn, cursor, statement, parameters, context, executemany):  # type: ignore[no-untyped-def]
        seen.append(" ".join(statement.split()))

    event.listen(engine, "before_cursor_execute", record)
    try:
        yield seen
    finally:
        event.remove(engine, "before_cursor_execute", record)


def sent(got: list[str]) -> str:
    return f"{len(got)} statements:\n" + "\n".join(f"  {s[:160]}" for s in got)


# Per backend: a blind append (first of its table; later ones), and the per-table terms of a
# multi-table transaction (fixed part, per table).
APPEND_FIRST = {"sqlite": 8, "postgres": 1}
APPEND = {"sqlite": 7, "postgres": 1}
KEYED = {"sqlite": 8, "postgres": 1}
MULTI_FIXED = {"sqlite": 3, "postgres": 2}
MULTI_PER_TABLE = {"sqlite": 4, "postgres": 1}


def test_append_statements(catalog: Catalog, catalog_spec: CatalogSpec) -> None:  # type: ignore[no-untyped-def]
    b = catalog_spec.backend
    catalog.create_namespace("s")
    t = catalog.create_table("s.plain", SCHEMA)
    for i, expected in enumerate([APPEND_FIRST[b], APPEND[b], APPEND[b]]):
        with statements(catalog) as got:
            t.append(rows(10 * i))
        assert len(got) == expected, f"append #{i + 1}: " + sent(got)
        assert not any(s.startswith("SELECT") for s in got), "an append reads nothing: " + sent(got)
    assert t.count() == 9


@pytest.mark.parametrize("kind", ["primary_key", "partitioned"])
def test_upsert_and_partitioned_append_statements(catalog: Catalog, catalog_spec: CatalogSpec,  # type: ignore[no-untyped-def]
                                                  kind: str) -> None:
    """An upsert (a blind MERGE), and an append of three files (one per partition): the same
    statements as a plain append; the files go in one statement."""
    b = catalog_spec.backend
    catalog.create_namespace("s")
    if kind == "primary_key":
        t = catalog.create_table("s.t", SCHEMA, primary_key=["id"])
    else:
        t = catalog.create_table("s.t", SCHEMA, partition_by=["name"])
    for i, expected in enumerate([APPEND_FIRST[b], APPEND[b]]):
        with statements(catalog) as got:
            t.append(rows(2 * i, 6, names=3))
        assert len(got) == expected, f"{kind} append #{i + 1}: " + sent(got)
    assert len(t.files()) == (2 if kind == "primary_key" else 6)
    assert t.count() == (8 if kind == "primary_key" else 12)


def test_keyed_and_multi_table_commit_statements(catalog: Catalog, catalog_spec: CatalogSpec) -> None:  # type: ignore[no-untyped-def]
    b = catalog_spec.backend
    catalog.create_namespace("s")
    t1, t2 = catalog.create_table("s.a", SCHEMA), catalog.create_table("s.b", SCHEMA)
    t1.append(rows(0))
    t2.append(rows(0))  # the column sets are recorded

    tx = catalog.transaction(job_id="job", batch_id=1)
    tx.append(t1, rows(10))
    with statements(catalog) as got:
        tx.commit()
    assert len(got) == KEYED[b], "a commit with an idempotency key: " + sent(got)

    tx = catalog.transaction()
    tx.append(t1, rows(20))
    tx.append(t2, rows(20, names=2))
    with statements(catalog) as got:
        tx.commit()
    assert len(got) == MULTI_FIXED[b] + 2 * MULTI_PER_TABLE[b], "a two-table transaction: " + sent(got)
    assert (t1.count(), t2.count()) == (9, 6)


# An overwrite of a whole table: its read (BEGIN, head, live files, end) and its commit
# through the general path: BEGIN, lock the head, the transaction row, count and tombstone
# the live files, ONE insert of the new file rows (ids by RETURNING, none read back), their
# statistics rows, the column sets (ON CONFLICT DO NOTHING), the head, the commit row, COMMIT.
OVERWRITE = {"sqlite": 15, "postgres": 15}


def test_general_path_statements(catalog: Catalog, catalog_spec: CatalogSpec) -> None:  # type: ignore[no-untyped-def]
    catalog.create_namespace("s")
    t = catalog.create_table("s.t", SCHEMA)
    t.append(rows(0))
    with statements(catalog) as got:
        t.overwrite(rows(100, 4, names=2))
    assert len(got) == OVERWRITE[catalog_spec.backend], "an overwrite: " + sent(got)
    with catalog.backend.read() as conn:
        assert stats_sql.covered(conn, t.table_id) == {"id", "day"}
    assert sorted(t.to_arrow().column("id").to_pylist()) == [100, 101, 102, 103]


def _covered(cat: Catalog, table_id: int) -> frozenset[str]:
    with cat.backend.read() as conn:
        return stats_sql.covered(conn, table_id)


def test_column_set_recorded_after_a_rolled_back_commit(catalog: Catalog, catalog_spec: CatalogSpec) -> None:  # type: ignore[no-untyped-def]
    """A table's first commit rolls back after its column set was written: the next append
    writes it again (the set is never taken as recorded by a commit that did not land)."""
    b = catalog_spec.backend
    catalog.create_namespace("s")
    t1, t2 = catalog.create_table("s.a", SCHEMA), catalog.create_table("s.b", SCHEMA)
    tx = catalog.transaction()
    tx.append(t1, rows(0))
    tx.append(t2, rows(0))
    _failpoints.arm("commit.table_done", "raise")
    try:
        with pytest.raises(_failpoints.FailpointError):
            tx.commit()
    finally:
        _failpoints.disarm("commit.table_done")
    assert t1.count() == 0 and _covered(catalog, t1.table_id) == frozenset()
    with statements(catalog) as got:
        t1.append(rows(10))
    assert len(got) == APPEND_FIRST[b], sent(got)
    assert _covered(catalog, t1.table_id) == {"id", "day"}


def test_column_set_recorded_for_a_table_recreated_elsewhere(catalog: Catalog, catalog_spec: CatalogSpec) -> None:  # type: ignore[no-untyped-def]
    """Another catalog (another process) drops a table this one appended to and creates one
    of the same name (on SQLite with the same table id): this catalog's next append to it
    records the column set the new table lacks."""
    catalog.create_namespace("s")
    t = catalog.create_table("s.t", SCHEMA)
    t.append(rows(0))
    other = catalog_spec.open()
    try:
        other.drop_table("s.t")
        again = other.create_table("s.t", SCHEMA)
    finally:
        other.close()
    if catalog_spec.backend == "sqlite":
        assert again.table_id == t.table_id  # the row id is reused: a cache keyed by it would be wrong
    fresh = catalog.load_table("s.t")
    with statements(catalog) as got:
        fresh.append(rows(10))
    assert len(got) == APPEND_FIRST[catalog_spec.backend], sent(got)
    assert _covered(catalog, fresh.table_id) == {"id", "day"}
    with catalog.backend.read() as conn:
        n = conn.execute(sa.text("SELECT count(*) FROM ls_stats_columns WHERE table_id = :t"),
                         {"t": fresh.table_id}).scalar_one()
    assert n == 1


def _root_and_derived(catalog: Catalog) -> tuple[Table, Pipeline]:
    """s.raw, written by the root job ``ingest``, and s.d1, made from it by the job ``d1``."""
    from lakestep.barrier import Pipeline

    catalog.create_namespace("s")
    raw = catalog.create_table("s.raw", SCHEMA)
    catalog.create_table("s.d1", SCHEMA)
    p = Pipeline(catalog)
    p.register_job("ingest", sinks=["s.raw"], external_input=True)
    p.register_job("d1", sources=["s.raw"], sinks=["s.d1"])
    return raw, p


DERIVED_PLAN = {"sqlite": 5, "postgres": 5}
DERIVED_COMMIT = {"sqlite": 10, "postgres": 7}


def test_derived_batch_statements(catalog: Catalog, catalog_spec: CatalogSpec) -> None:  # type: ignore[no-untyped-def]
    """A derived batch's plan and commit, after the first (the graph and prepared statements
    cached; the sink's column set recorded), one source and one sink."""
    from lakestep.barrier import OPEN_EPOCH
    from lakestep.services import Coordinator

    b = catalog_spec.backend
    raw, p = _root_and_derived(catalog)
    coord = Coordinator(catalog, interval=3600)
    for i in range(3):
        raw.append(rows(10 * i), barrier=OPEN_EPOCH)
        coord.seal()
        with statements(catalog) as planned:
            plan = p.next_batch("d1")
        assert plan is not None and (plan.lo, plan.hi) == (i + 1, i + 1)
        src = plan.sources["s.raw"]
        data = raw.to_arrow(version=src.to_version)
        with statements(catalog) as committed:
            with p.batch(plan) as batch:
                batch.append("s.d1", data.slice(0, 1))
        assert batch.result is not None and not batch.result.replayed
        if i > 0:
            assert len(planned) == DERIVED_PLAN[b], f"plan #{i + 1}: " + sent(planned)
            assert len(committed) == DERIVED_COMMIT[b], f"commit #{i + 1}: " + sent(committed)
    assert catalog.load_table("s.d1").count() == 3


SEAL_TICK = {"sqlite": 13, "postgres": 8}


def test_coordinator_seal_statements(catalog: Catalog, catalog_spec: CatalogSpec) -> None:  # type: ignore[no-untyped-def]
    """The coordinator's tick that seals, with a derived job in the topology (its snapshot
    check), the lease held (a lease of an hour: not renewed during the test)."""
    from lakestep.barrier import OPEN_EPOCH
    from lakestep.services import Coordinator

    raw, p = _root_and_derived(catalog)
    coord = Coordinator(catalog, interval=0.001, lease_seconds=3600)
    assert coord.acquire()
    sealed = 0
    while sealed < 3:
        raw.append(rows(10 * sealed), barrier=OPEN_EPOCH)
        with statements(catalog) as got:
            tick = coord.tick()
        if tick.sealed is None:  # not due yet (an interval of a millisecond): the next tick is
            continue
        sealed += 1
        if sealed > 1:  # the first read the graph
            assert len(got) == SEAL_TICK[catalog_spec.backend], f"seal #{sealed}: " + sent(got)
    assert [s.barrier for s in p.seals()] == [1, 2, 3]
