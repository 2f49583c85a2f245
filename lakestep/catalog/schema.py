"""The catalog's own metadata schema, and how it is created and upgraded.

Every table is prefixed ``ls_`` so that a catalog can share a database with
other applications. ``ls_meta`` holds the schema version; :func:`upgrade`
applies the numbered migrations a database lacks, under a lock, and refuses a
database written by a newer lakestep (:class:`CatalogVersionError`).

Times are stored as float seconds since the Unix epoch (UTC): portable across
SQLite and PostgreSQL, and exact enough to order commits (commit times are
also forced to increase per table, see ``commit.py``).
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, Callable

import sqlalchemy as sa
from sqlalchemy.engine import Connection
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql.expression import ColumnElement

from ..errors import CatalogCorruptError, CatalogVersionError
from .files import file_stats_rows

metadata = sa.MetaData()

# SQLite only auto-increments an INTEGER PRIMARY KEY; PostgreSQL wants BIGINT.
BigId = sa.BigInteger().with_variant(sa.Integer(), "sqlite")

meta = sa.Table(
    "ls_meta",
    metadata,
    sa.Column("key", sa.String(128), primary_key=True),
    sa.Column("value", sa.Text, nullable=False),
)

namespaces = sa.Table(
    "ls_namespace",
    metadata,
    sa.Column("name", sa.String(128), primary_key=True),
    sa.Column("properties", sa.Text, nullable=False, default="{}"),
    sa.Column("created_at", sa.Float, nullable=False),
)

tables = sa.Table(
    "ls_table",
    metadata,
    sa.Column("table_id", BigId, primary_key=True, autoincrement=True),
    sa.Column("namespace", sa.String(128), nullable=False),
    sa.Column("name", sa.String(128), nullable=False),
    sa.Column("location", sa.Text, nullable=False),
    sa.Column("external", sa.Boolean, nullable=False, default=False),
    sa.Column("schema_ipc", sa.LargeBinary, nullable=False),
    # Bumped by every schema change (additive evolution: Table.add_columns); a
    # commit that rewrites files must have read them with the current schema.
    sa.Column("schema_id", sa.Integer, nullable=False, default=0, server_default="0"),
    sa.Column("partition_by", sa.Text, nullable=False, default="[]"),
    sa.Column("primary_key", sa.Text, nullable=False, default="[]"),
    sa.Column("properties", sa.Text, nullable=False, default="{}"),
    sa.Column("created_at", sa.Float, nullable=False),
    # The head: bumped by every commit under the table row's lock.
    sa.Column("version", sa.BigInteger, nullable=False, default=0),
    sa.Column("data_version", sa.BigInteger, nullable=False, default=0),
    sa.Column("last_commit_at", sa.Float, nullable=False),
    # The change stamp (version 9): set by every change of the row or of the facts
    # the barrier layer derives from its commits; see the comment above _v9.
    sa.Column("stamp", sa.BigInteger, nullable=False, default=0, server_default="0"),
    # Column ids (version 11, columns.py): [[path, id], ...] of the physical schema, the
    # highest id ever given, and the path -> id mapping of files written before ids.
    sa.Column("column_ids", sa.Text, nullable=True),
    sa.Column("last_column_id", sa.Integer, nullable=False, default=0, server_default="0"),
    sa.Column("name_mapping", sa.Text, nullable=True),
    sa.UniqueConstraint("namespace", "name", name="ls_table_ident"),
    sa.Index("ls_table_stamp", "stamp"),
)

# Every schema a table has had (version 12, columns.py rule 6): the schema (Arrow IPC,
# the table's columns), its column ids, and the version it took effect at. Rows are
# never changed; a time-travel read takes the newest row at or below its version.
schemas = sa.Table(
    "ls_schema",
    metadata,
    sa.Column("table_id", sa.BigInteger, primary_key=True),
    sa.Column("schema_id", sa.Integer, primary_key=True),
    sa.Column("version", sa.BigInteger, nullable=False),
    sa.Column("schema_ipc", sa.LargeBinary, nullable=False),
    sa.Column("column_ids", sa.Text, nullable=False),
    sa.Column("last_column_id", sa.Integer, nullable=False),
    sa.Column("primary_key", sa.Text, nullable=False, default="[]"),
    sa.Column("partition_by", sa.Text, nullable=False, default="[]"),
)

# One row per catalog transaction (one or several table commits). The uuid lets
# a writer whose connection broke during COMMIT find out whether it landed; the
# (job_id, batch_id) key makes replays idempotent.
txns = sa.Table(
    "ls_txn",
    metadata,
    sa.Column("txn_id", BigId, primary_key=True, autoincrement=True),
    sa.Column("txn_uuid", sa.String(36), nullable=False, unique=True),
    sa.Column("job_id", sa.String(256), nullable=True),
    sa.Column("batch_id", sa.BigInteger, nullable=True),
    sa.Column("committed_at", sa.Float, nullable=False),
    sa.UniqueConstraint("job_id", "batch_id", name="ls_txn_idempotency"),
)

commits = sa.Table(
    "ls_commit",
    metadata,
    sa.Column("table_id", sa.BigInteger, primary_key=True),
    sa.Column("version", sa.BigInteger, primary_key=True),
    sa.Column("data_version", sa.BigInteger, nullable=False),
    sa.Column("operation", sa.String(16), nullable=False),
    sa.Column("base_version", sa.BigInteger, nullable=False),
    sa.Column("txn_id", sa.BigInteger, nullable=True),
    sa.Column("barrier", sa.BigInteger, nullable=True),
    sa.Column("committed_at", sa.Float, nullable=False),
    sa.Column("added_files", sa.Integer, nullable=False, default=0),
    sa.Column("removed_files", sa.Integer, nullable=False, default=0),
    sa.Column("added_rows", sa.BigInteger, nullable=False, default=0),
    sa.Column("removed_rows", sa.BigInteger, nullable=False, default=0),
    sa.Column("summary", sa.Text, nullable=False, default="{}"),
    sa.Index("ls_commit_time", "table_id", "committed_at"),
    sa.Index("ls_commit_txn", "txn_id"),
)

files = sa.Table(
    "ls_file",
    metadata,
    sa.Column("file_id", BigId, primary_key=True, autoincrement=True),
    sa.Column("table_id", sa.BigInteger, nullable=False),
    # Relative to the table's location. The same path may appear in several rows
    # when a commit re-adds a file (undoing a compaction): cleanup counts paths.
    sa.Column("path", sa.Text, nullable=False),
    sa.Column("added_version", sa.BigInteger, nullable=False),
    sa.Column("removed_version", sa.BigInteger, nullable=True),
    sa.Column("record_count", sa.BigInteger, nullable=False),
    sa.Column("file_size", sa.BigInteger, nullable=False),
    sa.Column("partition", sa.Text, nullable=False, default="{}"),
    sa.Column("stats", sa.Text, nullable=False, default="{}"),
    # Compaction outputs: the file ids they were made from (JSON list), so a
    # later delete can undo the compaction by metadata where they overlap.
    sa.Column("source_ids", sa.Text, nullable=True),
    # Position of the file's rows in commit order, for merge-on-read of
    # primary-key tables: NULL means added_version. Rewrites and re-adds keep
    # their source's sequence; a compaction output takes its newest input's.
    sa.Column("seq", sa.BigInteger, nullable=True),
    sa.Index("ls_file_live", "table_id", "removed_version"),
    sa.Index("ls_file_added", "table_id", "added_version"),
    # version 7: reads that pin every partition column list only those partitions
    sa.Index("ls_file_partition", "table_id", "partition"),
)


# --- version 2: snapshots, version locks, the open epoch ---------------------
snapshots = sa.Table(
    "ls_snapshot",
    metadata,
    sa.Column("table_id", sa.BigInteger, primary_key=True),
    sa.Column("name", sa.String(256), primary_key=True),
    sa.Column("version", sa.BigInteger, nullable=False),
    sa.Column("barrier", sa.BigInteger, nullable=True),
    sa.Column("created_at", sa.Float, nullable=False),
    sa.Column("expires_at", sa.Float, nullable=True),  # NULL: retained until dropped
    sa.Index("ls_snapshot_version", "table_id", "version"),
    sa.Index("ls_snapshot_barrier", "table_id", "barrier"),
)

# A reader pins a table version: cleanup keeps every file it references until
# the lock is released or its lease expires (NULL expires_at: permanent).
locks = sa.Table(
    "ls_lock",
    metadata,
    sa.Column("lock_id", BigId, primary_key=True, autoincrement=True),
    sa.Column("locker", sa.String(256), nullable=False),
    sa.Column("table_id", sa.BigInteger, nullable=False),
    sa.Column("version", sa.BigInteger, nullable=False),
    sa.Column("kind", sa.String(32), nullable=False),
    sa.Column("created_at", sa.Float, nullable=False),
    sa.Column("expires_at", sa.Float, nullable=True),
    sa.Index("ls_lock_table", "table_id", "version"),
    sa.Index("ls_lock_locker", "locker"),
)

# One row: the open epoch (docs/design.md §3.1). Root commits read it FOR SHARE in
# their commit transaction; sealing updates it FOR UPDATE.
epoch = sa.Table(
    "ls_epoch",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=False),
    sa.Column("open_epoch", sa.BigInteger, nullable=False),
    sa.Column("opened_at", sa.Float, nullable=False),
)


# --- version 3: the barrier coordinator (lakestep/barrier) -------------------
# The topology: jobs and the tables they read and write (FLIP-276's
# __META_JOB_SOURCE / __META_JOB_SINK). Retired jobs keep their rows.
jobs = sa.Table(
    "ls_job",
    metadata,
    sa.Column("job_id", sa.String(256), primary_key=True),
    sa.Column("external_input", sa.Boolean, nullable=False),
    # The committed barrier when the job was registered: its derived sinks
    # join the COMMIT set once they have caught up with it.
    sa.Column("joined_barrier", sa.BigInteger, nullable=False, default=0),
    sa.Column("created_at", sa.Float, nullable=False),
    sa.Column("updated_at", sa.Float, nullable=False),
    sa.Column("retired_at", sa.Float, nullable=True),
    sa.Column("description", sa.Text, nullable=False, default=""),
)

job_sources = sa.Table(
    "ls_job_source",
    metadata,
    sa.Column("job_id", sa.String(256), primary_key=True),
    sa.Column("table_id", sa.BigInteger, primary_key=True),
    sa.Index("ls_job_source_table", "table_id"),
)

job_sinks = sa.Table(
    "ls_job_sink",
    metadata,
    sa.Column("job_id", sa.String(256), primary_key=True),
    sa.Column("table_id", sa.BigInteger, primary_key=True),
    sa.Index("ls_job_sink_table", "table_id"),
)

# One row: bumped by every topology change (serializes them, keys caches).
topology = sa.Table(
    "ls_topology",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=False),
    sa.Column("generation", sa.BigInteger, nullable=False),
    sa.Column("updated_at", sa.Float, nullable=False),
)

# One row per sealed epoch, written in the sealing transaction.
seals = sa.Table(
    "ls_seal",
    metadata,
    sa.Column("barrier", sa.BigInteger, primary_key=True, autoincrement=False),
    sa.Column("opened_at", sa.Float, nullable=False),
    sa.Column("sealed_at", sa.Float, nullable=False),
    sa.Column("holder", sa.String(256), nullable=False),
    sa.Column("token", sa.BigInteger, nullable=False),
)

# One row: the coordinator lease. ``token`` grows with every acquisition and
# fences a stale holder out; times are the database's clock.
coordinator = sa.Table(
    "ls_coordinator",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=False),
    sa.Column("holder", sa.String(256), nullable=True),
    sa.Column("token", sa.BigInteger, nullable=False),
    sa.Column("acquired_at", sa.Float, nullable=True),
    sa.Column("expires_at", sa.Float, nullable=False),
    sa.Column("snapshot_barrier", sa.BigInteger, nullable=False),  # newest barrier snapshotted
)

rollbacks = sa.Table(
    "ls_rollback",
    metadata,
    sa.Column("rollback_id", BigId, primary_key=True, autoincrement=True),
    sa.Column("to_barrier", sa.BigInteger, nullable=False),
    sa.Column("open_epoch", sa.BigInteger, nullable=False),
    sa.Column("created_at", sa.Float, nullable=False),
    sa.Column("summary", sa.Text, nullable=False, default="{}"),
)

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


def _v1(conn: Connection) -> None:
    for t in (meta, namespaces, tables, txns, commits, files):
        t.create(conn, checkfirst=True)


def _v2(conn: Connection) -> None:
    import time

    for t in (snapshots, locks, epoch):
        t.create(conn, checkfirst=True)
    conn.execute(sa.insert(epoch).values(id=1, open_epoch=1, opened_at=time.time()))


def _v3(conn: Connection) -> None:
    import time

    for t in (jobs, job_sources, job_sinks, topology, seals, coordinator, rollbacks):
        t.create(conn, checkfirst=True)
    for ddl in _V3_INDEXES:
        conn.exec_driver_sql(ddl)
    if "ls_lineage" not in sa.inspect(conn).get_view_names():
        conn.exec_driver_sql(_LINEAGE_VIEW)
    now = time.time()
    conn.execute(sa.insert(topology).values(id=1, generation=1, updated_at=now))
    conn.execute(sa.insert(coordinator).values(id=1, holder=None, token=0, acquired_at=None, expires_at=0.0,
                                               snapshot_barrier=0))


# Numbered migrations. Append only; never edit a released one.
# --- version 4: what the lakestep sources of a streaming job agreed to read ----
# Each Spark source of a job runs in its own process; the n-th latestOffset()
# call of every source since the job's batch started at barrier ``start``
# belongs to the same trigger, so they all use the one decision recorded under
# (job, start, call): the first to arrive records it (lakestep/streaming/progress.py).
job_triggers = sa.Table(
    "ls_job_trigger",
    metadata,
    sa.Column("job_id", sa.String(256), primary_key=True),
    sa.Column("start_barrier", sa.BigInteger, primary_key=True),
    sa.Column("call_no", sa.Integer, primary_key=True),
    sa.Column("end_barrier", sa.BigInteger, nullable=False),
    sa.Column("created_at", sa.Float, nullable=False),
)


def _v4(conn: Connection) -> None:
    job_triggers.create(conn, checkfirst=True)


# --- version 5: ls_table.schema_id (additive schema evolution) -------------------
def _v5(conn: Connection) -> None:
    if "schema_id" not in {c["name"] for c in sa.inspect(conn).get_columns("ls_table")}:
        conn.exec_driver_sql("ALTER TABLE ls_table ADD COLUMN schema_id INTEGER NOT NULL DEFAULT 0")


# --- version 6: trigger decisions numbered in the order they were made -----------
# A decision belongs to one run of a query: a source counts as its run's the
# decisions numbered above the newest one of the job when it was created, and
# a sink finds its batch's decision as the newest one that read anything at the
# batch's start (lakestep/barrier/triggers.py). Numbers come from the database,
# never from a clock; SQLite's AUTOINCREMENT never reuses a number. Replaces
# ls_job_trigger, whose rows (call numbers restarting with each run) are copied
# over in the order they were made.
trigger_decisions = sa.Table(
    "ls_trigger_decision",
    metadata,
    sa.Column("decision_id", BigId, primary_key=True, autoincrement=True),
    sa.Column("job_id", sa.String(256), nullable=False),
    sa.Column("start_barrier", sa.BigInteger, nullable=False),
    sa.Column("call_no", sa.Integer, nullable=False),
    sa.Column("end_barrier", sa.BigInteger, nullable=False),
    sa.Column("created_at", sa.Float, nullable=False),  # informational only
    sa.UniqueConstraint("job_id", "start_barrier", "call_no", name="ls_trigger_decision_call"),
    sqlite_autoincrement=True,
)


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


# --- version 8: column statistics in typed, indexed rows ---------------------------
# ``ls_file.stats`` (JSON) stays the record every verdict is made from; these rows
# copy the bounds that SQL compares exactly (integers, booleans, dates: one BIGINT
# each), so that a read whose filter bounds such a column lets the database list
# the candidate files through an index instead of parsing every live file's JSON
# (``stats_sql.py``). One row per (file, column) whose bounds are exact integers,
# or whose values are all null; ``width`` is the bit length of max - min, so that
# a point lookup is a bounded index range per width (a file's min lies within
# 2**width of any value it holds). ``ls_stats_columns`` records each distinct set
# of columns that the files of a table have rows for: a column missing from one
# of them turns the SQL narrowing off for that column (a file without a row may
# hold anything). Rows are keyed by file_id and deleted with their file row.
file_stats = sa.Table(
    "ls_file_stats",
    metadata,
    sa.Column("file_id", sa.BigInteger, primary_key=True),
    sa.Column("column_name", sa.String(128), primary_key=True),
    sa.Column("table_id", sa.BigInteger, nullable=False),
    sa.Column("null_count", sa.BigInteger, nullable=False),
    sa.Column("min_value", sa.BigInteger, nullable=True),  # NULL (with max and width): every value is null
    sa.Column("max_value", sa.BigInteger, nullable=True),
    sa.Column("width", sa.Integer, nullable=True),
    sa.Index("ls_file_stats_bounds", "table_id", "column_name", "width", "min_value", "max_value", "file_id"),
    sqlite_with_rowid=False,  # the key is the table's order: one B-tree fewer to write per commit
)

stats_columns = sa.Table(
    "ls_stats_columns",
    metadata,
    sa.Column("table_id", sa.BigInteger, primary_key=True),
    sa.Column("digest", sa.String(64), primary_key=True),  # sha256 of ``columns``
    sa.Column("columns", sa.Text, nullable=False),  # JSON list of column names, sorted
)


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


def stats_rows(table_id: int, file_id: int, count: int, stats_json: str) -> tuple[list[dict[str, Any]], list[str]]:
    """The ``ls_file_stats`` rows of one file, and the columns they cover: the bounds that
    files.file_stats_rows copies from the file's statistics JSON."""
    got = file_stats_rows(count, stats_json)
    rows = [{"file_id": file_id, "table_id": table_id, "column_name": c, "null_count": n, "min_value": a,
             "max_value": b, "width": w} for c, n, a, b, w in got]
    return rows, [r[0] for r in got]


