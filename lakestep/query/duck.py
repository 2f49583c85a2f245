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

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Sequence

import pyarrow as pa

from ..errors import QueryError
from .read import ConsistentRead, ReadInfo, TableRef, consistent_read
from .sql import rewrite, table_refs

if TYPE_CHECKING:
    from ..catalog import Catalog


def _duckdb():  # type: ignore[no-untyped-def]
    try:
        import duckdb
    except ImportError:  # pragma: no cover - an extra
        raise QueryError("lakestep's DuckDB helpers need duckdb: pip install 'lakestep[duckdb]'") from None
    return duckdb


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
        return self.con.sql(query).fetch_arrow_table()

    def close(self) -> None:
        self._read.close()
        if self._owns:
            self.con.close()

    def __enter__(self) -> "DuckDBRead":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _attach(con: Any, read: ConsistentRead) -> None:
    con.execute("SET TimeZone = 'UTC'")
    for i, (label, plan) in enumerate(read.plans.items()):
        schema, view = view_name(read.refs[label])
        source = f"__lakestep_{i}_{plan.table_id}_v{plan.version}"
        # plain tables: a lazy dataset (filters pushed down); primary-key tables: merged rows
        con.register(source, plan.to_arrow() if plan.merge_on_read else plan.dataset())
        con.execute(f"CREATE SCHEMA IF NOT EXISTS {_quote(schema)}")
        con.execute(f"CREATE OR REPLACE VIEW {_quote(schema)}.{_quote(view)} AS SELECT * FROM {_quote(source)}")


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
    sql: str  # as run (time travel rewritten to the views' names)


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

    The tables are found in the SQL by parsing it; ``VERSION AS OF`` and
    ``TIMESTAMP AS OF`` clauses are honoured (module docstring of sql.py).
    """
    refs = table_refs(sql, "duckdb")
    run = rewrite(sql, "duckdb", view_name) if any(r.travels for r in refs) else sql
    with duckdb_connect(catalog, refs, level=level, scope=scope, barrier=barrier, snapshot=snapshot) as db:
        try:
            rows = db.sql(run)
        except _duckdb().Error as e:
            raise QueryError(f"DuckDB refused the query: {str(e).splitlines()[0]}") from e
        return QueryResult(rows, db.read, run)
