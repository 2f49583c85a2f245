"""Column statistics as typed SQL rows (``ls_file_stats``, schema version 8).

The verdicts of :mod:`predicates` are made from ``ls_file.stats`` (JSON) in
Python; at 10^6 live files, parsing every file's JSON takes seconds. This
module copies the bounds that SQL compares exactly into ``ls_file_stats`` when
files are recorded (:func:`copies`, :func:`rows_of`; the copy of one file's
statistics is ``files.file_stats_rows``), and turns a filter into one SQL
condition on them (:func:`candidates`), so that the database lists the
candidate files of a read through an index. The Python verdict still judges
every listed file: the SQL condition only has to keep a superset.

1. **what is copied**: a column's ``[min, max, null_count]`` when both bounds
   are integers (not floats), booleans (0/1) or dates (days since 1970-01-01)
   within 64 bits, or when every value of the file is null (no bounds). Floats
   (NaN, -0.0), decimals, strings (collations differ from Python's order),
   bytes, times and timestamps (time zones) are never copied: filters on them
   are judged in Python only;
2. **when a file has no row for a column** (its JSON lacks the column, or the
   bounds are not copied), nothing may be concluded about it: every table
   records in ``ls_stats_columns`` each set of columns its files have rows for,
   and a column missing from one of those sets is not narrowed by SQL at all;
3. **what narrows**: per clause of the filter, one term ``=``, ``in`` (at most
   :data:`MAX_IN` values), ``<``, ``<=``, ``>`` or ``>=`` on a copied column
   whose value converts exactly to the column's type and fits 64 bits. A
   clause without such a term keeps every file, and so the whole filter
   (then the listing is the usual one). ``!=``, ``not in``, ``is_null`` and
   ``not_null`` never narrow in SQL;
4. **how**: ``width`` is the bit length of ``max - min``; a file holding a
   value ``x`` has ``min`` in ``(x - 2**width, x]``. A point lookup is thus
   one bounded index range per width that the column's rows have (found first
   by a loose index scan; usually one or two), never a scan of half the table's
   bounds.
"""

from __future__ import annotations

import functools
import json
from typing import Any, Iterable, Sequence

import pyarrow as pa
import sqlalchemy as sa

from . import schema as S
from .files import INT64_MIN, file_stats_rows, sql_int
from .predicates import Predicate

MAX_IN = 16
#: The ``ls_file_stats`` rows of one file, and the columns they cover (step 1: the copy
#: itself is files.file_stats_rows; the schema's migration backfilled with the same rows).
stats_rows = S.stats_rows
#: One file's copied bounds: (column, null_count, min, max, width) (files.file_stats_rows).
Copied = list[tuple[str, int, int | None, int | None, int | None]]
#: The columns of an ``ls_file_stats`` row, in the order of the tuples of :func:`rows_of`.
STATS_COLS = ("file_id", "column_name", "table_id", "null_count", "min_value", "max_value", "width")
#: Rows of one multi-row insert (:func:`insert_rows_sql`): 7,000 parameters, within SQLite's 32,766.
STATS_CHUNK = 1000


@functools.lru_cache(maxsize=64)
def insert_rows_sql(n: int) -> str:
    """The insert of ``n`` ``ls_file_stats`` rows in one statement (SQLite's parameter style)."""
    row = f"({', '.join('?' * len(STATS_COLS))})"
    return f"INSERT INTO ls_file_stats ({', '.join(STATS_COLS)}) VALUES {', '.join([row] * n)}"


def copied_type(t: pa.DataType) -> bool:
    """Whether the bounds of a column of type ``t`` are copied (step 1)."""
    return pa.types.is_integer(t) or pa.types.is_boolean(t) or pa.types.is_date(t)


def literal(t: pa.DataType, v: Any) -> int | None:
    """The BIGINT that a filter value compares as, on a column of type ``t``; None when the
    value does not convert exactly (the term then does not narrow)."""
    if v is None:
        return None
    try:
        got = pa.array([v], t).to_pylist()[0]
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError, TypeError, OverflowError,
            ValueError):
        return None
    if got is None or got != v or type(got) is not type(v) and not (
            isinstance(v, int) and isinstance(got, int)):
        return None  # e.g. 5.5, or 5.0, or a datetime on a date column: left to Python
    return sql_int(got)


def _int(v: int) -> Any:
    """A bound as a BIGINT literal (PostgreSQL's driver writes ints inline: -2**63 alone would be
    read as a numeric, and a numeric comparison cannot use the index)."""
    return sa.cast(sa.literal(v, sa.BigInteger), sa.BigInteger)


