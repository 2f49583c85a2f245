"""The operator's view in the library: Pipeline.status, lag_history, diagnose and pinned_storage."""

from __future__ import annotations

import pytest

from lakestep import Catalog, errors
from lakestep.barrier import OPEN_EPOCH, Pipeline, diagnose, lag_history, sealing
from lakestep.catalog.pins import pinned_storage
from lakestep.services import Coordinator

from .conftest import kv, make_tables, root_and_copy
from .test_states import copy_of, process


def late_joiner(catalog: Catalog, p: Pipeline, coord: Coordinator) -> None:
    """s.a (root) -> s.d (copy, processes barrier 1 only); barriers 1..3 sealed, barrier 1
    snapshotted; then s.l (copy of s.a) registers late: it joins at the committed barrier 1."""
    make_tables(catalog, "a", "d", "l")
    p.register_job("ingest", sinks=["s.a"], external_input=True)
    p.register_job("copy", sources=["s.a"], sinks=["s.d"])
    catalog.load_table("s.a").append(kv((1, 1)), barrier=OPEN_EPOCH)
    coord.seal()
    assert process(p, "copy", copy_of("s.a"), catalog) == 1
    assert coord.snapshot() == [1]
    catalog.load_table("s.a").append(kv((2, 2)), barrier=OPEN_EPOCH)
    coord.seal()
    coord.seal()
    assert p.register_job("late", sources=["s.a"], sinks=["s.l"]).joined_barrier == 1


def test_status_agrees_with_the_states_of_each_cell(catalog: Catalog, pipeline: Pipeline,
                                                     coordinator: Coordinator) -> None:
    late_joiner(catalog, pipeline, coordinator)
    st = pipeline.status(last=3)
    assert (st.open_epoch, st.sealed, st.committed, st.oldest_retained, list(st.barriers)) == (4, 3, 1, 1, [1, 2, 3])
    assert list(st.tables) == ["s.a", "s.d", "s.l"]  # roots first, then derived
    got = {n: (t.kind, t.job, t.frontier, t.behind, t.catching_up, t.version) for n, t in st.tables.items()}
    assert got == {"s.a": ("root", "ingest", 3, 0, False, 2), "s.d": ("derived", "copy", 1, 2, False, 1),
                   "s.l": ("derived", "late", 0, 3, True, 0)}
    seals = {s.barrier: s.sealed_at for s in pipeline.seals()}
    assert st.seals == seals
    assert st.tables["s.d"].lag_seconds == pytest.approx(st.now - seals[2])
    assert st.tables["s.l"].lag_seconds == pytest.approx(st.now - seals[1])
    assert st.tables["s.a"].lag_seconds == 0.0
    for name in st.tables:
        for b in range(1, 5):
            assert st.states(name, b) == {s.value for s in pipeline.states(name, b)}, (name, b)
    assert st.states("s.d", 1) == {"PRECOMMIT", "COMMIT", "SNAPSHOT"} and st.states("s.d", 2) == set()
    assert st.coordinator_alive and st.lease.holder == coordinator.holder
    assert list(pipeline.status(last=1).barriers) == [3]
    with pytest.raises(errors.InvalidArgumentError):
        pipeline.status(last=0)


def test_lag_history_replays_seals_and_commits(catalog: Catalog, pipeline: Pipeline,
                                               coordinator: Coordinator) -> None:
    a = root_and_copy(catalog, pipeline)
    a.append(kv((1, 1)), barrier=OPEN_EPOCH)
    coordinator.seal()
    coordinator.seal()
    process(pipeline, "copy", copy_of("s.a"), catalog)  # barrier 1 (s.a changes at 1: a batch of its own)
    coordinator.seal()
    seals = {s.barrier: s.sealed_at for s in pipeline.seals()}
    commit = catalog.load_table("s.d").history(limit=1)[0]
    assert commit.barrier == 1
    now = max(seals[3], commit.committed_at) + 5.0
    got = lag_history(catalog, "s.d", seconds=3600, now=now)
    events = sorted([(seals[1], "seal"), (seals[2], "seal"), (seals[3], "seal"), (commit.committed_at, "commit")],
                    key=lambda e: (e[0], e[1] != "seal"))
    assert [s.at for s in got] == [now - 3600] + [t for t, _ in events] + [now]
    fr = sealed = 0
    expected = [(0, 0.0, 0, 0)]
    for t, kind in events:
        if kind == "seal":
            sealed += 1
        else:
            fr = 1
        behind = sealed - min(fr, sealed)
        expected.append((behind, 0.0 if behind == 0 else t - seals[fr + 1], min(fr, sealed), sealed))
    expected.append((2, now - seals[2], 1, 3))
    assert [(s.barriers, s.seconds, s.frontier, s.sealed) for s in got] == [
        (b, pytest.approx(secs), f, se) for b, secs, f, se in expected]
    assert lag_history(catalog, "s.a", now=now) == []  # a root does not lag
    late = lag_history(catalog, "s.d", seconds=1.0, now=now)  # a window after every event
    assert [(s.barriers, s.frontier, s.sealed) for s in late] == [(2, 1, 3), (2, 1, 3)]
    assert late[-1].seconds == pytest.approx(now - seals[2])
    assert pipeline.lag_history("s.d", seconds=3600)[-1].barriers == 2


def findings(d) -> dict[tuple[str, str], tuple[str, str]]:  # type: ignore[no-untyped-def]
    return {(f.check, f.subject): (f.severity, f.message) for f in d.findings}


