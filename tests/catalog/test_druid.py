"""The Druid analysis as a test suite (seeds/druid-concurrent-compaction-and-ingestion.txt).

The analysis runs two tasks against one time interval and asks, for every
start order, finish order and failure, which rows a correct system must show.
Here the interval is partition ``D`` (partition ``E`` is a bystander) and the
tasks are:

* ingest: append rows;
* compact: rewrite the interval's files into one;
* replace: overwrite the whole interval (Druid's replace / re-index);
* partial: overwrite part of the interval (ids >= 5), keeping the rest;
* rewrite: a segment rewrite of the single file holding id 1 (delete row 2
  for a privacy request and drop the ``note`` values), touching no other file.

Two real processes prepare on the same base (concurrent) or one after the
other's commit (sequential); one may fail (it never publishes). The correct
outcome is the serial execution of the successful tasks in commit order; the
only task that may have to fail is a segment rewrite whose file a concurrent
replacement already replaced (its rows are gone: nothing to rewrite). Druid
loses or duplicates rows in several of these cases; lakestep must not.
"""

from __future__ import annotations

import itertools
from typing import Any

import pyarrow as pa
import pytest

from lakestep import Catalog

from .workers import WorkerError

# On S3 too, with LAKESTEP_TEST_S3=all (tests/conftest.py): too long to run on both storages in CI.
pytestmark = pytest.mark.s3("postgres", opt_in=True)

SCHEMA = pa.schema([("id", pa.int64()), ("part", pa.string()), ("note", pa.string())])
MODULE = __name__
TASKS = ["ingest", "compact", "replace", "partial", "rewrite"]
Rows = dict[int, tuple[str, Any]]
BASE: Rows = {i: ("D", f"n{i}") for i in range(1, 7)} | {100: ("E", "n100")}


def _rows(ids: list[int], part: str = "D") -> pa.Table:
    return pa.table({"id": ids, "part": [part] * len(ids), "note": [f"n{i}" for i in ids]}, schema=SCHEMA)


def new_ids(task: str, role: str) -> list[int]:
    k = 0 if role == "A" else 2
    return {"ingest": [10 + k, 11 + k], "replace": [20 + k, 21 + k], "partial": [50 + k]}.get(task, [])


def _privacy_rewrite(rows: pa.Table) -> pa.Table:
    keep = rows.filter(pa.compute.not_equal(rows.column("id"), 2))
    return keep.set_column(keep.schema.get_field_index("note"), "note", pa.nulls(keep.num_rows, pa.string()))


# --- run in the worker processes (through Worker.prepare_fn) -----------------
def task(cat: Catalog, tx: Any, ident: str, name: str, role: str) -> None:
    t = cat.load_table(ident)
    if name == "ingest":
        tx.append(t, _rows(new_ids(name, role)))
    elif name == "compact":
        tx.compact(t)
    elif name == "replace":
        tx.overwrite(t, _rows(new_ids(name, role)), partitions=[{"part": "D"}])
    elif name == "partial":
        tx.overwrite(t, _rows(new_ids(name, role)), where=[("part", "=", "D"), ("id", ">=", 5)])
    elif name == "rewrite":
        holder = [f for f in t.files() if f.stats["id"].min <= 1 <= f.stats["id"].max]
        if holder:  # (sequentially after a replacement there is no such file: nothing to do)
            tx.rewrite_file(t, holder[0], _privacy_rewrite)


# --- the model: what a correct system shows -----------------------------------
def apply(name: str, role: str, rows: Rows, rewrite_ids: set[int]) -> Rows:
    out = dict(rows)
    if name == "ingest":
        out.update({i: ("D", f"n{i}") for i in new_ids(name, role)})
    elif name == "replace":
        out = {k: v for k, v in out.items() if v[0] != "D"} | {i: ("D", f"n{i}") for i in new_ids(name, role)}
    elif name == "partial":
        out = {k: v for k, v in out.items() if not (v[0] == "D" and k >= 5)}
        out.update({i: ("D", f"n{i}") for i in new_ids(name, role)})
    elif name == "rewrite":
        out = {k: ((v[0], None) if k in rewrite_ids else v) for k, v in out.items() if k != 2 or 2 not in rewrite_ids}
    return out