# The distinct widths of a column's rows, one index seek each (a loose index scan: neither
# backend skips through an index by itself).
_WIDTHS = sa.text("""
WITH RECURSIVE w(v) AS (
  SELECT MIN(width) FROM ls_file_stats WHERE table_id = :t AND column_name = :c AND width IS NOT NULL
  UNION ALL
  SELECT (SELECT MIN(width) FROM ls_file_stats WHERE table_id = :t AND column_name = :c AND width > w.v)
    FROM w WHERE w.v IS NOT NULL)
SELECT v FROM w WHERE v IS NOT NULL""")


def widths(conn: sa.Connection, table_id: int, col: str) -> list[int]:
    """The widths that rows of ``col`` have (step 4): a point lookup needs a range per width."""
    return [int(v) for v in conn.execute(_WIDTHS, {"t": table_id, "c": col}).scalars().all()]


def _point(table_id: int, col: str, x: int, ws: Sequence[int]) -> list[sa.Select]:
    s = S.file_stats.c
    out = []
    for w in ws:
        lo = max(INT64_MIN, x - 2 ** w + 1)
        out.append(sa.select(s.file_id).where(s.table_id == table_id, s.column_name == col, s.width == w,
                                              s.min_value >= _int(lo), s.min_value <= _int(x),
                                              s.max_value >= _int(x)))
    return out


def _above(table_id: int, col: str, x: int, strict: bool, ws: Sequence[int]) -> list[sa.Select]:
    s = S.file_stats.c
    out = []
    for w in ws:
        # max <= min + 2**w - 1, so max > x (>= x) needs min > x - 2**w + 1 (>= x - 2**w + 1)
        lo = max(INT64_MIN, x - 2 ** w + (2 if strict else 1))
        out.append(sa.select(s.file_id).where(s.table_id == table_id, s.column_name == col, s.width == w,
                                              s.min_value >= _int(lo),
                                              s.max_value > _int(x) if strict else s.max_value >= _int(x)))
    return out


def _below(table_id: int, col: str, x: int, strict: bool) -> list[sa.Select]:
    s = S.file_stats.c
    return [sa.select(s.file_id).where(s.table_id == table_id, s.column_name == col, s.width.is_not(None),
                                       s.min_value < _int(x) if strict else s.min_value <= _int(x))]


def _term(conn: sa.Connection, schema: pa.Schema, table_id: int, term: tuple[str, str, Any], col: str
          ) -> list[sa.Select] | None:
    """The selects of the file ids a term may match (step 3), or None: it does not narrow.
    ``col``: the name the term's column is stored under (columns.py rule 6)."""
    name, op, val = term
    i = schema.get_field_index(name)
    if i < 0 or not copied_type(schema.field(i).type):
        return None
    t = schema.field(i).type
    if op in ("=", "=="):
        x = literal(t, val)
        return None if x is None else _point(table_id, col, x, widths(conn, table_id, col))
    if op == "in":
        vals = list(val)
        if len(vals) > MAX_IN:
            return None
        out: list[sa.Select] = []
        ws = widths(conn, table_id, col)
        for v in vals:
            if v is None:
                continue  # a null is in no list of a file's values (Python's verdict skips it too)
            x = literal(t, v)
            if x is None:
                return None
            out.extend(_point(table_id, col, x, ws))
        return out
    if op in ("<", "<=", ">", ">="):
        x = literal(t, val)
        if x is None:
            return None
        return _below(table_id, col, x, op == "<") if op in ("<", "<=") else _above(table_id, col, x, op == ">", widths(conn, table_id, col))
    return None


def covered(conn: sa.Connection, table_id: int) -> frozenset[str]:
    """The columns every file of the table ever recorded has a stats row for (step 2)."""
    sets = conn.execute(sa.select(S.stats_columns.c.columns).where(
        S.stats_columns.c.table_id == table_id)).scalars().all()
    out: set[str] | None = None
    for js in sets:
        cols = set(json.loads(js))
        out = cols if out is None else out & cols
    return frozenset(out or ())


def candidates(conn: sa.Connection, pred: Predicate, schema: pa.Schema, table_id: int,
               columns: frozenset[str]) -> sa.CompoundSelect | sa.Select | None:
    """One select of the ids of the files that may hold rows matching ``pred`` (a superset),
    or None when SQL cannot narrow (step 3). ``columns``: :func:`covered`."""
    parts: list[sa.Select] = []
    for clause in pred.clauses:
        best: list[sa.Select] | None = None
        for term in clause:
            stored = pred.stored_name(term[0])
            if stored not in columns:
                continue
            got = _term(conn, schema, table_id, term, stored)
            if got is not None and (best is None or (term[1] in ("=", "==", "in") and len(got) <= len(best))):
                best = got
                if term[1] in ("=", "=="):
                    break
        if best is None:
            return None
        parts.extend(best)
    if not parts:  # no file has bounds in the column (every file of nulls): nothing can match
        return sa.select(S.file_stats.c.file_id).where(sa.false())
    return parts[0] if len(parts) == 1 else sa.union_all(*parts)


