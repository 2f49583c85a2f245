"""Renaming a column while writer processes that hold the schema from before keep appending,
on both backends: nothing is lost, nothing is misnamed.

Three real processes (tests/catalog/workers.py) each load the table once, so they hold the
schema from before any change, and append batches of rows with unique ids and known values
(``v = id * 7``, ``w = -id``) in a loop. Meanwhile this process renames ``v`` to ``value``,
adds a new column ``v`` (the old name, reused) and renames ``value`` to ``amount``: three
``ALTER`` commits, each made only after every writer has committed since the previous one
(conditions on the table's rows, not on the clock), so every writer has appends in each of
the four schemas' windows. The writers stop a fixed number of batches after they see the
last schema. Then the third writer, still stale, deletes some of its rows: refused with
:class:`SchemaChangedConflict`, leaving nothing behind; after a refresh the delete works and
it appends once under the new names, the only rows with a value in the new ``v``.

At the end: every id a writer reported committed is there exactly once (minus the deleted
ones), ``amount`` is ``id * 7`` and ``w`` is ``-id`` in every row, the new ``v`` is null
in every row but the refreshed writer's (by reads, filters and DuckDB), each stale append
after the first change warned once naming its schema, time travel shows each version's
names, the history records the three ALTERs, and the files under the table's ``data/``
are exactly the ones the catalog records, each once.
"""

from __future__ import annotations

import logging
from typing import Any

import pyarrow as pa
import sqlalchemy as sa

from lakestep import Catalog
from lakestep.catalog import schema as S
from lakestep.errors import CommitConflict, SchemaChangedConflict
from lakestep.query import duckdb_query
from tests.waiting import wait_until

from .workers import Worker, WorkerError

MODULE = __name__
IDENT = "rr.t"
SCHEMA = pa.schema([pa.field("id", pa.int64(), nullable=False), ("v", pa.int64()), ("w", pa.int64())])
FINAL = ["id", "amount", "w", "v"]  # after: v -> value, add v, value -> amount
WRITERS = 3  # writer n appends ids n * SPAN + ...; the last one also deletes
SPAN = 100_000
BATCH = 6  # rows per append
AFTER = 3  # appends each writer makes after it has seen the final schema
MAX_BATCHES = 400  # a writer never seeing the final schema stops here (the test then fails)
DELETED_K = (1, 4)  # the last writer deletes rows k of its first batch: its file is rewritten, not dropped


def stale_row_values(ids: list[int]) -> dict[str, list[int]]:
    return {"id": ids, "v": [i * 7 for i in ids], "w": [-i for i in ids]}


