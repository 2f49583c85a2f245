"""RESTORE commits, and rollback of the topology to a barrier."""

from __future__ import annotations

import pytest

from lakestep import Catalog, CommitConflict
from lakestep.barrier import OPEN_EPOCH, Pipeline, RollbackRefusedError, StaleBatchError
from lakestep.services import Coordinator

from .conftest import KV, kv, root_and_copy, rows
from .test_states import copy_of, process


def test_restore_is_a_new_commit(catalog: Catalog) -> None:
    catalog.create_namespace("s")
    t = catalog.create_table("s.t", KV)
    t.append(kv((1, 1)))
    t.append(kv((2, 2)))
    t.append(kv((3, 3)))
    t.compact()  # version 4: one file
    t.delete([("k", "=", 3)])  # version 5
    r = t.restore(2)
    assert (r.operation, r.version, r.base_version) == ("RESTORE", 6, 2)
    assert r.summary["restored_files"] == 2  # the files of 1 and 2, removed by the compaction
    assert rows(t.to_arrow()) == rows(t.to_arrow(version=2)) == [(1, 1), (2, 2)]
    assert rows(t.to_arrow(version=5)) == [(1, 1), (2, 2)] and rows(t.to_arrow(version=4)) == [(1, 1), (2, 2), (3, 3)]
    assert [h.operation for h in t.history()][:2] == ["RESTORE", "DELETE"]  # history kept
    t.restore(0, barrier=7)
    assert t.to_arrow().num_rows == 0 and t.history(limit=1)[0].barrier == 7
    with catalog.transaction() as tx:  # with other writes, atomically
        tx.restore(t, 4)
    assert rows(t.to_arrow()) == [(1, 1), (2, 2), (3, 3)]
    from lakestep.errors import VersionNotFoundError

    with pytest.raises(VersionNotFoundError):
        t.restore(99)


def test_restore_past_retention_needs_a_pin(catalog: Catalog) -> None:
    catalog.create_namespace("s")
    t = catalog.create_table("s.t", KV, properties={"lakestep.retention-seconds": "0"})
    t.append(kv((1, 1)))
    t.overwrite(kv((2, 2)))
    with pytest.raises(CommitConflict, match="retention"):
        t.restore(1)  # its file may be gone
    t.create_snapshot("keep", version=1)
    t.restore(1)
    assert rows(t.to_arrow()) == [(1, 1)]


def pipeline_at(catalog: Catalog, p: Pipeline, coord: Coordinator) -> None:
    """a (root) -> d (copy of a); barriers 1..3 sealed, d processed 1..2, snapshot of 1."""
    a = root_and_copy(catalog, p)
    for i in (1, 2, 3):
        a.append(kv((i, i)), barrier=OPEN_EPOCH)
        coord.seal()
        if i < 3:
            process(p, "copy", copy_of("s.a"), catalog)
        if i == 1:
            assert coord.snapshot() == [1]
    a.append(kv((4, 4)), barrier=OPEN_EPOCH)  # in the open epoch 4


def test_rollback(catalog: Catalog, pipeline: Pipeline, coordinator: Coordinator) -> None:
    p = pipeline
    pipeline_at(catalog, p, coordinator)
    a, d = catalog.load_table("s.a"), catalog.load_table("s.d")
    stale = p.next_batch("copy")  # barrier 3, planned before the rollback
    assert stale is not None and stale.lo == 3
    with pytest.raises(RollbackRefusedError) as ei:
        p.rollback(to=0)
    assert (ei.value.to_barrier, ei.value.snapshot_barrier) == (0, 1)
    heads = (a.version, d.version)
    res = p.rollback(to=1)
    assert res.to_barrier == 1 and res.open_epoch == 4 and set(res.tables) == {"s.a", "s.d"}
    assert res.tables["s.a"].from_version == heads[0]
    assert rows(a.to_arrow()) == rows(d.to_arrow()) == [(1, 1)]
    assert rows(a.to_arrow(version=heads[0])) == [(1, 1), (2, 2), (3, 3), (4, 4)]  # history kept
    for e in (1, 2, 3):  # barriers above 1 now read as 1, everywhere
        assert rows(a.to_arrow(version=p.version_at("s.a", e))) == [(1, 1)]
    assert p.frontier("s.d") == 1 and p.frontier("s.a") == 3
    with pytest.raises(StaleBatchError, match="its frontier is 1, the batch starts at 3"):
        with p.batch(stale) as b:
            b.overwrite("s.d", kv((9, 9)))
    plan = p.next_batch("copy")
    assert plan is not None and (plan.lo, plan.hi) == (2, 3)  # the rolled-back barriers are empty now
    process(p, "copy", copy_of("s.a"), catalog)
    a.append(kv((5, 5)), barrier=OPEN_EPOCH)  # root jobs go on in the open epoch
    coordinator.seal()
    process(p, "copy", copy_of("s.a"), catalog)
    c = p.choose(["s.a", "s.d"])
    assert c.barrier == 4 and rows(c.read("s.a")) == rows(c.read("s.d")) == [(1, 1), (5, 5)]
    assert p.rollback(to=4).tables == {}  # nothing above 4: no commit at all