def columns_json(cols: list[str]) -> str:
    """A set of columns as ``ls_stats_columns.columns`` records it: a JSON list, sorted."""
    return json.dumps(sorted(cols), separators=(",", ":"))


def columns_digest(cols: list[str]) -> str:
    """The key of a set of columns in ``ls_stats_columns``: sha256 of :func:`columns_json`."""
    return hashlib.sha256(columns_json(cols).encode()).hexdigest()


# --- version 9: a change stamp per table --------------------------------------------
# A reader that keeps the barrier facts of many tables (barrier/progress.py,
# FactsCache) asks only for the rows that changed since its last look:
# ``stamp >= since``. Every writer of ``ls_table`` (a commit, create, rename,
# a cleanup that prunes commit rows) sets ``stamp`` to STAMP_SQL; a reader's
# next ``since`` is WATERMARK_SQL, read in the same statement as the rows.
#
# * PostgreSQL: the stamp is the writer's transaction id (txid_current()), the
#   watermark the xmin of the reader's snapshot: every transaction below it has
#   ended, so it is visible now or never; a transaction at or above it may
#   land later (ids are taken at a transaction's first write, not at its
#   commit), and ``>=`` will still see it.
# * SQLite: one writer at a time, so max(stamp) + 1 orders the writers; the
#   watermark is the same expression, read in the reader's snapshot.
#
# Deleting a row (drop_table) can lower max(stamp) on SQLite and is invisible to
# ``stamp >= since`` anyway: a drop bumps ``ls_topology.generation``, and a reader
# that sees a new generation starts over from ``since = 0``.
STAMP_SQL = {
    "sqlite": "(SELECT COALESCE(max(stamp), 0) + 1 FROM ls_table)",
    "postgresql": "txid_current()",
}
WATERMARK_SQL = {
    "sqlite": STAMP_SQL["sqlite"],
    "postgresql": "txid_snapshot_xmin(txid_current_snapshot())",
}


