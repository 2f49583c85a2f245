"""Every cell of the conflict matrix (docs/design.md §2), raced by two real processes.

Both processes prepare their change against the same base version; then the
test lets ``E`` commit first and ``L`` second. Running every ordered pair of
operations covers both outcomes of each race. The expected rows are computed
here from the matrix, independently of lakestep's code. Every cell runs with
the warehouse on the local disk and on S3: no outcome may depend on the storage.
"""

from __future__ import annotations

import itertools
from typing import Any, Callable

import pyarrow as pa
import pytest

from lakestep import Catalog

# The matrix on the local disk and on S3 (tests/conftest.py); S3 with PostgreSQL only, its production
# partner: the storage does not depend on the catalog's database, and S3 cells cost time.
pytestmark = pytest.mark.s3("postgres")

SCHEMA = pa.schema([("id", pa.int64()), ("part", pa.string()), ("v", pa.int64())])
Rows = dict[int, tuple[str, int]]  # id -> (part, v)

BASE: Rows = {1: ("a", 0), 2: ("a", 0), 3: ("a", 0), 4: ("b", 0), 5: ("b", 0), 6: ("b", 0)}


def make_table(cat: Catalog, properties: dict[str, str] | None = None, ident: str = "m.t") -> str:
    cat.create_namespace("m", exist_ok=True)
    t = cat.create_table(ident, SCHEMA, partition_by=["part"], properties=properties)
    # Four files, two per partition, so that compaction has work in both.
    for ids in ([1, 2], [3], [4, 5], [6]):
        t.append(rows_table({i: BASE[i] for i in ids}))
    return ident


TABLE_NO = itertools.count(1)


@pytest.fixture
def shared(shared_catalog: tuple[Any, Catalog]) -> tuple[Any, Catalog, str]:
    """The module's catalog of this kind (tests/conftest.py SharedCatalogs) and a fresh table in it
    (the matrix's base state): each race touches only its own table, and a catalog schema made per
    cell cost more than the race."""
    spec, cat = shared_catalog
    return spec, cat, make_table(cat, ident=f"m.t_{next(TABLE_NO)}")


def rows_table(rows: Rows) -> pa.Table:
    ids = sorted(rows)
    return pa.table(
        {"id": ids, "part": [rows[i][0] for i in ids], "v": [rows[i][1] for i in ids]}, schema=SCHEMA
    )


def read(cat: Catalog, ident: str) -> Rows:
    t = cat.load_table(ident).to_arrow()
    out: Rows = {}
    for r in t.to_pylist():
        assert r["id"] not in out, f"row {r['id']} is duplicated"
        out[r["id"]] = (r["part"], r["v"])
    return out


# ---- the operations: (how a worker prepares it, its effect on rows) --------
# New rows get ids by role, so that E's and L's appends are different rows.
def _overwrite_a(new_id: int) -> Callable[[Rows], Rows]:
    def fx(rows: Rows) -> Rows:
        out = {k: v for k, v in rows.items() if v[0] != "a"}
        out[new_id] = ("a", 0)
        return out

    return fx


def op(name: str, role: str) -> tuple[tuple[str, tuple[Any, ...], dict[str, Any]], Callable[[Rows], Rows]]:
    n = 0 if role == "E" else 1
    if name == "APPEND":
        return ("append", (rows_table({100 + n: ("a", 0)}),), {}), lambda r: {**r, 100 + n: ("a", 0)}
    if name == "OVERWRITE":
        return (
            ("overwrite", (rows_table({200 + n: ("a", 0)}),), {"partitions": [{"part": "a"}]}),
            _overwrite_a(200 + n),
        )
    if name == "DELETE":
        return ("delete", ([("id", "=", 2)],), {}), lambda r: {k: v for k, v in r.items() if k != 2}
    if name == "UPDATE":
        return (
            ("update", ({"v": 7}, [("id", "=", 1)]), {}),
            lambda r: {k: ((v[0], 7) if k == 1 else v) for k, v in r.items()},
        )
    if name == "COMPACT":
        return ("compact", (), {"target_file_size": 1 << 30}), lambda r: dict(r)
    raise ValueError(name)


OPS = ["APPEND", "OVERWRITE", "DELETE", "UPDATE", "COMPACT"]

# What happens to L (the later commit) given E (already landed). Straight from
# the matrix, with these operations: DELETE, UPDATE and OVERWRITE all touch the
# file holding ids 1 and 2 in partition "a".
OUTCOME = {
    # L = APPEND: always both succeed
    **{(e, "APPEND"): "ok" for e in OPS},
    # L = OVERWRITE: always succeeds, L wins
    **{(e, "OVERWRITE"): "ok" for e in OPS},
    # L = DELETE / UPDATE
    ("APPEND", "DELETE"): "ok", ("OVERWRITE", "DELETE"): "fail", ("DELETE", "DELETE"): "fail",
    ("UPDATE", "DELETE"): "fail", ("COMPACT", "DELETE"): "ok",
    ("APPEND", "UPDATE"): "ok", ("OVERWRITE", "UPDATE"): "fail", ("DELETE", "UPDATE"): "fail",
    ("UPDATE", "UPDATE"): "fail", ("COMPACT", "UPDATE"): "ok",
    # L = COMPACT
    ("APPEND", "COMPACT"): "ok", ("OVERWRITE", "COMPACT"): "discarded", ("DELETE", "COMPACT"): "discarded",
    ("UPDATE", "COMPACT"): "discarded", ("COMPACT", "COMPACT"): "discarded",
}


