"""Bounded concurrency torture: 4 appenders, 1 compactor, 1 overwriter/updater.

Six real processes work on one table, a fixed number of operations each (the compactor and
the mutator paced by the table's version, not by the clock). Each logs what its
successful commits did. At the end the table must hold exactly what that
committed history implies: every appended row once (unless a later overwrite
replaced it), every update applied to exactly the rows it saw; nothing lost,
nothing duplicated, and no appender ever saw a conflict.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pyarrow.dataset as ds

from lakestep import Catalog
from tests.waiting import wait_until

from .workers import Worker

SCHEMA = pa.schema(
    [("id", pa.int64()), ("part", pa.string()), ("bumpable", pa.bool_()), ("bumped", pa.int64())]
)
APPENDS = 40  # per appender: a fixed amount of work, whatever the machine's speed
COMPACTIONS = 12
MUTATIONS = 10
MODULE = __name__


def _rows(ids: list[int], part: str) -> pa.Table:
    return pa.table(
        {"id": ids, "part": [part] * len(ids), "bumpable": [i % 3 == 0 for i in ids], "bumped": [0] * len(ids)},
        schema=SCHEMA,
    )


# ---- what each worker process runs (called through Worker.call) -----------
def appender(cat: Catalog, n: int, count: int) -> list[dict[str, Any]]:
    t = cat.load_table("t.t")
    log = []
    for seq in range(count):
        part = "hot" if seq % 2 else "cold"
        ids = [n * 1_000_000 + seq * 10 + k for k in range(1 + seq % 3)]
        r = t.append(_rows(ids, part))  # must never raise
        log.append({"version": r.version, "ids": ids, "part": part})
    return log


def compactor(cat: Catalog, count: int) -> list[dict[str, Any]]:
    t = cat.load_table("t.t")
    log = []
    for i in range(count):
        # spread over the appenders' run: paced by the table's progress, not by the clock
        v = 8 * (i + 1)
        wait_until(lambda: cat.load_table("t.t").version >= v, f"version {v} of t.t", timeout=600, interval=0.01)
        r = t.compact(min_files=3)
        log.append({"version": r.version, "discarded": r.discarded, "removed": r.removed_files})
    return log


def mutator(cat: Catalog, count: int) -> list[dict[str, Any]]:
    t = cat.load_table("t.t")
    log = []
    for seq in range(count):
        v = 10 * (seq + 1)  # paced by the table's progress, not by the clock
        wait_until(lambda: cat.load_table("t.t").version >= v, f"version {v} of t.t", timeout=600, interval=0.01)
        if seq % 2 == 0:
            ids = [9_000_000 + seq * 10 + k for k in range(2)]
            r = t.overwrite(_rows(ids, "hot"), partitions=[{"part": "hot"}])
            log.append({"op": "overwrite", "version": r.version, "ids": ids})
        else:
            r = t.update({"bumped": ds.field("bumped") + 1}, [("part", "=", "cold"), ("bumpable", "=", True)])
            log.append({"op": "update", "version": r.version, "base": r.base_version})
    return log


def test_torture(catalog_spec, catalog) -> None:  # type: ignore[no-untyped-def]
    catalog.create_namespace("t")
    table = catalog.create_table("t.t", SCHEMA, partition_by=["part"])
    workers = [Worker() for _ in range(6)]
    try:
        for w in workers:  # warm up: spawn and open the catalog before the clock starts
            w.call(catalog_spec, "tests.catalog.workers", "ping")
        calls = [(w, "appender", (i + 1, APPENDS)) for i, w in enumerate(workers[:4])]
        calls += [(workers[4], "compactor", (COMPACTIONS,)), (workers[5], "mutator", (MUTATIONS,))]
        for w, func, args in calls:
            w.send_call(catalog_spec, MODULE, func, *args)
        logs = [w.receive(timeout=600) for w, _, _ in calls]
    finally:
        for w in workers:
            w.stop()
    appends = [e for log in logs[:4] for e in log]
    compactions, mutations = logs[4], logs[5]
    assert (len(appends), len(compactions), len(mutations)) == (4 * APPENDS, COMPACTIONS, MUTATIONS)
    print(f"appends={len(appends)} mutations={len(mutations)} compactions={len(compactions)} "
          f"discarded={sum(c['discarded'] for c in compactions)}")

    # --- what the committed history implies ---------------------------------
    overwrites = [m for m in mutations if m["op"] == "overwrite"]
    updates = [m for m in mutations if m["op"] == "update"]
    last_ow = max(overwrites, key=lambda m: m["version"])
    expected: dict[int, tuple[str, int]] = {i: ("hot", 0) for i in last_ow["ids"]}
    for a in appends:
        for i in a["ids"]:
            if a["part"] == "hot":
                if a["version"] > last_ow["version"]:
                    expected[i] = ("hot", 0)
            else:
                bumps = sum(1 for u in updates if u["base"] >= a["version"]) if i % 3 == 0 else 0
                expected[i] = ("cold", bumps)

    got: dict[int, tuple[str, int]] = {}
    for r in table.to_arrow().to_pylist():
        assert r["id"] not in got, f"row {r['id']} duplicated"
        got[r["id"]] = (r["part"], r["bumped"])
    missing = set(expected) - set(got)
    extra = set(got) - set(expected)
    assert not missing and not extra, (sorted(missing)[:10], sorted(extra)[:10])
    wrong = {i: (got[i], expected[i]) for i in expected if got[i] != expected[i]}
    assert not wrong, list(wrong.items())[:10]

    # --- every version is readable and agrees with the commit log -----------
    history = list(reversed(table.history()))
    versions = [h.version for h in history]
    assert versions == list(range(len(versions)))
    running = 0
    for h in history[:: max(1, len(history) // 25)] + [history[-1]]:
        running = sum(x.added_rows - x.removed_rows for x in history if x.version <= h.version)
        assert table.count(version=h.version) == running
        assert table.to_arrow(version=h.version).num_rows == running
    assert sum(1 for c in compactions if not c["discarded"] and c["removed"]) >= 1
