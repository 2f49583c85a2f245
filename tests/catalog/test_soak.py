"""A bounded soak: upserting writers, a maintenance loop, and slow pinned readers, as processes.

At the end: no reader ever failed (no missing file), every reader's rows equal
the committed version it pinned (twice: when it pinned and after a slow
pause), no row is lost or duplicated, and disk use returns to exactly what the
live data needs.
"""

from __future__ import annotations

import os
import time
from typing import Any

import pyarrow as pa
import pytest

from lakestep import Catalog

from .workers import Worker

SCHEMA = pa.schema([("k", pa.int64()), ("v", pa.string())])
SECONDS = 5.0  # `make test`: long enough for several cleanups beside several slow pinned reads
LONG_SECONDS = 60.0  # `make test-long`
RETENTION = 0.5
MODULE = __name__


def writer(cat: Catalog, n: int, seconds: float) -> list[dict[str, Any]]:
    """Upserts keys of its own range; every 4th commit deletes one of them."""
    t = cat.load_table("soak.t")
    log, seq, deadline = [], 0, time.time() + seconds
    while time.time() < deadline:
        base = n * 10_000
        if seq % 4 == 3:
            k = base + (seq * 7) % 50
            r = t.delete([("k", "=", k)])
            log.append({"version": r.version, "delete": k})
        else:
            ks = [base + (seq * 13 + i) % 50 for i in range(5)]
            vs = [f"{n}:{seq}:{i}" for i in range(5)]
            r = t.upsert({"k": ks, "v": vs})
            log.append({"version": r.version, "upsert": dict(zip(ks, vs))})
        seq += 1
    return log


def maintainer(cat: Catalog, seconds: float) -> list[dict[str, Any]]:
    from lakestep.services import MaintenanceLoop

    loop = MaintenanceLoop(cat, ["soak.t"], interval=0.2, min_files=3, major_every=3)
    return [r.tables["soak.t"] for r in loop.run(duration=seconds)]


def reader(cat: Catalog, n: int, seconds: float) -> list[dict[str, Any]]:
    """Pins the newest version, reads it, waits past the retention window, reads it again."""
    t = cat.load_table("soak.t")
    out, deadline = [], time.time() + seconds
    while time.time() < deadline:
        with t.lock(locker=f"reader-{n}", lease_seconds=60) as pin:
            first = {r["k"]: r["v"] for r in t.to_arrow(version=pin.version).to_pylist()}
            time.sleep(RETENTION * 2)  # long enough for cleanup to want these files
            second = {r["k"]: r["v"] for r in t.to_arrow(version=pin.version).to_pylist()}
            out.append({"version": pin.version, "first": first, "second": second})
    return out


def model_at(logs: list[dict[str, Any]], version: int) -> dict[int, str]:
    state: dict[int, str] = {}
    for e in sorted(logs, key=lambda e: e["version"]):
        if e["version"] > version:
            break
        if "upsert" in e:
            state.update(e["upsert"])
        else:
            state.pop(e["delete"], None)
    return state


def test_soak(catalog_spec, catalog) -> None:  # type: ignore[no-untyped-def]
    _soak(catalog_spec, catalog, SECONDS)


@pytest.mark.long
def test_soak_long(catalog_spec, catalog) -> None:  # type: ignore[no-untyped-def]
    _soak(catalog_spec, catalog, LONG_SECONDS)


def _soak(catalog_spec, catalog, seconds: float) -> None:  # type: ignore[no-untyped-def]
    catalog.create_namespace("soak")
    table = catalog.create_table("soak.t", SCHEMA, primary_key=["k"],
                                 properties={"lakestep.retention-seconds": str(RETENTION)})
    workers = [Worker() for _ in range(5)]
    try:
        for w in workers:
            w.call(catalog_spec, "tests.catalog.workers", "ping")
        calls = [(workers[0], "writer", (1, seconds)), (workers[1], "writer", (2, seconds)),
                 (workers[2], "maintainer", (seconds,)),
                 (workers[3], "reader", (1, seconds)), (workers[4], "reader", (2, seconds))]
        for w, func, args in calls:
            w.send_call(catalog_spec, MODULE, func, *args)
        results = [w.receive(timeout=seconds + 180) for w, _, _ in calls]  # a reader error raises here
    finally:
        for w in workers:
            w.stop()
    writes = results[0] + results[1]
    rounds, reads = results[2], results[3] + results[4]
    assert len(writes) > 20 and len(reads) >= 4 and len(rounds) >= 3
    assert not [r for r in rounds if "error" in r], rounds
    assert sum(r.get("deleted_files", 0) for r in rounds) > 0  # cleanup really ran beside the readers
    for r in reads:
        assert r["first"] == r["second"] == model_at(writes, r["version"]), r["version"]
    final = {r["k"]: r["v"] for r in table.to_arrow().to_pylist()}
    assert final == model_at(writes, table.version)
    # quiet now: after the window, cleanup brings disk use down to the live data
    time.sleep(RETENTION + 0.1)
    table.compact(major=True)
    time.sleep(RETENTION + 0.1)
    table.cleanup()
    on_disk = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(table.location) for f in fs)
    assert on_disk == sum(f.file_size for f in table.files())
    assert {r["k"]: r["v"] for r in table.to_arrow().to_pylist()} == final
