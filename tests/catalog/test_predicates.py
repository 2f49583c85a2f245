"""Pruning by statistics (catalog/predicates.py): what a file's min, max and null count tell.

Verdicts decide which files a scan skips, which files an overwrite drops whole,
and whether a serializable commit conflicts. Two kinds of checks:

* every branch of the rules, with the exact verdict the statistics allow
  (the rules are worked out by hand here, not read from the code);
* a property: whatever the filter and the rows, ``NONE`` means no row
  matches and ``ALL`` means every row does, when the rows are evaluated.
"""

from __future__ import annotations

import json
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from lakestep.catalog.files import DataFile, compute_stats
from lakestep.catalog.predicates import Predicate, Verdict
from lakestep.errors import InvalidPredicateError

NONE, SOME, ALL = Verdict.NONE, Verdict.SOME, Verdict.ALL
SCHEMA = pa.schema([("x", pa.int64())])

A = [1, 2, 3]  # min 1, max 3, no nulls
B = [2, 2]  # min = max = 2
B2 = [2, None]  # min = max = 2, one null
C = [None, None]  # all null
D = [1, None, 3]  # min 1, max 3, one null
E: list[int | None] = []  # no rows


def file_of(values: list[Any], stats: dict[str, list[Any]] | None = None) -> DataFile:
    t = pa.table({"x": pa.array(values, pa.int64())})
    return DataFile(file_id=1, path="f.parquet", record_count=len(values), file_size=1, added_version=1,
                    stats_json=json.dumps(compute_stats(t) if stats is None else stats))


def rows_matching(where: Any, values: list[Any]) -> list[bool]:
    return Predicate.parse(where, SCHEMA).mask(pa.table({"x": pa.array(values, pa.int64())})).to_pylist()


CASES = [
    # =
    (A, ("x", "=", 0), NONE), (A, ("x", "=", 4), NONE), (A, ("x", "=", 1), SOME), (A, ("x", "=", 3), SOME),
    (B, ("x", "=", 2), ALL), (B2, ("x", "=", 2), SOME), (C, ("x", "=", 1), NONE),
    # !=
    (B, ("x", "!=", 2), NONE), (B2, ("x", "!=", 2), NONE), (A, ("x", "!=", 0), ALL), (A, ("x", "!=", 4), ALL),
    (A, ("x", "!=", 1), SOME), (A, ("x", "!=", 2), SOME), (A, ("x", "!=", 3), SOME), (D, ("x", "!=", 0), SOME),
    (C, ("x", "!=", 1), NONE),
    # < <= > >=
    (A, ("x", "<", 1), NONE), (A, ("x", "<", 2), SOME), (A, ("x", "<", 3), SOME), (A, ("x", "<", 4), ALL),
    (D, ("x", "<", 4), SOME),
    (A, ("x", "<=", 0), NONE), (A, ("x", "<=", 1), SOME), (A, ("x", "<=", 2), SOME), (A, ("x", "<=", 3), ALL),
    (D, ("x", "<=", 3), SOME),
    (A, ("x", ">", 3), NONE), (A, ("x", ">", 2), SOME), (A, ("x", ">", 1), SOME), (A, ("x", ">", 0), ALL),
    (D, ("x", ">", 0), SOME),
    (A, ("x", ">=", 4), NONE), (A, ("x", ">=", 3), SOME), (A, ("x", ">=", 2), SOME), (A, ("x", ">=", 1), ALL),
    (D, ("x", ">=", 1), SOME),
    # in / not in
    (A, ("x", "in", [0, 4]), NONE), (A, ("x", "in", []), NONE), (A, ("x", "in", [1]), SOME),
    (A, ("x", "in", [3, 9]), SOME), (B, ("x", "in", [2, 5]), ALL), (B2, ("x", "in", [2]), SOME),
    (C, ("x", "in", [1]), NONE),
    (B, ("x", "not in", [2]), NONE), (B2, ("x", "not in", [2, 7]), NONE), (A, ("x", "not in", [0, 4]), ALL),
    (A, ("x", "not in", []), ALL), (D, ("x", "not in", []), SOME), (A, ("x", "not in", [1]), SOME), (A, ("x", "not in", [3]), SOME),
    (A, ("x", "not in", [2]), SOME), (D, ("x", "not in", [0]), SOME), (C, ("x", "not in", [1]), NONE),
    # null tests
    (A, ("x", "is_null", None), NONE), (C, ("x", "is_null", None), ALL), (D, ("x", "is_null", None), SOME),
    (A, ("x", "not_null", None), ALL), (C, ("x", "not_null", None), NONE), (D, ("x", "not_null", None), SOME),
    # no rows: nothing can match
    (E, ("x", "=", 1), NONE), (E, ("x", "not_null", None), NONE), (E, ("x", "is_null", None), NONE),
]


