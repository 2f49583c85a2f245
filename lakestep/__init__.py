"""lakestep: consistent multi-table streaming ETL on Apache Spark.

The front door: everything a pipeline is written with is importable from here::

    from lakestep import Catalog, Pipeline, DerivedJob, duckdb_query, spark_sql

* the catalog: :class:`Catalog`, :class:`Table`, :class:`Transaction` and what a commit
  returns (``lakestep.catalog``; no pyspark);
* barriers: :class:`Pipeline` (the whole barrier API of one catalog), :func:`diagnose`
  (``lakestep.barrier``; no pyspark);
* the services: :class:`Coordinator` (seals epochs), :class:`MaintenanceLoop`
  (``lakestep.services``);
* jobs on Spark: :class:`DerivedJob` for derived tables, :func:`foreach_batch` for existing
  ``foreachBatch`` code, :func:`register` for the ``lakestep`` sink and source
  (``lakestep.streaming``); a Kafka-fed root is ``lakestep.streaming.kafka.ingest``;
* consistent reads: :func:`duckdb_query`, :func:`spark_sql`, :func:`consistent_arrow` and
  the rest of ``lakestep.query``;
* every error (all subclasses of :class:`LakestepError`, ``lakestep.errors``).

Names are imported on first use: Spark starts many Python workers, and a worker that only
reads Kafka should not pay for the catalog's imports, nor a catalog user for pyspark's.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from . import _lazy
from ._version import __version__

if TYPE_CHECKING:  # for type checkers and readers; loaded lazily by __getattr__ at run time
    from .barrier import Level, Pipeline, Scope, diagnose
    from .catalog import (
        OPEN_EPOCH,
        Catalog,
        CommitInfo,
        CommitResult,
        DataFile,
        Operation,
        Predicate,
        Snapshot,
        Table,
        Transaction,
        VersionLock,
    )
    from .errors import (
        ArgumentTypeError,
        CatalogCorruptError,
        CatalogError,
        CatalogUnavailableError,
        CatalogVersionError,
        CatalogWaitExpiredError,
        CommitConflict,
        CommitError,
        DataFileCorruptError,
        DataOutOfRangeError,
        FilterValueError,
        IcebergConflictError,
        IcebergError,
        IcebergSchemaError,
        InternalError,
        InvalidArgumentError,
        InvalidDataError,
        InvalidIdentifierError,
        InvalidLocationError,
        InvalidPredicateError,
        InvalidPropertyError,
        InvalidSchemaError,
        LakestepError,
        LocationOverlapError,
        LockNotFoundError,
        NamespaceAlreadyExistsError,
        NamespaceNotEmptyError,
        NamespaceNotFoundError,
        NoPrimaryKeyError,
        QueryError,
        SchemaChangedConflict,
        SchemaChangeError,
        SchemaMismatchError,
        ServeRequestError,
        ServerStartError,
        SnapshotExistsError,
        SparkSetupError,
        SparkVersionError,
        StorageError,
        StreamingJobError,
        TableAlreadyExistsError,
        TableNotFoundError,
        TransactionClosedError,
        VersionNotFoundError,
    )
    from .query import (
        consistent_arrow,
        consistent_read,
        duckdb_connect,
        duckdb_query,
        spark_sql,
        spark_table,
        table_refs,
    )
    from .services import Coordinator, MaintenanceLoop
    from .streaming import DerivedJob, foreach_batch, register, register_job

#: Each public name and the module it lives in.
_PUBLIC: dict[str, str] = {
    **dict.fromkeys(["Catalog", "Table", "Transaction", "CommitResult", "CommitInfo", "DataFile", "Operation",
                     "Predicate", "OPEN_EPOCH", "Snapshot", "VersionLock"], "catalog"),
    **dict.fromkeys(["Coordinator", "MaintenanceLoop"], "services"),
    **dict.fromkeys(["Pipeline", "Level", "Scope", "diagnose"], "barrier"),
    **dict.fromkeys(["DerivedJob", "foreach_batch", "register", "register_job"], "streaming"),
    **dict.fromkeys(["consistent_read", "consistent_arrow", "duckdb_connect", "duckdb_query", "spark_sql",
                     "spark_table", "table_refs"], "query"),
    **dict.fromkeys([
        "LakestepError", "CatalogError", "CatalogVersionError", "CatalogUnavailableError", "CatalogWaitExpiredError",
        "CatalogCorruptError", "InvalidIdentifierError", "InvalidLocationError", "NamespaceNotFoundError",
        "NamespaceAlreadyExistsError", "NamespaceNotEmptyError", "TableNotFoundError", "TableAlreadyExistsError",
        "VersionNotFoundError", "SnapshotExistsError", "LockNotFoundError", "SchemaMismatchError",
        "InvalidPredicateError", "DataOutOfRangeError", "CommitError", "CommitConflict", "SchemaChangedConflict",
        "TransactionClosedError", "InvalidArgumentError", "ArgumentTypeError", "InvalidPropertyError",
        "InvalidSchemaError", "SchemaChangeError", "InvalidDataError", "FilterValueError", "NoPrimaryKeyError",
        "LocationOverlapError", "StorageError", "DataFileCorruptError", "InternalError", "StreamingJobError",
        "SparkSetupError", "SparkVersionError", "IcebergError", "IcebergSchemaError", "IcebergConflictError",
        "ServeRequestError", "ServerStartError", "QueryError"], "errors"),
}

__all__ = [  # a literal list, so that linters see the lazy names as exported (== sorted(_PUBLIC) + __version__)
    "ArgumentTypeError", "Catalog", "CatalogCorruptError", "CatalogError", "CatalogUnavailableError",
    "CatalogVersionError", "CatalogWaitExpiredError", "CommitConflict", "CommitError", "CommitInfo", "CommitResult",
    "Coordinator", "DataFile", "DataFileCorruptError", "DataOutOfRangeError", "DerivedJob", "FilterValueError",
    "IcebergConflictError", "IcebergError", "IcebergSchemaError", "InternalError", "InvalidArgumentError",
    "InvalidDataError", "InvalidIdentifierError", "InvalidLocationError", "InvalidPredicateError",
    "InvalidPropertyError", "InvalidSchemaError", "LakestepError", "Level", "LocationOverlapError",
    "LockNotFoundError", "MaintenanceLoop", "NamespaceAlreadyExistsError", "NamespaceNotEmptyError",
    "NamespaceNotFoundError", "NoPrimaryKeyError", "OPEN_EPOCH", "Operation", "Pipeline", "Predicate", "QueryError",
    "SchemaChangeError", "SchemaChangedConflict", "SchemaMismatchError", "Scope", "ServeRequestError",
    "ServerStartError", "Snapshot", "SnapshotExistsError", "SparkSetupError", "SparkVersionError", "StorageError",
    "StreamingJobError", "Table", "TableAlreadyExistsError", "TableNotFoundError", "Transaction",
    "TransactionClosedError", "VersionLock", "VersionNotFoundError", "__version__", "consistent_arrow",
    "consistent_read", "diagnose", "duckdb_connect", "duckdb_query", "foreach_batch", "register", "register_job",
    "spark_sql", "spark_table", "table_refs",
]


__getattr__, __dir__ = _lazy.exports(__name__, _PUBLIC)
