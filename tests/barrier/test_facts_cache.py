"""Wide read_committed choices (scope related/global) from facts kept by change stamp.

facts_cache.FactsCache keeps every table's barrier facts and asks the database only
for the tables whose stamp is at or above the watermark of its previous look.
The oracle here is the general path of choose.py, which reads every fact of
the scope afresh (facts.facts_ex) and knows nothing of stamps.
"""

from __future__ import annotations

import random
import threading
from typing import Any, Iterator

import pytest

from lakestep import Catalog, _failpoints
from lakestep.barrier import OPEN_EPOCH, Pipeline, facts, facts_cache
from lakestep.barrier import choose as choose_mod
from lakestep.barrier.choose import Choice
from lakestep.barrier.errors import BarrierNotRetainedError, RollbackRefusedError
from lakestep.errors import TableNotFoundError
from lakestep.services import Coordinator

from .conftest import KV, kv, rows


def _view(c: Choice) -> tuple[Any, ...]:
    tables = {k: (t.kind, t.job, t.frontier, t.head, t.version, t.queried, t.catching_up)
              for k, t in c.explanation.tables.items()}
    return (c.barrier, c.versions, c.explanation.held_by, c.explanation.notes, c.explanation.open_epoch, tables)


def _general(catalog: Catalog, tables: list[str], scope: str, monkeypatch: pytest.MonkeyPatch) -> Choice:
    """The reference: the general path, every fact read afresh."""
    with monkeypatch.context() as m:
        m.setattr(choose_mod, "_committed_wide", lambda *a, **k: None)
        return Pipeline(catalog).choose(tables, scope=scope)  # type: ignore[arg-type]


def _copy_batch(p: Pipeline, writer: Catalog, job: str) -> bool:
    plan = p.next_batch(job, max_barriers=2)
    if plan is None:
        return False
    got: list[tuple[int, int]] = []
    for name, s in plan.sources.items():
        got += rows(writer.load_table(name).to_arrow(version=s.to_version))
    with p.batch(plan) as b:
        b.overwrite(plan.sinks[0], kv(*sorted(set(got))[:50]))
    return True


@pytest.fixture
def writer(catalog: Catalog, catalog_spec: Any) -> Iterator[Catalog]:
    """A second catalog object on the same database: its changes reach the reader only
    through the database."""
    w = catalog_spec.open()
    yield w
    w.close()