@pytest.mark.parametrize("values,term,want", CASES, ids=[f"{v}{t[1]}{t[2]}" for v, t, _ in CASES])
def test_term_verdict(values: list[Any], term: tuple[str, str, Any], want: Verdict) -> None:
    got = Predicate.parse([term], SCHEMA).verdict(file_of(values))
    assert got is want
    m = rows_matching([term], values)  # and the verdict holds for the rows
    assert (want is not NONE or not any(m)) and (want is not ALL or all(m))


@pytest.mark.parametrize("where,want", [
    ([("x", ">=", 1), ("x", "<=", 3)], ALL),  # AND: every term all
    ([("x", ">=", 1), ("x", "<", 3)], SOME),  # one some
    ([("x", ">", 3), ("x", ">=", 1)], NONE),  # one none
    ([[("x", "=", 0)], [("x", ">", 0)]], ALL),  # OR: one clause all
    ([[("x", "=", 0)], [("x", "=", 9)]], NONE),  # every clause none
    ([[("x", "=", 0)], [("x", "=", 2)]], SOME),  # one some, none all
    ([[("x", "=", 2)], [("x", "=", 0)]], SOME),  # the same, the other order
])
def test_and_or(where: Any, want: Verdict) -> None:
    assert Predicate.parse(where, SCHEMA).verdict(file_of(A)) is want


def test_missing_or_unusable_statistics_say_some() -> None:
    where = [("x", "=", 5)]
    assert Predicate.parse(where, SCHEMA).verdict(file_of(A, stats={})) is SOME  # no stats for x
    assert Predicate.parse(where, SCHEMA).verdict(file_of(A, stats={"x": [None, None, 0]})) is SOME  # no bounds
    # a literal the statistics cannot be compared with: SOME, never an error
    assert Predicate.parse(where, SCHEMA).verdict(file_of(A, stats={"x": ["a", "c", 0]})) is SOME


@pytest.mark.parametrize("where", [
    [],  # an empty filter would match every row
    (),
    None,  # not a list at all
    5,
    [("x", "=")],  # a pair is no term
    [(1, "=", 2)],  # nor a tuple whose column is not a name
    [["x", "=", 1]],  # a term is a tuple; this is a clause of three non-terms
    [[("x", "=", 1)], []],  # an empty clause would match every row
    [[("x", "=", 1)], [1, 2]],  # a clause of non-terms
    [("x", "in", "12")],  # "in" takes a list, and a string is none
    [("x", "not in", b"12")],
], ids=["empty-list", "empty-tuple", "none", "int", "pair", "int-column", "list-term", "empty-clause", "bad-clause", "in-str", "not-in-bytes"])
def test_malformed_filters_are_refused(where: Any) -> None:
    """Whatever shape a filter has, it is read exactly or refused with InvalidPredicateError
    (never accepted as something else, never a raw TypeError or IndexError)."""
    with pytest.raises(InvalidPredicateError):
        Predicate.parse(where, SCHEMA)
    with pytest.raises(InvalidPredicateError):
        Predicate.parse(where)  # without a schema too (the shape alone decides)


