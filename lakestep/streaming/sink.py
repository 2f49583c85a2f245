"""The lakestep streaming sink: ``df.writeStream.format("lakestep")``.

Protocol of one micro-batch (numbered as it runs):

1. executors (``write``): each task turns its Arrow batches into rows of the
   table's schema (a mismatch fails the task with :class:`SchemaMismatchError`:
   nothing is committed) and writes Parquet files named
   ``b<batch>-p<partition>-a<attempt>-<uuid>.parquet``. Executors never talk to
   the catalog database; they return the list of files written;
2. driver (``commit``), one catalog transaction:
   * root job (external input, e.g. Kafka): the files are published tagged
     with the open epoch, idempotently per ``(job, batchId)``: Spark's replay
     of a batch after a crash returns the first commit;
   * derived job: the batch's barriers are the ones its lakestep sources
     agreed on (``microbatch.py``); the files are published through a
     :class:`~lakestep.barrier.JobBatch`, tagged with the batch's barrier,
     idempotent per (job, barrier). An empty micro-batch still commits, and so
     precommits its barrier;
   * a dead-letter table (option ``deadLetterTable``) receives the rows whose
     ``_ls_error`` column is set, in the same transaction;
   While the catalog database is unavailable, the commit waits
   (:func:`lakestep.retry.retrying`: bounded exponential backoff, one log
   line when the wait starts, one when it ends) up to ``catalogWaitSeconds``
   (default 300), then fails the batch with
   :class:`~lakestep.errors.CatalogWaitExpiredError`. A commit whose answer
   was lost is looked up by its uuid (catalog/commit.py step 3), never made
   twice; a commit whose outcome stays unknown is not redone here (a redo
   would be told "replay" and delete the landed commit's files): the batch
   fails, and Spark's replay of it is recognised by ``(job, batchId)``;
3. on failure (``abort``): nothing is deleted. A commit that failed may still
   have landed (its connection died after the database committed, or the
   query was stopped while the commit ran in its Python worker, which may
   finish it after Spark gave up on it), and deleting its files would lose
   committed rows. The files no commit recorded are orphans that ``cleanup``
   removes once they are older than the table's retention window.
   Not guaranteed: orphans take storage until cleanup runs.

Options: ``catalog`` (database URL, required), ``table`` (required), ``job``
(default: ``spark-<table>``), ``mode`` (``append`` | ``update`` (upsert,
primary-key tables) | ``complete`` (overwrite); default from Spark's output
mode and the table), ``deadLetterTable``, ``mergeSchema`` (``true``: columns
the table lacks are added to it as nullable columns when the query starts;
default: such a query is refused before it writes anything), ``storage.<name>``
(object-store options, :class:`lakestep.catalog.storage.Storage`: the driver opens
the catalog with them and hands them to the executors with the table's shape;
default: the AWS environment), ``catalogWaitSeconds`` (how long a commit waits
for an unavailable catalog database, step 2; default 300).

Output modes: Spark 4 hands a Python sink only the append and complete
output modes (``outputMode("update")`` fails with "lakestep does not support
Update mode": Spark requires a JVM-only capability for it). Upserts therefore
come two ways: rows streamed in append output mode into a primary-key table
(``mode`` defaults to ``update`` there), and stateful aggregations in update
output mode through :func:`lakestep.streaming.foreach_batch` with
``mode="update"``.
"""

from __future__ import annotations

import logging
import pickle
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Literal, Sequence, cast

import pyarrow as pa

from .. import retry as _retry
from ..catalog.changes import FilesMode
from ..catalog.columns import ColumnIds
from ..catalog.files import NewFile
from ..catalog.plan import SerializedSchemas
from ..catalog.storage import Storage
from ..catalog.writer import FileWriter
from ..catalog.writes import conform
from ..errors import InvalidArgumentError
from . import microbatch
from .catalog_cache import open_catalog, required, storage_of
from .compat import DataSourceStreamArrowWriter, WriterCommitMessage, to_arrow_schema
from .executors import freeze_worker_heap

log = logging.getLogger(__name__)

ERROR_COL = "_ls_error"
#: The one column of a query whose rows are file lists already written (lakestep.streaming.kafka.ingest).
STAGED_COLUMN = "_ls_files"
#: What a sink does with a micro-batch: append rows, upsert them by key, or replace the table.
SinkMode = Literal["append", "update", "complete"]
_FLUSH_ROWS = 1_000_000


@dataclass
class FilesWritten(WriterCommitMessage):
    files: list[NewFile] = field(default_factory=list)
    dead_letters: list[NewFile] = field(default_factory=list)
    rows: int = 0


