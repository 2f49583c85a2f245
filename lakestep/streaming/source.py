"""The lakestep streaming source: ``spark.readStream.format("lakestep")``.

Offsets are barriers: ``{"barrier": e, "dv": d}``, ``d`` being the table's
data version at barrier ``e``. A micro-batch reads the rows the table gained
between two offsets' data versions (appended and upserted rows; compactions
make no data version, so compacted rows never come back).

1. ``initialOffset``: where the job's sinks are (a restarted job with a fresh
   checkpoint continues from the catalog, not from zero);
2. ``latestOffset``: the barrier the job's sources agreed on for this trigger
   (:mod:`lakestep.barrier.triggers`): the job's next batch, one barrier by default (option
   ``maxBarriersPerTrigger`` for catching up), and only once every source of
   the job has precommitted it. With ``Trigger.AvailableNow`` the query stops
   at the newest barrier every source had precommitted when it started (the
   sources of a job follow one recorded decision per trigger, so they stay
   aligned even if they froze different targets);
3. ``partitions``: one Spark partition per data file to read, carrying the
   file's recorded size and row count; executors read the files (never the
   catalog database), checked against those (a changed or missing file
   fails the task with :class:`DataFileCorruptError`, see catalog/reader.py);
4. ``commit``: pins the version the next batch starts from with a leased
   version lock, so cleanup keeps its files while the stream is behind.

Spark fixes a streaming query's schema when it starts: the reader keeps the
table's schema of that moment. A column added since is left out of the
query's rows (a restarted query reads it). A column whose type was widened or
made optional since (``Table.update_column``) would be read wrongly under the
old schema: step 3 then fails the query with
:class:`~lakestep.errors.StreamingJobError` naming the change and asking for a
restart, which reads with the new schema from its next barrier on.

While the catalog database is unavailable, the reader's creation and steps
1, 2, 3 and 4 on the driver wait (:func:`lakestep.retry.retrying`: bounded exponential backoff, one log
line when the wait starts, one when it ends) up to ``catalogWaitSeconds``,
then fail the query with :class:`~lakestep.errors.CatalogWaitExpiredError`.
Redoing them is safe: a trigger decision is recorded once per
``(job, start, call)`` and read back by a redo (barrier/triggers.py).

Options: ``catalog``, ``table``, ``job`` (required: a derived job registered
with its sources and sinks), ``maxBarriersPerTrigger`` (default 1),
``storage.<name>`` (object-store options, see :class:`lakestep.catalog.storage.Storage`;
default: the AWS environment of each process), ``catalogWaitSeconds`` (default
300).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Iterator, Sequence, cast

import pyarrow as pa

from .. import retry as _retry
from ..barrier import triggers
from ..catalog import reader
from ..catalog.columns import stored_name
from ..errors import CatalogUnavailableError, InvalidArgumentError, StreamingJobError
from .catalog_cache import open_catalog, pipeline_of, required, storage_of
from .compat import DataSourceStreamReader, InputPartition, SupportsTriggerAvailableNow
from .executors import freeze_worker_heap
from .microbatch import ensure_source_registered
from .sink import TableShape, wait_policy

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class FileToRead:
    """A data file as the catalog recorded it: executors check it on read (catalog/reader.py)."""

    path: str
    record_count: int
    file_size: int


class FilesPartition(InputPartition):
    def __init__(self, files: Sequence[FileToRead]) -> None:
        super().__init__([f.path for f in files])
        self.files = list(files)


def max_barriers_per_trigger(options: Any) -> int:
    """The option ``maxBarriersPerTrigger``: a whole number >= 1 (default 1).

    Raises:
        InvalidArgumentError: a ValueError naming the option.
    """
    raw = options.get("maxBarriersPerTrigger")
    if raw is None or str(raw).strip() == "":
        return 1
    try:
        value = int(str(raw).strip())
    except ValueError:
        value = 0
    if value < 1:
        raise InvalidArgumentError(f"option maxBarriersPerTrigger must be a whole number >= 1, got {raw!r}",
                                   argument="maxBarriersPerTrigger", value=raw)
    return value


def changed_columns(started: pa.Schema, now: pa.Schema) -> list[str]:
    """The columns of ``started`` (a query's schema) whose type or nullability ``now`` differs
    (columns added since are not changes: a running query leaves them out)."""
    out = []
    for f in started:
        i = now.get_field_index(f.name)
        if i < 0:
            out.append(f"column {f.name!r} is gone")
            continue
        g = now.field(i)
        if stored_name(g) != stored_name(f):  # renamed away, and a new column took the name
            out.append(f"column {f.name!r} is another column now (the one of that name was renamed or dropped)")
        elif not g.type.equals(f.type):
            out.append(f"column {f.name!r} is {g.type}, was {f.type}")
        elif g.nullable != f.nullable:
            out.append(f"column {f.name!r} is {'optional' if g.nullable else 'required'} now")
    return out


class LakestepStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, options: Any) -> None:
        self.url = required(options, "catalog")
        self.storage = storage_of(options)
        self.table = required(options, "table")
        self.job = required(options, "job")
        self.max_barriers = max_barriers_per_trigger(options)
        self.retry = wait_policy(options)

        def start() -> tuple[TableShape, int]:
            cat = open_catalog(self.url, self.storage)
            ensure_source_registered(cat, self.job, self.table)
            # Decisions numbered above the mark are this run's (barrier/triggers.py, step 1).
            return TableShape.of(cat.load_table(self.table)), triggers.run_mark(cat, self.job)

        self.shape, self._mark = self._waiting(start, "start")
        self._calls: dict[int, int] = {}
        self._target: int | None = None  # Trigger.AvailableNow: the last barrier to read

    def _waiting(self, fn: Any, step: str) -> Any:
        """``fn()``, waiting out an unavailable catalog database (module docstring)."""
        return _retry.retrying(fn, policy=self.retry, what=f"source {self.table} of job {self.job} ({step})")

    def _offset(self, barrier: int) -> dict[str, int]:
        dv = pipeline_of(self.url, self.storage).at(self.table, barrier).data_version if barrier > 0 else 0
        return {"barrier": barrier, "dv": dv}

    def initialOffset(self) -> dict[str, int]:
        return self._waiting(lambda: self._offset(
            pipeline_of(self.url, self.storage).job_frontier(self.job)), "initialOffset")

    def prepareForTriggerAvailableNow(self) -> None:
        """Freeze the barrier an availableNow query reads up to: the newest one
        every source of the job has precommitted now. The query then runs its
        batches (one barrier each, or ``maxBarriersPerTrigger``) up to it and stops."""
        self._target = self._waiting(
            lambda: pipeline_of(self.url, self.storage).ready_barrier(self.job),
            "prepareForTriggerAvailableNow")
        log.info("job %s: availableNow reads %s up to barrier %d", self.job, self.table, self._target)

    def latestOffset(self, start: dict[str, int], limit: Any = None) -> dict[str, int]:
        s = int(start["barrier"])
        n = self._calls.get(s, 0)
        self._calls = {s: n + 1}
        most = self.max_barriers if self._target is None else min(self.max_barriers, self._target - s)

        def plan() -> int:
            if most < 1:
                return s
            nxt = pipeline_of(self.url, self.storage).next_batch(self.job, max_barriers=most)
            return nxt.hi if nxt is not None and nxt.lo == s + 1 else s

        def decided() -> dict[str, int]:
            cat = open_catalog(self.url, self.storage)
            end = triggers.decide(cat, self.job, s, n, plan, mark=self._mark)
            return start if end == s else self._offset(end)

        return self._waiting(decided, "latestOffset")

    def partitions(self, start: dict[str, int], end: dict[str, int]) -> Sequence[InputPartition]:
        if int(end["dv"]) <= int(start["dv"]):
            return []

        def files() -> list[FilesPartition]:
            t = open_catalog(self.url, self.storage).load_table(self.table)
            changed = changed_columns(self.shape.schema, t.schema)
            if changed:
                raise StreamingJobError(
                    f"job {self.job!r}: the schema of its source {self.table} changed after this query started "
                    f"({'; '.join(changed)}): Spark fixed the query's schema at its start, so it cannot read the "
                    "new rows; restart the query (it reads with the new schema from its next barrier on)")
            return [FilesPartition([FileToRead(f.path, f.record_count, f.file_size)])
                    for f in t.added_files(int(start["dv"]), int(end["dv"]))]

        return self._waiting(files, "partitions")

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:  # executors
        freeze_worker_heap()
        files = cast(FilesPartition, partition).files  # Spark hands back what partitions() made
        data = reader.read(self.shape.ident, self.shape.store(), files, self.shape.physical_schema)
        if self.shape.primary_key:  # upserted rows; tombstones are not rows
            data = data.filter(pa.compute.invert(data.column("_ls_deleted"))).drop_columns(["_ls_deleted"])
        yield from data.to_batches()

    def commit(self, end: dict[str, int]) -> None:
        self._waiting(lambda: self._pin(end), "commit")

    def _pin(self, end: dict[str, int]) -> None:
        cat = open_catalog(self.url, self.storage)
        t = cat.load_table(self.table)
        locker = f"stream:{self.job}:{self.table}"
        from ..catalog.lifecycle import release_locks

        release_locks(cat, locker)
        try:
            b = int(end["barrier"])
            v = pipeline_of(self.url, self.storage).version_at(self.table, b) if b > 0 else 0
            t.lock(locker=locker, version=v, lease_seconds=3600)
        except CatalogUnavailableError:  # waited out by commit()
            raise
        except Exception as e:  # a pin is a courtesy to cleanup; never fail the stream for it
            log.warning("could not pin %s for stream %s: %s", self.table, self.job, e)

    def stop(self) -> None:
        pass
