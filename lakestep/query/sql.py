"""The lakestep tables a SQL string reads, found with a SQL parser (sqlglot), never a regex.

A lakestep table is named ``namespace.table`` in the SQL; names without a
namespace are left alone (CTEs, the engine's own tables, temporary views).
Time travel written in the SQL is honoured:

* ``shop.orders VERSION AS OF 12``: version 12;
* ``shop.orders TIMESTAMP AS OF '2026-11-22 10:00:00'``: the last commit at or before it;
* ``shop.orders VERSION AS OF 'month-end'``: the snapshot named ``month-end``;
* ``shop.orders VERSION AS OF 'barrier=42'``: the table's version at barrier 42.

:func:`rewrite` replaces the references by the names of the views a reader
registered for them, keeping (or adding) the alias, so that qualified column
references (``orders.id``) still work.
"""

from __future__ import annotations

import functools
import re
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

from ..errors import QueryError
from .read import TableRef

if TYPE_CHECKING:
    from sqlglot import exp

_BARRIER = re.compile(r"^\s*barrier\s*=\s*(\d+)\s*$", re.IGNORECASE)


def _parse(sql: str, dialect: str) -> exp.Expr:
    try:
        import sqlglot
    except ImportError:  # pragma: no cover - an extra
        raise QueryError("lakestep's SQL helpers need sqlglot: pip install 'lakestep[duckdb]' or "
                         "'lakestep[spark]'") from None
    try:
        trees = sqlglot.parse(sql, read=dialect)
    except sqlglot.errors.ParseError as e:
        raise QueryError(f"cannot parse the SQL ({dialect}): {str(e).splitlines()[0]}") from None
    found = [t for t in trees if t is not None]
    if len(found) != 1:
        raise QueryError(f"expected one SQL statement, got {len(found)}")
    return found[0]


def _ref(node: exp.Table) -> TableRef | None:
    from sqlglot import exp

    if not node.db or node.catalog:
        return None
    ident = f"{node.db}.{node.name}"
    version = node.args.get("version")
    if version is None:
        return TableRef(ident)
    kind = str(version.this).upper()
    value = version.expression
    if not isinstance(value, exp.Literal):
        raise QueryError(f"{ident}: {kind} AS OF needs a literal, got {value.sql()}")
    if kind == "TIMESTAMP":
        return TableRef(ident, timestamp=str(value.this))
    if value.is_string:
        m = _BARRIER.match(str(value.this))
        if m:
            return TableRef(ident, barrier=int(m.group(1)))
        return TableRef(ident, snapshot=str(value.this))
    try:
        return TableRef(ident, version=int(str(value.this)))
    except ValueError:
        raise QueryError(f"{ident}: VERSION AS OF needs a whole number, a snapshot name or 'barrier=N'") from None


@dataclass(frozen=True)
class ParsedSQL:
    """One SQL statement, parsed: the lakestep tables it reads."""

    tree: Any
    refs: list[TableRef]
    dialect: str


def parse_sql(sql: str, dialect: str) -> ParsedSQL:
    """Parse ``sql`` once (see :class:`ParsedSQL`)."""
    from sqlglot import exp

    tree = _parse(sql, dialect)
    ctes = {c.alias_or_name for c in tree.find_all(exp.CTE)}
    out: list[TableRef] = []
    for node in tree.find_all(exp.Table, bfs=False):
        if node.name in ctes and not node.db:
            continue
        ref = _ref(node)
        if ref is not None and ref not in out:
            out.append(ref)
    if not out:
        raise QueryError("the SQL names no lakestep table (write them as namespace.table)")
    return ParsedSQL(tree, out, dialect)


_MARK = f"lakestep_ref_{uuid.uuid4().hex[:8]}_"
_MARKED = re.compile(r'["`]' + _MARK + r'(\d+)["`]')


@dataclass(frozen=True)
class SQLTemplate:
    """A SQL statement with each lakestep table reference replaced by a placeholder.

    Parsing and printing SQL with sqlglot costs milliseconds (more with long
    file lists), and a dashboard runs the same statements again and again: the
    template of a statement is made once per process (:func:`sql_template`)
    and each run only fills in what each table is read from."""

    refs: tuple[TableRef, ...]
    text: str

    def fill(self, source_of: Callable[[TableRef], str]) -> str:
        """The SQL with each reference replaced by ``source_of(ref)``: SQL text to read
        from (a quoted view name, or a table function such as DuckDB's read_parquet)."""
        return _MARKED.sub(lambda m: source_of(self.refs[int(m.group(1))]), self.text)


@functools.lru_cache(maxsize=512)
def sql_template(sql: str, dialect: str) -> SQLTemplate:
    """The template of ``sql`` (cached per process; a statement that does not parse is not)."""
    parsed = parse_sql(sql, dialect)
    index = {ref: i for i, ref in enumerate(parsed.refs)}
    text = _render(parsed.tree, dialect, lambda ref: (None, f"{_MARK}{index[ref]}"), copy=False)
    return SQLTemplate(tuple(parsed.refs), text)


def table_refs(sql: str, dialect: str) -> list[TableRef]:
    """The lakestep tables ``sql`` reads, each once (with its time travel, if any)."""
    return parse_sql(sql, dialect).refs


def rewrite(sql: str, dialect: str, view_of: Callable[[TableRef], tuple[str | None, str]]) -> str:
    """``sql`` with every lakestep table reference replaced by ``view_of(ref)``: (schema or None, name)."""
    return _render(_parse(sql, dialect), dialect, view_of, copy=False)


def _render(tree: Any, dialect: str, view_of: Callable[[TableRef], tuple[str | None, str]], *, copy: bool) -> str:
    from sqlglot import exp

    def swap(node: exp.Expr) -> exp.Expr:
        if not isinstance(node, exp.Table):
            return node
        ref = _ref(node)
        if ref is None:
            return node
        schema, name = view_of(ref)
        alias = node.args.get("alias") or exp.TableAlias(this=exp.to_identifier(node.name))
        return exp.Table(this=exp.to_identifier(name, quoted=True),
                         db=exp.to_identifier(schema, quoted=True) if schema else None, alias=alias)

    return tree.transform(swap, copy=copy).sql(dialect=dialect)
