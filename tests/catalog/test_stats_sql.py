"""Typed statistics rows (ls_file_stats, stats_sql.py): the database narrows a read by
column bounds, never losing a file the statistics do not rule out, on both backends.

The reference is the Python path: every live file listed and judged by its JSON
statistics (``read_plan().prune(where)``). A planned read through SQL must keep exactly
the same files, and those files must include every file holding a matching row.
"""

from __future__ import annotations

import datetime as dt
import decimal
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import sqlalchemy as sa
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from lakestep import Catalog
from lakestep.catalog import migrations as M
from lakestep.catalog import schema as S
from lakestep.catalog import stats_sql
from lakestep.catalog.backend import create_backend
from lakestep.catalog.predicates import Predicate
from lakestep.clock import ManualClock

BIG = 2 ** 53
I64 = 2 ** 63 - 1
SCHEMA = pa.schema([
    ("i", pa.int64()), ("s8", pa.int8()), ("u", pa.uint64()), ("b", pa.bool_()), ("d", pa.date32()),
    ("f", pa.float64()), ("t", pa.string()), ("dec", pa.decimal128(10, 2)),
    ("ts", pa.timestamp("us", tz="UTC")),
])
D = dt.date(2026, 3, 1)
TS = dt.datetime(2026, 3, 1, tzinfo=dt.timezone.utc)


def _rows(i: list[Any], *, u: list[Any] | None = None, b: list[Any] | None = None, d: list[Any] | None = None,
          f: list[Any] | None = None, t: list[Any] | None = None) -> pa.Table:
    n = len(i)
    return pa.table({
        "i": i, "s8": [None if x is None else x % 100 for x in i], "u": u or [0] * n, "b": b or [True] * n,
        "d": d or [D] * n, "f": f or [0.0] * n, "t": t or ["a"] * n,
        "dec": [decimal.Decimal("1.50")] * n, "ts": [TS] * n}, schema=SCHEMA)


# One file per row set: bounds at the edges of 53 and 64 bits, nulls, a file of nulls.
FILES = [
    _rows([1, 2, 3], b=[False, False, False], d=[D, D, D], t=["a", "b", "B"]),
    _rows([BIG, BIG + 1], u=[2 ** 64 - 1, 5], f=[float("nan"), -0.0], t=["é", "z"]),
    _rows([-(2 ** 63), -5]),
    _rows([I64, I64 - 1], d=[dt.date(1969, 12, 31), dt.date(2100, 1, 1)]),
    _rows([None, 10], b=[None, True], d=[None, D], f=[float("inf"), None]),
    _rows([None, None], b=[None, None], d=[None, None]),
    _rows([100, 163], f=[1.0, 2.0], t=["x", "y"]),
]


def _made(catalog: Catalog):  # type: ignore[no-untyped-def]
    catalog.create_namespace("s")
    t = catalog.create_table("s.t", SCHEMA)
    for data in FILES:
        t.append(data)
    return t


@pytest.fixture
def table(catalog: Catalog):  # type: ignore[no-untyped-def]
    return _made(catalog)


@pytest.fixture
def read_only_table(shared_catalog):  # type: ignore[no-untyped-def]
    """The table of ``table``, made once in the module's catalog of the backend (conftest.SharedCatalogs),
    for tests that only read it."""
    catalog = shared_catalog[1]
    return catalog.load_table("s.t") if "s" in catalog.list_namespaces() else _made(catalog)


def _matching(table, where) -> set[str]:  # type: ignore[no-untyped-def]
    """The files holding a row that matches, found by reading every live file."""
    pred = Predicate.parse(where, table.schema)
    out = set()
    for f in table.read_plan().files:
        rows = pq.read_table(f.uri, schema=table.schema)
        if pred.mask(rows).to_pylist().count(True):
            out.add(f.path)
    return out


