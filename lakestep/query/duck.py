"""Consistent reads in DuckDB: a connection whose views all show one consistent barrier.

Example::

    from lakestep import Catalog
    from lakestep.query import duckdb_connect, duckdb_query

    cat = Catalog(warehouse="./wh")
    with duckdb_connect(cat, ["shop.revenue", "shop.counts"]) as db:   # read_committed
        db.sql("SELECT r.customer, r.revenue / c.orders FROM shop.revenue r JOIN shop.counts c USING (customer)")
        db.read.barrier, db.read.versions                               # what every view shows

    result = duckdb_query(cat, "SELECT count(*) FROM shop.orders JOIN shop.daily USING (day)")
    result.table, result.read.explanation

Each table becomes a view ``"namespace"."table"`` over exactly the files of
its chosen version (a lazy Arrow dataset: DuckDB pushes filters and column
selections into the scan; a primary-key table is merged first). A table read
with time travel in the SQL gets a view of its own. The connection keeps
nothing open in the catalog: a ``repeatable_read`` connection's pins are
released by ``close()`` (or on leaving ``with``).
"""

from __future__ import annotations

import os
import re
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Sequence, cast

import pyarrow as pa

from ..errors import QueryError
from .read import ConsistentRead, ReadInfo, TableRef, consistent_read
from .sql import sql_template

if TYPE_CHECKING:
    from types import ModuleType

    from ..catalog import Catalog


def _duckdb() -> ModuleType:
    try:
        import duckdb
    except ImportError:  # pragma: no cover - an extra
        raise QueryError("lakestep's DuckDB helpers need duckdb: pip install 'lakestep[duckdb]'") from None
    return duckdb


def load_extensions(con: Any, *names: str) -> None:
    """``LOAD`` DuckDB extensions from their PyPI wheels (``duckdb-extension-<name>``, pinned to the
    installed duckdb's version), for machines that cannot download them. Load ``avro`` before
    ``iceberg``.

    Example::

        con = duckdb.connect()
        load_extensions(con, "avro", "iceberg")
        con.sql("SELECT * FROM iceberg_scan('.../metadata/00003-....metadata.json', version => 'barrier-42')")
    """
    import importlib
    from pathlib import Path

    version = _duckdb().__version__.lstrip("v")
    for name in names:
        try:
            mod = importlib.import_module(f"duckdb_extension_{name}")
        except ImportError:
            raise QueryError(f"the DuckDB extension {name!r} is not installed: "
                             f"pip install duckdb-extension-{name}=={version}") from None
        folder = Path(cast(str, mod.__file__)).parent / "extensions"  # a regular package: __file__ is set
        found = sorted(folder.glob(f"v{version}/**/*.duckdb_extension"))
        if not found:
            have = sorted(p.name for p in folder.glob("v*"))
            raise QueryError(f"the installed duckdb-extension-{name} is built for DuckDB {have}, not {version}: "
                             f"pip install duckdb-extension-{name}=={version}")
        path = found[0]
        canonical = _EXTENSION_NAMES.get(name, name)
        if path.stem != canonical:  # DuckDB finds an extension's entry point by its file name
            path = _renamed(path, canonical, version)
        con.execute(f"LOAD '{path}'")


# The wheels whose file is not named after the extension it holds.
_EXTENSION_NAMES = {"sqlite": "sqlite_scanner", "postgres": "postgres_scanner"}


def _renamed(path: Any, canonical: str, version: str) -> Any:
    """A link to ``path`` named ``<canonical>.duckdb_extension``, in a per-user cache directory."""
    from pathlib import Path

    folder = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "lakestep" / "duckdb" / f"v{version}"
    folder.mkdir(parents=True, exist_ok=True)
    link = folder / f"{canonical}.duckdb_extension"
    if not link.exists() or link.resolve() != Path(path).resolve():
        tmp = folder / f".{canonical}.{os.getpid()}"
        tmp.unlink(missing_ok=True)
        tmp.symlink_to(path)
        os.replace(tmp, link)
    return link


def _quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def view_name(ref: TableRef) -> tuple[str, str]:
    """(schema, view) for a table reference: ``ns.table``, or ``ns."table@v3"`` with time travel."""
    ns, name = ref.ident.split(".", 1)
    if not ref.travels:
        return ns, name
    return ns, name + "@" + re.sub(r"[^A-Za-z0-9_=.:-]", "_", ref.label.split("@", 1)[1])


class DuckDBRead:
    """A DuckDB connection with one view per table, all at one consistent point."""

    def __init__(self, con: Any, read: ConsistentRead, owns: bool) -> None:
        self.con = con
        self._read = read
        self._owns = owns

    @property
    def read(self) -> ReadInfo:
        return self._read.info

    def sql(self, query: str) -> pa.Table:
        """Run ``query`` (it may name the tables' views) and return the rows as Arrow."""
        return _arrow(self.con.sql(query))

    def close(self) -> None:
        self._read.close()
        if self._owns:
            self.con.close()

    def __enter__(self) -> "DuckDBRead":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _arrow(relation: Any) -> pa.Table:
    fetch = getattr(relation, "to_arrow_table", None) or relation.fetch_arrow_table  # duckdb >= 1.4 renamed it
    return fetch()


