"""How a catalog database is created and upgraded: the numbered migrations.

``ls_meta`` holds the metadata schema version. :func:`upgrade` applies the
numbered migrations a database lacks (the caller holds the catalog's write lock)
and refuses a database written by a newer lakestep (:class:`CatalogVersionError`);
:func:`create_latest` makes a new catalog at the newest version in one pass. The
tables are defined in ``schema.py``, each migration creates its tables from their
newest definition there; the rows of the one-row tables are seeded by one function
per table group, which the migrations and :func:`create_latest` share.
"""

from __future__ import annotations

import json
import time
from typing import Callable

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from ..errors import CatalogCorruptError, CatalogVersionError
from .schema import (
    columns_digest,
    columns_json,
    commits,
    coordinator,
    epoch,
    file_stats,
    files,
    job_sinks,
    job_sources,
    job_triggers,
    jobs,
    locks,
    meta,
    metadata,
    namespaces,
    published_snapshots,
    published_tables,
    publisher,
    rollbacks,
    schemas,
    seals,
    snapshots,
    stats_columns,
    stats_rows,
    tables,
    topology,
    trigger_decisions,
    txns,
)

# --- version 3: the lineage view and indexes of ls_commit ----------------------------
# Lineage by name, active jobs only: the plain-SQL face of the topology.
_LINEAGE_VIEW = """
CREATE VIEW ls_lineage AS
SELECT j.job_id AS job_id,
       j.external_input AS external_input,
       src.namespace || '.' || src.name AS source_table,
       dst.namespace || '.' || dst.name AS sink_table,
       s.table_id AS source_id,
       k.table_id AS sink_id
  FROM ls_job j
  JOIN ls_job_source s ON s.job_id = j.job_id
  JOIN ls_job_sink k ON k.job_id = j.job_id
  JOIN ls_table src ON src.table_id = s.table_id
  JOIN ls_table dst ON dst.table_id = k.table_id
 WHERE j.retired_at IS NULL
"""

# Indexes of ls_commit for barrier reads (lakestep/barrier/progress.py). The
# partial index holds RESTORE commits only: queries name the literal 'RESTORE'.
_V3_INDEXES = (
    "CREATE INDEX IF NOT EXISTS ls_commit_barrier ON ls_commit (table_id, barrier, version)",
    "CREATE INDEX IF NOT EXISTS ls_commit_restore ON ls_commit (table_id, version) WHERE operation = 'RESTORE'",
)


# --- the rows of the one-row tables ---------------------------------------------------
# Seeded by the migration that creates their tables (versions 2, 3 and 10) and by
# create_latest: one function each, so both make the same rows.
def _seed_epoch(conn: Connection, now: float) -> None:
    conn.execute(sa.insert(epoch).values(id=1, open_epoch=1, opened_at=now))


def _seed_coordination(conn: Connection, now: float) -> None:
    conn.execute(sa.insert(topology).values(id=1, generation=1, updated_at=now))
    conn.execute(sa.insert(coordinator).values(id=1, holder=None, token=0, acquired_at=None, expires_at=0.0,
                                               snapshot_barrier=0))


def _seed_publisher(conn: Connection) -> None:
    conn.execute(sa.insert(publisher).values(id=1, enabled=False, holder=None, token=0, expires_at=0.0,
                                             complete_barrier=None, rollback_id=0))


def _v1(conn: Connection) -> None:
    for t in (meta, namespaces, tables, txns, commits, files):
        t.create(conn, checkfirst=True)


def _v2(conn: Connection) -> None:
    for t in (snapshots, locks, epoch):
        t.create(conn, checkfirst=True)
    _seed_epoch(conn, time.time())


def _v3(conn: Connection) -> None:
    for t in (jobs, job_sources, job_sinks, topology, seals, coordinator, rollbacks):
        t.create(conn, checkfirst=True)
    for ddl in _V3_INDEXES:
        conn.exec_driver_sql(ddl)
    if "ls_lineage" not in sa.inspect(conn).get_view_names():
        conn.exec_driver_sql(_LINEAGE_VIEW)
    _seed_coordination(conn, time.time())


def _v4(conn: Connection) -> None:
    job_triggers.create(conn, checkfirst=True)


# --- version 5: ls_table.schema_id (additive schema evolution) -------------------
def _v5(conn: Connection) -> None:
    if "schema_id" not in {c["name"] for c in sa.inspect(conn).get_columns("ls_table")}:
        conn.exec_driver_sql("ALTER TABLE ls_table ADD COLUMN schema_id INTEGER NOT NULL DEFAULT 0")


def _v6(conn: Connection) -> None:
    trigger_decisions.create(conn, checkfirst=True)
    if sa.inspect(conn).has_table("ls_job_trigger"):
        old = job_triggers.c
        rows = conn.execute(sa.select(old.job_id, old.start_barrier, old.call_no, old.end_barrier, old.created_at)
                            .order_by(old.created_at, old.call_no)).all()
        if rows:
            conn.execute(sa.insert(trigger_decisions), [r._asdict() for r in rows])
        job_triggers.drop(conn)


