"""The exceptions lakestep raises.

Everything lakestep raises on purpose derives from :class:`LakestepError`, so
``except LakestepError`` catches all of it. Plain misuse of an argument (a wrong
type, an unknown mode) raises :class:`ValueError` or :class:`TypeError` as usual.
Errors carry the facts as attributes (table, versions, the other commit) and
chain their cause with ``raise ... from``.
"""

from __future__ import annotations

from typing import Any


class LakestepError(Exception):
    """Root of every error lakestep raises."""


# --------------------------------------------------------------------- catalog
class CatalogError(LakestepError):
    """A problem with the metadata catalog itself."""


class CatalogVersionError(CatalogError):
    """The catalog database was written by a newer lakestep, or is not upgraded."""

    def __init__(self, message: str, *, found: int, supported: int) -> None:
        super().__init__(message)
        self.found = found
        self.supported = supported


class CatalogUnavailableError(CatalogError):
    """The catalog database could not be reached, or the connection was lost.

    When ``outcome_unknown`` is true, the connection broke while a commit was
    being made durable and lakestep could not find out, after reconnecting,
    whether it landed. Retrying the same commit with the same idempotency key
    ``(job_id, batch_id)`` is always safe.
    """

    def __init__(self, message: str, *, outcome_unknown: bool = False) -> None:
        super().__init__(message)
        self.outcome_unknown = outcome_unknown


class InvalidIdentifierError(LakestepError, ValueError):
    """A namespace, table, column or job name that lakestep does not accept."""

    def __init__(self, message: str, *, identifier: str) -> None:
        super().__init__(message)
        self.identifier = identifier


class InvalidLocationError(LakestepError, ValueError):
    """A table location or file path that is malformed or escapes the warehouse."""

    def __init__(self, message: str, *, location: str) -> None:
        super().__init__(message)
        self.location = location


class NamespaceNotFoundError(LakestepError):
    def __init__(self, namespace: str) -> None:
        super().__init__(f"namespace {namespace!r} does not exist")
        self.namespace = namespace


class NamespaceAlreadyExistsError(LakestepError):
    def __init__(self, namespace: str) -> None:
        super().__init__(f"namespace {namespace!r} already exists")
        self.namespace = namespace


class NamespaceNotEmptyError(LakestepError):
    def __init__(self, namespace: str, tables: list[str]) -> None:
        super().__init__(
            f"namespace {namespace!r} still holds {len(tables)} table(s): {', '.join(tables[:5])}"
        )
        self.namespace = namespace
        self.tables = tables


class TableNotFoundError(LakestepError):
    def __init__(self, table: str) -> None:
        super().__init__(f"table {table!r} does not exist")
        self.table = table


class TableAlreadyExistsError(LakestepError):
    def __init__(self, table: str) -> None:
        super().__init__(f"table {table!r} already exists")
        self.table = table


class VersionNotFoundError(LakestepError):
    """Time travel asked for a version, timestamp or barrier the table does not have."""

    def __init__(self, table: str, what: str) -> None:
        super().__init__(f"table {table!r} has no {what}")
        self.table = table
        self.what = what


class SchemaMismatchError(LakestepError):
    """Data whose schema does not match the table's. Nothing was written."""

    def __init__(self, table: str, problems: list[str]) -> None:
        super().__init__(f"schema of the data does not match table {table!r}: " + "; ".join(problems))
        self.table = table
        self.problems = problems


class InvalidPredicateError(LakestepError, ValueError):
    """A filter that names an unknown column or uses an unknown operator."""


class DataOutOfRangeError(LakestepError):
    """An overwrite whose new rows fall outside the range it replaces."""

    def __init__(self, table: str, message: str) -> None:
        super().__init__(f"table {table!r}: {message}")
        self.table = table


# --------------------------------------------------------------------- commits
class CommitError(LakestepError):
    """A commit that did not land. Nothing of it is visible."""


class CommitConflict(CommitError):
    """The later of two concurrent commits had to fail (DESIGN.md §2).

    Attributes name both commits: ``table``, ``operation`` and ``base_version``
    of the failed one, and ``other_version`` / ``other_operation`` of the commit
    that had already landed.
    """

    def __init__(
        self,
        *,
        table: str,
        operation: str,
        base_version: int,
        other_version: int,
        other_operation: str,
        reason: str,
    ) -> None:
        super().__init__(
            f"{operation} on {table!r} based on version {base_version} conflicts with "
            f"{other_operation} committed as version {other_version}: {reason}"
        )
        self.table = table
        self.operation = operation
        self.base_version = base_version
        self.other_version = other_version
        self.other_operation = other_operation
        self.reason = reason

    def __reduce__(self) -> tuple[Any, ...]:  # picklable across processes
        return (
            _rebuild_conflict,
            (
                type(self),
                self.table,
                self.operation,
                self.base_version,
                self.other_version,
                self.other_operation,
                self.reason,
            ),
        )


def _rebuild_conflict(
    cls: type, table: str, operation: str, base_version: int, other_version: int, other_operation: str, reason: str
) -> CommitConflict:
    return cls(
        table=table,
        operation=operation,
        base_version=base_version,
        other_version=other_version,
        other_operation=other_operation,
        reason=reason,
    )


class SchemaChangedConflict(CommitConflict):
    """A commit that rewrites files, prepared with a schema older than the table's.

    Columns were added (:meth:`Table.add_columns`) after the writer read the
    files; rewriting them with the old schema would drop the new columns'
    values. Reload the table and retry. Appends and upserts never get it.
    """


class TransactionClosedError(CommitError):
    """A transaction used after it committed or rolled back."""


__all__ = [
    "LakestepError",
    "CatalogError",
    "CatalogVersionError",
    "CatalogUnavailableError",
    "InvalidIdentifierError",
    "InvalidLocationError",
    "NamespaceNotFoundError",
    "NamespaceAlreadyExistsError",
    "NamespaceNotEmptyError",
    "TableNotFoundError",
    "TableAlreadyExistsError",
    "VersionNotFoundError",
    "SchemaMismatchError",
    "InvalidPredicateError",
    "DataOutOfRangeError",
    "CommitError",
    "CommitConflict",
    "TransactionClosedError",
]
