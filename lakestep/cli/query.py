"""``lakestep query "SQL"``: run SQL on DuckDB over tables read at one consistent barrier."""

from __future__ import annotations

from typing import Any

import click
from rich.table import Table as RichTable

from .common import common, open_catalog
from .output import Output

LEVELS = ("read_committed", "read_uncommitted", "repeatable_read")
SCOPES = ("query", "related", "global")


@click.command("query")
@click.argument("sql")
@click.option("--level", type=click.Choice(LEVELS), default="read_committed", show_default=True,
              help="consistency level of the read (docs/design.md §4)")
@click.option("--scope", type=click.Choice(SCOPES), default="query", show_default=True,
              help="read_committed: the tables whose frontiers bound the barrier")
@click.option("--max-rows", type=click.IntRange(min=0), default=100, show_default=True,
              help="rows to print (--json prints them all)")
@click.option("--explain/--no-explain", default=True, show_default=True, help="print why this barrier")
@common
def query_cmd(out: Output, catalog_url: str, sql: str, level: str, scope: str, max_rows: int,
              explain: bool) -> None:
    """Run SQL on DuckDB; lakestep tables are named as in the catalog (namespace.table)
    and are all read at one consistent barrier. Prints the rows, then what was read.

    \b
    Example:
      lakestep query "SELECT o.day, sum(o.amount) FROM shop.orders o GROUP BY 1" --catalog ./wh
      lakestep query "SELECT * FROM shop.daily JOIN shop.totals USING (day)" --level repeatable_read --json
    """
    from ..query import duckdb_query
    from ..query.rows import records

    with open_catalog(catalog_url) as cat:
        with out.progress("querying", None):
            result = duckdb_query(cat, sql, level=level, scope=scope)
    table, read = result.table, result.read
    read_doc: dict[str, Any] = {"level": read.level, "scope": read.scope, "barrier": read.barrier,
                                "versions": dict(read.versions), "behind": dict(read.behind),
                                "explanation": str(read.explanation)}
    columns, rows = records(table)  # every column, a duplicate name as name_2 (query/rows.py)
    out.emit({"columns": columns, "rows": rows, "num_rows": table.num_rows, "read": read_doc})
    if out.json:
        return
    grid = RichTable(title=f"{table.num_rows} row(s)" + (f", first {max_rows} shown" if table.num_rows > max_rows
                                                         else ""), title_justify="left")
    for name in columns:
        grid.add_column(name)
    for row in rows[:max_rows]:
        grid.add_row(*["NULL" if v is None else str(v) for v in row.values()])
    out.print(grid)
    at = "no common barrier (newest versions)" if read.barrier is None else f"barrier {read.barrier}"
    versions = ", ".join(f"{t} v{v}" + (f" ({read.behind[t]} behind)" if read.behind.get(t) else "")
                         for t, v in read.versions.items())
    out.print(f"read {read.level} (scope {read.scope}) at {at}: {versions}")
    if explain:
        out.print(str(read.explanation), markup=False)


COMMANDS = [query_cmd]