# --- version 7: an index of files by partition -----------------------------------
# A read whose filter pins every partition column lists the files of those
# partitions only (Predicate.partition_keys, TableHandle.files_at): the cost
# follows the partitions read, not the number of files in the table.
def _v7(conn: Connection) -> None:
    if "ls_file_partition" not in {i["name"] for i in sa.inspect(conn).get_indexes("ls_file")}:
        conn.exec_driver_sql("CREATE INDEX ls_file_partition ON ls_file (table_id, \"partition\")")


def _v8(conn: Connection) -> None:
    file_stats.create(conn, checkfirst=True)
    stats_columns.create(conn, checkfirst=True)
    f = files.c
    last = -1
    seen: set[tuple[int, str]] = set()
    while True:  # backfill from ls_file.stats, in batches of file ids
        batch = conn.execute(sa.select(f.file_id, f.table_id, f.record_count, f.stats)
                             .where(f.file_id > last).order_by(f.file_id).limit(5000)).all()
        if not batch:
            break
        rows: list[dict] = []
        for file_id, table_id, count, stats in batch:
            got, cols = stats_rows(int(table_id), int(file_id), int(count), stats)
            rows.extend(got)
            digest = columns_digest(cols)
            if (int(table_id), digest) not in seen:
                seen.add((int(table_id), digest))
                conn.execute(sa.insert(stats_columns).values(table_id=int(table_id), digest=digest,
                                                            columns=columns_json(cols)))
        if rows:
            conn.execute(sa.insert(file_stats), rows)
        last = int(batch[-1][0])



# --- version 9: the change stamp of ls_table (schema.py, STAMP_SQL) -----------------------
def _v9(conn: Connection) -> None:
    if "stamp" not in {c["name"] for c in sa.inspect(conn).get_columns("ls_table")}:
        conn.exec_driver_sql("ALTER TABLE ls_table ADD COLUMN stamp BIGINT NOT NULL DEFAULT 0")
    if "ls_table_stamp" not in {i["name"] for i in sa.inspect(conn).get_indexes("ls_table")}:
        conn.exec_driver_sql("CREATE INDEX ls_table_stamp ON ls_table (stamp)")


def _v10(conn: Connection) -> None:
    for t in (publisher, published_tables, published_snapshots):
        t.create(conn, checkfirst=True)
    if conn.execute(sa.select(publisher.c.id)).first() is None:
        _seed_publisher(conn)


# --- version 11: column ids (columns.py) ---------------------------------------------
# Every table gets ids by position over its physical schema; the same mapping is the
# name mapping of the files written before (they carry no Parquet field ids).
def _v11(conn: Connection) -> None:
    import pyarrow as pa

    from .columns import assign
    from .pk import physical_schema

    have = {c["name"] for c in sa.inspect(conn).get_columns("ls_table")}
    for ddl, col in (("ALTER TABLE ls_table ADD COLUMN column_ids TEXT", "column_ids"),
                     ("ALTER TABLE ls_table ADD COLUMN last_column_id INTEGER NOT NULL DEFAULT 0", "last_column_id"),
                     ("ALTER TABLE ls_table ADD COLUMN name_mapping TEXT", "name_mapping")):
        if col not in have:
            conn.exec_driver_sql(ddl)
    t = tables.c
    for tid, ipc, pk_json in conn.execute(sa.select(t.table_id, t.schema_ipc, t.primary_key).where(
            t.column_ids.is_(None))).all():
        schema = pa.ipc.read_schema(pa.py_buffer(ipc))
        pk = json.loads(pk_json or "[]")
        ids = assign(physical_schema(schema, pk) if pk else schema)
        conn.execute(sa.update(tables).where(t.table_id == tid).values(
            column_ids=ids.to_json(), last_column_id=ids.last, name_mapping=ids.to_json()))


# --- version 12: schema history (ls_schema) -------------------------------------------
# Every table's current schema becomes its first recorded one, taking effect at version 0.
# Not kept: the schemas of versions before the upgrade (a time-travel read to them shows
# the schema of the upgrade, as before it).
def _v12(conn: Connection) -> None:
    schemas.create(conn, checkfirst=True)
    t = tables.c
    have = {r[0] for r in conn.execute(sa.select(schemas.c.table_id))}
    for r in conn.execute(sa.select(t.table_id, t.schema_id, t.schema_ipc, t.column_ids, t.last_column_id,
                                    t.primary_key, t.partition_by)).all():
        if r.table_id not in have:
            conn.execute(sa.insert(schemas).values(
                table_id=r.table_id, schema_id=r.schema_id, version=0, schema_ipc=r.schema_ipc,
                column_ids=r.column_ids or "[]", last_column_id=r.last_column_id, primary_key=r.primary_key,
                partition_by=r.partition_by))