@dataclass
class StagedFiles(FilesWritten):
    """The files one task wrote for ``table``, before any commit: the row of
    :data:`STAGED_COLUMN` a ``lakestep-kafka-ingest`` task yields (lakestep.streaming.kafka.ingestion)."""

    table: str = ""


def gather(batches: Iterator[pa.RecordBatch], table: str) -> FilesWritten:
    """Sink side (executors): the file lists of a task's rows of :data:`STAGED_COLUMN`, as one message.

    Raises:
        SchemaMismatchError: a list was written for another table than ``table``.
    """
    from ..errors import SchemaMismatchError

    out = FilesWritten()
    for rb in batches:
        for blob in rb.column(STAGED_COLUMN).to_pylist():
            staged = pickle.loads(blob)
            if not isinstance(staged, StagedFiles) or staged.table != table:
                got = staged.table if isinstance(staged, StagedFiles) else type(staged).__name__
                raise SchemaMismatchError(table, [f"{STAGED_COLUMN} holds files written for {got!r}, not for "
                                                  f"{table!r}: start the query with lakestep.streaming.kafka.ingest"])
            out.files += staged.files
            out.rows += staged.rows
    return out


@dataclass(frozen=True)
class TableShape(SerializedSchemas):
    """What executors need of a table: no database access."""

    ident: str
    location: str
    schema_ipc: bytes
    physical_ipc: bytes
    partition_by: tuple[str, ...]
    primary_key: tuple[str, ...]
    storage: Storage = Storage()  # how executors reach an object store (the catalog's options)
    column_ids: tuple[str, int] | None = None  # (JSON, last) of catalog/columns.py: the files' field ids

    @classmethod
    def of(cls, table: Any) -> "TableShape":
        ids = table.meta.column_ids
        return cls(table.ident, table.location, table.schema.serialize().to_pybytes(),
                   table.physical_schema.serialize().to_pybytes(), tuple(table.partition_by),
                   tuple(table.primary_key), table.catalog.storage,
                   None if ids is None else (ids.to_json(), ids.last))

    def store(self) -> FileWriter:
        ids = None if self.column_ids is None else ColumnIds.from_json(*self.column_ids)
        return FileWriter(self.location, self.storage, column_ids=ids, schema=self.schema)



def _physical(shape: TableShape, rows: pa.Table) -> pa.Table:
    if not shape.primary_key:
        return rows
    from ..catalog import pk

    dedup = pk.last_per_key(rows, shape.primary_key)
    flag = pa.array([False] * dedup.num_rows, pa.bool_())
    return pa.Table.from_arrays(list(dedup.columns) + [flag], schema=shape.physical_schema)


def task_prefix(ctx: Any, batch: int | None = None) -> str:
    """``b<batch>-p<partition>-a<attempt>-``: where a staged file came from (ctx: a TaskContext or None)."""
    if batch is None and ctx is not None:
        batch = ctx.getLocalProperty("streaming.sql.batchId")
    return f"b{batch or 'x'}-p{ctx.partitionId() if ctx else 0}-a{ctx.attemptNumber() if ctx else 0}-"


class BatchFiles:
    """Executor side of a micro-batch: Arrow batches in, Parquet files of the table out.

    Rows are conformed to the table's schema (:class:`SchemaMismatchError`
    otherwise); rows whose ``_ls_error`` is set go to the dead-letter table.
    Used by the sink's ``write`` and by :func:`lakestep.streaming.foreach_batch`.
    """

    def __init__(self, shape: TableShape, dead: TableShape | None) -> None:
        self.shape, self.dead = shape, dead

    def write(self, iterator: Iterator[pa.RecordBatch], prefix: str) -> FilesWritten:
        msg = FilesWritten()
        pending: list[pa.RecordBatch] = []
        n = 0
        for rb in iterator:
            pending.append(rb)
            n += rb.num_rows
            if n >= _FLUSH_ROWS:
                self._flush(pending, prefix, msg)
                pending, n = [], 0
        if pending:
            self._flush(pending, prefix, msg)
        return msg

    def _flush(self, batches: list[pa.RecordBatch], prefix: str, msg: FilesWritten) -> None:
        data = pa.Table.from_batches(batches)
        if data.num_rows == 0:
            return
        if ERROR_COL in data.column_names:
            errors = data.column(ERROR_COL)
            bad_mask = pa.compute.is_valid(errors)
            bad = data.filter(bad_mask)
            data = data.filter(pa.compute.invert(bad_mask)).drop_columns([ERROR_COL])
            if bad.num_rows:
                if self.dead is None:
                    raise InvalidArgumentError(
                        f"{bad.num_rows} row(s) carry {ERROR_COL} but the sink has no deadLetterTable",
                        argument="deadLetterTable", value=None)
                rows = conform(bad.select([c for c in bad.column_names if c in self.dead.schema.names]),
                               self.dead.schema, self.dead.ident)
                msg.dead_letters += self.dead.store().write_partitioned(
                    rows, list(self.dead.partition_by), prefix=prefix)
        if data.num_rows:
            if self.dead is not None:  # the dead-letter table's own columns are not the good rows'
                own = set(self.dead.schema.names) - set(self.shape.schema.names)
                data = data.drop_columns([c for c in data.column_names if c in own])
            rows = _physical(self.shape, conform(data, self.shape.schema, self.shape.ident))
            msg.files += self.shape.store().write_partitioned(
                rows, list(self.shape.partition_by), prefix=prefix)
            msg.rows += data.num_rows

    def delete(self, messages: Sequence[FilesWritten | None]) -> None:
        """Delete the files of ``messages`` (an aborted batch, or a replay's second copy)."""
        for m in messages:
            if m is None:
                continue
            for shape, files in ((self.shape, m.files), (self.dead, m.dead_letters)):
                if shape is not None:
                    writer = shape.store()
                    for f in files:
                        writer.delete(f.path)


