"""A multi-table transaction: :class:`Transaction`, changes to one or more tables that commit
atomically (``Catalog.transaction()`` makes one)."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Mapping, Protocol, Sequence

import sqlalchemy as sa

from ..errors import (
    CommitConflict,
    InvalidArgumentError,
    NoPrimaryKeyError,
    TransactionClosedError,
    VersionNotFoundError,
)
from .changes import CommitResult, FilesMode, Isolation, Operation, TableChange
from .checks import check_barrier
from .files import NewFile
from .predicates import Filter, Predicate
from .storage import check_relative_path
from .table import Table
from .writer import FileWriter
from .writes import (
    PartitionSpec,
    change_of,
    prepare_append,
    prepare_compact,
    prepare_delete,
    prepare_overwrite,
    prepare_pk_delete,
    prepare_pk_update,
    prepare_rewrite_file,
    prepare_update,
)

if TYPE_CHECKING:
    from .commit import After, Guard
    from .storage import Storage

log = logging.getLogger(__name__)


class TransactionCatalog(Protocol):
    """What a :class:`Transaction` uses of its catalog (:class:`lakestep.catalog.Catalog`)."""

    storage: "Storage"

    def as_table(self, table: Table | str) -> Table: ...

    def commit_guarded(self, changes: Sequence[TableChange], *, guard: "Guard | None" = None,
                       after: "After | None" = None, job_id: str | None = None,
                       batch_id: int | None = None) -> tuple[bool, list[CommitResult]]: ...


class Transaction:
    """Changes to one or more tables that commit atomically.

    Use it as a context manager: a clean exit commits, an exception aborts
    (nothing becomes visible). Each table takes one write per transaction,
    except appends, which accumulate. Data files are written when a method is
    called; the commit only publishes them.

    Example::

        with catalog.transaction(job_id="orders_etl", batch_id=42) as tx:
            tx.append("shop.orders", orders)
            tx.overwrite("shop.daily", daily, partitions="dynamic")
        tx.results   # one CommitResult per table
    """

    def __init__(self, catalog: TransactionCatalog, *, job_id: str | None, batch_id: int | None,
                 guard: Guard | None = None, after: After | None = None) -> None:
        self.catalog = catalog
        self.job_id = job_id
        self.batch_id = batch_id
        self.guard = guard
        self.after = after
        self.changes: dict[int, TableChange] = {}
        self.results: list[CommitResult] = []
        self.noops: list[CommitResult] = []  # writes with nothing to do (a compaction of nothing)
        self.closed = False
        self.replayed = False  # the commit found its work done before (by its key, or its guard said so)

    def __enter__(self) -> "Transaction":
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if self.closed:
            return
        if exc_type is None:
            self.commit()
        else:
            self.abort()

    def _add(self, change: TableChange) -> None:
        if self.closed:
            raise TransactionClosedError("transaction already committed or aborted")
        prior = self.changes.get(change.table_id)
        if change.operation is Operation.COMPACT and not change.removed and prior is None:
            # nothing to merge: no commit, no new version
            self.noops.append(CommitResult(
                table=change.ident, version=change.base_version, data_version=change.base_data_version,
                operation=change.operation.value, base_version=change.base_version,
                summary={"noop": True}))
            return
        if prior is None:
            self.changes[change.table_id] = change
        elif change.blind and prior.blind and prior.operation is change.operation and prior.barrier == change.barrier:
            prior.added.extend(change.added)
        else:
            self._discard_files(change)
            raise InvalidArgumentError(
                f"{change.ident} already has a {prior.operation.value} in this transaction; "
                "a table takes one write per transaction (appends accumulate)", argument="table", value=change.ident
            )

    def append(self, table: Table | str, data: Any, *, barrier: int | None = None, prefix: str = "") -> None:
        self._check_open(barrier)
        self._add(prepare_append(self.catalog.as_table(table), data, barrier=barrier, prefix=prefix))

    def overwrite(self, table: Table | str, data: Any, *, partitions: PartitionSpec = None,
                  where: Filter | Predicate | None = None, barrier: int | None = None, prefix: str = "") -> None:
        self._check_open(barrier)
        self._add(prepare_overwrite(self.catalog.as_table(table), data, partitions=partitions, where=where,
                                    barrier=barrier, prefix=prefix))

    def add_files(self, table: Table | str, files: Sequence[NewFile], *, mode: FilesMode = "append",
                  barrier: int | None = None) -> None:
        """Commit data files that were written elsewhere (by Spark executors, say).

        ``mode``: ``append`` (on a primary-key table: upsert, as the files were
        written in the table's physical form) or ``overwrite`` (replace
        everything live with these files). The files must lie under the
        table's location and match its schema: whoever wrote them checked that.
        """
        self._check_open(barrier)
        t = self.catalog.as_table(table)
        if mode not in ("append", "overwrite"):
            raise InvalidArgumentError(f"mode must be 'append' or 'overwrite', got {mode!r}", argument="mode", value=mode)
        for f in files:
            check_relative_path(f.path)
        if mode == "append":
            op = Operation.MERGE if t.primary_key else Operation.APPEND
            change = TableChange(table_id=t.table_id, ident=t.ident, operation=op, base_version=-1,
                                 location=t.location, added=list(files), barrier=barrier)
        else:
            base, base_dv, _ = t.head_and_live()
            change = TableChange(table_id=t.table_id, ident=t.ident, operation=Operation.OVERWRITE,
                                 base_version=base, base_data_version=base_dv, location=t.location,
                                 added=list(files), barrier=barrier, summary={"scope": "all"})
        self._add(change)

    def upsert(self, table: Table | str, data: Any, *, barrier: int | None = None, prefix: str = "") -> None:
        t = self.catalog.as_table(table)
        if not t.primary_key:
            raise NoPrimaryKeyError(t.ident)
        self.append(t, data, barrier=barrier, prefix=prefix)

    def delete(self, table: Table | str, where: Filter | Predicate, *, isolation: Isolation | None = None,
               barrier: int | None = None) -> None:
        self._check_open(barrier)
        t = self.catalog.as_table(table)
        if t.primary_key:  # tombstones, merged on read
            self._add(prepare_pk_delete(t, where, barrier=barrier))
        else:
            self._add(prepare_delete(t, where, barrier=barrier, isolation=isolation))

    def update(self, table: Table | str, set: Mapping[str, Any], where: Filter | Predicate, *,
               isolation: Isolation | None = None, barrier: int | None = None) -> None:
        self._check_open(barrier)
        t = self.catalog.as_table(table)
        if t.primary_key:  # the changed rows, upserted
            self._add(prepare_pk_update(t, set, where, barrier=barrier))
        else:
            self._add(prepare_update(t, set, where, barrier=barrier, isolation=isolation))

    def compact(self, table: Table | str, *, target_file_size: int = 128 << 20, min_files: int = 2,
                major: bool = False, runs: int = 0) -> None:
        self._check_open()
        self._add(prepare_compact(self.catalog.as_table(table), target_file_size=target_file_size,
                                  min_files=min_files, major=major, runs=runs))

    def rewrite_file(self, table: Table | str, file: Any, transform: Any) -> None:
        self._check_open()
        self._add(prepare_rewrite_file(self.catalog.as_table(table), file, transform))

    def restore(self, table: Table | str, version: int, *, barrier: int | None = None) -> None:
        """Make ``table`` hold exactly the rows of ``version`` again (metadata only).

        A new commit, history kept: its ``base_version`` is ``version``; commits
        landing concurrently are undone too. See ``resolver.Resolver._restore`` (the
        RESTORE row of ``resolver.MATRIX``).
        """
        self._check_open(barrier)
        t = self.catalog.as_table(table)
        head = t.version
        if not 0 <= int(version) <= head:
            raise VersionNotFoundError(t.ident, f"version {version} (newest is {head})")
        self._add(change_of(
            t, operation=Operation.RESTORE, base_version=int(version), barrier=barrier, retention_seconds=t.retention_seconds,
            summary={"restored_to": int(version)},
        ))

    def _check_open(self, barrier: int | None = None) -> None:
        if self.closed:
            raise TransactionClosedError("transaction already committed or aborted")
        if barrier is not None:
            check_barrier(barrier, open_epoch_ok=True)

    def commit(self) -> list[CommitResult]:
        self._check_open()
        self.closed = True
        changes = [self.changes[k] for k in sorted(self.changes)]
        if not changes:
            self.results = list(self.noops)
            return self.results
        refused: list[bool] = []  # the guard raised: nothing was committed

        def guard(conn: sa.Connection) -> list[CommitResult] | None:
            refused.clear()
            try:
                return self.guard(conn) if self.guard is not None else None
            except BaseException:
                refused.append(True)
                raise

        try:
            committed, self.results = self.catalog.commit_guarded(
                changes, guard=guard if self.guard is not None else None, after=self.after,
                job_id=self.job_id, batch_id=self.batch_id)
        except BaseException as e:
            if isinstance(e, CommitConflict) or refused:  # certainly not committed: the files are no one's
                for c in changes:
                    self._discard_files(c)
            raise
        self.replayed = not committed
        for c, r in zip(changes, self.results):
            if not committed or r.discarded or r.replayed:  # files no commit references: a second copy
                self._discard_files(c)
        self.results = self.results + self.noops
        return self.results

    def abort(self) -> None:
        """Drop the transaction; the files it wrote are deleted (best effort)."""
        if self.closed:
            return
        self.closed = True
        for c in self.changes.values():
            self._discard_files(c)

    def _discard_files(self, change: TableChange) -> None:
        if not change.added:
            return
        try:
            writer = FileWriter(change.location, self.catalog.storage)
            for f in change.added:
                writer.delete(f.path)
        except Exception as e:  # orphans are harmless; cleanup collects them
            log.debug("could not delete uncommitted files of %s: %s", change.ident, e)
