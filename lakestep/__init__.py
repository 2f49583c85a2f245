"""lakestep: consistent multi-table streaming ETL on Apache Spark.

The catalog (``lakestep.catalog``) stores tables as immutable Parquet files and
commits; it imports no pyspark. Timestamp barriers live in ``lakestep.barrier``
and the Spark integration in ``lakestep.streaming``.

Public names are imported on first use: Spark starts many Python workers, and
a worker that only reads Kafka should not pay for the catalog's imports.
"""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"

_CATALOG = {"Catalog", "Table", "Transaction", "CommitResult", "CommitInfo", "DataFile", "Operation", "Predicate"}
_ERRORS = {
    "LakestepError", "CatalogError", "CatalogUnavailableError", "CommitConflict", "CommitError",
    "InvalidIdentifierError", "InvalidLocationError", "SchemaMismatchError", "SchemaChangedConflict", "TableNotFoundError",
    "VersionNotFoundError",
}

__all__ = sorted(_CATALOG | _ERRORS)


def __getattr__(name: str) -> Any:
    if name in _CATALOG:
        from . import catalog

        return getattr(catalog, name)
    if name in _ERRORS:
        from . import errors

        return getattr(errors, name)
    raise AttributeError(f"module 'lakestep' has no attribute {name!r}")