def expected(a: str, b: str, mode: str, fate: str) -> tuple[Rows, bool]:
    """(rows, whether B must fail with a conflict)."""
    if fate == "A fails":
        return apply(b, "B", BASE, {1, 2, 3}), False
    after_a = apply(a, "A", BASE, {1, 2, 3})
    if fate == "B fails":
        return after_a, False
    if b == "rewrite":
        if mode == "concurrent":
            if a in ("replace", "rewrite"):  # the file B read was replaced (or rewritten) first
                return after_a, True
            return apply(b, "B", after_a, {1, 2, 3}), False
        # sequential: B rewrites whatever file holds id 1 after A
        holder = {"compact": set(range(1, 7)), "replace": set(), "rewrite": {1, 3}}.get(a, {1, 2, 3})
        return apply(b, "B", after_a, holder), False
    return apply(b, "B", after_a, set()), False


def read(cat: Catalog, ident: str = "d.t") -> Rows:
    out: Rows = {}
    for r in cat.load_table(ident).to_arrow().to_pylist():
        assert r["id"] not in out, f"row {r['id']} duplicated"
        out[r["id"]] = (r["part"], r["note"])
    return out


def setup_table(cat: Catalog, ident: str = "d.t") -> None:
    cat.create_namespace("d", exist_ok=True)
    t = cat.create_table(ident, SCHEMA, partition_by=["part"])
    for ids, part in (([1, 2, 3], "D"), ([4, 5, 6], "D"), ([100], "E")):
        t.append(_rows(ids, part))


CASES = [(a, b, "concurrent", fate) for a in TASKS for b in TASKS for fate in ("both", "A fails", "B fails")]
CASES += [(a, b, "sequential", "both") for a in TASKS for b in TASKS]
SCENARIO = itertools.count(1)  # the table name of each scenario


@pytest.mark.parametrize("a,b,mode,fate", CASES, ids=["-".join(c).replace(" ", "_") for c in CASES])
def test_druid_scenario(shared_catalog, worker_pair, a, b, mode, fate) -> None:  # type: ignore[no-untyped-def]
    # Each scenario has a table of its own in the module's catalog (tests/conftest.py SharedCatalogs):
    # the tasks touch only that table, and a catalog schema made per scenario cost more than the race.
    spec, catalog = shared_catalog
    ident = f"d.t_{next(SCENARIO)}"
    setup_table(catalog, ident)
    bystander = [(f.file_id, f.record_count) for f in catalog.load_table(ident).files() if f.partition["part"] == "E"]
    assert len(bystander) == 1
    wa, wb = worker_pair
    rows, b_conflicts = expected(a, b, mode, fate)
    wa.prepare_fn(spec, MODULE, "task", ident, a, "A")
    if mode == "concurrent":
        wb.prepare_fn(spec, MODULE, "task", ident, b, "B")
    if fate == "A fails":
        wa.abort()
    else:
        wa.commit()
    if mode == "sequential":
        wb.prepare_fn(spec, MODULE, "task", ident, b, "B")
    if fate == "B fails":
        wb.abort()
    elif b_conflicts:
        with pytest.raises(WorkerError) as ei:
            wb.commit()
        assert ei.value.kind == "CommitConflict", ei.value
    else:
        wb.commit()
    assert read(catalog, ident) == rows
    # the bystander partition is never touched by anyone: the very same file, still live
    assert [(f.file_id, f.record_count) for f in catalog.load_table(ident).files()
            if f.partition["part"] == "E"] == bystander


def test_segment_rewrite_touches_no_other_file(catalog: Catalog) -> None:
    setup_table(catalog)
    t = catalog.load_table("d.t")
    before = {f.file_id for f in t.files()}
    holder = next(f for f in t.files() if f.stats["id"].min == 1)
    r = t.rewrite_file(holder, _privacy_rewrite)
    after = {f.file_id for f in t.files()}
    assert before - after == {holder.file_id} and len(after - before) == 1
    assert (r.removed_files, r.added_files) == (1, 1)
    assert read(catalog) == apply("rewrite", "A", BASE, {1, 2, 3})
