"""Branches of the commit resolver (catalog/commit.py) that no other test ran (issue 16 §2).

Each test prepares a change in a :class:`Transaction` (its files are written and
its base version fixed), lets other commits land, then commits it: the same
window a concurrent writer has between prepare and commit. Exact expectations,
SQLite and PostgreSQL, on a :class:`ManualClock` (retention decided by moving it).
"""

from __future__ import annotations

import dataclasses

import pyarrow as pa
import pytest

from lakestep import Catalog, _failpoints, errors
from lakestep.catalog.commit import MAX_REBASES
from lakestep.clock import ManualClock
from lakestep.services import Coordinator

SCHEMA = pa.schema([("id", pa.int64()), ("day", pa.string())])


def rows(t) -> list[tuple[int, str]]:  # type: ignore[no-untyped-def]
    return sorted((r["id"], r["day"]) for r in t.to_arrow().to_pylist())


def table(cat: Catalog, *batches: tuple[int, str]):  # type: ignore[no-untyped-def]
    cat.create_namespace("s")
    t = cat.create_table("s.t", SCHEMA, partition_by=["day"])
    for i, day in batches:  # one file each
        t.append({"id": [i], "day": [day]})
    return t


def test_undoing_a_compaction_of_a_compaction(clocked: Catalog) -> None:
    """A delete read file 1; compaction C1 merged it (with file 2) into o1, and
    compaction C2 merged o1 (with a later file 4) into o2. The delete undoes both:
    o2 goes, files 2 and 4 are recorded again, and only row 1 is gone."""
    t = table(clocked, (1, "d1"), (2, "d1"), (3, "d2"))
    assert t.version == 3
    paths = {f.path for f in t.files()}
    tx = clocked.transaction()
    tx.delete(t, [("id", "=", 1)])  # reads file 1 only (the statistics rule out 2 and 3)
    c1 = t.compact()  # d1: files 1 and 2 -> o1
    assert (c1.version, c1.removed_files, c1.added_files) == (4, 2, 1)
    t.append({"id": [4], "day": ["d1"]})  # v5: file 4
    c2 = t.compact()  # d1: o1 and file 4 -> o2
    assert (c2.version, c2.removed_files, c2.added_files) == (6, 2, 1)
    [r] = tx.commit()
    assert (r.version, r.operation, r.base_version) == (7, "DELETE", 3)
    assert r.summary["undone_compactions"] == [4, 6]
    assert r.summary["restored_files"] == 2
    assert (r.removed_files, r.removed_rows) == (1, 3)  # o2 (rows 1, 2, 4); file 1 went with C1
    assert (r.added_files, r.added_rows) == (2, 2)  # files 2 and 4 again; no rows of file 1 remain
    assert rows(t) == [(2, "d1"), (3, "d2"), (4, "d1")]
    live = {f.path for f in t.files()}
    assert len(live) == 3 and len(live & paths) == 2  # files 2 and 3 by their own paths, and file 4


def test_compaction_output_rewritten_since_is_a_conflict(clocked: Catalog) -> None:
    """A delete read file 1; a compaction merged it into o1, and another delete then
    rewrote o1. The first delete cannot undo that by metadata: it conflicts with the
    second delete, and nothing of it lands."""
    t = table(clocked, (1, "d1"), (2, "d1"), (3, "d2"))
    tx = clocked.transaction()
    tx.delete(t, [("id", "=", 1)])
    assert t.compact().version == 4
    assert t.delete([("id", "=", 2)]).version == 5  # rewrites o1
    with pytest.raises(errors.CommitConflict) as ei:
        tx.commit()
    e = ei.value
    assert (e.table, e.operation, e.base_version, e.other_version, e.other_operation) == ("s.t", "DELETE", 3, 5,
                                                                                           "DELETE")
    assert e.reason.endswith("holding rows this DELETE read was removed")
    assert t.version == 5 and rows(t) == [(1, "d1"), (3, "d2")]