@dataclass(frozen=True)
class SinkTarget:
    """Where a streaming job's micro-batches go: made on the driver, pickled to executors."""

    url: str
    job: str
    mode: SinkMode
    shape: TableShape
    dead: TableShape | None
    retry: _retry.RetryPolicy = _retry.STREAMING  # waiting out an unavailable catalog database (step 2)

    @classmethod
    def open(cls, url: str, table_name: str, *, job: str | None, mode: str | None, overwrite: bool = False,
             dead_letter: str | None = None, schema: Any = None, merge_schema: bool = False,
             storage: Storage | None = None, retry: _retry.RetryPolicy | None = None) -> "SinkTarget":
        """Check the options against the table and register the job (driver side only).

        ``schema``: the Spark schema of the rows to come. Columns the table
        lacks are refused here, before any file is written, unless
        ``merge_schema``: then they are added to the table as nullable columns.
        """
        cat = open_catalog(url, storage)
        table = cat.load_table(table_name)
        dead_table = cat.load_table(dead_letter) if dead_letter else None
        if schema is not None:
            evolve_schema(table, schema, dead_table, merge_schema)
        job = job or f"spark-{table.ident.replace('.', '-')}"
        mode = mode or ("complete" if overwrite else "update" if table.primary_key else "append")
        if mode not in ("append", "update", "complete"):
            raise InvalidArgumentError(f"option mode must be append, update or complete, got {mode!r}",
                                       argument="mode", value=mode)
        if mode == "update" and not table.primary_key:
            raise InvalidArgumentError(f"update mode upserts by primary key, and {table.ident} has none",
                                       argument="mode", value=mode)
        dead = TableShape.of(dead_table) if dead_table is not None else None
        microbatch.ensure_sink_registered(cat, job, table.ident, dead.ident if dead else None)
        return cls(url, job, cast(SinkMode, mode),  # one of SinkMode's, checked above
                   TableShape.of(table), dead, retry or _retry.STREAMING)

    def files(self) -> BatchFiles:
        return BatchFiles(self.shape, self.dead)

    def lacks(self, columns: Any) -> list[str]:
        """The ``columns`` of a batch the table has no place for."""
        return _unplaced(columns, self.shape.schema, self.dead.schema if self.dead else None)

    def commit(self, messages: Sequence[FilesWritten | None], batch_id: int) -> list[Any]:
        """Publish a micro-batch's files in one catalog transaction (driver side)."""
        files = [f for m in messages if m is not None for f in m.files]
        dead = [f for m in messages if m is not None for f in m.dead_letters]
        # upserts are appends to a primary-key table: the newest file wins per key
        mode: FilesMode = "overwrite" if self.mode == "complete" else "append"
        results = _retry.retrying(
            lambda: microbatch.commit_batch(open_catalog(self.url, self.shape.storage), self.job, batch_id,
                                            self.shape.ident, files, mode=mode,
                                            dead_letter=(self.dead.ident, dead) if self.dead else None),
            policy=self.retry, what=f"sink of job {self.job} (batch {batch_id})")
        if results and all(r.replayed for r in results):
            # a replay of a batch that had committed: these files are a second copy
            self.files().delete(messages)
        log.info("job %s batch %d: %s", self.job, batch_id, results)
        return results