def test_rollback_of_a_lagging_table_and_snapshot_progress(catalog: Catalog, pipeline: Pipeline,
                                                          coordinator: Coordinator) -> None:
    p = pipeline
    pipeline_at(catalog, p, coordinator)
    stale = p.next_batch("copy")
    assert stale is not None and stale.lo == 3
    res = p.rollback(to=2)  # d is at 2 already: only a is restored
    assert set(res.tables) == {"s.a"}
    with pytest.raises(StaleBatchError, match="changed since it was planned"):
        with p.batch(stale) as b:
            b.overwrite("s.d", kv((9, 9)))
    assert rows(catalog.load_table("s.d").to_arrow()) == [(1, 1), (2, 2)]
    process(p, "copy", copy_of("s.a"), catalog)
    assert p.committed_barrier() == 3
    assert coordinator.snapshot() == [2, 3]
    assert p.choose(["s.a", "s.d"], level="repeatable_read").barrier == 3


def test_version_at_in_older_eras_after_two_rollbacks(catalog: Catalog, pipeline: Pipeline) -> None:
    """Barriers older than the last restore are found by the era loop (progress.py: the newest era,
    then the restore itself, then the era before): every barrier reads exactly its rows."""
    p = pipeline
    a = root_and_copy(catalog, p, copy=False)
    coord = Coordinator(catalog)
    for k in (1, 2, 3, 4):  # barrier k holds rows 1..k
        a.append(kv((k, k)), barrier=OPEN_EPOCH)
        coord.seal()
    p.rollback(to=3)  # era 2 starts: barrier 4's row is gone
    a.append(kv((5, 5)), barrier=OPEN_EPOCH)  # barrier 5
    coord.seal()
    p.rollback(to=2)  # era 3 starts
    a.append(kv((6, 6)), barrier=OPEN_EPOCH)  # barrier 6
    coord.seal()
    want = {0: [], 1: [(1, 1)], 2: [(1, 1), (2, 2)], 3: [(1, 1), (2, 2)], 4: [(1, 1), (2, 2)],
            5: [(1, 1), (2, 2)], 6: [(1, 1), (2, 2), (6, 6)]}
    got = {e: rows(a.to_arrow(version=p.version_at("s.a", e))) for e in want}
    assert got == want
    # the first era as it was before any rollback: untouched history, by version
    assert rows(a.to_arrow(version=4)) == [(1, 1), (2, 2), (3, 3), (4, 4)]
    coord.release()


def test_a_rolled_back_derived_table_stands_at_the_rollback_barrier(catalog: Catalog, pipeline: Pipeline) -> None:
    """After a rollback to r, a derived table whose job has not run since has its RESTORE (tagged r)
    as its newest barriered commit: its frontier is r, and a consistent read answers r, in the
    one-statement choice and in the general path alike (a fresh pipeline, no cached topology)."""
    p = pipeline
    a = root_and_copy(catalog, p)
    coord = Coordinator(catalog)
    for k in (1, 2, 3, 4):
        a.append(kv((k, k)), barrier=OPEN_EPOCH)
        coord.seal()
        process(p, "copy", copy_of("s.a"), catalog)
    p.rollback(to=2)
    assert p.frontier("s.d") == 2
    for pipe in (p, Pipeline(catalog)):
        c = pipe.choose(["s.a", "s.d"])
        assert c.barrier == 2
        assert rows(catalog.load_table("s.d").to_arrow(version=c.versions["s.d"])) == [(1, 1), (2, 2)]
        assert pipe.choose(["s.a", "s.d"], scope="global").barrier == 2
    coord.release()


