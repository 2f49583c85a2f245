"""The catalog's own metadata schema: the tables of the catalog database.

Every table is prefixed ``ls_`` so that a catalog can share a database with
other applications. The comment above each table says which metadata schema
version added it; ``migrations.py`` creates and upgrades a database to these
definitions (``ls_meta`` holds the version).

Times are stored as float seconds since the Unix epoch (UTC): portable across
SQLite and PostgreSQL, and exact enough to order commits (commit times are
also forced to increase per table, see ``commit.py``).
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql.expression import ColumnElement

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
    # the barrier layer derives from its commits; see STAMP_SQL below.
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