def test_serializable_check_skips_compaction_outputs(clocked: Catalog) -> None:
    """A serializable delete of ids <= 2 read files 1 and 2; a concurrent compaction
    merged them into one file that matches the predicate. That file holds rows
    that existed before, not new ones: the delete undoes the compaction and
    commits; a file appended concurrently that matches still conflicts."""
    t = table(clocked, (1, "d1"), (2, "d1"), (3, "d2"))
    tx = clocked.transaction()
    tx.delete(t, [("id", "<=", 2)], isolation="serializable")
    c = t.compact()
    assert (c.version, c.removed_files, c.added_files) == (4, 2, 1)
    [r] = tx.commit()
    assert (r.version, r.base_version) == (5, 3)
    assert r.summary["undone_compactions"] == [4] and r.summary["restored_files"] == 0
    assert (r.removed_files, r.removed_rows, r.added_files) == (1, 2, 0)
    assert rows(t) == [(3, "d2")]
    # the same window with a matching append instead: serializable refuses it
    tx = clocked.transaction()
    tx.delete(t, [("id", "<=", 3)], isolation="serializable")
    t.append({"id": [2], "day": ["d1"]})  # v6
    with pytest.raises(errors.CommitConflict) as ei:
        tx.commit()
    assert (ei.value.other_version, ei.value.other_operation, ei.value.base_version) == (6, "APPEND", 5)
    assert rows(t) == [(2, "d1"), (3, "d2")]


def test_table_dropped_between_prepare_and_commit(clocked: Catalog) -> None:
    t = table(clocked, (1, "d1"), (2, "d2"))
    other = clocked.create_table("s.u", SCHEMA)
    tx = clocked.transaction()
    tx.delete(t, [("id", "=", 1)])
    tx.append(other, {"id": [9], "day": ["d9"]})
    clocked.drop_table("s.t")
    with pytest.raises(errors.TableNotFoundError) as ei:
        tx.commit()
    assert ei.value.table == "s.t"
    assert other.version == 0 and other.to_arrow().num_rows == 0  # nothing of the transaction landed
    assert clocked.list_tables("s") == ["s.u"]


def test_restore_of_files_removed_past_the_retention_window(clocked: Catalog, clock: ManualClock) -> None:
    """RESTORE to version 2 after a concurrent delete removed file 1 (version 3):
    within the retention window the file is recorded again; past it the restore
    conflicts with that delete, unless a snapshot pins a version holding the file."""
    t = table(clocked, (1, "d1"), (2, "d2"))
    t.delete([("id", "=", 1)])  # v3
    retention = t.retention_seconds
    clock.advance(retention + 1)
    with pytest.raises(errors.CommitConflict) as ei:
        t.restore(2)
    assert (ei.value.other_version, ei.value.other_operation, ei.value.operation) == (3, "DELETE", "RESTORE")
    assert "past the retention window" in ei.value.reason
    assert t.version == 3 and rows(t) == [(2, "d2")]
    t.create_snapshot("keep", version=1)  # pins version 1, where file 1 was live
    r = t.restore(2)
    assert (r.version, r.operation, r.added_files, r.removed_files) == (4, "RESTORE", 1, 0)
    assert r.summary["restored_files"] == 1 and r.summary["restored_to"] == 2
    assert rows(t) == [(1, "d1"), (2, "d2")]


def test_a_compaction_exactly_retention_old_is_not_undone(clocked: Catalog, clock: ManualClock) -> None:
    """The retention window's edge, to the instant: a compaction exactly ``R`` old is the
    version current at ``now - R``, so cleanup may delete its inputs' bytes now (cleanup.py:
    files removed at or before that version expire). A delete that read one of those
    inputs must then fail, not record file 2 again (its bytes may be gone)."""
    t = table(clocked, (1, "d1"), (2, "d1"), (3, "d2"))
    tx = clocked.transaction()
    tx.delete(t, [("id", "=", 1)])  # reads file 1
    clock.advance(1)
    c = t.compact()  # d1: files 1 and 2 -> o1, at START + 1
    assert (c.version, c.committed_at) == (4, ManualClock.START + 1)
    clock.advance(t.retention_seconds)  # now - R is the compaction's own time
    inputs = sorted(f.path for f in t.files(version=3) if f.partition["day"] == "d1")
    assert sorted(t.cleanup(dry_run=True).deleted_files) == inputs  # cleanup may delete files 1 and 2 now
    with pytest.raises(errors.CommitConflict) as ei:
        tx.commit()
    assert (ei.value.other_version, ei.value.other_operation) == (4, "COMPACT")
    assert "retention window" in ei.value.reason
    assert t.version == 4 and rows(t) == [(1, "d1"), (2, "d1"), (3, "d2")]  # o1 holds them

    # the matrix rule itself (resolver.Rule.UNDO_COMPACTION), at the same edge, when nothing would
    # be recorded again: a delete that read both inputs of a compaction exactly R old fails too
    t.append({"id": [4], "day": ["d1"]})  # v5: file 4
    tx = clocked.transaction()
    tx.delete(t, [("day", "=", "d1")])  # reads o1 and file 4
    clock.advance(1)
    assert t.compact().version == 6  # o1 and file 4 -> o2
    clock.advance(t.retention_seconds)
    with pytest.raises(errors.CommitConflict) as ei:
        tx.commit()
    assert (ei.value.other_version, ei.value.other_operation) == (6, "COMPACT")
    assert t.version == 6 and rows(t) == [(1, "d1"), (2, "d1"), (3, "d2"), (4, "d1")]