def _check(table, where, version: int | None = None) -> None:  # type: ignore[no-untyped-def]
    python = {f.path for f in table.read_plan(version=version).prune(where).files}
    fresh = table.catalog.load_table(table.ident)  # nothing cached
    planned = {f.path for f in fresh.read_plan(version=version, where=where).files}
    assert planned == python, where
    if version is None:
        assert _matching(table, where) <= planned, where
    # and the SQL candidates alone keep every file Python keeps
    pred = Predicate.parse(where, table.schema)
    with table.catalog.backend.read() as conn:
        cand = stats_sql.candidates(conn, pred, table.schema, table.table_id, stats_sql.covered(conn, table.table_id))
        if cand is not None:
            ids = set(conn.execute(cand).scalars().all())
            assert {f.file_id for f in table.files(version=version) if f.path in python} <= ids, where


CASES = {
    "int point": [("i", "==", 2)],
    "int point at 2**53 + 1": [("i", "==", BIG + 1)],
    "int point at 2**53 (a float would round 2**53 + 1 to it)": [("i", "==", BIG)],
    "int64 min": [("i", "<=", -(2 ** 63))],
    "int64 max": [("i", ">=", I64)],
    "int range": [("i", ">", 3), ("i", "<", 200)],
    "int in": [("i", "in", [3, -5, 163])],
    "int8": [("s8", "==", 63)],
    "bool": [("b", "==", False)],
    "bool true": [("b", "=", True)],
    "date": [("d", ">", dt.date(2099, 1, 1))],
    "date before 1970": [("d", "<", dt.date(1970, 1, 1))],
    "datetime on a date column (Python only)": [("d", "==", dt.datetime(2026, 3, 1))],
    "float column (Python only)": [("f", ">", 1.5)],
    "string column (Python only, collation)": [("t", ">", "Z")],
    "decimal column (Python only)": [("dec", "==", decimal.Decimal("1.50"))],
    "timestamp column (Python only)": [("ts", "<", TS)],
    "is_null (Python only)": [("i", "is_null", None)],
    "not_null": [("i", "not_null", None)],
    "!= (Python only)": [("i", "!=", 2)],
    "or of int and string clauses (no narrowing)": [[("i", "==", 2)], [("t", "==", "z")]],
    "or of two int clauses": [[("i", "==", 2)], [("d", "<", dt.date(1970, 1, 1))]],
    "and with a string term": [("i", ">", 0), ("t", "==", "x")],
    "empty in": [("i", "in", [])],
    "contradiction": [("i", "==", 1), ("i", "==", 100)],
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_planned_reads_equal_the_python_path(read_only_table, name: str) -> None:  # type: ignore[no-untyped-def]
    _check(read_only_table, CASES[name])


def test_values_that_do_not_convert_exactly_do_not_narrow() -> None:
    assert stats_sql.literal(pa.int64(), 2.0) is None  # pyarrow compares it as a float
    assert stats_sql.literal(pa.int64(), BIG + 1) == BIG + 1
    assert stats_sql.literal(pa.int8(), 300) is None
    assert stats_sql.literal(pa.uint64(), 2 ** 64 - 1) is None  # beyond a BIGINT
    assert stats_sql.literal(pa.date32(), dt.datetime(2026, 3, 1)) is None
    assert stats_sql.literal(pa.date32(), dt.date(1969, 12, 31)) == -1
    assert stats_sql.literal(pa.bool_(), True) == 1


def test_a_file_of_nulls_is_pruned_by_comparisons_kept_by_is_null(table) -> None:  # type: ignore[no-untyped-def]
    nulls_only = {f.path for f in table.files() if f.stats["i"].null_count == f.record_count}
    assert len(nulls_only) == 1
    assert not nulls_only & {f.path for f in table.catalog.load_table("s.t").read_plan(where=[("i", ">", -BIG)]).files}
    assert nulls_only <= {f.path for f in table.catalog.load_table("s.t").read_plan(where=[("i", "is_null", None)]).files}


def test_the_rows_record_the_bounds_sql_compares_exactly(table) -> None:  # type: ignore[no-untyped-def]
    with table.catalog.backend.read() as conn:
        rows = {(r.file_id, r.column_name): (r.null_count, r.min_value, r.max_value, r.width)
                for r in conn.execute(sa.select(S.file_stats))}
    files = sorted(table.files(), key=lambda f: f.file_id)
    big = files[1].file_id
    assert rows[(big, "i")] == (0, BIG, BIG + 1, 1)  # exact beyond 2**53
    assert (big, "u") not in rows  # 2**64 - 1 does not fit a BIGINT
    assert rows[(files[2].file_id, "i")] == (0, -(2 ** 63), -5, 63)
    assert rows[(files[0].file_id, "b")] == (0, 0, 0, 0)
    assert rows[(files[3].file_id, "d")] == (0, -1, (dt.date(2100, 1, 1) - dt.date(1970, 1, 1)).days, 16)
    assert rows[(files[5].file_id, "i")] == (2, None, None, None)  # every value null
    assert not {c for _, c in rows} & {"f", "t", "dec", "ts"}


# ----------------------------------------------------------- random filters (property)
INTS = st.one_of(st.integers(-20, 180), st.sampled_from([BIG - 1, BIG, BIG + 1, -(2 ** 63), I64, I64 - 1]))
DATES = st.dates(dt.date(1969, 12, 1), dt.date(2100, 2, 1))
TERM = st.one_of(
    st.tuples(st.sampled_from(["i", "s8"]), st.sampled_from(["=", "==", "!=", "<", "<=", ">", ">="]), INTS),
    # (no None in the lists: pyarrow's isin matches a null row with a None of the list, which the
    # statistics verdict of predicates.py does not: a mismatch older than these rows, left alone here)
    st.tuples(st.just("i"), st.sampled_from(["in", "not in"]), st.lists(INTS, max_size=4)),
    st.tuples(st.sampled_from(["i", "d", "b"]), st.sampled_from(["is_null", "not_null"]), st.none()),
    st.tuples(st.just("d"), st.sampled_from(["=", "<", ">=", "!="]), DATES),
    st.tuples(st.just("b"), st.sampled_from(["=", "!="]), st.booleans()),
    st.tuples(st.just("t"), st.sampled_from(["=", "<", ">"]), st.sampled_from(["a", "B", "é", "y", "Z"])),
)
WHERE = st.lists(st.lists(TERM, min_size=1, max_size=3), min_size=1, max_size=3)


@settings(max_examples=60, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(WHERE)
@example([[("i", "==", BIG + 1)]])
@example([[("s8", ">", 62)], [("i", "<", -(2 ** 63) + 1)]])
def test_random_filters_keep_what_python_keeps(table, where) -> None:  # type: ignore[no-untyped-def]
    try:
        Predicate.parse(where, table.schema)
    except Exception:  # a value the column cannot compare with: refused before any read
        return
    _check(table, where)


# ------------------------------------------------------------------------ write paths
def assert_stats_rows_match(catalog: Catalog) -> None:
    """Every file row of the catalog has exactly the stats rows its JSON statistics give, and
    its column set is recorded for its table; no stats row is left without its file."""
    with catalog.backend.read() as conn:
        got = sorted(tuple(r) for r in conn.execute(sa.select(
            S.file_stats.c.file_id, S.file_stats.c.table_id, S.file_stats.c.column_name, S.file_stats.c.null_count,
            S.file_stats.c.min_value, S.file_stats.c.max_value, S.file_stats.c.width)))
        want = []
        sets: dict[int, set[str]] = {}
        for fid, tid, count, stats in conn.execute(sa.select(S.files.c.file_id, S.files.c.table_id,
                                                             S.files.c.record_count, S.files.c.stats)):
            rows, cols = stats_sql.stats_rows(int(tid), int(fid), int(count), stats)
            want += [(r["file_id"], r["table_id"], r["column_name"], r["null_count"], r["min_value"],
                      r["max_value"], r["width"]) for r in rows]
            sets.setdefault(int(tid), set()).add(S.columns_json(cols))
        recorded: dict[int, set[str]] = {}
        for tid, cols in conn.execute(sa.select(S.stats_columns.c.table_id, S.stats_columns.c.columns)):
            recorded.setdefault(int(tid), set()).add(cols)
    assert got == sorted(want)
    for tid, cols in sets.items():
        assert cols <= recorded.get(tid, set()), tid


def test_every_add_path_writes_stats_rows(catalog: Catalog) -> None:  # type: ignore[no-untyped-def]
    catalog.create_namespace("s")
    t = catalog.create_table("s.t", pa.schema([("k", pa.int64()), ("v", pa.string()), ("p", pa.int64())]),
                             partition_by=["p"])
    t.append({"k": [1, 2], "v": ["a", "b"], "p": [1, 2]})  # the blind append (fast path)
    u = catalog.create_table("s.u", pa.schema([("k", pa.int64())]))
    with catalog.transaction() as tx:  # appends to two tables in one transaction
        tx.append(t, {"k": [3], "v": ["c"], "p": [1]})
        tx.append(u, {"k": [7]})
    t.overwrite({"k": [4], "v": ["d"], "p": [2]}, where=[("p", "==", 2)])
    t.delete([("k", "==", 1)])
    t.update({"v": "z"}, where=[("k", "==", 3)])
    t.append({"k": [5], "v": [None], "p": [1]})
    t.compact(min_files=2)
    pk = catalog.create_table("s.pk", pa.schema([pa.field("id", pa.int64(), nullable=False), ("x", pa.int64())]),
                              primary_key=["id"])
    pk.upsert({"id": [1, 2], "x": [10, None]})
    pk.upsert({"id": [2], "x": [20]})
    t.add_columns(("n", pa.int64()))
    t.append({"k": [6], "v": ["e"], "p": [1], "n": [1]})
    assert_stats_rows_match(catalog)
    with catalog.backend.read() as conn:
        cols = stats_sql.covered(conn, t.table_id)
    assert cols == {"k", "p"}  # "n" is missing from the files written before it: never narrowed by SQL
    t2 = catalog.load_table("s.t")
    for where in ([("n", "==", 1)], [("n", "is_null", None)], [("k", ">=", 5)], [("k", "==", 4)]):
        assert {f.path for f in t2.read_plan(where=where).files} == {
            f.path for f in t2.read_plan().prune(where).files}, where
    catalog.drop_table("s.u")
    assert_stats_rows_match(catalog)
    with catalog.backend.read() as conn:
        assert conn.execute(sa.select(sa.func.count()).select_from(S.stats_columns).where(
            S.stats_columns.c.table_id == u.table_id)).scalar() == 0


def test_time_travel_plans_the_files_of_the_version(catalog: Catalog) -> None:  # type: ignore[no-untyped-def]
    catalog.create_namespace("s")
    t = catalog.create_table("s.t", pa.schema([("k", pa.int64())]))
    t.append({"k": [1, 2]})  # v1
    t.append({"k": [5, 6]})  # v2
    t.delete([("k", "==", 5)])  # v3: [5, 6] rewritten to [6]
    t.append({"k": [5]})  # v4
    fresh = catalog.load_table("s.t")
    for v, want in ((1, []), (2, [[5, 6]]), (3, []), (4, [[5]])):
        files = fresh.read_plan(version=v, where=[("k", "==", 5)]).files
        assert sorted(sorted(pq.read_table(f.uri).column("k").to_pylist()) for f in files) == want, v
        _check(fresh, [("k", "==", 5)], version=v)


def test_cleanup_deletes_the_stats_rows_of_the_files_it_forgets(clocked: Catalog, clock: ManualClock) -> None:  # type: ignore[no-untyped-def]
    clocked.create_namespace("s")
    t = clocked.create_table("s.t", pa.schema([("k", pa.int64())]), properties={"lakestep.retention-seconds": "60"})
    t.append({"k": [1]})
    t.append({"k": [2]})
    old = {f.file_id for f in t.files()}
    t.compact(min_files=2)
    clock.advance(61)
    report = t.cleanup()
    assert report.pruned_file_rows == 2
    with clocked.backend.read() as conn:
        left = set(conn.execute(sa.select(S.file_stats.c.file_id)).scalars().all())
    assert not left & old and left == {f.file_id for f in t.files()}
    assert_stats_rows_match(clocked)
    assert [r["k"] for r in clocked.load_table("s.t").to_arrow(where=[("k", ">", 1)]).to_pylist()] == [2]


# ------------------------------------------------------------------------- migration
def test_a_catalog_of_version_7_is_backfilled(catalog_spec) -> None:  # type: ignore[no-untyped-def]
    from tests.catalog.test_upgrade import _write_as_version

    backend = create_backend(catalog_spec.url)
    with backend.write() as conn:
        assert M.upgrade(conn, target=7) == 7
        assert not sa.inspect(conn).has_table("ls_file_stats")
        _write_as_version(conn, 7, catalog_spec.warehouse)
    backend.dispose()
    cat = catalog_spec.open()
    assert_stats_rows_match(cat)
    t = cat.load_table("s.t")
    with cat.backend.read() as conn:
        assert stats_sql.covered(conn, t.table_id) == {"id"}  # "name" is a string: never copied
        assert conn.execute(sa.select(sa.func.count()).select_from(S.file_stats)).scalar() == 3
    for where in ([("id", "==", 3)], [("id", "<", 3)], [("id", ">=", 1), ("name", "==", "b")]):
        for version in (1, 2, 3):
            _check(t, where, version=version)
    assert [f.path for f in cat.load_table("s.t").read_plan(where=[("id", "==", 3)]).files] == ["data/b.parquet"]
    cat.close()


# ------------------------------------ floats and out-of-range integers against integer columns
FLOATS = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([2.5, -4.5, 0.0, -0.0, 100.0, 162.5, 163.0, float(BIG), float(BIG + 1), float(I64),
                     -float(2 ** 63), 1e30, -1e30, float(2 ** 64)]),
)
# integers beyond int8 / int64 / uint64, and within them (uint64 holds 2**64 - 1 and 5)
EDGE_INTS = st.sampled_from([5, 99, 100, 127, 128, -129, 300, 2 ** 63 - 1, 2 ** 63, 2 ** 64 - 1, 2 ** 64,
                             -(2 ** 63), -(2 ** 63) - 1])
NUMBERS = st.one_of(FLOATS, EDGE_INTS)
FLOAT_TERM = st.one_of(
    st.tuples(st.sampled_from(["i", "s8", "u"]), st.sampled_from(["=", "==", "!=", "<", "<=", ">", ">="]), NUMBERS),
    st.tuples(st.sampled_from(["i", "s8", "u"]), st.sampled_from(["in", "not in"]),
              st.lists(st.one_of(NUMBERS, st.integers(-5, 200)), max_size=3)),
)
_EXACT = {"=": lambda x, v: x == v, "==": lambda x, v: x == v, "!=": lambda x, v: x != v,
          "<": lambda x, v: x < v, "<=": lambda x, v: x <= v, ">": lambda x, v: x > v, ">=": lambda x, v: x >= v,
          "in": lambda x, v: x in v, "not in": lambda x, v: x not in v}


@settings(max_examples=60, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(st.lists(FLOAT_TERM, min_size=1, max_size=2))
@example([("i", ">", 2.5)])  # pyarrow compared int64 rows beyond 2**24 with 2.5 in floats, and refused them
@example([("i", "==", float(BIG))])
@example([("u", "<", 1e30), ("i", "!=", float("nan"))])
@example([("u", "==", 5)])  # pyarrow compared a uint64 column with an int64 literal by casting the column
@example([("s8", ">", 300), ("u", "in", [2 ** 64 - 1, 2 ** 64])])
def test_float_values_on_integer_columns_compare_exactly(table, clause) -> None:  # type: ignore[no-untyped-def]
    """Floats, and integers beyond the column's type, against integer columns: the rows a read
    returns are those Python's own (exact) int/float comparisons keep; a null matches no
    comparison. The planned files agree with the Python path."""
    got = table.to_arrow(where=clause).select(["i", "s8", "u"]).to_pylist()
    want = [r for r in table.to_arrow().select(["i", "s8", "u"]).to_pylist()
            if all(r[c] is not None and _EXACT[op](r[c], v) for c, op, v in clause)]
    key = repr
    assert sorted(got, key=key) == sorted(want, key=key), clause
    _check(table, clause)