def test_version_at_an_older_restores_own_barrier(catalog: Catalog, pipeline: Pipeline) -> None:
    """A barrier equal to an older RESTORE's tag, while the newest era starts above it: the
    era loop answers that RESTORE itself (the newest commit tagged <= e), not the version it
    restored from the era before (the same rows, but a version cleanup may prune first)."""
    p = pipeline
    a = root_and_copy(catalog, p, copy=False)
    coord = Coordinator(catalog)
    for k in (1, 2, 3, 4):
        a.append(kv((k, k)), barrier=OPEN_EPOCH)
        coord.seal()
    first = p.rollback(to=3).tables["s.a"].restore_version  # tagged 3
    a.append(kv((5, 5)), barrier=OPEN_EPOCH)  # epoch 5
    coord.seal()
    second = p.rollback(to=4).tables["s.a"].restore_version  # tagged 4: the newest era starts above 3
    assert p.version_at("s.a", 3) == first
    assert p.version_at("s.a", 4) == second
    assert p.version_at("s.a", 2) == 2
    assert rows(a.to_arrow(version=p.version_at("s.a", 3))) == [(1, 1), (2, 2), (3, 3)]
    coord.release()


def test_version_at_in_an_older_era_includes_the_commits_that_change_no_rows(catalog: Catalog,
                                                                              pipeline: Pipeline) -> None:
    """Rule 2 of the version rule holds in older eras too (the era loop, states._version_at_slow):
    a commit after m that changes no rows belongs to m's barrier; the next data change does not."""
    p = pipeline
    a = root_and_copy(catalog, p, copy=False)
    coord = Coordinator(catalog)
    a.append(kv((1, 1)), barrier=OPEN_EPOCH)  # v1: barrier 1
    a.append(kv())  # v2: no rows, no barrier
    coord.seal()
    for k in (2, 3):  # v3, v4: barriers 2 and 3
        a.append(kv((k, k)), barrier=OPEN_EPOCH)
        coord.seal()
    restore = p.rollback(to=2).tables["s.a"].restore_version  # v5, tagged 2: barrier 1 is in the era before
    assert restore == 5
    assert p.version_at("s.a", 1) == 2 and rows(a.to_arrow(version=2)) == [(1, 1)]
    assert p.version_at("s.a", 2) == 5 and rows(a.to_arrow(version=5)) == [(1, 1), (2, 2)]
    coord.release()


def test_a_derived_table_restored_without_a_barrier_keeps_its_frontier(catalog: Catalog, pipeline: Pipeline) -> None:
    """A plain RESTORE (no barrier; here to the table's own newest version, so no row changes)
    starts an era with no barrier tag: the derived table's frontier is still the newest barrier
    its commits carry, from the era before (facts.facts_ex), and its job goes on from there."""
    p = pipeline
    a, d = root_and_copy(catalog, p), catalog.load_table("s.d")
    coord = Coordinator(catalog)
    for k in (1, 2):
        a.append(kv((k, k)), barrier=OPEN_EPOCH)
        coord.seal()
        process(p, "copy", copy_of("s.a"), catalog)
    assert d.restore(d.version).barrier is None
    for pipe in (p, Pipeline(catalog)):
        assert pipe.frontier("s.d") == 2
        c = pipe.choose(["s.a", "s.d"])
        assert c.barrier == 2 and rows(c.read("s.a")) == rows(c.read("s.d")) == [(1, 1), (2, 2)]
    coord.seal()
    plan = p.next_batch("copy")
    assert plan is not None and (plan.lo, plan.hi) == (3, 3)
    coord.release()
