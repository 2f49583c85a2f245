"""Sealing races with root commits made by several processes: no commit lands in a sealed epoch.

Three worker processes append to two root tables with ``barrier=OPEN_EPOCH``
(one table, or both in one transaction), with a failpoint that makes every
commit linger inside its database transaction, after it has read the open
epoch. Meanwhile this process seals epochs as fast as it can and, right after
each seal of ``e`` returns, counts the commits carrying ``e``. At the end:

* every commit's barrier lies between the open epoch read just before it
  started and the one read just after it returned (it is the epoch open at
  its commit time);
* no sealed barrier gained a commit after its seal returned;
* the seals are contiguous, and the commits spread over many epochs and
  processes (the race was real).
"""

from __future__ import annotations

import collections
import random
import time
from typing import Any, Iterator

import pytest
import sqlalchemy as sa

from lakestep import Catalog
from lakestep.barrier import OPEN_EPOCH, Pipeline
from lakestep.services import Coordinator
from tests.catalog.workers import Worker

from .conftest import kv, make_tables

COMMITS = 25  # appends each worker makes (a count, not a time window: the seal loop may hog SQLite's lock)
_COUNT = sa.text("SELECT count(*) FROM ls_commit WHERE barrier = :b")


def commit_loop(cat: Catalog, start_at: float, commits: int, worker: int) -> list[tuple[int, int, int, int]]:
    """(open epoch before, barrier stamped, open epoch after, worker) of every commit made."""
    p = Pipeline(cat)
    r1, r2 = cat.load_table("s.r1"), cat.load_table("s.r2")
    out = []
    i = 0
    time.sleep(max(0.0, start_at - time.time()))
    while i < commits:
        before = p.open_epoch()
        if i % 3 == 2:
            with cat.transaction() as tx:
                tx.append(r1, kv((worker, i)), barrier=OPEN_EPOCH)
                tx.append(r2, kv((worker, i)), barrier=OPEN_EPOCH)
            results = tx.results
        else:
            results = [(r1 if i % 2 else r2).append(kv((worker, i)), barrier=OPEN_EPOCH)]
        after = p.open_epoch()
        out.extend((before, int(r.barrier), after, worker) for r in results)  # type: ignore[arg-type]
        i += 1
    return out


@pytest.fixture(scope="module")
def racers() -> Iterator[list[Worker]]:
    # every commit sleeps 3 ms holding its transaction, after reading the open epoch
    workers = [Worker(env={"LAKESTEP_FAILPOINTS": "commit.locked=sleep:0.003"}) for _ in range(3)]
    yield workers
    for w in workers:
        w.stop()


def test_no_commit_lands_in_a_sealed_epoch(catalog_spec: Any, catalog: Catalog, racers: list[Worker]) -> None:
    catalog.create_namespace("s")
    make_tables(catalog, "r1", "r2")
    p = Pipeline(catalog)
    p.register_job("ingest", sinks=["s.r1", "s.r2"], external_input=True)
    for w in racers:  # each opens the catalog
        w.call(catalog_spec, "tests.catalog.workers", "ping")
    start_at = time.time() + 0.3  # then they start together
    for n, w in enumerate(racers):
        w.send_call(catalog_spec, __name__, "commit_loop", start_at, COMMITS, n)
    coord = Coordinator(catalog, lease_seconds=60.0, snapshot_every=None)
    rnd = random.Random(7)
    at_seal: dict[int, int] = {}
    time.sleep(max(0.0, start_at - time.time()))
    deadline = time.monotonic() + 120
    while not all(w.pipe.poll() for w in racers) and time.monotonic() < deadline:
        s = coord.seal()
        assert s is not None
        with catalog.backend.read() as conn:
            at_seal[s.barrier] = int(conn.execute(_COUNT, {"b": s.barrier}).scalar_one())
        time.sleep(rnd.choice([0, 0.001, 0.005, 0.02]))
    commits = [c for w in racers for c in w.receive(timeout=120)]
    coord.release()

    assert all(before <= b <= after for before, b, after, _ in commits), "a commit carried a stale epoch"
    with catalog.backend.read() as conn:
        final = {b: int(conn.execute(_COUNT, {"b": b}).scalar_one()) for b in at_seal}
    late = {b: (at_seal[b], final[b]) for b in at_seal if final[b] != at_seal[b]}
    assert not late, f"commits landed in sealed epochs: {late}"
    assert [s.barrier for s in p.seals()] == sorted(at_seal) == list(range(1, len(at_seal) + 1))
    by_barrier = collections.defaultdict(set)
    for _, b, _, w in commits:
        by_barrier[b].add(w)
    print(f"{len(commits)} commits by {len(racers)} processes in {len(by_barrier)} epochs, {len(at_seal)} seals")
    assert len(commits) > 50 and len(by_barrier) >= 10
    assert any(len(ws) >= 2 for ws in by_barrier.values())  # processes really interleaved in epochs
    # every commit is counted exactly once: in its sealed barrier, or in the epoch still open
    assert sum(final.values()) + sum(1 for c in commits if c[1] not in final) == len(commits)
