"""The data of a commit: operations, prepared changes, results, and the file rows
they record. The commit protocol that applies them is in commit.py; how a change
is decided against concurrent commits, in resolver.py."""

from __future__ import annotations

import dataclasses
import enum
import json
import logging
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Literal, Sequence

from . import schema as S
from .files import DataFile, NewFile
from .predicates import Predicate

Isolation = Literal["snapshot", "serializable"]
#: How files written elsewhere are committed (Transaction.add_files).
FilesMode = Literal["append", "overwrite"]

class Operation(str, enum.Enum):
    CREATE = "CREATE"
    APPEND = "APPEND"
    OVERWRITE = "OVERWRITE"
    DELETE = "DELETE"
    UPDATE = "UPDATE"
    MERGE = "MERGE"
    COMPACT = "COMPACT"
    RESTORE = "RESTORE"  # metadata only: the live files become those of ``base_version``
    ALTER = "ALTER"  # metadata only: a column's type widened or made optional (Table.update_column)

    @property
    def rewrites_rows(self) -> bool:
        """DELETE / UPDATE / MERGE: read rows, then replace the files holding them."""
        return self in (Operation.DELETE, Operation.UPDATE, Operation.MERGE)

    @property
    def changes_data(self) -> bool:
        return self not in (Operation.COMPACT, Operation.CREATE, Operation.ALTER)


@dataclass
class TableChange:
    """A prepared change of one table, ready to commit.

    ``removed`` are the files the writer replaces: for DELETE/UPDATE/MERGE the
    files whose rows it read (its read set); for COMPACT its inputs; for a
    predicate OVERWRITE the straddling files it rewrote. For OVERWRITE the
    files wholly inside ``scope`` (or all, when ``scope`` is None) are decided
    at commit time, so rows that landed concurrently are replaced too.
    """

    table_id: int
    ident: str
    operation: Operation
    base_version: int  # -1 for blind appends: they never conflict
    location: str = ""
    base_data_version: int = -1
    added: list[NewFile] = field(default_factory=list)
    removed: list[DataFile] = field(default_factory=list)
    scope: Predicate | None = None
    isolation: Isolation = "snapshot"
    barrier: int | None = None
    retention_seconds: float = 7 * 24 * 3600.0
    summary: dict[str, Any] = field(default_factory=dict)
    # The table schema the writer read files with (ls_table.schema_id); None: not checked
    schema_id: int | None = None
    # Called (outside any lock) with the files an OVERWRITE must still rewrite.
    rebase: Callable[["TableChange", list[DataFile]], None] | None = None

    @property
    def read_ids(self) -> set[int]:
        return {f.file_id for f in self.removed}

    @property
    def blind(self) -> bool:
        """Adds rows without reading any: appends and primary-key upserts never conflict."""
        return self.operation in (Operation.APPEND, Operation.MERGE) and not self.removed


@dataclass(frozen=True)
class CommitResult:
    """What one table's commit did."""

    table: str
    version: int
    data_version: int
    operation: str
    base_version: int
    added_files: int = 0
    removed_files: int = 0
    added_rows: int = 0
    removed_rows: int = 0
    barrier: int | None = None
    committed_at: float = 0.0
    discarded: bool = False
    replayed: bool = False
    summary: dict[str, Any] = field(default_factory=dict)


def warn_older_schema(c: TableChange, head_schema_id: int) -> None:
    """A blind append or upsert written under an older schema of its table lands (docs/design.md
    §2, the schema-change row): its files are read by column id, so values of columns renamed
    since read under their new names, and values of columns dropped since are discarded (they
    stay in the files, never read). Said once per commit, as a warning."""
    if c.schema_id is None or c.schema_id == head_schema_id or not c.added:
        return
    logging.getLogger("lakestep.catalog.commit").warning(
        "%s: %s written under schema %d, the table is at schema %d: its rows are read by column id "
        "(values of columns dropped since are discarded; renamed columns read under their new names)",
        c.ident, c.operation.value, c.schema_id, head_schema_id)


class KeyReplayed(Exception):
    """Internal: the transaction's ``(job_id, batch_id)`` is at or below the job's newest
    recorded batch id: a replay, even when its own record was pruned (step 2b)."""

    def __init__(self, job_id: str, batch_id: int) -> None:
        super().__init__(f"job {job_id!r} batch {batch_id}: a replay")
        self.job_id = job_id
        self.batch_id = batch_id


class NeedsRebase(Exception):
    """Internal: an OVERWRITE must rewrite files that landed after it prepared."""

    def __init__(self, change: TableChange, files: list[DataFile]) -> None:
        super().__init__(f"{change.ident}: {len(files)} file(s) to rewrite")
        self.change = change
        self.files = files


#: The columns of a file row after its id, in the order :class:`DataFile` takes them
#: (the one list: selects, inserts and the fast path's SQL are written from it).
FILE_FIELDS = ("path", "record_count", "file_size", "added_version", "removed_version", "partition", "stats",
               "source_ids", "seq")
FILE_COLS = (S.files.c.file_id, *(S.files.c[n] for n in FILE_FIELDS))


def row_to_file(r: Any) -> DataFile:
    """A selected row of :data:`FILE_COLS` as a :class:`DataFile` (positional: the columns are
    in the order of its fields, checked below; a listing builds one per live file)."""
    return DataFile(*r)


assert [f.name for f in dataclasses.fields(DataFile)] == [
    "file_id", "path", "record_count", "file_size", "added_version", "removed_version", "partition_json",
    "stats_json", "source_ids_json", "seq_raw"] and [c.name for c in FILE_COLS][1:] == list(FILE_FIELDS), (
    "FILE_COLS and DataFile's fields must stay in the same order (row_to_file)")


#: The columns of a new ``ls_file`` row, in the order of :func:`file_values`.
FILE_ROW_FIELDS = ("table_id", *FILE_FIELDS)


def file_values(table_id: int, version: int, f: "NewFile | DataFile") -> tuple[Any, ...]:
    """The ``ls_file`` row recording ``f`` as added by ``version``, as a tuple of
    :data:`FILE_ROW_FIELDS` (for driver SQL; a re-added file keeps its position in commit
    order, and loses its sources: it is no rewrite)."""
    sources = f.source_ids if isinstance(f, NewFile) else None
    return (table_id, f.path, f.record_count, f.file_size, version, None, f.partition_json, f.stats_json,
            json.dumps(sources) if sources else None, f.seq)


def file_row(table_id: int, version: int, f: "NewFile | DataFile") -> dict[str, Any]:
    """:func:`file_values` as a mapping of column name to value."""
    return dict(zip(FILE_ROW_FIELDS, file_values(table_id, version, f)))


def chunks(ids: Sequence[int], n: int = 500) -> Iterable[Sequence[int]]:
    for i in range(0, len(ids), n):
        yield ids[i : i + n]