def _source(plan: Any) -> Any:
    """What DuckDB scans for a plan: a lazy dataset (filters and columns pushed down), or,
    for a primary-key table, its merged rows."""
    return plan.to_arrow() if plan.merge_on_read else plan.dataset()


def _source_name(i: int, plan: Any) -> str:
    return f"__lakestep_{i}_{plan.table_id}_v{plan.version}"


def _attach(con: Any, read: ConsistentRead) -> None:
    con.execute("SET TimeZone = 'UTC'")
    for i, (label, plan) in enumerate(read.plans.items()):
        schema, view = view_name(read.refs[label])
        source = _source_name(i, plan)
        con.register(source, _source(plan))
        con.execute(f"CREATE SCHEMA IF NOT EXISTS {_quote(schema)}")
        con.execute(f"CREATE OR REPLACE VIEW {_quote(schema)}.{_quote(view)} AS SELECT * FROM {_quote(source)}")


_shared: tuple[int, Any] | None = None  # (pid, an in-memory database) for duckdb_query
_shared_lock = threading.Lock()


#: The shared database's settings. DuckDB's external file cache keeps the blocks of every file a
#: query scanned, evicted only under memory pressure (its memory limit is 80% of the machine's
#: memory by default): a process querying a table for days reads ever new immutable files (each
#: commit and compaction writes some), so the cache grew by the size of every file ever read
#: (the endurance run's reader: 220 MiB to 800 MiB in an hour). The files are local (the only
#: ones DuckDB scans itself: :meth:`ReadPlan.native_paths`), so the operating system's page
#: cache already keeps them: nothing is lost.
SHARED_CONFIG = {"enable_external_file_cache": False}


def _cursor() -> Any:
    """A new connection to this process's in-memory database: creating a database costs
    ~20 ms, a cursor on it ~0.02 ms. What a query registers on its cursor is seen by that
    cursor only, so concurrent queries do not see each other's sources. The database keeps
    no file's contents between queries (:data:`SHARED_CONFIG`)."""
    global _shared
    with _shared_lock:
        if _shared is None or _shared[0] != os.getpid():  # a forked child opens its own
            _shared = (os.getpid(), _duckdb().connect(config=dict(SHARED_CONFIG)))
        return _shared[1].cursor()


def duckdb_connect(
    catalog: "Catalog",
    tables: Sequence["str | TableRef"],
    *,
    level: str = "read_committed",
    scope: str = "query",
    barrier: int | None = None,
    snapshot: str | None = None,
    con: Any = None,
    lease_seconds: float | None = 300.0,
) -> DuckDBRead:
    """A DuckDB connection (new, or ``con``) with a view per table at one consistent point."""
    duckdb = _duckdb()
    read = consistent_read(catalog, tables, level=level, scope=scope, barrier=barrier, snapshot=snapshot,
                           lease_seconds=lease_seconds)
    owns = con is None
    try:
        con = con if con is not None else duckdb.connect()
        _attach(con, read)
    except BaseException:
        read.close()
        if owns and con is not None:
            con.close()
        raise
    return DuckDBRead(con, read, owns)


@dataclass(frozen=True)
class QueryResult:
    """The rows of a query and what was read."""

    table: pa.Table
    read: ReadInfo
    sql: str  # as run: each lakestep table replaced by its files, or by a source registered for it


def duckdb_query(
    catalog: "Catalog",
    sql: str,
    *,
    level: str = "read_committed",
    scope: str = "query",
    barrier: int | None = None,
    snapshot: str | None = None,
) -> QueryResult:
    """Run ``sql`` in DuckDB over the lakestep tables it names, all read at one consistent point.

    The tables are found in the SQL by parsing it (once per process and
    statement: :func:`~lakestep.query.sql.sql_template`); ``VERSION AS OF`` and
    ``TIMESTAMP AS OF`` clauses are honoured (module docstring of sql.py). The
    query runs on a cursor of a per-process in-memory database, with the SQL
    rewritten to read each table's files (``read_parquet([...])``, DuckDB's
    own scan, where :meth:`ReadPlan.native_paths` allows; else an Arrow
    dataset registered on that cursor only), so a query pays for no database
    start-up and no views.
    """
    template = sql_template(sql, "duckdb")
    with consistent_read(catalog, template.refs, level=level, scope=scope, barrier=barrier,
                         snapshot=snapshot) as read:
        con = _cursor()
        try:
            con.execute("SET TimeZone = 'UTC'")
            sources: dict[TableRef, str] = {}
            for i, (label, plan) in enumerate(read.plans.items()):
                paths = plan.native_paths()
                if paths is None:  # an Arrow dataset (or merged rows) registered on this cursor only
                    name = _source_name(i, plan)
                    con.register(name, _source(plan))
                    sources[read.refs[label]] = _quote(name)
                else:  # DuckDB's own Parquet scan, written into the SQL: about twice as fast
                    sources[read.refs[label]] = "read_parquet([" + ", ".join(
                        "'" + p.replace("'", "''") + "'" for p in paths) + "])"
            run = template.fill(lambda ref: sources[ref])
            try:
                rows = _arrow(con.sql(run))
            except _duckdb().Error as e:
                raise QueryError(f"DuckDB refused the query: {str(e).splitlines()[0]}") from e
        finally:
            con.close()
        return QueryResult(rows, read.info, run)