VALUES = st.lists(st.one_of(st.none(), st.integers(-3, 3)), max_size=5)
TERM = st.one_of(
    st.tuples(st.just("x"), st.sampled_from(["=", "!=", "<", "<=", ">", ">="]), st.integers(-4, 4)),
    st.tuples(st.just("x"), st.sampled_from(["in", "not in"]), st.lists(st.integers(-4, 4), max_size=3)),
    st.tuples(st.just("x"), st.sampled_from(["is_null", "not_null"]), st.none()),
)
WHERE = st.lists(st.lists(TERM, min_size=1, max_size=2), min_size=1, max_size=2)


@settings(max_examples=400, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(VALUES, WHERE)
@example([2, None], [[("x", "!=", 2)]])  # min = max = the value, plus a null: no row matches
@example([1, 3], [[("x", "not in", [1, 3])]])
@example([None], [[("x", "not_null", None)]])
def test_verdicts_hold_for_the_rows(values: list[Any], where: Any) -> None:
    verdict = Predicate.parse(where, SCHEMA).verdict(file_of(values))
    m = rows_matching(where, values)
    if verdict is NONE:
        assert not any(m), (values, where, m)
    if verdict is ALL:
        assert all(m), (values, where, m)


def test_not_in_leaves_nulls_out_of_scans_and_deletes_alike(catalog) -> None:  # type: ignore[no-untyped-def]
    """Before the fix, a null matched "not in" row by row (pyarrow's ~isin) while the statistics
    said a file of nulls holds no match: a scan skipped such a file but kept the nulls of
    another, and a delete removed nulls from one file and not from the other."""
    catalog.create_namespace("s")
    t = catalog.create_table("s.t", pa.schema([("k", pa.int64()), ("x", pa.int64())]))
    t.append({"k": [1, 2], "x": [None, None]})  # a file of nulls
    t.append({"k": [3, 4], "x": [None, 5]})  # a null beside a value
    where = [("x", "not in", [1])]
    assert sorted(r["k"] for r in t.to_arrow(where=where).to_pylist()) == [4]
    t.delete(where)
    assert sorted(r["k"] for r in t.to_arrow().to_pylist()) == [1, 2, 3]


def test_in_with_none_matches_no_null_in_scans_and_deletes_alike(catalog) -> None:  # type: ignore[no-untyped-def]
    """A null matches only is_null: before the fix, pyarrow's isin matched a null row when the
    list held None, while the statistics said a file of nulls holds no match, so a scan's
    answer depended on which files pruning skipped (seen by the SQL statistics work)."""
    catalog.create_namespace("s")
    t = catalog.create_table("s.t", pa.schema([("k", pa.int64()), ("x", pa.int64())]))
    t.append({"k": [1, 2], "x": [None, None]})  # a file of nulls: its verdict is NONE
    t.append({"k": [3, 4], "x": [None, 5]})  # a null beside a value: read row by row
    where = [("x", "in", [5, None])]
    assert sorted(r["k"] for r in t.to_arrow(where=where).to_pylist()) == [4]
    assert sorted(r["k"] for r in t.to_arrow(where=[("x", "in", [None])]).to_pylist()) == []
    t.delete(where)
    assert sorted(r["k"] for r in t.to_arrow().to_pylist()) == [1, 2, 3]


@pytest.mark.parametrize("catalog_spec", ["sqlite"], indirect=True)
def test_empty_in_lists_on_every_column_type(catalog) -> None:  # type: ignore[no-untyped-def]
    """``in`` an empty list (or one of nulls only) matches no row, ``not in`` it every non-null
    row, on string columns as on integer ones (found by tests/catalog/test_schema_property.py:
    a string column refused the empty list as a value of no type)."""
    catalog.create_namespace("s")
    t = catalog.create_table("s.t", pa.schema([("k", pa.int64()), ("n", pa.string())]))
    t.append({"k": [1, 2, 3], "n": ["x", None, "y"]})
    for col in ("k", "n"):
        for empty in ([], [None]):
            assert t.to_arrow(where=[(col, "in", empty)]).num_rows == 0, (col, empty)
            assert sorted(t.to_arrow(where=[(col, "not in", empty)]).column("k").to_pylist()) == (
                [1, 2, 3] if col == "k" else [1, 3]), (col, empty)
    t.delete([("n", "not in", [])])
    assert t.to_arrow().column("k").to_pylist() == [2]
