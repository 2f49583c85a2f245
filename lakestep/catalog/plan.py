"""Read plans: everything a reader needs to read one table at one version, without the catalog.

A :class:`ReadPlan` is made on the driver (one catalog read: the version and
its live files) and is then self-contained: absolute file URIs, the schema,
the primary key, the partitioning and, for primary-key tables, the commit
order of the files that merge-on-read needs. It pickles, so Spark executors,
DuckDB and Arrow readers all read the same files the same way, and nothing
outside ``catalog/`` joins paths by hand.

Reading a plan (:meth:`ReadPlan.to_arrow`, :meth:`ReadPlan.dataset`):

1. plain tables: the files are one Parquet dataset (lazy: filters and column
   selections are pushed into the scan);
2. primary-key tables: the files are read in commit order and merged, the
   newest row per key winning and tombstones hiding their keys
   (``pk.py``); a filter on key columns only prunes files first.

Not guaranteed: a plan does not pin its version. A reader slower than the
table's retention window must hold a version lock (``Table.lock``, or a
``repeatable_read`` choice), or cleanup may delete files it still reads.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Sequence

import pyarrow as pa
import pyarrow.fs as pafs

from ..errors import InvalidArgumentError
from . import reader
from .columns import plain_schema, renamed
from .files import DataFile
from .predicates import Filter, Predicate, Verdict
from .storage import Storage, resolve_filesystem
from .writer import FileWriter

if TYPE_CHECKING:
    import pyarrow.dataset as ds


def schema_from_ipc(data: bytes) -> pa.Schema:
    """A schema serialized with ``pa.Schema.serialize()`` (plans and table shapes carry them so)."""
    return pa.ipc.read_schema(pa.py_buffer(data))


class SerializedSchemas:
    """The two schemas of a table, carried serialized (picklable) by what goes to executors:
    read plans and the sink's table shapes."""

    schema_ipc: bytes
    physical_ipc: bytes

    @property
    def schema(self) -> pa.Schema:
        """The table's columns."""
        return schema_from_ipc(self.schema_ipc)

    @property
    def physical_schema(self) -> pa.Schema:
        """The columns of the data files (primary-key tables add a tombstone flag)."""
        return schema_from_ipc(self.physical_ipc)


@dataclass(frozen=True)
class PlannedFile:
    """One data file of a plan."""

    path: str  # relative to the table's location, as recorded
    uri: str  # absolute: a local path, or a URI pyarrow's filesystems open
    record_count: int
    file_size: int
    seq: int  # the position of its rows in commit order (merge-on-read)
    partition_json: str = "{}"
    stats_json: str = "{}"

    def data_file(self) -> DataFile:
        """As the catalog records it (for pruning by statistics)."""
        return DataFile(file_id=-1, path=self.path, record_count=self.record_count, file_size=self.file_size,
                        added_version=self.seq, partition_json=self.partition_json, stats_json=self.stats_json)

    @property
    def partition(self) -> dict[str, Any]:
        return self.data_file().partition


