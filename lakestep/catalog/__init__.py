"""The lakestep metadata catalog: tables, immutable data files, commits, versions.

No pyspark here: the catalog works, and is tested, with no JVM.
"""

from ..errors import LockNotFoundError, SnapshotExistsError
from .catalog import Catalog, Transaction, parse_ident
from .changes import CommitResult, Operation
from .epoch import OPEN_EPOCH
from .files import DataFile
from .lifecycle import Snapshot, VersionLock
from .predicates import Predicate
from .table import Table
from .table_reads import CommitInfo

__all__ = [
    "Catalog",
    "Transaction",
    "Table",
    "CommitResult",
    "CommitInfo",
    "DataFile",
    "Operation",
    "Predicate",
    "parse_ident",
    "OPEN_EPOCH",
    "Snapshot",
    "SnapshotExistsError",
    "VersionLock",
    "LockNotFoundError",
]
