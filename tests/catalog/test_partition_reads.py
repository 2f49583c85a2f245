"""Reads whose filter pins every partition column list only those partitions (the
ls_file_partition index): the result must be exactly the one of listing every file and
judging each by its statistics, on both backends, at the head and in the past."""

from __future__ import annotations

import datetime as dt

import pyarrow as pa
import pytest

from lakestep import Catalog
from lakestep.catalog.files import partition_key
from lakestep.catalog.predicates import MAX_PARTITION_KEYS, Predicate

SCHEMA = pa.schema([("day", pa.date32()), ("region", pa.string()), ("k", pa.int64())])
D1, D2, D3 = dt.date(2026, 1, 1), dt.date(2026, 1, 2), dt.date(2026, 1, 3)


def rows(day: dt.date | None, region: str | None, ks: list[int]) -> pa.Table:
    return pa.table({"day": [day] * len(ks), "region": [region] * len(ks), "k": ks}, schema=SCHEMA)


@pytest.fixture
def table(catalog: Catalog):  # type: ignore[no-untyped-def]
    catalog.create_namespace("s")
    t = catalog.create_table("s.p", SCHEMA, partition_by=["day", "region"])
    t.append(rows(D1, "eu", [1, 2]))
    t.append(rows(D1, "us", [3]))
    t.append(rows(D2, "eu", [4, 5]))
    t.append(rows(None, "eu", [6]))
    t.append(rows(D3, None, [7]))
    t.append(rows(D2, "eu", [8]))
    return t


CASES = {
    "one partition": [("day", "==", D1), ("region", "=", "eu")],
    "in x in": [("day", "in", [D1, D2]), ("region", "in", ["eu", "us"])],
    "null partition value": [("day", "is_null", None), ("region", "==", "eu")],
    "with a stats term": [("day", "==", D2), ("region", "==", "eu"), ("k", ">", 4)],
    "or of pinned clauses": [[("day", "==", D1), ("region", "==", "us")], [("day", "==", D3), ("region", "is_null", None)]],
    "contradiction": [("day", "==", D1), ("day", "==", D2), ("region", "==", "eu")],
    "two pinning terms on one column": [("day", "in", [D1, D2]), ("day", "==", D1), ("region", "==", "eu")],
    "one column free (no narrowing)": [("day", "==", D1)],
    "a free clause (no narrowing)": [[("day", "==", D1), ("region", "==", "eu")], [("k", "==", 7)]],
    "range (no narrowing)": [("day", ">=", D2), ("region", "==", "eu")],
    "datetime on a date column": [("day", "==", dt.datetime(2026, 1, 1)), ("region", "==", "eu")],
}


def _paths(plan) -> set[str]:  # type: ignore[no-untyped-def]
    return {f.path for f in plan.files}


@pytest.mark.parametrize("name", sorted(CASES))
def test_narrowed_reads_equal_full_listing(table, name: str) -> None:  # type: ignore[no-untyped-def]
    where = CASES[name]
    for version in (None, 3, table.version):
        full = table.read_plan(version=version).prune(where)  # every file listed, judged by statistics
        narrowed = table.read_plan(version=version, where=where)
        assert _paths(narrowed) == _paths(full), (name, version)
        everything = table.to_arrow(version=version)
        want = sorted(everything.filter(Predicate.parse(where, SCHEMA).expression()).column("k").to_pylist())
        assert sorted(table.to_arrow(version=version, where=where).column("k").to_pylist()) == want, (name, version)


def test_narrowing_lists_only_the_pinned_partitions(table) -> None:  # type: ignore[no-untyped-def]
    keys = Predicate.parse([("day", "in", [D1, D2]), ("region", "==", "eu")], SCHEMA).partition_keys(
        SCHEMA, ["day", "region"])
    assert keys == {partition_key({"day": D1, "region": "eu"}), partition_key({"day": D2, "region": "eu"})}
    with table.catalog.backend.read() as conn:
        listed = table.files_at(conn, table.version, table.version, partitions=keys)
    assert sorted(f.partition["region"] for f in listed) == ["eu", "eu", "eu"]
    assert sorted(f.record_count for f in listed) == [1, 2, 2]


def test_no_narrowing_when_it_cannot_be_exact() -> None:
    parts = ["day", "region"]
    assert Predicate.parse([("day", "==", D1)], SCHEMA).partition_keys(SCHEMA, parts) is None  # region free
    ints = pa.schema([("n", pa.int64())])
    assert Predicate.parse([("n", "==", 5.5)], ints).partition_keys(ints, ["n"]) == frozenset()  # no int64 equals it
    assert Predicate.parse([("n", ">", 5.5)], ints).partition_keys(ints, ["n"]) is None  # a range: not narrowed
    assert Predicate.parse([("n", "==", 5.0)], ints).partition_keys(ints, ["n"]) == {partition_key({"n": 5})}
    many = Predicate.parse([("n", "in", list(range(MAX_PARTITION_KEYS + 1)))], ints)
    assert many.partition_keys(ints, ["n"]) is None
    assert Predicate.parse([("n", "==", 1)], ints).partition_keys(ints, []) is None  # not partitioned


def test_narrowing_up_to_exactly_max_partition_keys_across_clauses() -> None:
    """At most MAX_PARTITION_KEYS candidates, counted over every clause, still narrow; one more
    does not. The keys of a clause pinning a column twice are the values both terms allow."""
    ints = pa.schema([("n", pa.int64())])
    first, rest = list(range(1000)), list(range(1000, MAX_PARTITION_KEYS))
    exactly = Predicate.parse([[("n", "in", first)], [("n", "in", rest)]], ints).partition_keys(ints, ["n"])
    assert exactly == {partition_key({"n": i}) for i in range(MAX_PARTITION_KEYS)}
    one_more = Predicate.parse([[("n", "in", first)], [("n", "in", rest + [MAX_PARTITION_KEYS])]], ints)
    assert one_more.partition_keys(ints, ["n"]) is None
    both = Predicate.parse([("n", "in", [1, 2, 3]), ("n", "in", [3, 2, 9])], ints).partition_keys(ints, ["n"])
    assert both == {partition_key({"n": 2}), partition_key({"n": 3})}