# Numbered migrations. Append only; never edit a released one.
MIGRATIONS: list[tuple[int, Callable[[Connection], None]]] = [
    (1, _v1),
    (2, _v2),
    (3, _v3),
    (4, _v4),
    (5, _v5),
    (6, _v6),
    (7, _v7),
    (8, _v8),
    (9, _v9),
    (10, _v10),
    (11, _v11),
    (12, _v12),
]
LATEST = MIGRATIONS[-1][0]


# --- a new catalog at the newest version, in one pass ------------------------------
# A new catalog is what replaying every migration on an empty database gives; the
# migrations create each table from its newest definition (above) and their other
# steps (added columns, backfills) find nothing to do there. So a new catalog is made
# directly: every table but the ones a migration dropped, the indexes and view that
# migrations add by hand, and the one-row tables' rows. tests/catalog/test_upgrade.py
# checks on both backends that it equals the replay, table by table, column by column,
# index by index. The DDL is compiled once per dialect and, on PostgreSQL, sent in one
# round trip: a new catalog costs a few statements instead of ~120 (the tests make
# hundreds of catalogs; a user's first `Catalog(...)` makes one).
_DROPPED = ("ls_job_trigger",)  # made by version 4, dropped by version 6
_ddl_cache: dict[str, tuple[str, ...]] = {}


def _latest_ddl(dialect: sa.engine.Dialect) -> tuple[str, ...]:
    if dialect.name not in _ddl_cache:
        from sqlalchemy.schema import CreateIndex, CreateTable

        out: list[str] = []
        for t in metadata.sorted_tables:
            if t.name in _DROPPED:
                continue
            out.append(str(CreateTable(t).compile(dialect=dialect)).strip())
            out += [str(CreateIndex(i).compile(dialect=dialect)).strip()
                    for i in sorted(t.indexes, key=lambda i: i.name or "")]
        out += [*_V3_INDEXES, _LINEAGE_VIEW.strip()]
        _ddl_cache[dialect.name] = tuple(out)
    return _ddl_cache[dialect.name]


def create_latest(conn: Connection, now: float) -> int:
    """Create the newest metadata schema in an empty database (the caller checked it is
    empty, holds the catalog's write lock and an open transaction), its one-row tables'
    rows opened at ``now``; returns :data:`LATEST`. Equal to :func:`upgrade` from version 0.

    Not guaranteed: anything about a database that already holds ``ls_`` objects (use
    :func:`upgrade`)."""
    ddl = _latest_ddl(conn.dialect)
    if conn.dialect.name == "postgresql":
        conn.exec_driver_sql(";\n".join(ddl))  # one round trip (psycopg2 sends a script as it is)
    else:
        for statement in ddl:
            conn.exec_driver_sql(statement)
    _seed_epoch(conn, now)
    _seed_coordination(conn, now)
    _seed_publisher(conn)
    conn.execute(sa.insert(meta).values(key="schema_version", value=str(LATEST)))
    return LATEST


def current_version(conn: Connection) -> int:
    """The metadata schema version of the database (0: no lakestep catalog yet).

    A ``ls_meta`` table without a readable version is a damaged catalog
    (:class:`CatalogCorruptError`), never taken for an empty one.
    """
    if not sa.inspect(conn).has_table("ls_meta"):
        return 0
    row = conn.execute(sa.select(meta.c.value).where(meta.c.key == "schema_version")).first()
    if row is None:
        raise CatalogCorruptError("the catalog database has an ls_meta table but no schema_version row: it is "
                                  "damaged or not a lakestep catalog (nothing was changed)")
    try:
        version = int(row[0])
    except (TypeError, ValueError):
        version = -1
    if version < 1:
        raise CatalogCorruptError(f"the catalog's schema_version is {row[0]!r}, not a version number: the "
                                  "catalog is damaged (nothing was changed)")
    return version


def lakestep_objects(conn: Connection) -> list[str]:
    """Tables and views named like lakestep's (``ls_*``) in the database."""
    insp = sa.inspect(conn)
    names = list(insp.get_table_names()) + list(insp.get_view_names())
    return sorted(n for n in names if n.lower().startswith("ls_"))


def upgrade(conn: Connection, *, target: int = LATEST) -> int:
    """Apply the migrations the database lacks, up to ``target``; return the version.

    The caller holds the catalog's write lock and an open transaction.
    """
    found = current_version(conn)
    if found > LATEST:
        raise CatalogVersionError(
            f"the catalog database has metadata schema version {found}, this lakestep "
            f"supports up to {LATEST}: upgrade lakestep",
            found=found,
            supported=LATEST,
        )
    for number, migrate in MIGRATIONS:
        if found < number <= target:
            migrate(conn)
            found = number
            stmt = (
                sa.update(meta).where(meta.c.key == "schema_version").values(value=str(number))
            )
            if conn.execute(stmt).rowcount == 0:
                conn.execute(sa.insert(meta).values(key="schema_version", value=str(number)))
    return found