def test_a_file_removed_exactly_retention_ago_is_not_restored(clocked: Catalog, clock: ManualClock) -> None:
    """RESTORE at the retention window's edge: the delete that removed file 1 is exactly
    ``R`` old, cleanup may have deleted the file's bytes, so the restore conflicts (a snapshot
    pinning a version that holds the file would keep it, as past the window)."""
    t = table(clocked, (1, "d1"), (2, "d2"))
    file1 = [f.path for f in t.files() if f.partition["day"] == "d1"]
    clock.advance(1)
    assert t.delete([("id", "=", 1)]).version == 3  # at START + 1
    clock.advance(t.retention_seconds)
    assert t.cleanup(dry_run=True).deleted_files == file1  # cleanup may delete file 1 now
    with pytest.raises(errors.CommitConflict) as ei:
        t.restore(2)
    assert (ei.value.other_version, ei.value.other_operation) == (3, "DELETE")
    assert "past the retention window" in ei.value.reason
    # pins that do not keep file 1 from cleanup do not help either: snapshots of a version before
    # it was added and of the version that removed it, and one that expires at this very instant
    t.create_snapshot("before-it", version=0)
    t.create_snapshot("at-the-delete", version=3)
    t.create_snapshot("brief", version=1, retain_seconds=10)
    clock.advance(10)
    assert t.cleanup(dry_run=True).deleted_files == file1
    with pytest.raises(errors.CommitConflict):
        t.restore(2)
    assert t.version == 3 and rows(t) == [(2, "d2")]
    t.create_snapshot("keep", version=1, retain_seconds=60)  # a pin in force where file 1 was live
    assert t.cleanup(dry_run=True).deleted_files == []
    r = t.restore(2)
    assert (r.version, r.added_files, r.removed_files) == (4, 1, 0) and rows(t) == [(1, "d1"), (2, "d2")]
    # restoring the newest version is a commit that changes nothing
    dv = t.data_version
    r = t.restore(4)
    assert (r.version, r.operation, r.data_version, r.added_files, r.removed_files) == (5, "RESTORE", dv, 0, 0)
    assert rows(t) == [(1, "d1"), (2, "d2")]


def test_a_replay_is_recognised_before_anything_else(clocked: Catalog) -> None:
    """Step 2b comes first: a transaction whose key is already recorded returns the first
    result, exactly (marked replayed), even when the table changed since in a way that would
    fail a new commit (here a column added after the replay was prepared)."""
    t = table(clocked, (1, "d1"), (2, "d2"))
    again = clocked.transaction(job_id="j", batch_id=1)
    again.delete(t, [("id", "=", 1)])  # prepared against the old schema
    with clocked.transaction(job_id="j", batch_id=1) as first:
        first.delete(t, [("id", "=", 1)])
    [r] = first.results
    t.add_columns(("note", pa.string()))
    head = t.version
    [replay] = again.commit()
    assert again.replayed and replay == dataclasses.replace(r, replayed=True)
    assert t.version == head and rows(t) == [(2, "d2")]


def test_an_overwrite_rebases_at_most_max_rebases_times(clocked: Catalog) -> None:
    """An OVERWRITE of ``5 <= id < 100`` while, before each of its attempts, a concurrent
    append lands a file straddling the range's edge: it rewrites those files and tries again,
    MAX_REBASES times exactly, then gives up with a CommitConflict; nothing of it lands."""
    t = table(clocked, (1, "d1"))
    tx = clocked.transaction()
    tx.overwrite(t, {"id": [7], "day": ["d1"]}, where=[("id", ">=", 5), ("id", "<", 100)])
    t.append({"id": [9, 2000], "day": ["d1", "d1"]})  # straddles: the first attempt must rebase
    rebased: list[int] = []

    def another_straddler(_name: str) -> None:
        rebased.append(t.version)
        if len(rebased) <= MAX_REBASES + 1:  # one more than allowed; then let it commit
            t.append({"id": [10 + len(rebased), 3000], "day": ["d1", "d1"]})

    _failpoints.arm("commit.rebased", another_straddler)
    try:
        with pytest.raises(errors.CommitConflict) as ei:
            tx.commit()
    finally:
        _failpoints.disarm("commit.rebased")
    assert len(rebased) == MAX_REBASES
    assert "kept changing the overwritten range" in ei.value.reason
    assert t.version == 2 + MAX_REBASES  # the appends only
    assert rows(t) == sorted([(1, "d1"), (9, "d1"), (2000, "d1")]
                             + [(10 + n, "d1") for n in range(1, MAX_REBASES + 1)] + [(3000, "d1")] * MAX_REBASES)


