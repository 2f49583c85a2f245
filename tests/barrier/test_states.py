"""Per-table states, next barriers, the version rule, consistency levels and explanations."""

from __future__ import annotations

from typing import Callable

import pytest
import sqlalchemy as sa

from lakestep import Catalog, errors
from lakestep.barrier import (
    OPEN_EPOCH,
    BarrierNotRetainedError,
    BarrierState,
    NoSnapshotError,
    Pipeline,
    RollbackRefusedError,
)
from lakestep.catalog import schema as S
from lakestep.catalog.lifecycle import live_locks
from lakestep.clock import ManualClock
from lakestep.errors import VersionNotFoundError
from lakestep.services import Coordinator

from .conftest import kv, make_tables, root_and_copy, rows


def process(p: Pipeline, job: str, fn: Callable[[dict[str, list[tuple[int, int]]]], list[tuple[int, int]]],
            catalog: Catalog) -> int | None:
    """Run one batch of ``job``: ``fn`` maps each source's rows at ``to_version`` to the sink's rows."""
    plan = p.next_batch(job)
    if plan is None:
        return None
    inputs = {name: rows(catalog.load_table(name).to_arrow(version=s.to_version)) for name, s in plan.sources.items()}
    with p.batch(plan) as b:
        b.overwrite(plan.sinks[0], kv(*fn(inputs)))
    return plan.hi


def copy_of(src: str) -> Callable[[dict[str, list[tuple[int, int]]]], list[tuple[int, int]]]:
    return lambda inputs: inputs[src]


def test_next_barrier_waits_for_every_source(catalog: Catalog, pipeline: Pipeline, coordinator: Coordinator) -> None:
    make_tables(catalog, "a", "b", "j", "j2")
    p = pipeline
    p.register_job("ingest_a", sinks=["s.a"], external_input=True)
    p.register_job("ingest_b", sinks=["s.b"], external_input=True)
    p.register_job("join", sources=["s.a", "s.b"], sinks=["s.j"])
    p.register_job("after", sources=["s.j"], sinks=["s.j2"])
    a = catalog.load_table("s.a")
    assert p.next_barrier("join") is None  # nothing sealed yet
    a.append(kv((1, 1)), barrier=OPEN_EPOCH)
    assert p.next_barrier("join") is None  # barrier 1 is open
    coordinator.seal()
    assert p.next_barrier("join") == 1  # sealing precommits 1 for both roots, data or not
    assert p.next_barrier("after") is None  # its source has not precommitted 1
    coordinator.seal()
    coordinator.seal()
    plan = p.next_batch("join")
    assert plan is not None and (plan.lo, plan.hi) == (1, 1)  # a changes at 1: a batch of its own
    assert plan.sources["s.a"].from_version == 0 and plan.sources["s.a"].to_version == 1
    assert process(p, "join", lambda i: i["s.a"] + i["s.b"], catalog) == 1
    plan = p.next_batch("join")
    assert plan is not None and (plan.lo, plan.hi) == (2, 3)  # nothing changed in 2..3: one batch
    assert p.next_batch("join", max_barriers=1).hi == 2  # type: ignore[union-attr]
    assert p.next_barrier("after") == 1
    process(p, "join", lambda i: i["s.a"] + i["s.b"], catalog)
    assert p.next_batch("join") is None
    assert p.frontier("s.j") == 3 and p.frontier("s.a") == 3 and p.frontier("s.j2") == 0


def _copy_job_first_batch(catalog: Catalog, p: Pipeline, coordinator: Coordinator):  # type: ignore[no-untyped-def]
    """s.a (root, job ingest) -> s.d (derived, job copy); barrier 1 sealed; the copy job's first plan."""
    root_and_copy(catalog, p)
    coordinator.seal()
    plan = p.next_batch("copy")
    assert plan is not None
    return plan


