"""The coordinator in-process: the lease and its fencing, interval and per-batch sealing, the thread."""

from __future__ import annotations

import pytest

from lakestep import Catalog
from lakestep.barrier import OPEN_EPOCH, NotCoordinatorError, Pipeline, sealing
from lakestep.clock import ManualClock
from lakestep.errors import InvalidArgumentError
from lakestep.services import Coordinator
from tests.waiting import wait_until

from .conftest import kv, make_tables


def test_lease_fences_a_stale_coordinator(clocked: Catalog, clock: ManualClock) -> None:
    catalog = clocked
    pipeline = Pipeline(catalog)
    c1 = Coordinator(catalog, lease_seconds=10, holder="c1")
    c2 = Coordinator(catalog, lease_seconds=10, holder="c2")
    assert c1.seal().barrier == 1  # type: ignore[union-attr]
    assert c1.lease is not None and c1.lease.expires_at == clock.now() + 10
    assert not c2.acquire()  # c1 holds it
    with pytest.raises(NotCoordinatorError):
        c2.seal()
    clock.advance(9.5)  # c1 is "paused": its lease runs out
    assert not c2.acquire()  # not yet
    clock.advance(0.5)  # to the instant it expires
    stale = c1.lease
    assert stale is not None
    assert c2.acquire() and c2.lease.token == stale.token + 1  # type: ignore[union-attr]
    with pytest.raises(NotCoordinatorError) as ei:  # the seal transaction itself fences it out
        sealing.seal(catalog, stale, 10.0)
    assert ei.value.current_holder == "c2" and ei.value.current_token == 2 and ei.value.token == 1
    with pytest.raises(NotCoordinatorError) as ei:
        c1.seal()  # and the coordinator, which checks first
    assert ei.value.token == 1 and not c1.is_leader
    assert c2.seal().barrier == 2  # type: ignore[union-attr]
    assert [(s.barrier, s.holder, s.token) for s in pipeline.seals()] == [(1, "c1", 1), (2, "c2", 2)]
    c2.release()
    assert c1.acquire()  # released: taken at once, no waiting for expiry
    c1.release()


def test_a_seal_of_an_epoch_no_longer_open_writes_nothing(clocked: Catalog, clock: ManualClock) -> None:
    """``seal(expected=e)`` seals only while ``e`` is open (a retried seal never seals twice):
    otherwise nothing is written, not even the lease's extension."""
    catalog = clocked
    pipeline = Pipeline(catalog)
    coord = Coordinator(catalog, lease_seconds=10, holder="c")
    assert coord.seal(expected=1).barrier == 1  # type: ignore[union-attr]
    with catalog.backend.read() as conn:
        before = sealing.read_lease(conn).expires_at
    clock.advance(1)
    assert coord.seal(expected=1) is None  # 1 is sealed: the open epoch is 2
    with catalog.backend.read() as conn:
        assert sealing.read_lease(conn).expires_at == before
        assert sealing.open_epoch(conn) == 2
    assert [s.barrier for s in pipeline.seals()] == [1]
    assert coord.seal(expected=2).barrier == 2  # type: ignore[union-attr]
    with catalog.backend.read() as conn:
        assert sealing.read_lease(conn).expires_at == clock.now() + 10
    assert [(s.barrier, s.sealed_at) for s in pipeline.seals()][-1] == (2, clock.now())
    coord.release()


def test_a_coordinator_renews_its_lease_after_a_third(clocked: Catalog, clock: ManualClock) -> None:
    # per_batch with no root table: nothing is ever due, so no seal extends the lease
    c1 = Coordinator(clocked, seal="per_batch", lease_seconds=30, holder="c1")
    c2 = Coordinator(clocked, seal="per_batch", lease_seconds=30, holder="c2")
    assert c1.tick().leader
    taken = clock.now()
    clock.advance(10)  # a third of the lease: no renewal yet
    assert c1.tick().leader and c1.lease.expires_at == taken + 30  # type: ignore[union-attr]
    clock.advance(0.5)
    assert c1.tick().leader and c1.lease.expires_at == clock.now() + 30  # type: ignore[union-attr]
    clock.advance(29.5)  # the renewed lease has half a second left
    assert not c2.tick().leader
    clock.advance(0.5)
    assert c2.tick().leader  # c1 stopped ticking: its lease lapsed, c2 took over
    assert not c1.tick().leader  # and c1 finds out