@dataclass(frozen=True)
class ReadPlan(SerializedSchemas):
    """One table at one version, ready to read anywhere (see the module docstring)."""

    table: str
    table_id: int
    version: int
    data_version: int
    location: str
    schema_ipc: bytes
    physical_ipc: bytes
    primary_key: tuple[str, ...]
    partition_by: tuple[str, ...]
    files: tuple[PlannedFile, ...]
    schema_id: int = 0  # bumped by each schema change: 0 means every file has the table's columns
    storage: Storage = Storage()  # how to reach an object store (credentials travel with the plan)

    @property
    def merge_on_read(self) -> bool:
        return bool(self.primary_key)

    @property
    def record_count(self) -> int:
        """Rows stored in the files (for a primary-key table: before merging)."""
        return sum(f.record_count for f in self.files)

    def filesystem(self) -> pafs.FileSystem:
        return resolve_filesystem(self.location, self.storage)[0]

    def store(self) -> FileWriter:
        """The table's files' store (paths and filesystem; no catalog access)."""
        return FileWriter(self.location, self.storage)

    def dataset(self) -> ds.Dataset:
        """The files as one lazy Parquet dataset of the table's columns (plain tables only).

        Each file is opened with its recorded size (a file of another size fails
        its footer read); the footers' row counts are checked by :meth:`to_arrow`
        only (a lazy scan has no place to check them after it ran).
        """
        if self.merge_on_read:
            raise InvalidArgumentError(f"{self.table} has a primary key: its files must be merged, use to_arrow()",
                                       argument="plan", value=self.table)
        if renamed(self.schema):  # stored names differ from the table's: read, then rename
            import pyarrow.dataset as ds  # here: it imports pandas (predicates.Predicate.mask)

            return ds.dataset(self.to_arrow())
        return reader.dataset(self.store(), self.files, self.schema)

    def native_paths(self) -> list[str] | None:
        """The files' local paths for an engine that scans Parquet itself (DuckDB), when
        that reads exactly what :meth:`dataset` reads: a plain table, never re-schemed
        (every file holds the table's columns), on the local disk, with at least one
        file. Sizes are checked as :meth:`dataset` checks them. Else None."""
        if self.merge_on_read or self.schema_id != 0 or not self.files or "://" in self.location:
            return None
        return reader.local_paths(self.store(), self.files)

    def to_arrow(self, *, columns: Sequence[str] | None = None, where: Filter | Predicate | None = None) -> pa.Table:
        """The rows of the table at this version (merged for primary-key tables)."""
        pred = Predicate.parse(where, self.schema) if where is not None else None
        if self.merge_on_read:
            return self._merged(columns, pred)
        plan = self.prune(pred) if pred is not None else self
        return reader.read(self.table, self.store(), plan.files, self.schema,
                           columns=list(columns) if columns else None,
                           filter=pred.file_expression() if pred is not None else None)

    def prune(self, where: Filter | Predicate) -> "ReadPlan":
        """The plan without the files that cannot hold rows matching ``where`` (by
        partition values and column statistics; on key columns only for primary-key
        tables, where every version of a row shares its key)."""
        pred = Predicate.parse(where, self.schema)
        if not prunable(pred, self.primary_key):
            return self
        keep = tuple(f for f in self.files if pred.verdict(f.data_file()) is not Verdict.NONE)
        return _replace_files(self, keep)

    def split(self, n: int) -> list["ReadPlan"]:
        """Plans that together read this one, for parallel readers (Spark partitions).

        Plain tables split into at most ``n`` groups of files of similar bytes.
        Primary-key tables split by partition value only: every version of a
        key lies in one partition (partition columns are part of the key), and
        must be merged together.
        """
        if not self.files:
            return [self]
        if self.merge_on_read:
            by_part: dict[str, list[PlannedFile]] = {}
            for f in self.files:
                by_part.setdefault(f.partition_json, []).append(f)
            return [_replace_files(self, tuple(g)) for g in by_part.values()]
        groups: list[list[PlannedFile]] = [[] for _ in range(max(1, min(n, len(self.files))))]
        sizes = [0] * len(groups)
        for f in sorted(self.files, key=lambda f: (-f.file_size, f.path)):
            i = sizes.index(min(sizes))
            groups[i].append(f)
            sizes[i] += f.file_size
        return [_replace_files(self, tuple(g)) for g in groups if g]

    def _merged(self, columns: Sequence[str] | None, pred: Predicate | None) -> pa.Table:
        from . import pk

        plan = self.prune(pred) if pred is not None else self
        schema = self.schema
        merged = pk.merge_files(self.physical_schema, list(self.primary_key), self.table, self.store(),
                                plan.files)
        merged = merged.drop_columns([pk.DELETED])
        schema = plain_schema(schema)
        merged = pa.Table.from_arrays(merged.columns, schema=schema) if merged.num_rows else schema.empty_table()
        if pred is not None and merged.num_rows:
            merged = merged.filter(pred.mask(merged))
        return merged.select(list(columns)) if columns else merged


def prunable(pred: Predicate, primary_key: Sequence[str]) -> bool:
    """Whether files may be skipped by ``pred``'s verdict on their statistics: always on plain
    tables; on primary-key tables only when ``pred`` reads key columns alone (a newer version
    of a row, in another file, may no longer match: merge on read needs every version)."""
    return not primary_key or pred.columns <= set(primary_key)


def _replace_files(plan: ReadPlan, files: tuple[PlannedFile, ...]) -> ReadPlan:
    import dataclasses

    return dataclasses.replace(plan, files=files)
