"""Every accelerator of the barrier rules agrees with the rules (lakestep/barrier/rules.py).

Hypothesis draws a topology (roots, derived tables reading earlier tables,
unmanaged tables, jobs registered late so their tables catch up) and a
program of seals, root commits, job batches, barrier-less commits (manual
fixes), compactions and rollbacks, run on a real catalog (SQLite, and
PostgreSQL with fewer examples). After every step the kernel's answers,
computed from nothing but the raw commit rows, the open epoch and the
topology, are compared with what each fast path answers:

* tags: ``facts.facts`` (one statement) and the kept facts of
  ``FactsCache.look``;
* the version at every barrier (rule 9): ``facts.versions_at`` (one
  statement), the era loop, ``FactsCache.versions_at`` (kept spans, asked
  twice) and the versions ``facts.choice_rows`` returns; with
  ``facts.versions_and_changes``, the first data change after each (what
  bounds a derived batch);
* e* (rule 8) at every scope, for several queried sets: the one statement
  of ``facts.choice_rows``, the ``FrontierIndex`` of ``FactsCache`` and
  ``Pipeline.choose`` (barrier, versions, catching-up flags);
* committed (rule 7), job frontiers and the next barrier of each job (rule
  6): ``Pipeline.committed_barrier``, ``Pipeline.job_frontier``,
  ``Pipeline.next_barrier``.

Derandomized (the same programs every run); ``LAKESTEP_RULES_EXAMPLES``
raises the count. A mutation of rules.py must make this test fail
(``python scripts/mutate.py --target lakestep/barrier/rules.py``).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Callable

import pyarrow as pa
import pytest
import sqlalchemy as sa
from hypothesis import HealthCheck, Phase, example, given, settings
from hypothesis import strategies as st

from lakestep import Catalog
from lakestep.barrier import OPEN_EPOCH, BarrierNotRetainedError, Pipeline, RollbackRefusedError, rules
from lakestep.barrier import facts as F
from lakestep.barrier.facts_cache import FactsCache
from lakestep.barrier.graph import Graph
from lakestep.catalog import epoch
from lakestep.services import Coordinator

from ..conftest import _pg_spec

EXAMPLES = int(os.environ.get("LAKESTEP_RULES_EXAMPLES", "40"))
KV = pa.schema([("k", pa.int64()), ("v", pa.int64())])
N = 5  # tables s.t0 .. s.t4
SCOPES: tuple[rules.Scope, ...] = ("query", "related", "global")


def kv(*pairs: tuple[int, int]) -> pa.Table:
    return pa.table({"k": [p[0] for p in pairs], "v": [p[1] for p in pairs]}, schema=KV)


# A topology: per table, (kind, sources, late). t0 is always a root; a derived table reads
# one or two earlier tables; a late job is registered by a step of the program.
table_spec = st.tuples(st.sampled_from(["root", "derived", "derived", "unmanaged"]),
                       st.lists(st.integers(0, N - 1), min_size=1, max_size=2), st.booleans())
topology = st.lists(table_spec, min_size=N - 1, max_size=N - 1)
step = st.tuples(st.sampled_from(["seal", "seal", "root", "root", "job", "job", "job", "manual", "compact",
                                  "register", "rollback", "stamp", "restore"]), st.integers(0, 2**16 - 1))
# scripts/mutate.py: a failing example is enough, shrinking it is not needed
PHASES = [Phase.explicit, Phase.reuse, Phase.generate] if os.environ.get("LAKESTEP_MUTANT") else list(Phase)
program = st.lists(step, min_size=6, max_size=16)


# Programs every run takes (hypothesis may not draw them): a late job whose table reaches
# exactly its joined barrier while every other table is ahead (it joins the COMMIT set and
# holds e* back); a rollback's RESTORE, then a manual RESTORE (no barrier) with nothing after
# it: the tag falls back to the newest barriered commit, the rollback's.
JOINS_EXACTLY = (
    [("derived", [0], True), ("root", [0], False), ("unmanaged", [0], False), ("derived", [0], False)],
    [("root", 0), ("seal", 0), ("job", 0), ("seal", 0), ("job", 0), ("seal", 0), ("job", 0), ("register", 0),
     ("seal", 0), ("job", 1), ("job", 0), ("job", 0), ("job", 0), ("job", 0)],
)
RESTORE_AFTER_ROLLBACK = (
    [("derived", [0], False), ("root", [0], False), ("unmanaged", [0], False), ("unmanaged", [0], False)],
    [("root", 0), ("seal", 0), ("job", 16), ("root", 0), ("seal", 0), ("job", 16), ("root", 0), ("seal", 0),
     ("job", 16), ("seal", 0), ("rollback", 1), ("restore", 1)],
)


def name(i: int) -> str:
    return f"s.t{i}"


class World:
    """One catalog, its topology and a program's counters."""

    def __init__(self, catalog: Catalog, spec: list[tuple[str, list[int], bool]]) -> None:
        self.catalog = catalog
        self.p = Pipeline(catalog)
        self.coord = Coordinator(self.p.catalog, lease_seconds=3600.0)
        self.cache = FactsCache()
        catalog.create_namespace("s", exist_ok=True)
        self.tables = [catalog.create_table(name(i), KV) for i in range(N)]
        # a derived job with an odd index also writes a second sink, s.x<i> (a job frontier is a min)
        self.extra = {i: catalog.create_table(f"s.x{i}", KV) for i in range(1, N, 2)}
        self.kinds = ["root"] + [k for k, _, _ in spec]
        self.sources = [[]] + [sorted({s % i for s in src}) for i, (_, src, _) in enumerate(spec, start=1)]
        self.late = [False] + [late for _, _, late in spec]
        self.registered: set[int] = set()
        self.counter = 0
        self.rollbacks = 0
        self.caught: set[int] = set()  # tables seen catching up
        for i in range(N):
            if self.kinds[i] == "root" or (self.kinds[i] == "derived" and not self.late[i]):
                self.register(i)
        self.by_tid = {t.table_id: t for t in [*self.tables, *self.extra.values()]}

    def register(self, i: int) -> None:
        if i in self.registered or self.kinds[i] == "unmanaged":
            return
        if self.kinds[i] == "root":
            self.p.register_job(f"in{i}", sinks=[name(i)], external_input=True)
        else:
            sinks = [name(i)] + ([self.extra[i].ident] if i in self.extra else [])
            self.p.register_job(f"job{i}", sources=[name(s) for s in self.sources[i]], sinks=sinks)
        self.registered.add(i)

    def row(self) -> pa.Table:
        self.counter += 1
        return kv((self.counter, self.counter % 7))

    # ------------------------------------------------------------------ steps
    def do(self, kind: str, arg: int) -> None:
        if kind == "seal":
            self.coord.seal()
        elif kind == "root":
            roots = [i for i in self.registered if self.kinds[i] == "root"]
            self.tables[sorted(roots)[arg % len(roots)]].append(self.row(), barrier=OPEN_EPOCH)
        elif kind == "job":
            jobs = sorted(i for i in self.registered if self.kinds[i] == "derived")
            if jobs:
                self.run_job(jobs[arg % len(jobs)], arg // 8)
        elif kind == "manual":  # a commit without a barrier that changes rows
            self.tables[arg % N].append(self.row())
        elif kind == "compact":
            t = self.tables[arg % N]
            if arg % 3 == 0:
                t.append(self.row())
            t.compact(min_files=2)
        elif kind == "stamp":  # a writer outside the protocol stamps a non-root table with the open epoch
            others = [self.tables[i] for i in range(N) if self.kinds[i] != "root"] + list(self.extra.values())
            if others:
                others[arg % len(others)].append(self.row(), barrier=OPEN_EPOCH)
        elif kind == "restore":  # a manual RESTORE (no barrier) to an earlier version
            t = (self.tables + list(self.extra.values()))[arg % (N + len(self.extra))]
            t.refresh()
            if t.version > 1:
                t.restore(1 + arg // N % (t.version - 1))
        elif kind == "register":
            late = [i for i in range(N) if self.kinds[i] == "derived" and i not in self.registered]
            if late:
                self.register(late[arg % len(late)])
        elif kind == "rollback":
            sealed = epoch.sealed(self.p.open_epoch())
            try:
                self.p.rollback(to=max(0, sealed - 1 - arg % 3))
                self.rollbacks += 1
            except RollbackRefusedError:
                pass

    def run_job(self, i: int, arg: int) -> None:
        plan = self.p.next_batch(f"job{i}", max_barriers=1 + arg % 3)
        if plan is None:
            return
        with self.p.batch(plan) as b:
            if arg % 4 == 0:
                pass  # no output: an empty commit still precommits lo..hi
            elif arg % 4 == 1:
                b.overwrite(name(i), self.row())
            else:
                b.append(name(i), self.row())

    # ------------------------------------------------------------------ checks
    def histories(self, conn: Any) -> dict[int, list[rules.Commit]]:
        out: dict[int, list[rules.Commit]] = {}
        for tid, v, b, dv, op in conn.execute(sa.text(
                "SELECT table_id, version, barrier, data_version, operation FROM ls_commit ORDER BY table_id, version")):
            out.setdefault(int(tid), []).append(
                rules.Commit(int(v), None if b is None else int(b), int(dv), op == "RESTORE"))
        return out

    def check(self) -> int:
        """Compare every accelerator with the kernel; returns how many answers were compared."""
        n = 0
        with self.catalog.backend.read() as conn:
            known = self.cache.look(conn)  # the first statement of the read
            graph: Graph = self.p.topology.graph(conn)
            open_ = epoch.open_epoch(conn)
            assert known.open_epoch == open_ and known.generation == graph.generation
            hist = self.histories(conn)
            ids = sorted(hist)
            tags = {t: rules.tag(h) for t, h in hist.items()}
            members = {m.table_id: m for m in rules.members(graph, tags, ids)}
            self.caught |= {t for t, m in members.items() if rules.catching_up(m, open_)}
            fx = F.facts(conn, ids)
            for t in ids:  # rule 2: tags, one statement and kept
                assert fx[t].tag == tags[t] == known.facts[t].tag, (t, hist[t])
                n += 1
            # rule 9 at every barrier, by every path
            for e in range(0, open_ + 1):
                want = {t: rules.version_at(hist[t], e) for t in ids}
                got = F.versions_at(conn, ids, e)
                with_changes, changes = F.versions_and_changes(conn, ids, e)  # a derived batch's plan
                below, here = F.versions_at_both(conn, ids, max(e - 1, 0), e)  # a derived batch's guard
                kept = self.cache.versions_at(conn, known, ids, e)
                again = self.cache.versions_at(conn, known, ids, e)
                for t in ids:
                    w = want[t]
                    assert (got[t].version, got[t].data_version) == w, ("versions_at", t, e, hist[t])
                    assert with_changes[t] == got[t] == here[t], ("versions_and_changes, both", t, e, hist[t])
                    wb = rules.version_at(hist[t], max(e - 1, 0))
                    assert (below[t].version, below[t].data_version) == wb, ("versions_at_both", t, e, hist[t])
                    # the first barriered commit after the answer whose data differs
                    after = [c.barrier for c in hist[t] if c.version > w[0] and c.barrier is not None
                             and c.data_version > w[1]]
                    assert changes[t] == (after[0] if after else None), ("first change", t, e, hist[t])
                    if e == open_ or any(c.restore for c in hist[t]):  # the era loop where it differs
                        slow = F._version_at_slow(conn, t, e)
                        assert (slow.version, slow.data_version) == w, ("era loop", t, e, hist[t])
                    assert (kept[t].version, kept[t].data_version) == w, ("kept", t, e)
                    assert (again[t].version, again[t].data_version) == w, ("kept again", t, e)
                    n += 4
            # rule 8 at every scope, for several queried sets
            queried_sets = [{t} for t in ids] + [set(ids[:2]), set(ids[-2:]), set(ids)]
            for q in queried_sets:
                for which in SCOPES:
                    scope = rules.scope(graph, q, which)
                    e = rules.e_star((members[t] for t in scope), open_, q)
                    got_rows = F.choice_rows(conn, scope | q, q)
                    assert got_rows is not None
                    if any(r.facts.tag is None and r.facts.restore_version is not None for r in got_rows[3].values()):
                        continue  # its precondition: the statement reads no tag before a RESTORE without one
                    assert got_rows[2] == e.barrier, ("choice_rows", which, q, got_rows[2], e)
                    for t in q & e.managed.keys():
                        r = got_rows[3][t]
                        if r.m is not None and r.dv is not None:  # else: the general path answers
                            v = r.facts.head if r.nxt is None else r.nxt - 1
                            assert (v, r.dv) == rules.version_at(hist[t], e.barrier), ("choice_rows v", t)
                    n += 1
                    if which != "query":
                        wide = self.cache.wide_barrier(known, graph, q, which)
                        if wide is not None:
                            assert wide[0] == e.barrier and set(wide[2]) == set(e.held), ("index", which, q, wide, e)
                            n += 1
            committed = rules.committed((members[t] for t in graph.derived if t in members), open_)
            # committed is e* of every managed table, none queried (both rules; e* is checked above)
            assert committed == rules.e_star((members[t] for t in graph.managed), open_).barrier
            assert committed <= epoch.sealed(open_)
            cs = rules.commit_set((members[t] for t in graph.managed), open_)  # and the COMMIT set's lowest
            assert committed == min([epoch.sealed(open_)] + [rules.tag_frontier(members[t].tag, open_) for t in cs
                                                              if members[t].kind == "derived"])
            jobs = {j: (job.sink_ids, job.source_ids) for j, job in graph.jobs.items() if not job.external_input}
        # the public paths, each in its own read
        for q in queried_sets:
            idents = [self.by_tid[t].ident for t in sorted(q)]
            for which in SCOPES:
                scope = rules.scope(graph, q, which)
                e = rules.e_star((members[t] for t in scope), open_, q)
                c = self.p.choose(idents, scope=which)
                assert c.barrier == e.barrier, ("choose", which, q, c.explanation.text())
                for t in sorted(q):
                    ident = self.by_tid[t].ident
                    if t in e.managed:
                        assert c.versions[ident] == rules.version_at(hist[t], e.barrier)[0], ("choose v", ident)
                    tc = c.explanation.tables[ident]
                    assert tc.catching_up == rules.catching_up(members[t], open_)
                    assert tc.frontier == rules.frontier(members[t].kind, members[t].tag, open_)
                n += 1
        assert self.p.committed_barrier() == committed
        for j, (sinks, sources) in jobs.items():
            jf = rules.job_frontier(rules.frontier(members[s].kind, members[s].tag, open_) for s in sinks)
            assert self.p.job_frontier(j) == jf == min(rules.tag_frontier(members[s].tag, open_) for s in sinks)
            ready = rules.ready((rules.frontier(members[s].kind, members[s].tag, open_) for s in sources
                                 if members[s].kind != "unmanaged"), open_)
            nxt = self.p.next_barrier(j)
            assert nxt == (jf + 1 if jf + 1 <= ready else None), (j, jf, ready)
            assert nxt is None or nxt <= epoch.sealed(open_)  # only sealed barriers are planned
            n += 2
        return n


def run_many(examples: int, fresh: Callable[[], Catalog]) -> dict[str, int]:
    seen = {"examples": 0, "steps": 0, "answers": 0, "rollbacks": 0, "catching_up": 0}

    @settings(max_examples=examples, deadline=None, derandomize=True, database=None, phases=PHASES,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(topology, program)
    @example(*JOINS_EXACTLY)
    @example(*RESTORE_AFTER_ROLLBACK)
    def run(spec: list[tuple[str, list[int], bool]], prog: list[tuple[str, int]]) -> None:
        cat = fresh()
        try:
            w = World(cat, spec)
            seen["examples"] += 1
            seen["answers"] += w.check()
            for kind, arg in prog:
                w.do(kind, arg)
                seen["steps"] += 1
                seen["answers"] += w.check()
            seen["rollbacks"] += w.rollbacks
            seen["catching_up"] += len(w.caught)
        finally:
            cat.close()

    run()
    return seen


def _assert_covered(seen: dict[str, int]) -> None:
    print(f"\nrules: {seen}")
    assert seen["examples"] > 0 and seen["answers"] > 0 and seen["rollbacks"] > 0 and seen["catching_up"] > 0


def test_fast_paths_agree_with_the_rules_sqlite(tmp_path: Path) -> None:
    counter = iter(range(10**6))

    def fresh() -> Catalog:
        return Catalog(warehouse=str(tmp_path / f"wh{next(counter)}"))

    _assert_covered(run_many(EXAMPLES, fresh))


def test_fast_paths_agree_with_the_rules_postgres(pg_admin: sa.Engine, tmp_path: Path) -> None:
    specs: list[Any] = []
    counter = iter(range(10**6))

    def fresh() -> Catalog:
        while specs:
            specs.pop().__exit__(None, None, None)
        cm = _pg_spec(pg_admin, str(tmp_path / f"wh{next(counter)}"))
        specs.append(cm)
        return cm.__enter__().open()

    try:
        _assert_covered(run_many(max(4, EXAMPLES // 5), fresh))
    finally:
        while specs:
            specs.pop().__exit__(None, None, None)


@pytest.mark.parametrize("history, e, want", [
    # creation only
    ([rules.Commit(0, None, 0)], 3, (0, 0)),
    # a compaction (no data change, no barrier) after m counts with m
    ([rules.Commit(0, None, 0), rules.Commit(1, 1, 1), rules.Commit(2, None, 1)], 1, (2, 1)),
    # a manual fix (data, no barrier) counts with the next barriered commit
    ([rules.Commit(0, None, 0), rules.Commit(1, 1, 1), rules.Commit(2, None, 2), rules.Commit(3, 2, 3)], 1, (1, 1)),
    # a RESTORE to 1: barrier 2 reads the restore, barrier 1 untouched history before it
    ([rules.Commit(0, None, 0), rules.Commit(1, 1, 1), rules.Commit(2, 2, 2), rules.Commit(3, 1, 3, True)], 2, (3, 3)),
    ([rules.Commit(0, None, 0), rules.Commit(1, 1, 1), rules.Commit(2, 2, 2), rules.Commit(3, 1, 3, True)], 0, (0, 0)),
])
def test_version_rule_examples(history: list[rules.Commit], e: int, want: tuple[int, int]) -> None:
    """Rule 9 on hand-made histories (the property test above gets them from the catalog)."""
    assert rules.version_at(history, e) == want


def test_version_rule_refuses_a_pruned_history() -> None:
    """Rule 9 cannot answer when cleanup pruned the record of m or of the commit after m (the
    property test's catalogs are never cleaned up)."""
    full = [rules.Commit(0, None, 0), rules.Commit(1, 1, 1), rules.Commit(2, 2, 2), rules.Commit(3, 3, 3)]
    assert rules.version_at(full[2:], 2) == (2, 2)  # m = 2 and m + 1 kept: fine
    assert rules.version_at(full[3:], 3) == (3, 3)  # m = head: nothing after it is needed
    with pytest.raises(BarrierNotRetainedError):
        rules.version_at([full[1], full[3]], 1)  # m = 1 kept, 2 pruned
    with pytest.raises(BarrierNotRetainedError):
        rules.version_at(full[3:], 0)  # m = 0 pruned


def test_e_star_examples() -> None:
    """Rule 8 by hand: a root at O - 1, a derived table behind holds e* back, one catching up is left
    out unless queried, an unmanaged one never counts."""
    ms = [rules.Member(1, "root"), rules.Member(2, "derived", tag=3), rules.Member(3, "derived", tag=1, joined=4),
          rules.Member(4, "unmanaged", tag=9)]
    e = rules.e_star(ms, 6)
    assert (e.barrier, e.held, set(e.managed)) == (3, frozenset({2}), {1, 2})
    assert rules.e_star(ms, 6, queried={3}).barrier == 1
    assert rules.e_star([rules.Member(4, "unmanaged")], 6).barrier == 5
    assert rules.committed(ms, 6) == 3 and rules.commit_set(ms, 6) == [1, 2]
    # a derived table exactly at its joined barrier has joined; a tag above O - 1 counts as O - 1
    assert not rules.catching_up(rules.Member(5, "derived", tag=4, joined=4), 6)
    assert rules.committed([rules.Member(5, "derived", tag=9)], 6) == 5
    assert rules.job_frontier([3, 5]) == 3 and rules.job_frontier([]) == 0
    assert rules.ready([], 6) == 5 and rules.ready([3, 5], 6) == 3


def test_tag_examples() -> None:
    """Rule 2 by hand: the newest era's highest barrier; after a RESTORE without a barrier and
    nothing tagged since, the newest barriered commit by version (here the rollback's RESTORE)."""
    h = [rules.Commit(0, None, 0), rules.Commit(1, 1, 1), rules.Commit(2, 3, 2)]
    assert rules.tag(h) == 3
    h += [rules.Commit(3, 1, 3, True), rules.Commit(4, None, 4, True)]
    assert rules.tag(h) == 1
