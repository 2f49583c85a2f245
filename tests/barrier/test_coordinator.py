"""The coordinator in-process: the lease and its fencing, interval and per-batch sealing, the thread."""

from __future__ import annotations

import time

import pytest

from lakestep import Catalog
from lakestep.barrier import OPEN_EPOCH, Coordinator, NotCoordinatorError, Pipeline, epochs

from .conftest import kv, make_tables


def test_lease_fences_a_stale_coordinator(catalog: Catalog, pipeline: Pipeline) -> None:
    c1 = Coordinator(catalog, lease_seconds=0.5, holder="c1")
    c2 = Coordinator(catalog, lease_seconds=0.5, holder="c2")
    assert c1.seal().barrier == 1  # type: ignore[union-attr]
    assert not c2.acquire()  # c1 holds it
    with pytest.raises(NotCoordinatorError):
        c2.seal()
    time.sleep(0.6)  # c1 is "paused" past its lease
    stale = c1.lease
    assert stale is not None
    assert c2.acquire() and c2.lease.token == stale.token + 1  # type: ignore[union-attr]
    with pytest.raises(NotCoordinatorError) as ei:  # the seal transaction itself fences it out
        epochs.seal(catalog, stale, 10.0)
    assert ei.value.current_holder == "c2" and ei.value.current_token == 2 and ei.value.token == 1
    with pytest.raises(NotCoordinatorError) as ei:
        c1.seal()  # and the coordinator, which checks first
    assert ei.value.token == 1 and not c1.is_leader
    assert c2.seal().barrier == 2  # type: ignore[union-attr]
    assert [(s.barrier, s.holder, s.token) for s in pipeline.seals()] == [(1, "c1", 1), (2, "c2", 2)]
    c2.release()
    assert c1.acquire()  # released: taken at once, no waiting for expiry
    c1.release()


def test_tick_per_batch_and_interval(catalog: Catalog, pipeline: Pipeline) -> None:
    make_tables(catalog, "a")
    pipeline.register_job("ingest", sinks=["s.a"], external_input=True)
    per_batch = Coordinator(catalog, seal="per_batch")
    assert per_batch.tick().sealed is None  # no root batch in the open epoch
    catalog.load_table("s.a").append(kv((1, 1)), barrier=OPEN_EPOCH)
    t = per_batch.tick()
    assert t.leader and t.sealed is not None and t.sealed.barrier == 1 and t.snapshots == ()
    assert per_batch.tick().sealed is None
    catalog.load_table("s.a").append(kv((2, 2)), barrier=OPEN_EPOCH)
    t = per_batch.tick()  # barrier 1 is committed now: snapshotted in the same transaction as seal 2
    assert t.sealed is not None and t.sealed.barrier == 2 and t.snapshots == (1,)
    per_batch.release()
    interval = Coordinator(catalog, interval=0.3)
    first = interval.tick()  # the open epoch opened more than 0.3 s ago? maybe not
    if first.sealed is None:
        time.sleep(first.next_in + 0.01)
        first = interval.tick()
    assert first.sealed is not None and first.sealed.barrier == 3
    t = interval.tick()
    assert t.sealed is None and 0.1 < t.next_in <= 0.3
    time.sleep(t.next_in + 0.01)
    assert interval.tick().sealed.barrier == 4  # type: ignore[union-attr]
    standby = Coordinator(catalog)
    t = standby.tick()
    assert not t.leader and t.sealed is None
    interval.release()


def test_thread_seals_and_releases(catalog: Catalog, pipeline: Pipeline) -> None:
    coord = pipeline.coordinator(interval=0.02, lease_seconds=5.0)
    coord.start()
    deadline = time.monotonic() + 10
    while pipeline.open_epoch() < 6 and time.monotonic() < deadline:
        time.sleep(0.02)
    coord.stop()
    n = pipeline.open_epoch()
    assert n >= 6
    seals = pipeline.seals()
    assert [s.barrier for s in seals] == list(range(1, n))  # none skipped, none twice
    assert all(b.sealed_at - a.sealed_at >= 0.015 for a, b in zip(seals, seals[1:]))  # the interval holds
    assert not coord.is_leader and Coordinator(catalog).acquire()  # released on stop