def test_an_append_prepared_before_a_column_was_added_still_lands(clocked: Catalog) -> None:
    """Only writes that rewrite files read with the old schema conflict with a schema change;
    a blind append from before it lands (its rows read the new column as null), also when
    the transaction carries a rewrite of another table (the general commit path)."""
    t = table(clocked, (1, "d1"))
    u = clocked.create_table("s.u", SCHEMA)
    u.append({"id": [5], "day": ["d5"]})
    tx = clocked.transaction()
    tx.append(t, {"id": [2], "day": ["d2"]})
    tx.delete(u, [("id", "=", 5)])
    t.add_columns(("note", pa.string()))
    [rt, ru] = tx.commit()
    assert (rt.operation, ru.operation) == ("APPEND", "DELETE")
    assert sorted(tuple(r.values()) for r in t.to_arrow().to_pylist()) == [(1, "d1", None), (2, "d2", None)]
    assert u.to_arrow().num_rows == 0


def test_an_overwrite_drops_its_rewrite_of_a_file_replaced_meanwhile(clocked: Catalog) -> None:
    """An OVERWRITE of ``5 <= id < 100`` rewrote file F (ids 9 and 2000, straddling the edge)
    to keep 2000; before it commits, a delete of 2000 replaced F by F' (id 9). The rewrite is
    stale and dropped (2000 stays deleted); F', inside the range, is replaced."""
    t = table(clocked, (1, "d1"))
    t.append({"id": [9, 2000], "day": ["d1", "d1"]})  # F
    tx = clocked.transaction()
    tx.overwrite(t, {"id": [7], "day": ["d1"]}, where=[("id", ">=", 5), ("id", "<", 100)])
    assert t.delete([("id", "=", 2000)]).version == 3  # F -> F'
    [r] = tx.commit()
    assert (r.version, r.base_version, r.removed_files, r.added_files) == (4, 2, 1, 1)  # F' out, [7] in
    assert r.summary["stale_rewrites"] == 1
    assert rows(t) == [(1, "d1"), (7, "d1")]


def test_serializable_judges_only_files_added_after_the_base(clocked: Catalog) -> None:
    """Serializable isolation conflicts with rows that landed after the version L read, never
    with the files L read itself: a serializable delete of id 2 (the file added by its base
    version) commits beside a concurrent append that cannot hold id 2."""
    t = table(clocked, (1, "d1"), (2, "d2"))  # id 2: the file added by version 2
    tx = clocked.transaction()
    tx.delete(t, [("id", "=", 2)], isolation="serializable")
    assert t.append({"id": [50], "day": ["d5"]}).version == 3
    [r] = tx.commit()
    assert (r.version, r.base_version, r.removed_files) == (4, 2, 1)
    assert rows(t) == [(1, "d1"), (50, "d5")]


def test_open_epoch_is_read_inside_the_commit_on_the_general_path(clocked: Catalog) -> None:
    """``barrier=OPEN_EPOCH`` on a rewrite (not a blind append) records the epoch open when the
    commit runs, alone or beside changes of other tables; a change with an explicit barrier
    or none keeps it."""
    from lakestep.barrier import OPEN_EPOCH

    t = table(clocked, (1, "d1"), (2, "d2"))
    u = clocked.create_table("s.u", SCHEMA)
    w = clocked.create_table("s.w", SCHEMA)
    for x in (u, w):
        x.append({"id": [5, 6], "day": ["d5", "d6"]})
    coord = Coordinator(clocked)
    coord.seal()
    coord.seal()  # epoch 3 is open
    assert t.overwrite({"id": [3], "day": ["d1"]}, partitions=[{"day": "d1"}], barrier=OPEN_EPOCH).barrier == 3
    tx = clocked.transaction()
    tx.delete(t, [("id", "=", 2)], barrier=OPEN_EPOCH)
    tx.delete(u, [("id", "=", 5)])
    tx.delete(w, [("id", "=", 6)], barrier=1)
    assert [(r.table, r.operation, r.barrier) for r in tx.commit()] == [
        ("s.t", "DELETE", 3), ("s.u", "DELETE", None), ("s.w", "DELETE", 1)]
    assert [h.barrier for h in t.history()][:2] == [3, 3]
    coord.release()


