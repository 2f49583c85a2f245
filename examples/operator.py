"""A small pipeline to point the ``lakestep`` command at (README: "Watching a pipeline").

    python -m examples.operator ./ops-wh
    lakestep barriers --catalog ./ops-wh

The topology::

    job ingest (external) -> shop.orders ----> job daily -> shop.daily --+
    job crm (external)    -> shop.customers ------------------------------+-> job vip -> shop.vip
                                                      shop.vip -> job summary -> shop.summary
    shop.notes: unmanaged (retention 0, a snapshot pins its first version)

Built as a pipeline runs: root jobs commit into the open epoch, a coordinator
(holder ``coord-1``, a one-hour lease) seals by hand, derived jobs commit
batches with ``Pipeline.batch``. Where it stops (open epoch 5, committed 2):

==============  =======  ========  ======  =====================================
table           kind     frontier  behind  barriers 1..4
==============  =======  ========  ======  =====================================
shop.orders     root     4         0       SNAPSHOT COMMIT PRECOMMIT PRECOMMIT
shop.customers  root     4         0       SNAPSHOT COMMIT PRECOMMIT PRECOMMIT
shop.daily      derived  3         1       SNAPSHOT COMMIT PRECOMMIT -
shop.vip        derived  2         2       SNAPSHOT COMMIT -         -
shop.summary    derived  2         2       SNAPSHOT COMMIT -         -
==============  =======  ========  ======  =====================================

daily and vip have input ready (lagging); summary waits for vip. A file no
commit recorded sits in shop.orders' data directory, 30 days old (an orphan).
The tests of the command (tests/cli) run against exactly this.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path
from typing import Callable

import pyarrow as pa

from lakestep import Catalog
from lakestep.barrier import OPEN_EPOCH, Pipeline
from lakestep.services import Coordinator

KV = pa.schema([("k", pa.int64()), ("v", pa.int64())])
ORPHAN = "data/orphan-left-by-a-crashed-writer.parquet"
OLD = 30 * 24 * 3600.0  # the orphan's age: older than the 7-day default retention


def kv(*pairs: tuple[int, int]) -> pa.Table:
    return pa.table({"k": [p[0] for p in pairs], "v": [p[1] for p in pairs]}, schema=KV)


def _batch(p: Pipeline, job: str, fn: Callable[[dict[str, list[tuple[int, int]]]], list[tuple[int, int]]],
           max_barriers: int = 1) -> int:
    plan = p.next_batch(job, max_barriers=max_barriers)
    assert plan is not None, job
    cat = p.catalog
    inputs = {n: sorted((r["k"], r["v"]) for r in cat.load_table(n).to_arrow(version=s.to_version).to_pylist())
              if n != "shop.customers" else
              sorted((r["id"], 1 if r["tier"] == "gold" else 0) for r in
                     cat.load_table(n).to_arrow(version=s.to_version).to_pylist())
              for n, s in plan.sources.items()}
    with p.batch(plan) as b:
        b.overwrite(plan.sinks[0], kv(*fn(inputs)))
    return plan.hi


def copy(src: str) -> Callable[[dict[str, list[tuple[int, int]]]], list[tuple[int, int]]]:
    return lambda i: i[src]


def vip(i: dict[str, list[tuple[int, int]]]) -> list[tuple[int, int]]:
    gold = {k for k, g in i["shop.customers"] if g}
    return [(k, v) for k, v in i["shop.daily"] if k in gold]


def build(cat: Catalog) -> tuple[Pipeline, Coordinator, Path]:
    """Build the pipeline in an empty catalog; returns it, its coordinator and the orphan's path."""
    cat.create_namespace("shop")
    orders = cat.create_table("shop.orders", KV)
    customers = cat.create_table("shop.customers", pa.schema([("id", pa.int64()), ("tier", pa.string())]),
                                 primary_key=["id"], properties={"owner": "crm-team"})
    for name in ("daily", "vip", "summary"):
        cat.create_table(f"shop.{name}", KV)
    notes = cat.create_table("shop.notes", pa.schema([("id", pa.int64())]),
                             properties={"lakestep.retention-seconds": "0"})
    p = Pipeline(cat)
    p.register_job("ingest", sinks=["shop.orders"], external_input=True, description="orders from Kafka")
    p.register_job("crm", sinks=["shop.customers"], external_input=True)
    p.register_job("daily", sources=["shop.orders"], sinks=["shop.daily"])
    p.register_job("vip", sources=["shop.daily", "shop.customers"], sinks=["shop.vip"])
    p.register_job("summary", sources=["shop.vip"], sinks=["shop.summary"])
    coord = Coordinator(cat, holder="coord-1", lease_seconds=3600.0)
    # barrier 1: orders 1, 2 and two customers; every derived job processes it; snapshot of 1
    orders.append(kv((1, 10), (2, 20)), barrier=OPEN_EPOCH)
    customers.upsert({"id": [1, 2], "tier": ["gold", "free"]}, barrier=OPEN_EPOCH)
    assert coord.seal().barrier == 1  # type: ignore[union-attr]
    assert (_batch(p, "daily", copy("shop.orders")), _batch(p, "vip", vip),
            _batch(p, "summary", copy("shop.vip"))) == (1, 1, 1)
    assert coord.snapshot() == [1]
    # barrier 2: order 3; every derived job processes it (no snapshot: COMMIT only)
    orders.append(kv((3, 30)), barrier=OPEN_EPOCH)
    assert coord.seal().barrier == 2  # type: ignore[union-attr]
    assert (_batch(p, "daily", copy("shop.orders")), _batch(p, "vip", vip),
            _batch(p, "summary", copy("shop.vip"))) == (2, 2, 2)
    # barrier 3: order 4; only daily processes it; barrier 4: nothing new, nobody processes it
    orders.append(kv((4, 40)), barrier=OPEN_EPOCH)
    assert coord.seal().barrier == 3  # type: ignore[union-attr]
    assert _batch(p, "daily", copy("shop.orders")) == 3
    assert coord.seal().barrier == 4  # type: ignore[union-attr]
    # the unmanaged table: version 1 pinned by a snapshot, then replaced twice (retention 0)
    notes.append({"id": [1]})
    notes.create_snapshot("keep", version=1)
    notes.overwrite({"id": [2]})
    notes.overwrite({"id": [3]})
    orphan = Path(orders.location) / ORPHAN
    orphan.parent.mkdir(parents=True, exist_ok=True)
    orphan.write_bytes(b"PAR1 not really parquet PAR1")
    old = orphan.stat().st_mtime - OLD
    os.utime(orphan, (old, old))
    return p, coord, orphan



def main(argv: list[str]) -> None:
    where = Path(argv[0] if argv else "ops-wh")
    shutil.rmtree(where, ignore_errors=True)
    with Catalog(warehouse=str(where)) as cat:
        _, coord, _ = build(cat)
        coord.release()  # this process is not a running coordinator: `lakestep doctor` says so
    print(f"built a pipeline in {where}: try  lakestep barriers --catalog {where}")


if __name__ == "__main__":
    main(sys.argv[1:])
