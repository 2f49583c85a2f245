"""Spark batch reads and writes of lakestep tables: ``spark.read`` / ``df.write`` with ``format("lakestep")``.

Reads (:class:`LakestepBatchReader`)::

    spark.read.format("lakestep").option("catalog", url).option("table", "shop.orders").load()

1. on the driver, the version to read is chosen once, from at most one of
   the options ``versionAsOf``, ``timestampAsOf`` (ISO), ``snapshot``,
   ``barrier``, or ``level`` (``read_committed`` by default; with ``scope``:
   the table aligned with the others of its scope, as
   :meth:`Pipeline.choose` decides, the one place that decides, as for
   :func:`lakestep.query.consistent_read`); a plain read takes the newest version;
2. the :class:`~lakestep.catalog.plan.ReadPlan` of that version is split
   into Spark partitions (groups of files; a primary-key table by partition
   value, since every version of a key must be merged together);
3. executors read their files from the plan, merging primary-key tables on
   read; they never talk to the catalog database.

Writes (:class:`LakestepBatchWriter`)::

    df.write.format("lakestep").option("catalog", url).option("table", "shop.orders").mode("append").save()

1. on the driver: the DataFrame's columns are checked against the table
   (``mergeSchema=true`` adds new ones as nullable); the barrier the commit
   carries is decided: a table that a root job writes (or the option ``job``
   names a root job) takes the open epoch, like the streaming sink; a table
   that a derived job writes is refused (a batch write would bypass its
   barriers); an unmanaged table takes none;
2. executors write Parquet files (rows conformed to the table's schema);
3. the driver publishes them in ONE catalog commit: ``append`` (upserts on a
   primary-key table) or ``overwrite`` (the whole table), idempotent per
   ``(job, batchId)`` when both options are given. On failure the written
   files are deleted.

Both take ``storage.<name>`` options for an object-store warehouse
(:class:`lakestep.catalog.storage.Storage`); the plan and the table's shape carry
them to the executors.

Not guaranteed: a ``repeatable_read`` batch read pins its version with a
leased lock that is not released when the Spark job ends: it lapses after
``leaseSeconds`` (default 300).
"""

from __future__ import annotations

import logging
import uuid
from typing import Any, Iterator, Sequence, cast

import pyarrow as pa

from ..catalog.changes import FilesMode
from ..errors import LakestepError, QueryError, StreamingJobError
from .catalog_cache import open_catalog, required, storage_of
from .compat import DataSourceArrowWriter, DataSourceReader, InputPartition, WriterCommitMessage
from .executors import freeze_worker_heap
from .microbatch import ensure_sink_registered
from .sink import BatchFiles, FilesWritten, TableShape, evolve_schema, parse_flag, task_prefix

log = logging.getLogger(__name__)

_TIME_TRAVEL = ("versionasof", "timestampasof", "snapshot", "barrier", "level")


class PlanPartition(InputPartition):
    def __init__(self, plan: Any) -> None:
        super().__init__(plan.table)
        self.plan = plan


def read_plan(cat: Any, table: str, options: Any) -> Any:
    """Step 1 of a read: the plan of the version the options ask for."""
    given = {k: options.get(k) for k in _TIME_TRAVEL if options.get(k) not in (None, "")}
    if len(given) > 1:
        raise QueryError(f"give at most one of versionAsOf, timestampAsOf, snapshot, barrier, level; got "
                         f"{sorted(given)}")
    t = cat.load_table(table)
    if "versionasof" in given:
        return t.read_plan(version=_int(given["versionasof"], "versionAsOf"))
    if "timestampasof" in given:
        from ..clock import parse_timestamp

        return t.read_plan(as_of=parse_timestamp(str(given["timestampasof"]), what="option timestampAsOf"))
    if "snapshot" in given:
        return t.read_plan(snapshot=str(given["snapshot"]))
    if "barrier" in given:
        from ..barrier.pipeline import shared_pipeline

        return t.read_plan(version=shared_pipeline(cat).version_at(t.ident, _int(given["barrier"], "barrier")))
    if "level" in given:
        from ..barrier.pipeline import shared_pipeline

        lease = _float(options.get("leaseSeconds") or 300.0, "leaseSeconds")
        choice = shared_pipeline(cat).choose([t.ident], level=str(given["level"]),  # type: ignore[arg-type]
                                             scope=str(options.get("scope") or "query"),  # type: ignore[arg-type]
                                             lease_seconds=lease)
        return t.read_plan(version=choice.versions[t.ident])
    return t.read_plan()


def _int(value: Any, name: str) -> int:
    try:
        return int(str(value))
    except ValueError:
        raise QueryError(f"option {name} must be a whole number, got {value!r}") from None