class NextStamp(ColumnElement[int]):
    """The value a writer sets ``ls_table.stamp`` to (STAMP_SQL of the dialect)."""

    type = sa.BigInteger()
    inherit_cache = True


@compiles(NextStamp)
def _next_stamp(element: NextStamp, compiler: Any, **kw: Any) -> str:
    return STAMP_SQL.get(compiler.dialect.name, STAMP_SQL["sqlite"])


def _v9(conn: Connection) -> None:
    if "stamp" not in {c["name"] for c in sa.inspect(conn).get_columns("ls_table")}:
        conn.exec_driver_sql("ALTER TABLE ls_table ADD COLUMN stamp BIGINT NOT NULL DEFAULT 0")
    if "ls_table_stamp" not in {i["name"] for i in sa.inspect(conn).get_indexes("ls_table")}:
        conn.exec_driver_sql("CREATE INDEX ls_table_stamp ON ls_table (stamp)")


# --- version 10: Iceberg publishing (lakestep/iceberg) ------------------------------
# ``ls_publisher`` (one row): whether the catalog publishes its tables as Iceberg
# tables, the publisher's lease (a fencing token, as the coordinator's) and its
# progress: ``complete_barrier``, the newest barrier whose tag every published
# table has (``main`` never moves past it), and the newest rollback it handled.
# ``ls_published_table``: per lakestep table, what was published (the Iceberg
# identifier, the metadata file, the newest version and barrier, the last error).
# ``ls_published_snapshot``: every Iceberg snapshot a publisher made or is about
# to make, with the lakestep version it shows. A row is written before the
# snapshot becomes visible and deleted after the snapshot expired, so cleanup
# (cleanup.py ``_pinned``) keeps every file a retained Iceberg snapshot names.
publisher = sa.Table(
    "ls_publisher",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=False),
    sa.Column("enabled", sa.Boolean, nullable=False, default=False),
    sa.Column("holder", sa.String(256), nullable=True),
    sa.Column("token", sa.BigInteger, nullable=False, default=0),
    sa.Column("acquired_at", sa.Float, nullable=True),
    sa.Column("expires_at", sa.Float, nullable=False, default=0.0),
    sa.Column("complete_barrier", sa.BigInteger, nullable=True),
    sa.Column("rollback_id", sa.BigInteger, nullable=False, default=0),
    sa.Column("round_at", sa.Float, nullable=True),  # when the last round ended (catalog clock)
    sa.Column("error", sa.Text, nullable=True),  # the last round's error, None when it succeeded
)