def test_replay_and_empty_batches(catalog: Catalog, pipeline: Pipeline, coordinator: Coordinator) -> None:
    p = pipeline
    plan = _copy_job_first_batch(catalog, p, coordinator)
    with p.batch(plan):  # no output: an empty commit still precommits the barrier
        pass
    d = catalog.load_table("s.d")
    assert d.history(limit=1)[0].barrier == 1 and d.history(limit=1)[0].added_files == 0
    assert p.frontier("s.d") == 1
    version = d.version
    again = p.batch(plan)  # a restarted job redoing the same batch
    again.append("s.d", kv((9, 9)))
    res = again.commit()
    assert res.replayed and res.results[0].replayed and res.results[0].barrier == 1
    assert d.version == version and d.to_arrow().num_rows == 0  # nothing committed
    with pytest.raises(errors.InvalidArgumentError, match="not a sink"):
        p.batch(plan).append("s.a", kv((1, 1)))


def test_version_rule_with_barrierless_commits(catalog: Catalog, pipeline: Pipeline,
                                               coordinator: Coordinator) -> None:
    make_tables(catalog, "a")
    pipeline.register_job("ingest", sinks=["s.a"], external_input=True)
    a = catalog.load_table("s.a")
    a.append(kv((1, 1)), barrier=OPEN_EPOCH)
    a.append(kv((2, 2)), barrier=OPEN_EPOCH)  # versions 1, 2: barrier 1
    coordinator.seal()
    compact = a.compact()  # version 3, no barrier, same rows
    assert compact.barrier is None and compact.data_version == 2
    assert pipeline.version_at("s.a", 1) == 3  # the compaction is included: same rows, fewer files
    assert pipeline.version_at("s.a", 0) == 0
    a.append(kv((3, 3)))  # version 4: changes rows without a barrier
    assert pipeline.version_at("s.a", 1) == 3  # ...so it is not part of barrier 1
    a.append(kv((4, 4)), barrier=OPEN_EPOCH)  # version 5, barrier 2
    coordinator.seal()
    assert pipeline.version_at("s.a", 2) == 5  # version 4 counts with the next barriered commit
    assert rows(a.to_arrow(version=pipeline.version_at("s.a", 2))) == [(1, 1), (2, 2), (3, 3), (4, 4)]
    with pytest.raises(VersionNotFoundError, match="precommitted up to 2"):
        pipeline.version_at("s.a", 3)  # barrier 3 is still open
    assert pipeline.version_at("s.a", 99, strict=False) == 5


def test_the_choice_answers_the_version_rule_after_commits_that_change_no_rows(
        catalog: Catalog, pipeline: Pipeline, coordinator: Coordinator) -> None:
    """Commits after m that change no rows (here two empty appends) belong to m's barrier:
    version_at and read_committed (one statement, states._CHOICE) both answer the newest of
    them, exactly; a data change after them is left out, whether barriered or not."""
    p = pipeline
    a = root_and_copy(catalog, p)
    a.append(kv((1, 1)), barrier=OPEN_EPOCH)  # v1: barrier 1
    coordinator.seal()
    assert [a.append(kv()).data_version for _ in range(2)] == [1, 1]  # v2, v3: no rows, no new data version
    process(p, "copy", copy_of("s.a"), catalog)
    assert p.version_at("s.a", 1) == 3
    for pipe in (p, Pipeline(catalog)):  # the cached topology (one statement) and a fresh one
        c = pipe.choose(["s.a", "s.d"])
        assert (c.barrier, c.versions["s.a"]) == (1, 3)
    a.append(kv((2, 2)))  # v4: rows, no barrier: counts with the next barrier
    a.append(kv(), barrier=OPEN_EPOCH)  # v5: barrier 2
    assert p.version_at("s.a", 1) == 3 and p.choose(["s.a", "s.d"]).versions["s.a"] == 3
    coordinator.seal()
    process(p, "copy", copy_of("s.a"), catalog)
    assert p.version_at("s.a", 2) == 5
    c = p.choose(["s.a", "s.d"])
    assert (c.barrier, c.versions["s.a"]) == (2, 5) and rows(c.read("s.a")) == rows(c.read("s.d")) == [(1, 1), (2, 2)]