def _float(value: Any, name: str) -> float:
    try:
        return float(str(value))
    except ValueError:
        raise QueryError(f"option {name} must be a number, got {value!r}") from None


class LakestepBatchReader(DataSourceReader):
    def __init__(self, options: Any, schema: Any) -> None:
        cat = open_catalog(required(options, "catalog"), storage_of(options))
        self.plan = read_plan(cat, required(options, "table"), options)
        self.max_partitions = _int(options.get("maxPartitions") or 256, "maxPartitions")
        if self.max_partitions < 1:
            raise QueryError("option maxPartitions must be at least 1")
        log.info("reading %s at version %d: %d file(s)", self.plan.table, self.plan.version, len(self.plan.files))

    def partitions(self) -> Sequence[InputPartition]:
        return [PlanPartition(p) for p in self.plan.split(self.max_partitions)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:  # executors
        freeze_worker_heap()
        rows = cast(PlanPartition, partition).plan.to_arrow()  # Spark hands back what partitions() made
        yield from rows.to_batches()


# ------------------------------------------------------------------- writes
def write_barrier(cat: Any, job: str | None, table: str) -> int | None:
    """Step 1 of a write: the barrier the commit carries (module docstring)."""
    from ..barrier import OPEN_EPOCH, JobNotFoundError
    from ..barrier.pipeline import shared_pipeline

    p = shared_pipeline(cat)
    graph = p.topology.graph()
    if job is not None:
        try:
            j = p.topology.job(job)
        except JobNotFoundError:
            ensure_sink_registered(cat, job, table, None)
            return OPEN_EPOCH
        if not j.external_input and j.sources:
            raise StreamingJobError(
                f"job {job!r} is a derived job: its tables advance barrier by barrier through its streaming "
                "query, a batch write would bypass them")
        ensure_sink_registered(cat, job, table, None)
        return OPEN_EPOCH
    tid = cat.load_table(table).table_id
    kind = graph.kind(tid)
    if kind == "derived":
        writer = graph.writer(tid)
        assert writer is not None  # a derived table has its job
        raise StreamingJobError(
            f"{table} is written by the derived job {writer.job_id!r}: a batch write would bypass "
            "its barriers (write its sources instead, or retire the job)")
    return OPEN_EPOCH if kind == "root" else None


class LakestepBatchWriter(DataSourceArrowWriter):
    def __init__(self, options: Any, overwrite: bool, schema: Any) -> None:
        self.url = required(options, "catalog")
        self.storage = storage_of(options)
        cat = open_catalog(self.url, self.storage)
        table = cat.load_table(required(options, "table"))
        if schema is not None:
            evolve_schema(table, schema, None, parse_flag(options.get("mergeSchema")))
            table = table.refresh()
        self.job = options.get("job") or None
        batch = options.get("batchId")
        if batch not in (None, "") and self.job is None:
            raise QueryError("option batchId needs option job: the idempotency key is (job, batchId)")
        self.batch = None if batch in (None, "") else _int(batch, "batchId")
        self.mode: FilesMode = "overwrite" if overwrite else "append"
        self.barrier = write_barrier(cat, self.job, table.ident)
        self.shape = TableShape.of(table)
        self.write_id = uuid.uuid4().hex[:12]

    def write(self, iterator: Iterator[pa.RecordBatch]) -> FilesWritten:  # executors
        from pyspark import TaskContext

        freeze_worker_heap()

        ctx = TaskContext.get()
        prefix = f"w{self.write_id}-" + task_prefix(ctx, self.batch if self.batch is not None else 0)
        return BatchFiles(self.shape, None).write(iterator, prefix)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:  # driver
        files = [f for m in messages if isinstance(m, FilesWritten) for f in m.files]
        cat = open_catalog(self.url, self.storage)
        with cat.transaction(job_id=self.job if self.batch is not None else None, batch_id=self.batch) as tx:
            tx.add_files(self.shape.ident, files, mode=self.mode, barrier=self.barrier)
        log.info("batch write to %s: %s", self.shape.ident, tx.results)

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:  # driver
        """A failed write: its files are deleted only when the catalog says that none of
        them was recorded (a commit that raised may have landed); when the catalog
        cannot be asked, they are kept for cleanup."""
        written = [m for m in messages if isinstance(m, FilesWritten)]
        paths = [f.path for m in written for f in m.files]
        try:
            recorded = open_catalog(self.url, self.storage).load_table(self.shape.ident).recorded_paths(paths)
        except LakestepError as e:
            log.warning("batch write to %s aborted; its %d file(s) are kept for cleanup (%s)",
                        self.shape.ident, len(paths), e)
            return
        if recorded:
            log.warning("batch write to %s aborted after its commit landed: its files are kept", self.shape.ident)
            return
        BatchFiles(self.shape, None).delete(written)