def test_tick_per_batch_and_interval(clocked: Catalog, clock: ManualClock) -> None:
    catalog = clocked
    catalog.create_namespace("s")
    pipeline = Pipeline(catalog)
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
    opened = t.sealed.sealed_at  # epoch 3 opened then
    per_batch.release()
    interval = Coordinator(catalog, interval=5, idle=20, lease_seconds=30)
    first = interval.tick()
    assert first.leader and first.sealed is None and first.next_in == 5  # epoch 3 opened just now
    clock.advance(4.5)
    t = interval.tick()
    assert t.sealed is None and t.next_in == 0.5
    catalog.load_table("s.a").append(kv((3, 3)), barrier=OPEN_EPOCH)  # a root commit within the interval
    clock.advance(0.5)
    t = interval.tick()  # exactly 5 s after epoch 3 opened
    assert t.sealed is not None and t.sealed.barrier == 3 and t.sealed.opened_at == opened
    assert t.sealed.sealed_at == opened + 5 and t.next_in == 5
    opened = t.sealed.sealed_at  # epoch 4
    clock.advance(5)
    t = interval.tick()  # the interval passed, no root commit: checked again every poll
    assert t.sealed is None and t.next_in == interval.poll
    clock.advance(2)
    catalog.load_table("s.a").append(kv((4, 4)), barrier=OPEN_EPOCH)
    t = interval.tick()  # sealed as soon as a root commit landed
    assert t.sealed is not None and t.sealed.barrier == 4 and t.sealed.sealed_at == opened + 7
    opened = t.sealed.sealed_at  # epoch 5: no root commit; sealed when idle
    clock.advance(19.5)
    t = interval.tick()
    assert t.sealed is None and t.next_in == pytest.approx(interval.poll)
    clock.advance(0.5)
    t = interval.tick()
    assert t.sealed is not None and t.sealed.barrier == 5 and t.sealed.sealed_at == opened + 20
    standby = Coordinator(catalog)
    t = standby.tick()
    assert not t.leader and t.sealed is None and t.next_in == 1.0
    interval.release()
    clock_only = Coordinator(catalog, interval=5, idle=5, lease_seconds=30)  # lakestep 0.1's sealing
    assert clock_only.tick().sealed is None
    clock.advance(5)
    assert clock_only.tick().sealed.barrier == 6  # type: ignore[union-attr]
    clock_only.release()
    assert Coordinator(catalog, interval=2).idle == 20  # the default: 10 intervals
    with pytest.raises(InvalidArgumentError, match="idle must be at least the interval"):
        Coordinator(catalog, interval=5, idle=4)


def test_thread_seals_and_releases(catalog: Catalog, pipeline: Pipeline) -> None:
    coord = Coordinator(pipeline.catalog, interval=0.02, lease_seconds=5.0)
    coord.start()
    wait_until(lambda: pipeline.open_epoch() >= 6, "6 seals", timeout=120, interval=0.02)  # a hang, not a speed limit
    coord.stop()
    n = pipeline.open_epoch()
    assert n >= 6
    seals = pipeline.seals()
    assert [s.barrier for s in seals] == list(range(1, n))  # none skipped, none twice
    assert all(b.sealed_at - a.sealed_at >= 0.015 for a, b in zip(seals, seals[1:]))  # the interval holds
    assert not coord.is_leader and Coordinator(catalog).acquire()  # released on stop


_HOLD = r'''
import sys, time
from lakestep import Catalog
cat = Catalog(sys.argv[1])
if sys.argv[2] == "coordinator":
    from lakestep.barrier import sealing
    lease = sealing.acquire(cat, sealing.default_holder(), 600.0)
    print(lease.holder, flush=True)
else:
    from lakestep.iceberg import Publisher
    pub = Publisher(cat, lease_seconds=600.0)
    assert pub._acquire()[0]
    print(pub.holder, flush=True)
time.sleep(600)
'''


@pytest.mark.parametrize("lease", ["coordinator", "publisher"])
def test_a_lease_whose_holder_process_is_gone_is_taken_over_at_once(catalog: Catalog, lease: str) -> None:
    """A holder process that exited (SIGKILL) leaves its lease to the next taker at once, not a
    lease later; while it lives (even idle) the lease is its own."""
    import subprocess
    import sys

    if lease == "publisher":
        pytest.importorskip("pyiceberg")
        from lakestep.iceberg import Publisher

        mine = Publisher(catalog, lease_seconds=10.0)

        def take() -> bool:
            return mine._acquire()[0]
    else:
        def take() -> bool:
            return sealing.acquire(catalog, sealing.default_holder(), 10.0) is not None

    child = subprocess.Popen([sys.executable, "-c", _HOLD, catalog.connection_url(), lease], stdout=subprocess.PIPE,
                             text=True)
    try:
        holder = child.stdout.readline().strip()  # type: ignore[union-attr]
        assert holder.split(":")[1] == str(child.pid) and sealing.holder_gone(holder) is False
        assert not take()  # alive (sleeping): its lease, 600 s of it left
        child.kill()
        child.wait()
        assert sealing.holder_gone(holder)
        assert take()  # gone: taken at once
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()


def test_only_a_default_name_of_this_host_and_namespace_is_ever_judged_gone() -> None:
    import os
    import socket

    me = sealing.default_holder()
    host, pid, rand, where = me.split(":")
    assert host == socket.gethostname() and pid == str(os.getpid()) and where
    assert not sealing.holder_gone(me)  # this process
    dead = 2 ** 22 + 7  # above the PID limit of a default kernel: no process has it
    assert sealing.holder_gone(f"{host}:{dead}:{rand}:{where}")
    for name in (None, "c1", f"{host}:{dead}:{rand}", f"other-host:{dead}:{rand}:{where}",
                 f"{host}:{dead}:{rand}:{where}x", f"{host}:x{dead}:{rand}:{where}"):
        assert not sealing.holder_gone(name), name