def two_components(catalog: Catalog, p: Pipeline, coord: Coordinator) -> None:
    """r1 -> d1 (lags), r2 -> d2 (caught up); three sealed barriers."""
    make_tables(catalog, "r1", "d1", "r2", "d2")
    p.register_job("i1", sinks=["s.r1"], external_input=True)
    p.register_job("i2", sinks=["s.r2"], external_input=True)
    p.register_job("c1", sources=["s.r1"], sinks=["s.d1"])
    p.register_job("c2", sources=["s.r2"], sinks=["s.d2"])
    for i in range(3):
        catalog.load_table("s.r1").append(kv((i, i)), barrier=OPEN_EPOCH)
        catalog.load_table("s.r2").append(kv((i, 10 * i)), barrier=OPEN_EPOCH)
        coord.seal()
        process(p, "c2", copy_of("s.r2"), catalog)
        if i == 0:
            process(p, "c1", copy_of("s.r1"), catalog)


@pytest.mark.parametrize("prepared", ["1", "0"])
def test_levels_scopes_and_explanations(catalog: Catalog, pipeline: Pipeline, coordinator: Coordinator,
                                        prepared: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The same on PostgreSQL with prepared statements and without (prepared_statements=False, for pgbouncer)."""
    catalog.backend.prepared_statements = prepared == "1"
    p = pipeline
    two_components(catalog, p, coordinator)
    c = p.choose(["s.r1", "s.d1"])
    assert c.barrier == 1 and c.level == "read_committed"
    assert rows(c.read("s.r1")) == rows(c.read("s.d1")) == [(0, 0)]  # consistent
    assert c.explanation.held_by == ("s.d1",)
    assert c.explanation.behind("s.d1") == 2 and c.explanation.behind("s.r1") == 0
    text = str(c.explanation)
    assert "held back by s.d1 (derived, job 'c1'): precommitted up to 1, 2 barrier(s) behind" in text
    weak = p.choose(["s.r1", "s.d1"], level="read_uncommitted")
    assert weak.barrier is None
    assert rows(weak.read("s.r1")) != rows(weak.read("s.d1"))  # the weak level mixes barriers
    # scopes: the other component is not held back by d1 unless the scope is global
    assert p.choose(["s.r2"]).barrier == 3
    assert p.choose(["s.r2"], scope="related").barrier == 3
    g = p.choose(["s.r2"], scope="global")
    assert g.barrier == 1 and g.explanation.held_by == ("s.d1",) and p.committed_barrier() == 1
    assert set(g.explanation.tables) == {"s.r1", "s.d1", "s.r2", "s.d2"}
    assert rows(g.read("s.r2")) == [(0, 0)]
    assert p.choose(["s.r1"], scope="related").barrier == 1
    # states
    assert p.states("s.d1", 1) == {BarrierState.PRECOMMIT, BarrierState.COMMIT}
    assert p.states("s.d2", 3) == {BarrierState.PRECOMMIT}
    assert p.states("s.d1", 2) == frozenset()
    coordinator.snapshot()
    assert BarrierState.SNAPSHOT in p.states("s.d2", 1)
    # an unmanaged table is read at its head
    make_tables(catalog, "dim")
    catalog.load_table("s.dim").append(kv((7, 7)))
    c = p.choose(["s.r1", "s.dim"])
    assert c.versions["s.dim"] == 1 and c.explanation.tables["s.dim"].kind == "unmanaged"
    with catalog.backend.read() as conn:
        assert bool(conn.connection.info.get("lakestep_prepared")) == (
            prepared == "1" and conn.dialect.name == "postgresql")


def test_a_new_job_catches_up_without_pulling_commit_back(catalog: Catalog, pipeline: Pipeline,
                                                          coordinator: Coordinator) -> None:
    p = pipeline
    two_components(catalog, p, coordinator)
    while process(p, "c1", copy_of("s.r1"), catalog) is not None:
        pass
    assert p.committed_barrier() == 3
    make_tables(catalog, "late")
    job = p.register_job("late", sources=["s.r1"], sinks=["s.late"])
    assert job.joined_barrier == 3
    assert p.committed_barrier() == 3  # catching up: not in the COMMIT set
    assert p.choose(["s.r2"], scope="global").barrier == 3
    c = p.choose(["s.late", "s.r1"])  # queried by name: included, and explained
    assert c.barrier == 0 and c.explanation.tables["s.late"].catching_up
    plan = p.next_batch("late")
    assert plan is not None and plan.lo == 1
    while process(p, "late", copy_of("s.r1"), catalog) is not None:
        pass
    assert p.frontier("s.late") == 3
    coordinator.seal()
    assert p.committed_barrier() == 3  # now in the COMMIT set, and behind
    assert p.choose(["s.r2"], scope="global").explanation.held_by == ("s.d1", "s.d2", "s.late")


def test_repeatable_read_pins_snapshots(catalog: Catalog, pipeline: Pipeline, coordinator: Coordinator) -> None:
    p = pipeline
    two_components(catalog, p, coordinator)
    with pytest.raises(NoSnapshotError):
        p.choose(["s.r2", "s.d2"], level="repeatable_read")
    process(p, "c1", copy_of("s.r1"), catalog)
    process(p, "c1", copy_of("s.r1"), catalog)
    assert coordinator.snapshot() == [1, 2, 3]
    with p.choose(["s.r2", "s.d2"], level="repeatable_read", locker="report") as c:
        assert c.barrier == 3
        assert {(lk[1], lk[3]) for lk in live_locks(catalog)} == {("report", c.versions["s.r2"]),
                                                                    ("report", c.versions["s.d2"])}
        before = rows(c.read("s.d2"))
        catalog.load_table("s.r2").append(kv((99, 99)), barrier=OPEN_EPOCH)
        coordinator.seal()
        process(p, "c2", copy_of("s.r2"), catalog)
        assert rows(c.read("s.d2")) == before == rows(c.read("s.r2"))  # rereads are repeatable
    assert live_locks(catalog) == []


def test_snapshots_every_k_retention_and_cleanup(clocked: Catalog, clock: ManualClock) -> None:
    catalog = clocked
    catalog.create_namespace("s")
    p = Pipeline(catalog)
    a = root_and_copy(catalog, p)
    coord = Coordinator(catalog, snapshot_every=2, retain_count=2)
    for i in range(7):
        a.overwrite(kv((i, i)), barrier=OPEN_EPOCH)
        coord.seal()
        process(p, "copy", copy_of("s.a"), catalog)
        coord.snapshot()
    names = sorted(s.name for s in a.snapshots())
    assert names == ["lakestep-barrier-4", "lakestep-barrier-6"]  # every 2nd, the newest 2
    assert p.snapshot_barrier() == 6
    v4 = p.version_at("s.a", 4)
    from lakestep.barrier import BarrierNotRetainedError

    with pytest.raises(BarrierNotRetainedError):
        p.version_at("s.a", 3)  # older than the oldest retained barrier
    v6 = p.version_at("s.a", 6)
    clock.advance(1)  # every commit is older than a window of 0
    report = a.cleanup(retention_seconds=0, force=True)  # snapshots protect their files from cleanup
    assert report.deleted_files and {v4, v6} <= set(report.pinned_versions)
    assert rows(a.to_arrow(version=v4)) == [(3, 3)]
    assert p.version_at("s.a", 6) == v6  # still derived exactly from the pinned records
    with pytest.raises(BarrierNotRetainedError):
        p.version_at("s.a", 5)  # its commit records are pruned: refused, not guessed
    coord.release()  # a standby takes over at once
    aged = Coordinator(catalog, snapshot_every=1, retain_count=None, retain_seconds=60)
    for _ in range(2):
        a.overwrite(kv((0, 0)), barrier=OPEN_EPOCH)
        aged.seal()
        process(p, "copy", copy_of("s.a"), catalog)
    assert aged.snapshot() == [8, 9]  # 7 was committed under the old cadence (every 2nd)
    assert p.snapshot_barrier() == 9
    clock.advance(59.5)
    assert p.snapshot_barrier() == 9
    clock.advance(0.5)
    assert p.snapshot_barrier() == 6  # retention by age: 8 and 9 expired, exactly at their expiry
    aged.release()


def test_a_snapshot_is_gone_at_its_expiry_instant(clocked: Catalog, clock: ManualClock) -> None:
    """A snapshot lives while now < expires_at, to the instant, for every reader of snapshots:
    repeatable_read, the SNAPSHOT state and the since-frontier of status (as for cleanup's pins)."""
    catalog = clocked
    catalog.create_namespace("s")
    p = Pipeline(catalog)
    a = root_and_copy(catalog, p)
    coord = Coordinator(catalog, snapshot_every=1, retain_count=None, retain_seconds=60)
    a.append(kv((1, 1)), barrier=OPEN_EPOCH)
    coord.seal()
    process(p, "copy", copy_of("s.a"), catalog)
    assert coord.snapshot() == [1]
    [snap] = catalog.load_table("s.a").snapshots()
    assert snap.expires_at is not None
    clock.set(snap.expires_at - 1)
    with p.choose(["s.a", "s.d"], level="repeatable_read") as c:
        assert c.barrier == 1
    assert BarrierState.SNAPSHOT in p.states("s.a", 1) and p.status().oldest_retained == 1
    clock.set(snap.expires_at)
    with pytest.raises(NoSnapshotError):
        p.choose(["s.a", "s.d"], level="repeatable_read")
    assert BarrierState.SNAPSHOT not in p.states("s.a", 1)
    assert p.status().oldest_retained is None and p.snapshot_barrier() is None
    coord.release()


def test_choice_follows_renames_and_drops(catalog: Catalog, pipeline: Pipeline, coordinator: Coordinator) -> None:
    make_tables(catalog, "a", "b")
    pipeline.register_job("ingest", sinks=["s.a", "s.b"], external_input=True)
    coordinator.seal()
    assert pipeline.choose(["s.a", "s.b"]).barrier == 1
    catalog.rename_table("s.a", "s.a2")
    c = pipeline.choose(["s.a2", "s.b"])  # the cached id of s.a is not trusted
    assert set(c.versions) == {"s.a2", "s.b"} and c.barrier == 1
    from lakestep.errors import TableNotFoundError

    with pytest.raises(TableNotFoundError):
        pipeline.choose(["s.a"])
    catalog.drop_table("s.b")
    with pytest.raises(TableNotFoundError):
        pipeline.choose(["s.b"])
    with pytest.raises(errors.InvalidArgumentError):
        pipeline.choose(["s.a2"], level="serializable")  # type: ignore[arg-type]


def test_cleanup_keeps_the_newest_barrier_of_an_idle_table(clocked: Catalog, clock: ManualClock) -> None:
    """A derived table whose job stays idle longer than the retention window keeps its frontier:
    cleanup never prunes a table's newest commit row that carries a barrier."""
    catalog = clocked
    catalog.create_namespace("s")
    p = Pipeline(catalog)
    coordinator = Coordinator(catalog)
    plan = _copy_job_first_batch(catalog, p, coordinator)
    with p.batch(plan) as b:
        b.append("s.d", kv((1, 1)))
    d = catalog.load_table("s.d")
    d.append(kv((2, 2)))  # barrierless commits (a backfill, a compaction) after the tagged one
    d.append(kv((3, 3)))
    d.compact()
    clock.advance(1)
    report = d.cleanup(retention_seconds=0, force=True)
    assert report.pruned_commit_rows > 0
    assert [h.barrier for h in d.history()].count(1) == 1  # the tagged row is kept
    assert p.frontier("s.d") == 1
    coordinator.seal()
    nxt = p.next_batch("copy")
    assert nxt is not None and (nxt.lo, nxt.hi) == (2, 2)  # not barrier 1 again


def _ingest(catalog: Catalog, *names: str) -> tuple[Pipeline, Coordinator]:
    """Root tables ``s.<name>`` written by one job with external input, and a coordinator."""
    catalog.create_namespace("s")
    make_tables(catalog, *names)
    p = Pipeline(catalog)
    p.register_job("ingest", sinks=[f"s.{n}" for n in names], external_input=True)
    return p, Coordinator(catalog)


def test_snapshots_of_one_barrier_expiring_at_different_instants(clocked: Catalog, clock: ManualClock) -> None:
    """Snapshots taken by hand may give one barrier's snapshots different expiry instants: the
    barrier is a common SNAPSHOT only while every table has a live one, and repeatable_read reads
    its versions from the live ones only (to the instant; by name among a table's live ones)."""
    catalog = clocked
    p, coord = _ingest(catalog, "a", "b")
    a, b = catalog.load_table("s.a"), catalog.load_table("s.b")
    a.append(kv((1, 1)), barrier=OPEN_EPOCH)  # a v1, barrier 1
    a.append(kv())  # a v2: no rows, no barrier: barrier 1 too
    b.append(kv((1, 1)), barrier=OPEN_EPOCH)  # b v1
    coord.seal()
    a.append(kv((2, 2)), barrier=OPEN_EPOCH)  # a v3, barrier 2
    b.append(kv((2, 2)), barrier=OPEN_EPOCH)  # b v2
    coord.seal()
    assert [p.version_at("s.a", 1), p.version_at("s.a", 2), p.version_at("s.b", 1), p.version_at("s.b", 2)] == [
        2, 3, 1, 2]
    a.create_snapshot("x1", version=1, barrier=1, retain_seconds=10)  # the rows of barrier 1, as v2
    a.create_snapshot("x2", version=2, barrier=1)
    b.create_snapshot("y1", version=1, barrier=1)
    a.create_snapshot("z2", version=3, barrier=2)
    b.create_snapshot("w2", version=2, barrier=2, retain_seconds=10)
    clock.advance(9)
    assert p.snapshot_barrier(["s.a", "s.b"]) == 2
    with p.choose(["s.a", "s.b"], level="repeatable_read") as c:
        assert (c.barrier, c.versions) == (2, {"s.a": 3, "s.b": 2})
    clock.advance(1)  # x1 and w2 expire now: barrier 2 is s.a's alone, barrier 1 is read from x2
    assert p.snapshot_barrier(["s.a", "s.b"]) == 1
    with p.choose(["s.a", "s.b"], level="repeatable_read") as c:
        assert (c.barrier, c.versions) == (1, {"s.a": 2, "s.b": 1})
    coord.release()


def test_the_newest_snapshot_is_judged_on_the_catalog_clock(clocked: Catalog, clock: ManualClock) -> None:
    """NoSnapshotError names the table whose newest live snapshot is the oldest, and a rollback
    below a live snapshot's barrier is refused: both judge expiry on the catalog's clock, a
    snapshot gone at its expiry instant."""
    catalog = clocked
    p, coord = _ingest(catalog, "a", "b")
    a, b = catalog.load_table("s.a"), catalog.load_table("s.b")
    for k in (1, 2, 3):
        a.append(kv((k, k)), barrier=OPEN_EPOCH)
        b.append(kv((k, k)), barrier=OPEN_EPOCH)
        coord.seal()
    a.create_snapshot("a3", version=3, barrier=3, retain_seconds=10)
    b.create_snapshot("b1", version=1, barrier=1)
    clock.advance(5)
    with pytest.raises(NoSnapshotError) as no:
        p.choose(["s.a", "s.b"], level="repeatable_read")
    assert no.value.missing == "s.b"  # s.a's newest live snapshot is barrier 3, s.b's barrier 1
    with pytest.raises(RollbackRefusedError) as refused:
        p.rollback(to=2)
    assert (refused.value.snapshot_barrier, refused.value.table) == (3, "s.a")
    clock.advance(5)  # a3 expires now
    with pytest.raises(NoSnapshotError) as no:
        p.choose(["s.a", "s.b"], level="repeatable_read")
    assert no.value.missing == "s.a"  # none live any more
    done = p.rollback(to=2)
    assert sorted((t.table, t.to_version) for t in done.tables.values()) == [("s.a", 2), ("s.b", 2)]
    coord.release()


def test_version_at_refuses_barrier_zero_when_version_zeros_record_is_pruned(
        clocked: Catalog, clock: ManualClock) -> None:
    """m = 0 (no commit tagged <= e) and cleanup pruned version 0's record while a snapshot pins
    version 1's: refused (BarrierNotRetainedError), not answered from the records that remain."""
    catalog = clocked
    p, coord = _ingest(catalog, "a")
    a = catalog.load_table("s.a")
    coord.seal()  # barrier 1: no commit of s.a
    a.append(kv((1, 1)), barrier=OPEN_EPOCH)  # v1, v2: barrier 2
    a.append(kv((2, 2)), barrier=OPEN_EPOCH)
    coord.seal()
    assert (p.version_at("s.a", 1), p.version_at("s.a", 2)) == (0, 2)
    a.create_snapshot("keep", version=1)
    clock.advance(1)
    assert a.cleanup(retention_seconds=0, force=True).pruned_commit_rows == 1  # version 0's
    assert [h.version for h in a.history()] == [2, 1]
    with pytest.raises(BarrierNotRetainedError):
        p.version_at("s.a", 1)
    assert p.version_at("s.a", 2) == 2
    coord.release()


def test_version_at_in_an_older_era_refuses_when_the_next_record_is_pruned(
        clocked: Catalog, clock: ManualClock) -> None:
    """In an older era (the era loop), m's record pinned by a snapshot but m + 1's pruned: where
    barrier m's versions end is unknown, so it is refused (BarrierNotRetainedError), not guessed."""
    catalog = clocked
    p, coord = _ingest(catalog, "a")
    a = catalog.load_table("s.a")
    for k in (1, 2, 3):  # v1..v3: barriers 1..3
        a.append(kv((k, k)), barrier=OPEN_EPOCH)
        coord.seal()
    assert p.rollback(to=2).tables["s.a"].restore_version == 4  # tagged 2: barrier 1 is in the era before
    assert (p.version_at("s.a", 1), p.version_at("s.a", 2)) == (1, 4)
    a.create_snapshot("keep", version=1)
    clock.advance(1)
    a.cleanup(retention_seconds=0, force=True)
    assert [h.version for h in a.history()] == [4, 1]
    with pytest.raises(BarrierNotRetainedError):
        p.version_at("s.a", 1)
    assert p.version_at("s.a", 2) == 4
    coord.release()


def test_change_token_moves_with_what_a_plan_or_a_choice_reads(catalog: Catalog, pipeline: Pipeline,
                                                              coordinator: Coordinator) -> None:
    """Pipeline.change_token: equal while nothing changed; a new value after a commit to one of its
    tables, a seal, and a topology change; a commit to another table leaves it."""
    raw, agg, other = make_tables(catalog, "raw", "agg", "other")
    pipeline.register_job("ingest", sinks=[raw], external_input=True)
    pipeline.register_job("agg", sources=[raw], sinks=[agg])
    p, seen = pipeline, []

    def token() -> object:
        t = p.change_token([raw, agg])
        assert t == p.change_token([agg, raw])  # the same now, whatever the order asked in
        seen.append(t)
        return t

    first = token()
    catalog.load_table(other).append(kv((1, 1)))
    assert token() == first
    catalog.load_table(raw).append(kv((1, 1)), barrier=-1)
    after_commit = token()
    coordinator.seal()
    after_seal = token()
    p.register_job("agg", sources=[raw, other], sinks=[agg])
    after_topology = token()
    assert len({first, after_commit, after_seal, after_topology}) == 4
    plan = p.next_batch("agg")
    assert plan is not None and plan.hi == 1
    with p.batch(plan) as b:
        b.append(agg, kv((1, 3)))
    assert token() != after_topology
    with pytest.raises(errors.TableNotFoundError):
        p.change_token(["s.nope"])


def test_writes_signal_this_process(catalog: Catalog, pipeline: Pipeline, coordinator: Coordinator) -> None:
    """lakestep.catalog.signals: every write transaction this process commits (a commit, a seal,
    a registration) moves the sequence, and a waiter returns at once; reads do not move it."""
    import threading

    from lakestep.catalog import signals

    raw, = make_tables(catalog, "raw")
    before = signals.sequence()
    catalog.load_table(raw).to_arrow()
    pipeline.change_token([raw])
    assert signals.sequence() == before
    woke: list[int] = []
    waiter = threading.Thread(target=lambda: woke.append(signals.wait(before, 600)))
    waiter.start()
    catalog.load_table(raw).append(kv((1, 1)))
    waiter.join(600)
    assert woke and woke[0] > before
    for write in (coordinator.seal, lambda: pipeline.register_job("ingest", sinks=[raw], external_input=True)):
        at = signals.sequence()
        write()
        assert signals.wait(at, 600) > at


def test_seals_go_with_retention_but_never_one_still_needed(clocked: Catalog, clock: ManualClock) -> None:
    """Seal rows of barriers no snapshot retains any more are deleted, keeping the newest
    ``seal_history`` and, while Iceberg publishing is on, every one it has not completed yet."""
    from lakestep.iceberg import enable

    catalog = clocked
    catalog.create_namespace("s")
    p = Pipeline(catalog)
    a = root_and_copy(catalog, p)
    enable(catalog)  # publishing on, nothing published: no seal may go

    def run(coord: Coordinator, barriers: int) -> None:
        for i in range(barriers):
            a.append(kv((i, i)), barrier=OPEN_EPOCH)
            coord.seal()
            clock.advance(1)
            process(p, "copy", copy_of("s.a"), catalog)
            coord.snapshot()

    coord = Coordinator(catalog, snapshot_every=1, retain_count=2, seal_history=4)
    run(coord, 12)
    assert [s.barrier for s in p.seals()] == list(range(1, 13))
    with catalog.backend.write() as conn:  # as if the publisher had completed barrier 5
        conn.execute(sa.update(S.publisher).where(S.publisher.c.id == 1).values(complete_barrier=5))
    run(coord, 4)
    # barriers 1..5 are published (the rest waits for the publisher), 15..16 retained: 1..5 go
    assert [s.barrier for s in p.seals()] == list(range(6, 17))
    enable(catalog, False)
    run(coord, 4)
    assert sorted(s.name for s in a.snapshots()) == ["lakestep-barrier-19", "lakestep-barrier-20"]
    assert [s.barrier for s in p.seals()] == list(range(17, 21))  # the newest 4 (the retained ones among them)
    coord.release()
    wide = Coordinator(catalog, snapshot_every=1, retain_count=6, seal_history=2)
    run(wide, 3)  # snapshots of 19..23 retained: their seals stay, beyond the newest 2
    assert [s.barrier for s in p.seals()] == list(range(19, 24))
    wide.release()
    keep = Coordinator(catalog, snapshot_every=1, retain_count=None, seal_history=1)  # keeps every snapshot
    run(keep, 4)
    assert [s.barrier for s in p.seals()] == list(range(19, 28))  # so every seal too
    keep.release()
    with pytest.raises(errors.InvalidArgumentError):
        Coordinator(catalog, seal_history=0)