published_tables = sa.Table(
    "ls_published_table",
    metadata,
    sa.Column("table_id", sa.BigInteger, primary_key=True, autoincrement=False),
    sa.Column("namespace", sa.String(128), nullable=False),
    sa.Column("name", sa.String(128), nullable=False),
    sa.Column("metadata_location", sa.Text, nullable=True),
    sa.Column("version", sa.BigInteger, nullable=True),  # the newest version a snapshot shows
    sa.Column("barrier", sa.BigInteger, nullable=True),  # the newest barrier tagged
    sa.Column("main_version", sa.BigInteger, nullable=True),  # the version main shows
    sa.Column("error", sa.Text, nullable=True),
    sa.Column("error_at", sa.Float, nullable=True),
    sa.Column("updated_at", sa.Float, nullable=False),
)

published_snapshots = sa.Table(
    "ls_published_snapshot",
    metadata,
    sa.Column("table_id", sa.BigInteger, primary_key=True, autoincrement=False),
    sa.Column("snapshot_id", sa.BigInteger, primary_key=True, autoincrement=False),
    sa.Column("version", sa.BigInteger, nullable=False),
    sa.Column("barrier", sa.BigInteger, nullable=True),
    sa.Column("created_at", sa.Float, nullable=False),
    sa.Index("ls_published_snapshot_version", "table_id", "version"),
)


