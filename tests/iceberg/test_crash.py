"""The publisher killed at every step of a round, then run again; two publishers at once.

A kill is a failpoint with the ``exit`` action (``os._exit(137)``: nothing is
flushed or cleaned up, as with SIGKILL) in a ``lakestep publish`` process; the
standby test kills a running publisher with SIGKILL itself.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from typing import Any

import pyarrow as pa

from lakestep.barrier import OPEN_EPOCH
from lakestep.iceberg import Publisher, status
from tests.iceberg.conftest import TABLES, Shop, customers, orders
from tests.waiting import wait_until

CLI = [sys.executable, "-c", "import sys; from lakestep.cli import main; sys.exit(main())"]

# (failpoint, action): every step of a round, the per-table ones at several tables
KILLS = [
    ("publish.planned", "exit"),
    ("publish.table.pinned", "exit@1"),
    ("publish.table.written", "exit@2"),
    ("publish.table.swapped", "exit@1"),
    ("publish.table.swapped", "exit@4"),
    ("publish.tables_done", "exit"),
    ("publish.cut_moved", "exit"),
    ("publish.table.swapped", "exit@7"),  # in the second pass, moving main to the new cut
]


def publish(url: str, *args: str, env: dict[str, str] | None = None, **kw: Any) -> subprocess.CompletedProcess:
    return subprocess.run([*CLI, "publish", "--catalog", url, "--json", "--log-level", "WARNING",
                           "--holder", "crash-test", *args],
                          env={**os.environ, **(env or {})}, capture_output=True, text=True, timeout=300, **kw)


def advance(shop: Shop, i: int) -> None:
    """New data in every kind of table, two barriers sealed, the derived jobs run."""
    shop.orders.append(orders((100 + i, "eu", i), (200 + i, "us", i)), barrier=OPEN_EPOCH)
    shop.customers.upsert(customers((i % 3, f"c{i}", i)), barrier=OPEN_EPOCH)
    shop.regions.append(pa.table({"region": [f"r{i}"], "label": [str(i)]}))
    shop.seal()
    shop.orders.append(orders((300 + i, "apac", i)), barrier=OPEN_EPOCH)
    shop.seal()
    shop.derive()


def assert_never_ahead(shop: Shop) -> None:
    """Each table's main shows a tag at or below the complete cut, and every tag is a snapshot
    whose lakestep barrier is at or below the tag's own."""
    complete = status(shop.cat).complete
    for ident in TABLES:
        t = shop.engines.table(ident)
        tags = {int(n.split("-")[1]): r.snapshot_id for n, r in t.metadata.refs.items() if n.startswith("barrier-")}
        for b, sid in tags.items():
            got = t.metadata.snapshot_by_id(sid).summary.additional_properties
            assert int(got["lakestep.barrier"]) <= b, (ident, b, got)
        if ident == "shop.regions" or t.metadata.current_snapshot_id is None:
            continue
        assert complete is not None, f"{ident} has a main but no cut is complete"
        below = {sid for b, sid in tags.items() if b <= complete}
        assert t.metadata.current_snapshot_id in below, (ident, complete, sorted(tags))


def test_killed_at_every_step_then_rerun(catalog_spec) -> None:  # type: ignore[no-untyped-def]
    """Each kill point on one backend (half of them on each: the steps are the same code, and a
    kill costs two publisher processes)."""
    kills = KILLS[0::2] if catalog_spec.backend == "sqlite" else KILLS[1::2]
    cat = catalog_spec.open()
    shop = Shop(cat, engines=("pyiceberg", "duckdb"))
    try:
        advance(shop, 0)
        first = publish(catalog_spec.url, "--once")
        assert first.returncode == 0, first.stderr
        shop.check()
        for i, (point, action) in enumerate(kills, start=1):
            advance(shop, i)
            killed = publish(catalog_spec.url, "--once", env={"LAKESTEP_FAILPOINTS": f"{point}={action}"})
            assert killed.returncode == 137, (point, action, killed.returncode, killed.stderr[-2000:])
            assert_never_ahead(shop)
            # the rerun, in this process (the killed one is gone; what it left is in the catalog and the
            # storage, which the next publisher finds: the first run above is the CLI's own)
            again = catalog_spec.open()
            pub = Publisher(again, holder="crash-test")
            try:
                done = pub.publish_once()
            finally:
                pub.close()
                again.close()
            assert done.leader and not done.errors, (point, done)
            assert done.complete == shop.p.committed_barrier(), (point, done)
            assert_never_ahead(shop)
            shop.check()  # the new tags, each made once (refs are unique by name) and right
        # every barrier from the first on has exactly one tag on every managed table
        for ident in TABLES:
            if ident == "shop.regions":
                continue
            refs = shop.engines.table(ident).metadata.refs
            tags = sorted(int(n.split("-")[1]) for n in refs if n.startswith("barrier-"))
            assert tags == list(range(tags[0], shop.p.committed_barrier() + 1)), (ident, tags)
        shop.check(every_tag=True)
    finally:
        shop.pub.close()
        cat.close()


def test_a_standby_takes_over_from_a_killed_publisher(catalog_spec) -> None:  # type: ignore[no-untyped-def]
    cat = catalog_spec.open()
    shop = Shop(cat, engines=("pyiceberg",))
    procs: list[subprocess.Popen[str]] = []
    try:
        def start(holder: str) -> subprocess.Popen[str]:
            p = subprocess.Popen([*CLI, "publish", "--catalog", catalog_spec.url, "--interval", "0.05",
                                  "--lease", "2", "--holder", holder, "--log-level", "WARNING"],
                                 stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
            procs.append(p)
            return p

        def dead(p: subprocess.Popen[str]) -> str | None:
            return None if p.poll() is None else f"publisher exited {p.returncode}: {p.stderr.read()[-2000:]}"

        a = start("A")
        advance(shop, 0)
        wait_until(lambda: status(cat).complete == shop.p.committed_barrier(), "A publishes",
                   failed=lambda: dead(a))
        b = start("B")
        advance(shop, 1)
        wait_until(lambda: status(cat).complete == shop.p.committed_barrier(), "A publishes again",
                   failed=lambda: dead(a) or dead(b))
        assert status(cat).holder == "A"
        a.send_signal(signal.SIGKILL)
        a.wait()
        advance(shop, 2)
        wait_until(lambda: status(cat).holder == "B" and status(cat).complete == shop.p.committed_barrier(),
                   "B takes the lease over and publishes", failed=lambda: dead(b))
        b.send_signal(signal.SIGTERM)
        assert b.wait(timeout=60) == 0, b.stderr.read()[-2000:]
        assert status(cat).holder is None  # released on SIGTERM
        shop.pub.publish_once()
        assert_never_ahead(shop)
        shop.check(every_tag=True)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        shop.pub.close()
        cat.close()


def test_a_publisher_without_the_lease_does_nothing(catalog) -> None:  # type: ignore[no-untyped-def]
    shop = Shop(catalog, engines=("pyiceberg",))
    from lakestep.iceberg import Publisher

    other = Publisher(catalog, holder="other")
    try:
        advance(shop, 0)
        assert shop.pub.publish().leader
        r = other.publish()
        assert not r.leader and r.holder == shop.pub.holder and not r.tables
        shop.pub.release()
        assert other.publish_once().leader
        shop.check()
    finally:
        other.close()
        shop.pub.close()
