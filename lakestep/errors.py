"""The exceptions lakestep raises.

Everything lakestep raises on purpose derives from :class:`LakestepError`, so
``except LakestepError`` catches all of it. Bad input lakestep can name (an
out-of-range key, a bad table property, a filter value of the wrong type, a
ragged batch of rows) raises a :class:`LakestepError` that is also a
:class:`ValueError`, and its message says what to do; a Python object of the
wrong type altogether raises :class:`ArgumentTypeError`, which is also a
:class:`TypeError`.
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


class CatalogWaitExpiredError(CatalogUnavailableError):
    """A service gave up waiting for the catalog database (lakestep/retry.py).

    ``what`` waited ``waited`` seconds over ``attempts`` failed attempts; its
    policy's ``deadline`` (seconds, None: none). ``outcome_unknown`` as for
    :class:`CatalogUnavailableError`: set when the last attempt was a commit
    whose fate could not be looked up.
    """

    def __init__(self, message: str, *, what: str, waited: float, attempts: int, deadline: float | None,
                 outcome_unknown: bool = False) -> None:
        super().__init__(message, outcome_unknown=outcome_unknown)
        self.what = what
        self.waited = waited
        self.attempts = attempts
        self.deadline = deadline

    def __reduce__(self) -> tuple[Any, ...]:  # picklable across processes (keyword-only facts)
        return (_rebuild_wait_expired, (str(self), self.what, self.waited, self.attempts, self.deadline,
                                        self.outcome_unknown))


def _rebuild_wait_expired(message: str, what: str, waited: float, attempts: int, deadline: float | None,
                          outcome_unknown: bool) -> "CatalogWaitExpiredError":
    return CatalogWaitExpiredError(message, what=what, waited=waited, attempts=attempts, deadline=deadline,
                                   outcome_unknown=outcome_unknown)


class CatalogCorruptError(CatalogError):
    """The catalog database is damaged, or is not a lakestep catalog (nothing was changed)."""


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


class SnapshotExistsError(LakestepError):
    """A snapshot of that name already exists on the table (``exist_ok=True`` returns it)."""

    def __init__(self, table: str, name: str) -> None:
        super().__init__(f"table {table!r} already has a snapshot named {name!r}")
        self.table = table
        self.name = name


class LockNotFoundError(LakestepError):
    """A version lock that was released, or whose lease lapsed."""

    def __init__(self, lock_id: int) -> None:
        super().__init__(f"version lock {lock_id} does not exist (released or expired)")
        self.lock_id = lock_id


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
    """The later of two concurrent commits had to fail (docs/design.md §2).

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

    The schema changed (a column added, renamed, dropped, widened, made optional, or the
    columns reordered: an ``ALTER`` commit, named as the other commit) after the writer
    read the files; rewriting them with the old schema would lose what the change made.
    Reload the table and retry. Appends, upserts and keyed deletes never get it.
    """


class TransactionClosedError(CommitError):
    """A transaction used after it committed or rolled back."""


# ---------------------------------------------------------------- bad input
class InvalidArgumentError(LakestepError, ValueError):
    """An argument out of the range lakestep accepts (a batch id beyond int64, a
    negative barrier). Nothing was read or changed; ``argument`` and ``value``
    say which."""

    def __init__(self, message: str, *, argument: str, value: Any) -> None:
        super().__init__(message)
        self.argument = argument
        self.value = value


class ArgumentTypeError(LakestepError, TypeError):
    """An argument that is a Python object of the wrong type altogether (a dict
    where a pyarrow schema belongs, one string where a list of table names
    does). Nothing was read or changed; ``argument`` and ``value`` say which."""

    def __init__(self, message: str, *, argument: str, value: Any) -> None:
        super().__init__(message)
        self.argument = argument
        self.value = value


class InvalidPropertyError(LakestepError, ValueError):
    """A table property lakestep does not accept: an unknown ``lakestep.*`` key,
    or a value of the wrong form. Nothing was changed. ``known`` lists the
    ``lakestep.*`` keys there are."""

    def __init__(self, message: str, *, key: str, value: Any, known: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.key = key
        self.value = value
        self.known = known


class InvalidSchemaError(LakestepError, ValueError):
    """A table definition that cannot work (a key on a list column, duplicate
    names, a partition column of a type files cannot be split by). Nothing was
    created."""

    def __init__(self, message: str, *, table: str, column: str | None = None) -> None:
        super().__init__(message)
        self.table = table
        self.column = column


class SchemaChangeError(InvalidSchemaError):
    """A schema change the table cannot take (a narrowing or unrelated type change, a
    required column made of an optional one, a primary-key column made optional, an
    unknown column). ``reason`` says which; nothing was changed."""

    def __init__(self, table: str, column: str, reason: str) -> None:
        super().__init__(f"{table}: cannot change column {column!r}: {reason}", table=table, column=column)
        self.reason = reason


class InvalidDataError(LakestepError, ValueError):
    """Input that is not a table at all: columns of different lengths, values
    pyarrow cannot convert. Nothing was written."""

    def __init__(self, message: str, *, table: str) -> None:
        super().__init__(message)
        self.table = table


class FilterValueError(InvalidPredicateError):
    """A filter compares a column with a value of a type it cannot be compared with."""

    def __init__(self, message: str, *, column: str, op: str, value: Any, column_type: str) -> None:
        super().__init__(message)
        self.column = column
        self.op = op
        self.value = value
        self.column_type = column_type


class NoPrimaryKeyError(LakestepError, ValueError):
    """An operation by key (``upsert``) on a table created without a primary key."""

    def __init__(self, table: str) -> None:
        super().__init__(
            f"table {table!r} has no primary key, so it cannot upsert: use append, or create the table "
            "with primary_key=[...]")
        self.table = table


class LocationOverlapError(InvalidLocationError):
    """A table location that would contain, or lie inside, another table's
    location, the catalog database file or the warehouse root: dropping or
    cleaning one would delete the other's files. Nothing was created.

    ``other`` says what it overlaps (``"table s.t"``, ``"the catalog file"``,
    ``"the warehouse root"``), ``other_location`` where that is; both as real
    paths (symlinks resolved).
    """

    def __init__(self, message: str, *, location: str, other: str, other_location: str) -> None:
        super().__init__(message, location=location)
        self.other = other
        self.other_location = other_location


# ------------------------------------------------------------------ storage
class StorageError(LakestepError):
    """Writing or preparing data files failed in storage: disk full, a read-only
    or unwritable directory. Nothing was committed, and the files this call had
    written were deleted (best effort). ``path`` is where it failed,
    ``errno`` the operating system's error number (None if pyarrow gave none).
    """

    def __init__(self, message: str, *, path: str, errno: int | None) -> None:
        super().__init__(message)
        self.path = path
        self.errno = errno


class DataFileCorruptError(LakestepError):
    """A committed data file is not what the catalog recorded: missing, of
    another size, with another row count in its Parquet footer, or unreadable.

    The file was changed outside lakestep; the catalog is intact. ``table``,
    ``path`` (relative to the table location), ``problem`` (``"missing"``,
    ``"size"``, ``"row count"``, ``"unreadable"``), ``expected`` and ``found``.
    """

    def __init__(self, *, table: str, path: str, problem: str, expected: Any, found: Any) -> None:
        super().__init__(
            f"data file {path!r} of table {table!r} is corrupt ({problem}): the catalog recorded {expected}, "
            f"storage has {found}. It was changed or removed outside lakestep; put the original file back "
            "(from a backup or a replica) to read the versions that hold it")
        self.table = table
        self.path = path
        self.problem = problem
        self.expected = expected
        self.found = found


# --------------------------------------------------------------------- bugs
class InternalError(LakestepError, RuntimeError):
    """lakestep found one of its own invariants broken: a bug in lakestep (a catalog
    row that moved under a lock it holds, a case it deemed unreachable), or a library
    whose internals it relies on changed under it. Not a problem with the caller's
    input. The operation stops there, and a commit it was making does not land.
    Please report it with the message."""


__all__ = [
    "LakestepError",
    "CatalogError",
    "CatalogVersionError",
    "CatalogUnavailableError",
    "CatalogWaitExpiredError",
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
    "InvalidArgumentError",
    "ArgumentTypeError",
    "InvalidPropertyError",
    "InvalidSchemaError",
    "InvalidDataError",
    "FilterValueError",
    "NoPrimaryKeyError",
    "LocationOverlapError",
    "StorageError",
    "DataFileCorruptError",
    "InternalError",
]


# ----------------------------------------------------------------------- query
class StreamingJobError(LakestepError):
    """A streaming job that is not set up to run (unregistered, misaligned, ...)."""


class SparkSetupError(StreamingJobError):
    """Spark's Python processes cannot run lakestep's side of a query: on the executors,
    lakestep (or a module it needs) does not import, or another version of it does;
    on the driver, lakestep came only from ``--py-files``, which Spark does not hand
    the Python processes its JVM starts for data sources.

    ``problems``: one line per kind of failure (the Python, what it lacked or
    which lakestep it imported). The message says how to ship lakestep (README,
    "On a cluster").
    """

    def __init__(self, message: str, *, problems: list[str]) -> None:
        super().__init__(message)
        self.problems = problems


class SparkVersionError(StreamingJobError):
    """The Spark this runs on lacks what a lakestep feature needs (lakestep/streaming/compat.py
    holds the matrix): raised at the feature's first call, before any query starts.

    ``feature``: what was asked for; ``needs``: the Spark version it needs (``"4.2"``);
    ``found``: the version found; the message says what to use instead on that version.
    """

    def __init__(self, message: str, *, feature: str, needs: str, found: str) -> None:
        super().__init__(message)
        self.feature, self.needs, self.found = feature, needs, found


# --------------------------------------------------------------------- iceberg
class IcebergError(LakestepError):
    """Publishing lakestep tables as Iceberg tables failed (lakestep/iceberg)."""


class IcebergSchemaError(IcebergError, ValueError):
    """A table cannot be published to Iceberg as it is: ``column`` has a type Iceberg
    readers would read differently. The table is left out of publishing; the others go on."""

    def __init__(self, message: str, *, column: str | None = None) -> None:
        super().__init__(message)
        self.column = column


class IcebergConflictError(IcebergError):
    """The Iceberg metadata of ``table`` changed under the publisher (another writer
    committed to it): nothing of this publish was made visible; the next round reloads it."""

    def __init__(self, message: str, *, table: str) -> None:
        super().__init__(message)
        self.table = table


# --------------------------------------------------------------------- serve
class ServeRequestError(LakestepError):
    """A request to ``lakestep serve`` that is answered with an error (lakestep/serve): the
    HTTP ``status`` and the Iceberg REST error ``kind`` (``NoSuchTableException``, ...) of
    the spec's error body. The message is safe to send: it names no secret."""

    def __init__(self, message: str, *, status: int, kind: str) -> None:
        super().__init__(message)
        self.status = status
        self.kind = kind


class ServerStartError(LakestepError, RuntimeError):
    """A server lakestep runs in this process (``lakestep serve``'s app under uvicorn,
    lakestep/testing/serving.py) did not start listening, or did not stop."""


class QueryError(LakestepError, ValueError):
    """A query lakestep cannot run as written: unparseable SQL, an unknown level or scope,
    time travel it cannot honour. The message says what to change."""