def _unplaced(columns: Any, schema: pa.Schema, dead: pa.Schema | None) -> list[str]:
    """The ``columns`` that are neither the table's, nor the dead-letter table's, nor ``_ls_error``."""
    own = set(schema.names) | {ERROR_COL} | (set(dead.names) if dead is not None else set())
    return [c for c in columns if c not in own]


def evolve_schema(table: Any, spark_schema: Any, dead: Any, merge: bool) -> None:
    """Refuse, or with ``merge`` add (nullable), the columns of ``spark_schema`` that ``table`` lacks."""
    from ..errors import SchemaMismatchError

    arrow = to_arrow_schema(spark_schema)
    extra = [arrow.field(n) for n in _unplaced(arrow.names, table.schema, dead.schema if dead is not None else None)]
    if not extra:
        return
    if not merge:
        raise SchemaMismatchError(table.ident, [
            f"columns not in the table: {[f.name for f in extra]} (option mergeSchema=true adds them as "
            "nullable columns)"])
    table.add_columns(*(f.with_nullable(True) for f in extra))


def wait_policy(options: Any) -> _retry.RetryPolicy:
    """The option ``catalogWaitSeconds`` of a lakestep sink or source as a retry policy."""
    value = (options or {}).get("catalogWaitSeconds")
    if value is None:
        return _retry.STREAMING
    try:
        seconds = float(value)
    except ValueError:
        raise InvalidArgumentError(f"option catalogWaitSeconds must be a number of seconds, got {value!r}",
                                   argument="catalogWaitSeconds", value=value) from None
    if not seconds >= 0:  # NaN too
        raise InvalidArgumentError(f"option catalogWaitSeconds must be >= 0 seconds, got {value!r}",
                                   argument="catalogWaitSeconds", value=value)
    return _retry.RetryPolicy(deadline=seconds)


def parse_flag(value: Any, option: str = "mergeSchema") -> bool:
    v = str(value or "false").strip().lower()
    if v not in ("true", "false"):
        raise InvalidArgumentError(f"option {option} must be true or false, got {value!r}", argument=option,
                                   value=value)
    return v == "true"


class LakestepStreamWriter(DataSourceStreamArrowWriter):
    def __init__(self, options: Any, overwrite: bool, schema: Any = None) -> None:
        # Runs on the driver side: the only place that reads the catalog. Spark makes a new writer for
        # micro-batches of a running query too, so it waits out an unavailable database like a commit.
        url, table, policy = required(options, "catalog"), required(options, "table"), wait_policy(options)
        #: the rows are lists of files already written (lakestep.streaming.kafka.ingest), not the table's rows
        self.staged = schema is not None and list(schema.fieldNames()) == [STAGED_COLUMN]
        self.target = _retry.retrying(
            lambda: SinkTarget.open(url, table, job=options.get("job"), mode=options.get("mode"),
                                    overwrite=overwrite, dead_letter=options.get("deadLetterTable"),
                                    schema=None if self.staged else schema,
                                    merge_schema=parse_flag(options.get("mergeSchema")),
                                    storage=storage_of(options), retry=policy),
            policy=policy, what=f"sink of {table} (writer)")

    def write(self, iterator: Iterator[pa.RecordBatch]) -> FilesWritten:  # executors
        from pyspark import TaskContext

        freeze_worker_heap()
        if self.staged:
            return gather(iterator, self.target.shape.ident)
        return self.target.files().write(iterator, task_prefix(TaskContext.get()))

    # Spark hands commit and abort what the tasks' write returned: FilesWritten (the casts)
    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:  # driver
        self.target.commit(cast("list[FilesWritten | None]", messages), batchId)

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:  # driver
        # Step 3: keep the files (the commit may have landed, or land yet); cleanup takes orphans.
        n = sum(len(m.files) + len(m.dead_letters) for m in cast("list[FilesWritten | None]", messages)
                if m is not None)
        log.warning("job %s batch %d aborted: its %d file(s) are kept (a commit may have landed); cleanup "
                    "removes the ones no commit recorded", self.target.job, batchId, n)


def task_writer(target: SinkTarget, batch_id: int) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """A ``mapInArrow`` function (executors): each task writes its rows as files of ``target``
    (:class:`BatchFiles`) and yields one row, ``m``: its pickled :class:`FilesWritten`. What
    :func:`lakestep.streaming.foreach_batch` and :class:`~lakestep.streaming.DerivedJob` write with
    when Spark's own writer does not (schema ``"m binary"``)."""

    def write(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:  # executors
        from pyspark import TaskContext

        freeze_worker_heap()
        msg = target.files().write(batches, task_prefix(TaskContext.get(), batch_id))
        yield pa.RecordBatch.from_pydict({"m": [pickle.dumps(msg)]}, pa.schema([("m", pa.binary())]))

    return write