def _v10(conn: Connection) -> None:
    for t in (publisher, published_tables, published_snapshots):
        t.create(conn, checkfirst=True)
    if conn.execute(sa.select(publisher.c.id)).first() is None:
        conn.execute(sa.insert(publisher).values(id=1, enabled=False, holder=None, token=0, expires_at=0.0,
                                                 complete_barrier=None, rollback_id=0))


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


def record_schema(conn: Connection, table_id: int, version: int) -> None:
    """Insert the table row's current schema into ``ls_schema`` as taking effect at ``version``
    (create_table and every schema change, in their transaction)."""
    t = tables.c
    conn.execute(sa.insert(schemas).from_select(
        ["table_id", "schema_id", "version", "schema_ipc", "column_ids", "last_column_id", "primary_key",
         "partition_by"],
        sa.select(t.table_id, t.schema_id, sa.literal(version, sa.BigInteger), t.schema_ipc,
                  sa.func.coalesce(t.column_ids, "[]"), t.last_column_id, t.primary_key, t.partition_by)
        .where(t.table_id == table_id)))


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
    conn.execute(sa.insert(epoch).values(id=1, open_epoch=1, opened_at=now))
    conn.execute(sa.insert(topology).values(id=1, generation=1, updated_at=now))
    conn.execute(sa.insert(coordinator).values(id=1, holder=None, token=0, acquired_at=None, expires_at=0.0,
                                               snapshot_barrier=0))
    conn.execute(sa.insert(publisher).values(id=1, enabled=False, holder=None, token=0, expires_at=0.0,
                                             complete_barrier=None, rollback_id=0))
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