def test_diagnose(catalog: Catalog, pipeline: Pipeline, coordinator: Coordinator) -> None:
    late_joiner(catalog, pipeline, coordinator)
    d = diagnose(catalog, stuck_after=1e9, storage=False)
    f = findings(d)
    assert f[("coordinator", "coordinator")][0] == "ok"
    assert f[("job", "ingest")][0] == "ok"
    assert f[("job", "copy")][0] == "warning" and "input for 2 barrier(s) is ready" in f[("job", "copy")][1]
    late = [x for x in d.findings if x.subject == "late"]
    assert [(x.severity, x.facts["frontier"]) for x in late] == [("error", 0), ("info", 0), ("warning", 0)]
    assert "below the oldest retained barrier 1" in late[0].message
    assert "catching up since it registered at committed barrier 1" in late[1].message
    assert not d.healthy and d.worst() == "error"
    stuck = findings(diagnose(catalog, stuck_after=0, storage=False))
    assert stuck[("job", "copy")][0] == "error" and stuck[("job", "copy")][1].startswith("stuck: input for 2")

    # a lapsed version lock and a coordinator whose lease ran out without a release
    catalog.load_table("s.a").lock(locker="crashed-reader", lease_seconds=0.0)
    coordinator.release()
    assert sealing.acquire(catalog, "dead-coordinator", -1.0) is not None  # a lease that has already expired
    f = findings(diagnose(catalog, stuck_after=1e9, storage=False))
    assert f[("locks", "s.a")][0] == "info" and "'crashed-reader' on version 2 lapsed" in f[("locks", "s.a")][1]
    sev, msg = f[("coordinator", "coordinator")]
    assert sev == "error" and msg.startswith("the coordinator lease expired") and "'dead-coordinator'" in msg


def test_diagnose_storage_and_retention(catalog: Catalog) -> None:
    catalog.create_namespace("s")
    t = catalog.create_table("s.t", kv((0, 0)).schema, properties={"lakestep.retention-seconds": "0"})
    t.append(kv((1, 1)))
    t.create_snapshot("keep", version=1)
    t.overwrite(kv((2, 2)))
    t.overwrite(kv((3, 3)))
    d = diagnose(catalog)
    f = findings(d)
    assert f[("coordinator", "coordinator")][0] == "warning"  # no job: nothing needs sealing
    assert f[("pins", "s.t")][0] == "warning" and "snapshot 'keep' pins version 1" in f[("pins", "s.t")][1]
    assert f[("reclaimable", "s.t")][0] == "info"
    assert d.healthy
    t.cleanup()
    f = findings(diagnose(catalog))
    assert f[("retention", "s.t")] == ("info", "cleanup pruned the history below version 1: time travel to older "
                                               "versions is no longer possible")
    assert ("reclaimable", "s.t") not in f


def test_pinned_storage(catalog: Catalog) -> None:
    catalog.create_namespace("s")
    t = catalog.create_table("s.t", kv((0, 0)).schema, properties={"lakestep.retention-seconds": "0"})
    t.append(kv((1, 1)))  # v1: file A
    t.append(kv((2, 2)))  # v2: file B
    a, b = sorted(t.files(), key=lambda f: f.added_version)
    t.create_snapshot("one", version=1)
    lock = t.lock(locker="reader", version=2, lease_seconds=None)
    t.overwrite(kv((3, 3)))  # v3 removes A and B
    got = pinned_storage(t)
    assert got.floor_version == 3 and got.table == "s.t"
    assert [(p.kind, p.name, p.version, p.files, p.bytes) for p in got.pins] == [
        ("snapshot", "one", 1, 1, a.file_size), ("lock", "reader", 2, 2, a.file_size + b.file_size)]
    assert (got.total_files, got.total_bytes) == (2, a.file_size + b.file_size)  # A counted once
    assert t.cleanup(dry_run=True).deleted_files == []  # every expired file is pinned
    lock.release()
    got = pinned_storage(t)
    assert [(p.name, p.files) for p in got.pins] == [("one", 1)] and got.total_bytes == a.file_size
    assert t.cleanup(dry_run=True).deleted_files == [b.path]
    long = pinned_storage(t, retention_seconds=3600)  # inside the window nothing is expired
    assert long.floor_version == -1 and long.total_files == 0


def test_pinned_storage_names_every_pin_cleanup_keeps(catalog: Catalog) -> None:
    """A retained Iceberg snapshot lakestep published pins its version against cleanup
    (catalog/retention.py); the operator's view of pinned storage names it too."""
    import sqlalchemy as sa

    from lakestep.catalog import schema as S

    catalog.create_namespace("s")
    t = catalog.create_table("s.t", kv((0, 0)).schema, properties={"lakestep.retention-seconds": "0"})
    t.append(kv((1, 1)))  # v1: file A
    t.append(kv((2, 2)))  # v2: file B
    a, b = sorted(t.files(), key=lambda f: f.added_version)
    t.overwrite(kv((3, 3)))  # v3 removes A and B
    with catalog.backend.write() as conn:  # what the publisher records of a snapshot it published at v1
        conn.execute(sa.insert(S.published_snapshots).values(
            table_id=t.table_id, snapshot_id=77, version=1, barrier=None, created_at=0.0))
    kept = t.cleanup(dry_run=True)
    assert kept.pinned_versions == [1] and kept.deleted_files == [b.path]
    got = pinned_storage(t)
    assert [(p.kind, p.name, p.version, p.files, p.bytes) for p in got.pins] == [
        ("iceberg", "iceberg-77", 1, 1, a.file_size)]
    assert {p.version for p in got.pins} == set(kept.pinned_versions)
    assert (got.total_files, got.total_bytes) == (1, a.file_size)
    # the operator's diagnosis: the publisher's retention, not a forgotten pin
    pins = [x for x in diagnose(catalog).findings if x.check == "pins" and x.subject == "s.t"]
    assert [(x.severity, x.facts["iceberg_snapshots"], x.facts["files"]) for x in pins] == [("info", 1, 1)]