class _Warnings(logging.Handler):
    """The warnings of the catalog's commit logger in a writer process."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


# ---- what each writer process runs (called through Worker.call) -----------
def writer(cat: Catalog, n: int, deleter: bool) -> dict[str, Any]:
    """Append batches with the handle loaded at the start (the schema from before any change)
    until the final schema has been seen and AFTER more batches landed; the deleter then tries
    a delete with that handle, refreshes, deletes and appends under the new names."""
    t = cat.load_table(IDENT)
    loaded_schema_id = t.meta.schema_id
    caught = _Warnings()
    logger = logging.getLogger("lakestep.catalog.commit")
    logger.addHandler(caught)
    out: dict[str, Any] = {"commits": [], "loaded_schema_id": loaded_schema_id}
    try:
        after = 0
        seen_final = False
        for seq in range(MAX_BATCHES):
            if after >= AFTER:
                break
            # a fresh handle, to look: the writing handle `t` is never refreshed or read through
            seen_final = seen_final or cat.load_table(IDENT).schema.names == FINAL
            ids = [n * SPAN + seq * BATCH + k for k in range(BATCH)]
            before = len(caught.messages)
            r = t.append(pa.table(stale_row_values(ids), schema=SCHEMA))
            out["commits"].append({"version": r.version, "ids": ids, "warnings": caught.messages[before:],
                                   "seen_final": seen_final})
            if seen_final:
                after += 1
        out["stale_schema_id"] = t.meta.schema_id  # still the one loaded: every append above was stale
        out["stale_names"] = t.schema.names
        if not deleter:
            return out
        gone = [n * SPAN + k for k in DELETED_K]  # rows of this writer's first batch
        try:
            t.delete([("id", "in", gone)])
            out["stale_delete"] = "committed"
        except SchemaChangedConflict as e:
            out["stale_delete"] = {"kind": type(e).__name__, "commit_conflict": isinstance(e, CommitConflict),
                                   "message": str(e)}
        t.refresh()
        out["refreshed_names"] = t.schema.names
        d = t.delete([("id", "in", gone)])
        out["delete"] = {"version": d.version, "operation": d.operation, "deleted": d.summary.get("deleted_rows"),
                         "removed_rows": d.removed_rows, "added_rows": d.added_rows}
        out["deleted_ids"] = gone
        ids = [n * SPAN + 90_000 + k for k in range(BATCH)]  # under the new names: the new v has values
        before = len(caught.messages)
        r = t.append({"id": ids, "amount": [i * 7 for i in ids], "w": [-i for i in ids], "v": [i * 13 for i in ids]})
        out["fresh"] = {"version": r.version, "ids": ids, "warnings": caught.messages[before:]}
        return out
    finally:
        logger.removeHandler(caught)


# ---- the test ------------------------------------------------------------------
def _ids_by_writer(t: Any, **at: Any) -> dict[int, list[int]]:
    got: dict[int, list[int]] = {n: [] for n in range(1, WRITERS + 1)}
    for i in t.to_arrow(columns=["id"], **at).column("id").to_pylist():
        got[i // SPAN].append(i)
    return got


def _early(workers: list[Worker]) -> str | None:
    """A ``failed`` for the waits: a writer answered before the test let it finish (it failed)."""
    for n, w in enumerate(workers, 1):
        if not w.proc.is_alive():
            return f"writer {n} died (exit code {w.proc.exitcode})"
        if w.pipe.poll():
            try:
                return f"writer {n} returned early: {w.receive(timeout=1)!r:.500}"
            except WorkerError as e:
                return f"writer {n} failed: {e}\n{e.tb}"
    return None


def _alter_version(t: Any) -> int:
    return max(h.version for h in t.history(limit=50) if h.operation == "ALTER")


def test_stale_writers_race_renames_and_a_reused_name(catalog_spec, catalog) -> None:  # type: ignore[no-untyped-def]
    catalog.create_namespace("rr")
    t = catalog.create_table(IDENT, SCHEMA)
    v_id = t.meta.column_ids.ids[("v",)]
    workers = [Worker() for _ in range(WRITERS)]
    try:
        for w in workers:  # spawn and open the catalog before the race starts
            w.call(catalog_spec, "tests.catalog.workers", "ping")
        for n, w in enumerate(workers, 1):
            w.send_call(catalog_spec, MODULE, "writer", n, n == WRITERS)

        def each_wrote_since(base: dict[int, list[int]], batches: int) -> bool:
            """Every writer has ``batches`` appends committed after the version whose ids are ``base``.
            A writer's ids grow with its commits: ids beyond its largest then came after."""
            now = _ids_by_writer(t)
            return all(sum(1 for i in now[n] if i > max(base.get(n) or [-1])) >= batches * BATCH
                       for n in range(1, WRITERS + 1))

        alters: list[int] = []
        for what, change in [("v -> value", lambda: t.rename_column("v", "value")),
                             ("add v", lambda: t.add_columns(("v", pa.int64()))),
                             ("value -> amount", lambda: t.rename_column("value", "amount"))]:
            base = _ids_by_writer(t, version=alters[-1]) if alters else {}
            wait_until(lambda: each_wrote_since(base, 1 if alters else 2),
                       f"every writer to append before {what}", timeout=120, failed=lambda: _early(workers))
            change()
            alters.append(_alter_version(t))
        logs = [w.receive(timeout=180, what="writer") for w in workers]
    finally:
        for w in workers:
            w.stop()
    r1, a1, r2 = alters
    assert r1 < a1 < r2 and t.schema.names == FINAL

    # --- the writers: stale all along, with appends in each schema's window ----------
    expected: dict[int, int | None] = {}  # id -> the new v's value
    for n, log in enumerate(logs, 1):
        assert log["loaded_schema_id"] == 0 and log["stale_schema_id"] == 0, (n, log["stale_schema_id"])
        assert log["stale_names"] == ["id", "v", "w"]
        versions = [c["version"] for c in log["commits"]]
        assert len(log["commits"]) < MAX_BATCHES, f"writer {n} never saw the final schema"
        windows = [sum(1 for v in versions if lo < v < hi) for lo, hi in [(0, r1), (r1, a1), (a1, r2), (r2, 1 << 62)]]
        assert min(windows) >= 1, (n, windows)
        print(f"writer {n}: {len(versions)} stale appends, by schema window {windows}")
        assert sum(1 for c in log["commits"] if c["seen_final"]) == AFTER
        assert all(c["version"] > r2 for c in log["commits"] if c["seen_final"])
        for c in log["commits"]:
            schema_then = sum(1 for a in alters if a < c["version"])  # schema ids: 0, then +1 per ALTER
            want = [] if schema_then == 0 else [
                f"{IDENT}: APPEND written under schema 0, the table is at schema {schema_then}"]
            assert [m.split(": its rows")[0] for m in c["warnings"]] == want, (n, c)
            for i in c["ids"]:
                assert i not in expected, f"id {i} reported twice"
                expected[i] = None

    last = logs[-1]
    assert last["stale_delete"] == {"kind": "SchemaChangedConflict", "commit_conflict": True,
                                    "message": last["stale_delete"]["message"]}, last["stale_delete"]
    assert "schema changed" in last["stale_delete"]["message"]
    assert last["refreshed_names"] == FINAL
    assert last["delete"]["operation"] == "DELETE"
    assert last["delete"]["deleted"] == len(DELETED_K)
    # copy-on-write: the batch's file (BATCH rows) is replaced by one without the deleted rows
    assert (last["delete"]["removed_rows"], last["delete"]["added_rows"]) == (BATCH, BATCH - len(DELETED_K))
    for i in last["deleted_ids"]:
        del expected[i]
    assert last["fresh"]["warnings"] == []
    for i in last["fresh"]["ids"]:
        assert i not in expected
        expected[i] = i * 13
    assert len(expected) == sum(len(lg["commits"]) for lg in logs) * BATCH - len(DELETED_K) + BATCH

    # --- the rows: each id once, each column its own values -------------------------
    rows = t.to_arrow()
    assert rows.schema.names == FINAL
    got: dict[int, dict[str, Any]] = {}
    for r in rows.to_pylist():
        assert r["id"] not in got, f"row {r['id']} is duplicated"
        got[r["id"]] = r
    assert sorted(got) == sorted(expected)
    wrong = [r for r in got.values() if (r["amount"], r["w"], r["v"]) != (r["id"] * 7, -r["id"], expected[r["id"]])]
    assert not wrong, wrong[:5]
    n_new_v = sum(1 for v in expected.values() if v is not None)
    assert n_new_v == BATCH

    # filters judge the files by the stored names: the old v's statistics are not the new v's
    some = next(i for i, v in expected.items() if v is None)
    fresh = last["fresh"]["ids"][0]
    assert t.to_arrow(where=[("amount", "=", some * 7)]).column("id").to_pylist() == [some]
    assert t.to_arrow(where=[("v", "=", some * 7)]).num_rows == 0
    assert t.to_arrow(where=[("v", "=", fresh * 13)]).column("id").to_pylist() == [fresh]
    assert t.to_arrow(where=[("v", "is_null", None)]).num_rows == len(expected) - n_new_v
    assert t.count() == len(expected)
    duck = duckdb_query(catalog, f"SELECT count(*) AS n, count(v) AS with_v, "
                                 f"count(*) FILTER (WHERE amount = id * 7 AND w = -id) AS right FROM {IDENT}",
                        level="read_uncommitted").table.to_pylist()
    assert duck == [{"n": len(expected), "with_v": n_new_v, "right": len(expected)}]

    # --- time travel shows each version's names ------------------------------------
    before = t.to_arrow(version=r1 - 1)
    assert before.schema.names == ["id", "v", "w"] and before.num_rows > 0
    assert all(r["v"] == r["id"] * 7 for r in before.to_pylist())
    assert t.to_arrow(version=r1).schema.names == ["id", "value", "w"]
    at_add = t.to_arrow(version=a1)
    assert at_add.schema.names == ["id", "value", "w", "v"]
    assert at_add.column("v").null_count == at_add.num_rows > before.num_rows
    assert all(r["value"] == r["id"] * 7 for r in at_add.to_pylist())

    # --- the history: contiguous versions, the three ALTERs, every append ----------
    history = list(reversed(t.history()))
    assert [h.version for h in history] == list(range(len(history)))
    new_v_id = t.meta.column_ids.ids[("v",)]
    assert new_v_id > v_id and t.meta.column_ids.ids[("amount",)] == v_id
    assert [(h.version, h.summary) for h in history if h.operation == "ALTER"] == [
        (r1, {"change": "rename_column", "from": "v", "to": "value", "id": v_id}),
        (a1, {"change": "add_columns", "columns": [{"name": "v", "type": "int64", "id": new_v_id}]}),
        (r2, {"change": "rename_column", "from": "value", "to": "amount", "id": v_id}),
    ]
    appends = [h for h in history if h.operation == "APPEND"]
    assert len(appends) == sum(len(lg["commits"]) for lg in logs) + 1  # + the refreshed writer's
    assert sum(h.added_rows for h in appends) == len(expected) + len(DELETED_K)
    assert [h.version for h in history if h.operation == "DELETE"] == [last["delete"]["version"]]
    assert len(history) == 1 + len(appends) + 3 + 1  # create, appends, ALTERs, the one delete

    # --- the files: what storage holds is what the catalog records, each once ------
    with catalog.backend.read() as conn:
        recorded = conn.execute(sa.select(S.files.c.path).where(S.files.c.table_id == t.table_id)).scalars().all()
    assert len(recorded) == len(set(recorded))
    stored = {p for p in catalog_spec.files_under(t.location) if p.startswith("data/")}
    assert stored == set(recorded), (sorted(stored - set(recorded)), sorted(set(recorded) - stored))
    live = [f.path for f in t.files()]
    assert len(live) == len(set(live)) == len(appends)  # one file per append; the delete rewrote one