def test_a_wide_choice_from_kept_facts_equals_a_fresh_one(catalog: Catalog, writer: Catalog,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    catalog.create_namespace("s")
    for n in ("r0", "r1", "d0", "d1", "d2", "dim"):
        writer.create_table(f"s.{n}", KV)
    wp = Pipeline(writer)
    wp.register_job("in0", sinks=["s.r0"], external_input=True)
    wp.register_job("in1", sinks=["s.r1"], external_input=True)
    wp.register_job("j0", sources=["s.r0"], sinks=["s.d0"])
    wp.register_job("j1", sources=["s.r0", "s.r1"], sinks=["s.d1"])
    wp.register_job("j2", sources=["s.d1"], sinks=["s.d2"])
    coord = Coordinator(writer, interval=0.01, lease_seconds=30.0)
    reader = Pipeline(catalog)  # long-lived: its facts are kept between choices
    rng = random.Random(20261123)
    dim = "s.dim"
    extra: list[str] = []  # jobs registered during the run
    done: dict[str, int] = {}
    seen: set[str] = set()
    try:
        for i in range(120):
            step = rng.choice(["append", "append", "seal", "seal", "batch", "batch", "batch", "dim", "job"]
                              + (["rollback"] if i >= 70 else []))
            if step == "append":
                writer.load_table(rng.choice(["s.r0", "s.r1"])).append(kv((i, rng.randrange(100))),
                                                                         barrier=OPEN_EPOCH)
            elif step == "seal":
                coord.seal()
            elif step == "batch":
                _copy_batch(wp, writer, rng.choice(["j0", "j1", "j2"] + extra))
            elif step == "dim":
                what = rng.choice(["rename", "drop", "append"])
                if what == "rename":
                    new = "s.dim2" if dim == "s.dim" else "s.dim"
                    writer.rename_table(dim, new)
                    dim = new
                elif what == "drop":
                    writer.drop_table(dim)
                    writer.create_table(dim, KV)
                else:
                    writer.load_table(dim).append(kv((i, i)))
            elif step == "job":
                if extra and rng.random() < 0.5:
                    wp.retire_job(extra.pop())
                else:  # joins at the committed barrier, so its table catches up for a while
                    coord.seal()
                    for job in ["j0", "j1", "j2"] + extra:
                        while _copy_batch(wp, writer, job):
                            pass
                    name = f"x{i}"
                    writer.create_table(f"s.{name}", KV)
                    wp.register_job(name, sources=[rng.choice(["s.r1", "s.d0"])], sinks=[f"s.{name}"])
                    extra.append(name)
            else:
                c = wp.choose(["s.d2"], scope="global")
                try:
                    wp.rollback(to=max(0, (c.barrier or 0) - rng.randrange(3)))
                except RollbackRefusedError:
                    pass
            done[step] = done.get(step, 0) + 1
            lagging: set[str] = set()
            for scope in ("related", "global"):
                for tables in ([f"s.{extra[-1]}"] if extra else ["s.d0"], ["s.d1"], ["s.r0", dim], ["s.d2"]):
                    got = reader.choose(tables, scope=scope)  # type: ignore[arg-type]
                    want = _general(catalog, tables, scope, monkeypatch)
                    assert _view(got) == _view(want), (i, step, scope, tables)
                    for t in got.explanation.tables.values():
                        if t.catching_up:
                            lagging.add(t.table)
                            if t.table in got.explanation.held_by:
                                seen.add("catching up, queried, holds the barrier back")
                    if scope == "global" and lagging - set(tables) - set(got.explanation.tables):
                        seen.add("catching up, not queried, left out")
        # every kind of step happened, the catching-up tables too
        assert set(done) == {"append", "seal", "batch", "dim", "job", "rollback"}, done
        # versions were both served from kept answers and asked again (FactsCache.versions_at)
        kept = reader.topology.facts_cache
        assert kept.kept_hits > 0 and kept.kept_misses > 0, (kept.kept_hits, kept.kept_misses)
        assert seen == {"catching up, queried, holds the barrier back", "catching up, not queried, left out"}, seen
    finally:
        coord.stop()


def test_a_commit_that_took_its_transaction_id_first_and_landed_last_is_seen(pg_spec: Any) -> None:
    """On PostgreSQL the stamp is the writer's transaction id, taken at its first write,
    not at its commit: a commit that stamps early and lands after a later one must still
    be seen by the look after it lands (the watermark is the snapshot's xmin)."""
    catalog = pg_spec.open()
    writer = pg_spec.open()
    try:
        catalog.create_namespace("s")
        for n in ("r", "d"):
            writer.create_table(f"s.{n}", KV)
        wp = Pipeline(writer)
        wp.register_job("in", sinks=["s.r"], external_input=True)
        wp.register_job("copy", sources=["s.r"], sinks=["s.d"])
        writer.load_table("s.r").append(kv((1, 1)), barrier=OPEN_EPOCH)
        Coordinator(writer, interval=0.01, lease_seconds=30.0).seal()
        reader = Pipeline(catalog)
        assert reader.choose(["s.d"], scope="global").barrier == 0  # d holds the barrier back

        paused, go = threading.Event(), threading.Event()
        failed: list[BaseException] = []

        def hold(_name: str) -> None:
            if threading.current_thread().name == "slow-commit":
                paused.set()
                assert go.wait(60)

        def slow() -> None:
            try:
                assert _copy_batch(wp, writer, "copy")
            except BaseException as e:  # pragma: no cover - reported below
                failed.append(e)

        _failpoints.arm("commit.before_db_commit", hold)
        t = threading.Thread(target=slow, name="slow-commit")
        t.start()
        try:
            assert paused.wait(60)  # the derived commit holds its transaction id, not committed
            writer.load_table("s.r").append(kv((2, 2)), barrier=OPEN_EPOCH)  # a later id, landed first
            before = reader.choose(["s.d"], scope="global")
            assert before.barrier == 0
            assert before.explanation.tables["s.r"].head == 2
        finally:
            go.set()
            t.join(60)
            _failpoints.disarm("commit.before_db_commit")
        assert not failed, failed
        after = reader.choose(["s.d"], scope="global")
        fresh = Pipeline(catalog).choose(["s.d"], scope="global")
        assert after.barrier == 1
        assert _view(after) == _view(fresh)
    finally:
        catalog.close()
        writer.close()



def test_kept_versions_equal_fresh_ones_at_every_barrier(catalog: Catalog, writer: Catalog) -> None:
    """FactsCache.versions_at against facts.versions_at in the same snapshot, at barriers
    asked in random order, through barriered and barrier-less commits, compactions,
    rollbacks (RESTORE eras) and cleanups that prune commit rows (a change of stamp only)."""
    catalog.create_namespace("s")
    names = ["s.r0", "s.r1", "s.d0", "s.u"]
    for n in names:
        writer.create_table(n, KV)
    wp = Pipeline(writer)
    wp.register_job("in0", sinks=["s.r0"], external_input=True)
    wp.register_job("in1", sinks=["s.r1"], external_input=True)
    wp.register_job("j0", sources=["s.r0"], sinks=["s.d0"])
    coord = Coordinator(writer, interval=0.01, lease_seconds=30.0)
    ids = [catalog.load_table(n).table_id for n in names]
    cache = facts_cache.FactsCache()
    rng = random.Random(20261124)
    done: dict[str, int] = {}
    outcomes: dict[str, int] = {}
    try:
        for i in range(140):
            step = rng.choice(["append", "append", "plain", "seal", "seal", "batch", "compact", "cleanup"]
                              + (["rollback"] if i >= 40 else []))
            if step == "append":
                writer.load_table(rng.choice(["s.r0", "s.r1", "s.u"])).append(kv((i, i)), barrier=OPEN_EPOCH)
            elif step == "plain":  # no barrier: belongs to the next barriered commit's barrier
                writer.load_table(rng.choice(["s.r1", "s.u"])).append(kv((i, -i)))
            elif step == "seal":
                coord.seal()
            elif step == "batch":
                _copy_batch(wp, writer, "j0")
            elif step == "compact":
                writer.load_table(rng.choice(names)).compact(min_files=2)
            elif step == "cleanup":
                # (not s.r0: the derived job reads it at its older barriers)
                writer.load_table(rng.choice(["s.r1", "s.d0", "s.u"])).cleanup(retention_seconds=0, force=True,
                                                                               orphans=False)
            else:
                try:
                    wp.rollback(to=max(0, wp.choose(["s.d0"], scope="global").barrier - rng.randrange(3)))
                except (RollbackRefusedError, BarrierNotRetainedError):  # (a cleanup pruned the barrier)
                    pass
            done[step] = done.get(step, 0) + 1
            for _ in range(2):
                with catalog.backend.read() as conn:
                    known = cache.look(conn)
                    for e in rng.sample(range(known.open_epoch + 1), min(4, known.open_epoch + 1)):
                        try:
                            want: Any = facts.versions_at(conn, ids, e)
                        except BarrierNotRetainedError:
                            want = "not retained"
                        try:
                            got: Any = cache.versions_at(conn, known, ids, e)
                        except BarrierNotRetainedError:
                            got = "not retained"
                        assert got == want, (i, step, e)
                        key = "not retained" if want == "not retained" else "answered"
                        outcomes[key] = outcomes.get(key, 0) + 1
        assert set(done) == {"append", "plain", "seal", "batch", "compact", "cleanup", "rollback"}, done
        assert outcomes.get("answered", 0) > 100, outcomes
        assert cache.kept_hits > 100 and cache.kept_misses > 100, (cache.kept_hits, cache.kept_misses)
    finally:
        coord.stop()


@pytest.mark.parametrize("scope", ["query", "related", "global"])
def test_a_choice_over_a_thousand_names_is_answered(catalog: Catalog, scope: str) -> None:
    """Names are looked up in bounded statements: SQLite refuses an expression deeper than
    1000, which one OR over 1,000 names was (an untyped OperationalError)."""
    catalog.create_namespace("s")
    for n in ("a", "b"):
        catalog.create_table(f"s.{n}", KV)
    p = Pipeline(catalog)
    p.register_job("in", sinks=["s.a"], external_input=True)
    names = ["s.a", "s.b"] + [f"s.missing{i}" for i in range(1200)]
    with pytest.raises(TableNotFoundError) as e:
        p.choose(names, scope=scope)  # type: ignore[arg-type]
    assert "s.missing0" in str(e.value)
    c = p.choose(["s.a", "s.b"], scope=scope)  # type: ignore[arg-type]
    assert c.versions == {"s.a": 0, "s.b": 0}