def race(spec: Any, workers: Any, ident: str, e: tuple[Any, ...], l: tuple[Any, ...]) -> tuple[Any, Any]:
    """Both prepare on the same base; E commits, then L. Returns (E result, L result or error)."""
    we, wl = workers
    we.prepare(spec, e[0], ident, *e[1], **e[2])
    wl.prepare(spec, l[0], ident, *l[1], **l[2])
    res_e = we.commit()
    try:
        return res_e, wl.commit()
    except Exception as err:  # WorkerError carrying the remote exception
        return res_e, err


@pytest.mark.parametrize("l_op", OPS)
@pytest.mark.parametrize("e_op", OPS)
def test_matrix_cell(shared, worker_pair, e_op, l_op):
    catalog_spec, catalog, ident = shared
    (e_prep, e_fx), (l_prep, l_fx) = op(e_op, "E"), op(l_op, "L")
    res_e, res_l = race(catalog_spec, worker_pair, ident, e_prep, l_prep)
    assert res_e[0]["operation"] == e_op and not res_e[0]["discarded"]
    after_e = e_fx(dict(BASE))
    expected = OUTCOME[(e_op, l_op)]
    if expected == "fail":
        assert getattr(res_l, "kind", None) == "CommitConflict", res_l
        assert f"committed as version {res_e[0]['version']}" in res_l.message  # names the other commit
        assert read(catalog, ident) == after_e
        assert catalog.load_table(ident).version == res_e[0]["version"]  # nothing of L is visible
    elif expected == "discarded":
        assert not isinstance(res_l, Exception), res_l
        assert res_l[0]["discarded"] is True
        assert read(catalog, ident) == after_e
        assert catalog.load_table(ident).version == res_e[0]["version"]
    else:
        assert not isinstance(res_l, Exception), getattr(res_l, "tb", res_l)
        assert res_l[0]["discarded"] is False
        assert res_l[0]["version"] == res_e[0]["version"] + 1
        assert read(catalog, ident) == l_fx(after_e)


def test_delete_after_compaction_undoes_it_by_metadata(catalog_spec, catalog, worker_pair):
    """DELETE vs COMPACT: the compaction is undone only where it overlaps."""
    ident = make_table(catalog)
    _, res_l = race(catalog_spec, worker_pair, ident, op("COMPACT", "E")[0], op("DELETE", "L")[0])
    assert res_l[0]["summary"]["restored_files"] == 1  # the untouched input [3] is back
    files = catalog.load_table(ident).files()
    by_part: dict[str, list[Any]] = {}
    for f in files:
        by_part.setdefault(f.partition["part"], []).append(f)
    # partition b keeps its one compacted file; partition a: rewritten [1] + restored [3]
    assert len(by_part["b"]) == 1 and len(by_part["b"][0].source_ids) == 2
    assert sorted(f.record_count for f in by_part["a"]) == [1, 1]
    assert read(catalog, ident) == {k: v for k, v in BASE.items() if k != 2}
    from tests.catalog.test_stats_sql import assert_stats_rows_match

    assert_stats_rows_match(catalog)  # the re-added input has its typed statistics rows again


def test_undo_refused_past_retention(catalog_spec, catalog, worker_pair):
    """Past the retention window the compacted inputs may be gone: the DELETE fails instead."""
    ident = make_table(catalog, properties={"lakestep.retention-seconds": "0"})
    res_e, res_l = race(catalog_spec, worker_pair, ident, op("COMPACT", "E")[0], op("DELETE", "L")[0])
    assert getattr(res_l, "kind", None) == "CommitConflict"
    assert "retention" in res_l.message
    assert read(catalog, ident) == BASE


@pytest.mark.parametrize(
    "e_op,l_op,expected",
    [
        (("delete", ([("id", "=", 5)],), {}), ("delete", ([("id", "=", 2)],), {}),
         {1: ("a", 0), 3: ("a", 0), 4: ("b", 0), 6: ("b", 0)}),
        (("update", ({"v": 3}, [("id", "=", 6)]), {}), ("delete", ([("id", "=", 2)],), {}),
         {1: ("a", 0), 3: ("a", 0), 4: ("b", 0), 5: ("b", 0), 6: ("b", 3)}),
        # an overwrite of another partition did not replace the rows L read
        (("overwrite", (rows_table({300: ("b", 0)}),), {"partitions": [{"part": "b"}]}),
         ("update", ({"v": 7}, [("id", "=", 1)]), {}),
         {1: ("a", 7), 2: ("a", 0), 3: ("a", 0), 300: ("b", 0)}),
    ],
    ids=["delete-delete", "update-delete", "overwrite-b-update-a"],
)
def test_disjoint_rewrites_both_succeed(shared, worker_pair, e_op, l_op, expected):
    catalog_spec, catalog, ident = shared
    res_e, res_l = race(catalog_spec, worker_pair, ident, e_op, l_op)
    assert not isinstance(res_l, Exception), getattr(res_l, "tb", res_l)
    assert res_l[0]["version"] == res_e[0]["version"] + 1
    assert read(catalog, ident) == expected  # both took effect, exactly