def test_a_rewrite_that_only_adds_files_changes_the_data_version(clocked: Catalog) -> None:
    """The data version moves with every commit that adds or removes rows, also when it
    removes no file: an overwrite of a partition that held none, a restore that only
    records files again. A commit that changes neither keeps it."""
    t = table(clocked, (1, "d1"))
    assert (t.version, t.data_version) == (1, 1)
    r = t.overwrite({"id": [9], "day": ["d9"]}, partitions=[{"day": "d9"}])  # nothing of d9 to remove
    assert (r.version, r.data_version, r.removed_files, r.added_files) == (2, 2, 0, 1)
    r = t.delete([("day", "=", "d9")])
    assert (r.version, r.data_version, r.removed_files, r.added_files) == (3, 3, 1, 0)
    r = t.restore(2)  # records d9's file again, removes nothing
    assert (r.version, r.data_version, r.removed_files, r.added_files) == (4, 4, 0, 1)
    r = t.overwrite({"id": [], "day": []}, partitions=[{"day": "d7"}])  # empties an empty range
    assert (r.version, r.data_version, r.removed_files, r.added_files) == (5, 4, 0, 0)
    assert rows(t) == [(1, "d1"), (9, "d9")]


def test_a_whole_table_overwrite_counts_only_its_own_files(clocked: Catalog) -> None:
    """An overwrite of the whole table removes every file live at commit time, of that table
    only, and its result and commit record count exactly those files and rows."""
    t = table(clocked, (1, "d1"), (2, "d2"))
    u = clocked.create_table("s.u", SCHEMA)
    for i in range(3):
        u.append({"id": [10 * i, 10 * i + 1], "day": ["d1", "d1"]})
    r = t.overwrite({"id": [7], "day": ["d7"]})
    assert (r.version, r.removed_files, r.removed_rows, r.added_files, r.added_rows) == (3, 2, 2, 1, 1)
    [h] = [h for h in t.history() if h.version == 3]
    assert (h.removed_files, h.removed_rows) == (2, 2)
    assert rows(t) == [(7, "d7")] and u.to_arrow().num_rows == 6


def test_a_single_append_with_a_guard_or_an_after_hook_runs_them(clocked: Catalog) -> None:
    """One append is committed blind (the fast path) only when there is neither a guard nor
    an after hook: with a guard, the guard runs first in the commit's transaction and its
    answer decides (results: nothing committed); with a hook, the hook runs with the results."""
    t = table(clocked, (1, "d1"))
    seen: list[object] = []

    def guard(_conn) -> None:  # type: ignore[no-untyped-def]
        seen.append("guard")

    def stop(_conn) -> list:  # type: ignore[no-untyped-def,type-arg]
        seen.append("stop")
        return []

    def after(_conn, results) -> None:  # type: ignore[no-untyped-def]
        seen.append(("after", [r.version for r in results]))

    for kw, want in (({"guard": guard}, 2), ({"after": after}, 3)):
        tx = clocked.transaction(**kw)  # type: ignore[arg-type]
        tx.append(t, {"id": [want], "day": ["d1"]})
        assert [r.version for r in tx.commit()] == [want] and not tx.replayed
    tx = clocked.transaction(guard=stop)
    tx.append(t, {"id": [99], "day": ["d1"]})
    assert tx.commit() == [] and tx.replayed
    assert seen == ["guard", ("after", [3]), "stop"]
    assert t.version == 3 and rows(t) == [(1, "d1"), (2, "d1"), (3, "d1")]


def test_a_keyed_append_to_a_dropped_table_is_not_a_replay(clocked: Catalog) -> None:
    """A keyed blind append to a table dropped since it was loaded raises TableNotFoundError,
    whether its job never committed or the key is above the job's newest batch (on PostgreSQL
    the one-statement append cannot tell a missing head from a replay: the replay lookup tells)."""
    t = table(clocked, (1, "d1"))
    u = clocked.create_table("s.u", SCHEMA)
    u.append({"id": [5], "day": ["d5"]}, job_id="j", batch_id=3)
    clocked.drop_table("s.t")
    for job, batch in (("new", 0), ("j", 4)):
        with pytest.raises(errors.TableNotFoundError) as ei:
            t.append({"id": [2], "day": ["d2"]}, job_id=job, batch_id=batch)
        assert ei.value.table == "s.t"
    assert u.version == 1 and clocked.list_tables("s") == ["s.u"]
