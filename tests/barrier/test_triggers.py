"""Trigger agreement between the sources of a streaming job, across runs (barrier/triggers.py).

No Spark: the sources of two runs are played by calls with their run marks.
The Spark version of these cases is tests/streaming/test_restarts.py.
"""

from __future__ import annotations

import sqlalchemy as sa

from lakestep import Catalog
from lakestep.barrier import triggers
from lakestep.catalog import migrations as M
from lakestep.catalog import schema as S
from lakestep.catalog.backend import create_backend


def nothing_new(start: int):  # type: ignore[no-untyped-def]
    return lambda: start


def test_sources_of_one_run_follow_the_first_decision(catalog: Catalog) -> None:
    mark = triggers.run_mark(catalog, "j")
    assert mark == 0
    assert triggers.decide(catalog, "j", 0, 0, lambda: 1, mark=mark) == 1
    # the second source saw barrier 2 ready too, but follows the decision of this trigger
    assert triggers.decide(catalog, "j", 0, 0, lambda: 2, mark=mark) == 1
    assert triggers.batch_end(catalog, "j", 0) == 1


def test_restart_after_more_calls_than_the_new_run_made(catalog: Catalog) -> None:
    """The first run asked 5 times at barrier 0 while an upstream lagged ("nothing
    new" each time); the restarted run decides at its first call. Its batch must
    be committed with its own decision, not the first run's last "nothing new"."""
    old = triggers.run_mark(catalog, "j")
    for n in range(5):
        assert triggers.decide(catalog, "j", 0, n, nothing_new(0), mark=old) == 0
    assert triggers.batch_end(catalog, "j", 0) is None  # nothing to commit yet

    new = triggers.run_mark(catalog, "j")
    assert new > old
    assert triggers.decide(catalog, "j", 0, 0, lambda: 1, mark=new) == 1  # replaces the old call 0
    assert triggers.decide(catalog, "j", 0, 0, lambda: 3, mark=new) == 1  # the other source follows
    assert triggers.batch_end(catalog, "j", 0) == 1


def test_a_restart_never_follows_an_old_nothing_new(catalog: Catalog) -> None:
    """availableNow: an old run's "nothing new" at the same (start, call) is replaced."""
    old = triggers.run_mark(catalog, "j")
    assert triggers.decide(catalog, "j", 0, 0, nothing_new(0), mark=old) == 0
    new = triggers.run_mark(catalog, "j")
    assert triggers.decide(catalog, "j", 0, 0, lambda: 2, mark=new) == 2
    assert triggers.batch_end(catalog, "j", 0) == 2


def test_a_replayed_batch_keeps_the_decision_it_was_planned_from(catalog: Catalog) -> None:
    """Spark replays a batch from its offset log after a restart, without asking the
    sources again: the sink finds the earlier run's decision."""
    old = triggers.run_mark(catalog, "j")
    for n in range(3):
        triggers.decide(catalog, "j", 4, n, nothing_new(4), mark=old)
    assert triggers.decide(catalog, "j", 4, 3, lambda: 6, mark=old) == 6
    triggers.run_mark(catalog, "j")  # the new run's sources are created; they make no call yet
    assert triggers.batch_end(catalog, "j", 4) == 6


def test_a_newer_run_wins_whatever_the_call_numbers(catalog: Catalog) -> None:
    """Run 1 decided barrier 2 at call 3 (and died before Spark logged the batch);
    run 2, with maxBarriersPerTrigger=1, decided barrier 1 at call 0."""
    r1 = triggers.run_mark(catalog, "j")
    for n in range(3):
        triggers.decide(catalog, "j", 0, n, nothing_new(0), mark=r1)
    assert triggers.decide(catalog, "j", 0, 3, lambda: 2, mark=r1) == 2
    r2 = triggers.run_mark(catalog, "j")
    assert triggers.decide(catalog, "j", 0, 0, lambda: 1, mark=r2) == 1
    assert triggers.batch_end(catalog, "j", 0) == 1


def test_jobs_do_not_share_decisions(catalog: Catalog) -> None:
    triggers.decide(catalog, "a", 0, 0, lambda: 1, mark=triggers.run_mark(catalog, "a"))
    mark_b = triggers.run_mark(catalog, "b")
    assert mark_b == 0
    assert triggers.decide(catalog, "b", 0, 0, nothing_new(0), mark=mark_b) == 0
    assert triggers.batch_end(catalog, "b", 0) is None and triggers.batch_end(catalog, "a", 0) == 1


def test_old_decisions_are_pruned(catalog: Catalog) -> None:
    mark = triggers.run_mark(catalog, "j")
    for s in range(30):
        triggers.decide(catalog, "j", s, 0, lambda s=s: s + 1, mark=mark)
    d = S.trigger_decisions.c
    with catalog.backend.read() as conn:
        starts = sorted(r[0] for r in conn.execute(sa.select(d.start_barrier).where(d.job_id == "j")))
    assert starts == list(range(29 - 10, 30))


def test_upgrade_keeps_the_decisions_of_version_5_in_their_order(catalog_spec) -> None:  # type: ignore[no-untyped-def]
    backend = create_backend(catalog_spec.url)
    with backend.write() as conn:
        M.upgrade(conn, target=5)
        t = S.job_triggers
        conn.execute(sa.insert(t), [
            dict(job_id="j", start_barrier=0, call_no=4, end_barrier=0, created_at=10.0),
            dict(job_id="j", start_barrier=0, call_no=0, end_barrier=1, created_at=20.0),  # a later run
        ])
    backend.dispose()
    cat = catalog_spec.open()
    try:
        assert triggers.batch_end(cat, "j", 0) == 1
        assert triggers.run_mark(cat, "j") == 2
        with cat.backend.read() as conn:
            assert not sa.inspect(conn).has_table("ls_job_trigger")
    finally:
        cat.close()