@pytest.mark.parametrize("isolation", ["snapshot", "serializable"])
@pytest.mark.parametrize("appended_id", [2, 100])
def test_delete_vs_append_isolation(shared, worker_pair, isolation, appended_id):
    """Snapshot isolation: the append survives. Serializable: fail only if the new
    file can hold rows matching the delete's predicate (decided from file stats)."""
    catalog_spec, catalog, ident = shared
    catalog.load_table(ident).delete([("id", "=", 2)])  # id 2 gone; the append may bring one back
    base = {k: v for k, v in BASE.items() if k != 2}
    e = ("append", (rows_table({appended_id: ("a", 0)}),), {})
    l = ("delete", ([("id", "in", [2, 3])],), {"isolation": isolation})
    res_e, res_l = race(catalog_spec, worker_pair, ident, e, l)
    if isolation == "serializable" and appended_id == 2:
        assert getattr(res_l, "kind", None) == "CommitConflict", res_l
        assert "serializable" in res_l.message
        assert read(catalog, ident) == {**base, 2: ("a", 0)}
    else:
        assert not isinstance(res_l, Exception), getattr(res_l, "tb", res_l)
        expected = {k: v for k, v in base.items() if k != 3}
        expected[appended_id] = ("a", 0)  # L did not see it: it survives
        assert read(catalog, ident) == expected


def test_predicate_overwrite_rebases_onto_straddling_files(catalog_spec, catalog, worker_pair):
    """OVERWRITE of 5 <= id < 100 vs a concurrent append of ids 9 and 2000 in one file:
    the overwrite replaces 9 (it wins) and keeps 2000 (outside its range)."""
    ident = make_table(catalog)
    e = ("append", (rows_table({2000: ("b", 0), 9: ("b", 0)}),), {})
    l = ("overwrite", (rows_table({7: ("b", 1)}),), {"where": [("id", ">=", 5), ("id", "<", 100)]})
    res_e, res_l = race(catalog_spec, worker_pair, ident, e, l)
    assert not isinstance(res_l, Exception), getattr(res_l, "tb", res_l)
    assert read(catalog, ident) == {1: ("a", 0), 2: ("a", 0), 3: ("a", 0), 4: ("b", 0), 7: ("b", 1), 2000: ("b", 0)}
    assert res_l[0]["summary"]["rewritten_files"] == 2  # [4, 5] at prepare, [2000, 9] on rebase


@pytest.mark.parametrize("l_name", ["delete", "update"])
@pytest.mark.parametrize("appended,conflicts", [([2, 50], True), ([0, 2], True), ([60, 70], False)],
                         ids=["partly-2-50", "partly-0-2", "outside-60-70"])
def test_serializable_against_a_partly_matching_append(shared, worker_pair, l_name, appended,
                                                       conflicts):
    """Serializable DELETE/UPDATE of ``id in [2, 3]`` vs a concurrent append of a file whose
    rows only partly match (its stats overlap the predicate without every row matching):
    it may hold matching rows, so L fails; a file whose stats lie outside commits."""
    catalog_spec, catalog, ident = shared
    catalog.load_table(ident).delete([("id", "=", 2)])  # id 2 gone; the append brings one back
    base = {k: v for k, v in BASE.items() if k != 2}
    new = {i: ("a", 0) for i in appended}
    e = ("append", (rows_table(new),), {})
    where = [("id", "in", [2, 3])]
    l = (("delete", (where,), {"isolation": "serializable"}) if l_name == "delete"
         else ("update", ({"v": 9}, where), {"isolation": "serializable"}))
    res_e, res_l = race(catalog_spec, worker_pair, ident, e, l)
    if conflicts:
        assert getattr(res_l, "kind", None) == "CommitConflict", res_l
        assert "serializable" in res_l.message and f"committed as version {res_e[0]['version']}" in res_l.message
        assert read(catalog, ident) == {**base, **new}
    else:
        assert not isinstance(res_l, Exception), getattr(res_l, "tb", res_l)
        mine = {k: v for k, v in base.items() if k != 3} if l_name == "delete" else {**base, 3: ("a", 9)}
        assert read(catalog, ident) == {**mine, **new}


def test_the_matrix_has_one_rule_per_cell() -> None:
    from lakestep.catalog.resolver import MATRIX, PLANNERS, Kind

    earlier = [k for k in Kind if k is not Kind.RESTORE]  # a landed RESTORE is in the OVERWRITE column
    assert set(MATRIX) == {(later, e) for later in Kind for e in earlier}
    assert set(PLANNERS) == set(Kind)
