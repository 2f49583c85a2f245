"""lakestep: consistent multi-table streaming ETL on Apache Spark.

The catalog (``lakestep.catalog``) stores tables as immutable Parquet files and
commits; it imports no pyspark. Spark integration lives in
``lakestep.streaming``.
"""

from .catalog import Catalog, CommitInfo, CommitResult, DataFile, Operation, Predicate, Table, Transaction
from .errors import (
    CatalogError,
    CatalogUnavailableError,
    CommitConflict,
    CommitError,
    InvalidIdentifierError,
    InvalidLocationError,
    LakestepError,
    SchemaMismatchError,
    TableNotFoundError,
    VersionNotFoundError,
)

__version__ = "0.1.0"

__all__ = [
    "Catalog",
    "Table",
    "Transaction",
    "CommitResult",
    "CommitInfo",
    "DataFile",
    "Operation",
    "Predicate",
    "LakestepError",
    "CatalogError",
    "CatalogUnavailableError",
    "CommitConflict",
    "CommitError",
    "InvalidIdentifierError",
    "InvalidLocationError",
    "SchemaMismatchError",
    "TableNotFoundError",
    "VersionNotFoundError",
]