@functools.lru_cache(maxsize=1024)
def column_set(cols: tuple[str, ...]) -> tuple[str, str]:
    """(digest, JSON) of a set of columns, as ``ls_stats_columns`` records it
    (schema.columns_digest, schema.columns_json). Cached: it depends on the names only,
    never on a table or a database."""
    return S.columns_digest(list(cols)), S.columns_json(list(cols))


def copies(files: Iterable[tuple[int, str]]) -> tuple[list[Copied], dict[str, str]]:
    """Of files (record_count, stats_json): each one's copied bounds (step 1), in order, and
    the column sets they cover (digest -> JSON; step 2), each once. A file that copies no
    column has a set too: the empty one, which turns the SQL narrowing off for the table."""
    per_file: list[Copied] = []
    sets: dict[str, str] = {}
    for count, stats_json in files:
        got = file_stats_rows(count, stats_json)
        per_file.append(got)
        digest, cols = column_set(tuple([g[0] for g in got]))
        sets[digest] = cols
    return per_file, sets


def rows_of(table_id: int, file_ids: Sequence[int], per_file: Sequence[Copied]) -> list[tuple[Any, ...]]:
    """The ``ls_file_stats`` rows (tuples of :data:`STATS_COLS`) of files with ids ``file_ids``
    whose copied bounds are ``per_file`` (:func:`copies`, same order)."""
    return [(fid, col, table_id, n, a, b, w) for fid, got in zip(file_ids, per_file) for col, n, a, b, w in got]


def insert_statements(rows: Sequence[tuple[Any, ...]]) -> Iterable[tuple[str, tuple[Any, ...]]]:
    """The multi-row inserts of ``rows`` in SQLite's parameter style: (SQL, parameters), one per
    :data:`STATS_CHUNK` rows."""
    for i in range(0, len(rows), STATS_CHUNK):
        chunk = rows[i:i + STATS_CHUNK]
        yield insert_rows_sql(len(chunk)), tuple([v for row in chunk for v in row])


def insert_rows(conn: sa.Connection, rows: Sequence[tuple[Any, ...]]) -> None:
    """Insert ``ls_file_stats`` rows (:func:`rows_of`) in the caller's transaction: one
    statement (a :data:`STATS_CHUNK` of rows each), none when there are no rows."""
    if not rows:
        return
    if conn.dialect.name == "sqlite":  # one multi-row statement (cheaper than executemany's one per row)
        for sql, params in insert_statements(rows):
            conn.exec_driver_sql(sql, params)
    else:  # one multi-row statement (SQLAlchemy's insertmanyvalues), not a round trip a row
        conn.execute(sa.insert(S.file_stats), [dict(zip(STATS_COLS, r)) for r in rows])


def insert_added(conn: sa.Connection, table_id: int, files: Sequence[tuple[int, int, str]]) -> None:
    """Record the stats rows of files just added to the table ((file_id, record_count,
    stats_json)) and their column sets, in the caller's transaction: two statements (one
    when no file copies any bounds)."""
    per_file, sets = copies([(count, stats_json) for _, count, stats_json in files])
    insert_rows(conn, rows_of(table_id, [f[0] for f in files], per_file))
    record_sets(conn, table_id, sets)


@functools.lru_cache(maxsize=64)
def known_sets_sql(k: int) -> str:
    """A scalar subquery in SQLite's parameter style: how many of ``k`` distinct digests the
    table has recorded in ``ls_stats_columns``. Parameters: the table id, then the digests.
    Read inside the commit's write transaction (SQLite has one writer), it tells exactly
    whether :func:`record_sets` has anything to record: no in-process state that another
    process, a dropped table or a rolled-back commit could make wrong."""
    return (f"(SELECT count(*) FROM ls_stats_columns WHERE table_id = ? AND digest IN "
            f"({', '.join('?' * k)}))")


def record_sets(conn: sa.Connection, table_id: int, sets: dict[str, str]) -> None:
    """Record column sets (digest -> JSON) not yet recorded for the table (one statement; the
    commit holds the table's row lock, so no other commit of the table races it)."""
    if not sets:
        return
    params: dict[str, Any] = {"tid": table_id}
    rows = []
    for j, (digest, cols) in enumerate(sets.items()):
        rows.append(f"(:tid, :d{j}, :j{j})")
        params.update({f"d{j}": digest, f"j{j}": cols})
    conn.execute(sa.text(f"INSERT INTO ls_stats_columns (table_id, digest, columns) VALUES {', '.join(rows)} "
                         "ON CONFLICT DO NOTHING"), params)
