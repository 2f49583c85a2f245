"""A deterministic simulator of a streaming topology, driving the REAL catalog and coordinator.

Topology (every table ``(k int64, v int64)``)::

    orders (root) --filter--> big            incremental: appends filter(new rows)
    orders        --totals--> totals         full: sum(v) per k, overwritten
    orders, users --enrich--> enriched       full: join on k -> (region, amount)
    enriched      --regions-> by_region      full: sum(v) per region (a second level)

A program is a list of steps, run in order: root commits (one table, or both
in one transaction; replays of a root batch by its idempotency key), time
passing (the coordinator seals an epoch every ``INTERVAL`` units), derived
jobs planning, committing, crashing before or after their commit (and
replaying after a restart), lagging (not being scheduled), compactions (commits
without a barrier), snapshots, rollbacks (some refused below the snapshot),
and checks.

The simulator keeps its own model, independent of lakestep's code: the rows
each root job committed in each epoch, how many epochs are sealed, each
derived table's frontier (the ``hi`` of its last batch that committed,
lowered by rollbacks) and the coordinator's newest snapshot. From it, the
rows of every table at every barrier follow (a derived table at ``e`` is its
job's function of its sources at ``min(e, frontier)``), and so does the
barrier a ``read_committed`` choice must answer: ``min(frontier)`` over its
scope. A check asserts the choice is exactly that barrier and every table
reads exactly the model's rows there; plans, replays, snapshots and
rollbacks are checked against the model too. The same equations evaluated at
the heads (``read_uncommitted``) are only counted: the test asserts that they
fail in some runs. Real commits, real seals, real Parquet files; only the
jobs' functions are computed here, in Python.
"""

from __future__ import annotations

import collections
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import pyarrow as pa
import pyarrow.parquet as pq

from lakestep import Catalog, Table
from lakestep.barrier import (
    OPEN_EPOCH,
    BatchPlan,
    Pipeline,
    RollbackRefusedError,
    StaleBatchError,
)
from lakestep.barrier.snapshots import newest_snapshot
from lakestep.services import Coordinator

KV = pa.schema([("k", pa.int64()), ("v", pa.int64())])
Rows = list[tuple[int, int]]
INTERVAL = 2

ROOTS = ("s.orders", "s.users")
TABLES = ("s.orders", "s.users", "s.big", "s.totals", "s.enriched", "s.by_region")


def f_big(orders: Rows) -> Rows:
    return sorted(r for r in orders if r[1] >= 5)


def f_sum(rows: Rows) -> Rows:
    acc: dict[int, int] = collections.defaultdict(int)
    for k, v in rows:
        acc[k] += v
    return sorted(acc.items())


def f_enriched(orders: Rows, users: Rows) -> Rows:
    return sorted((u[1], o[1]) for o in orders for u in users if u[0] == o[0])


@dataclass(frozen=True)
class JobSpec:
    sources: tuple[str, ...]
    sink: str
    incremental: bool
    fn: Callable[..., Rows]


JOBS: dict[str, JobSpec] = {
    "filter": JobSpec(("s.orders",), "s.big", True, f_big),
    "totals": JobSpec(("s.orders",), "s.totals", False, f_sum),
    "enrich": JobSpec(("s.orders", "s.users"), "s.enriched", False, f_enriched),
    "regions": JobSpec(("s.enriched",), "s.by_region", False, f_sum),
}

# Each derived table as a function of the tables read with it.
EQUATIONS: list[tuple[str, tuple[str, ...], Callable[..., Rows]]] = [
    ("s.big", ("s.orders",), f_big),
    ("s.totals", ("s.orders",), f_sum),
    ("s.enriched", ("s.orders", "s.users"), f_enriched),
    ("s.by_region", ("s.enriched",), f_sum),
    ("s.by_region", ("s.orders", "s.users"), lambda o, u: f_sum(f_enriched(o, u))),
]


SINK_JOB = {spec.sink: job for job, spec in JOBS.items()}


def setup(catalog: Catalog) -> None:
    """The tables and jobs (done once per template on SQLite)."""
    catalog.create_namespace("s", exist_ok=True)
    for t in TABLES:
        catalog.create_table(t, KV)
    p = Pipeline(catalog)
    p.register_job("orders_in", sinks=["s.orders"], external_input=True)
    p.register_job("users_in", sinks=["s.users"], external_input=True)
    for job, spec in JOBS.items():
        p.register_job(job, sources=list(spec.sources), sinks=[spec.sink])


@dataclass
class Stats:
    examples: int = 0
    steps: int = 0
    strong_checks: int = 0
    weak_checks: int = 0
    weak_inconsistent: int = 0
    runs_weak_inconsistent: int = 0
    repeatable_checks: int = 0
    seals: int = 0
    batches: int = 0
    replays: int = 0
    stale: int = 0
    rollbacks: int = 0
    refused: int = 0
    counters: dict[str, int] = field(default_factory=collections.Counter)


def _table(rows: Rows) -> pa.Table:
    return pa.table({"k": [r[0] for r in rows], "v": [r[1] for r in rows]}, schema=KV)


class Sim:
    def __init__(self, catalog: Catalog, stats: Stats) -> None:
        self.catalog = catalog
        self.p = Pipeline(catalog)
        self.coord = Coordinator(catalog, lease_seconds=3600.0, snapshot_every=1, retain_count=3)
        self.stats = stats
        self.tables: dict[str, Table] = {t: catalog.load_table(t) for t in TABLES}
        self.pending: dict[str, BatchPlan | None] = {j: None for j in JOBS}
        # Did the pending plan commit before the job "crashed"? None: unknown,
        # since a rollback may have undone that commit (then it must commit again).
        self.forgot: dict[str, bool | None] = {j: False for j in JOBS}
        self.clock = 0
        self.last_seal = 0
        self.batch_no = collections.Counter[str]()
        self.last_root: tuple[str, str, int, Rows] | None = None
        self._files: dict[tuple[str, str], Rows] = {}
        self._rows: dict[tuple[str, int], Rows] = {}
        self.weak_bad = False
        # the model (module docstring)
        self.m_sealed = 0
        self.m_root: dict[str, list[tuple[int, Rows]]] = {t: [] for t in ROOTS}  # (epoch, rows) committed
        self.m_frontier: dict[str, int] = {spec.sink: 0 for spec in JOBS.values()}
        self.m_snap_last = 0  # the coordinator's snapshot progress
        self.m_snap_newest: int | None = None  # the newest barrier snapshotted

    # ------------------------------------------------------------------ model
    def model_rows(self, table: str, e: int) -> Rows:
        """The rows ``table`` must hold at barrier ``e``, from the model alone."""
        if table in ROOTS:
            return sorted(r for epoch, rows in self.m_root[table] if epoch <= e for r in rows)
        spec = JOBS[SINK_JOB[table]]
        b = min(e, self.m_frontier[table])
        return sorted(spec.fn(*[self.model_rows(s, b) for s in spec.sources]))

    def model_barrier(self, tables: Sequence[str]) -> int:
        """read_committed's barrier over ``tables``: min(frontier); a root's is the newest sealed epoch."""
        return min([self.m_sealed] + [self.m_frontier[t] for t in tables if t not in ROOTS])

    def seal(self) -> None:
        s = self.coord.seal()
        assert s is not None and s.barrier == self.m_sealed + 1, s
        self.m_sealed += 1

    def snapshot(self) -> None:
        made = self.coord.snapshot()
        committed = self.model_barrier(TABLES)
        if committed > self.m_snap_last:
            assert made and made[-1] == committed, (made, committed)
            self.m_snap_last = self.m_snap_newest = committed
        else:
            assert made == [], (made, committed)

    # ---------------------------------------------------------------- reading
    def rows(self, table: str, version: int) -> Rows:
        """The rows of ``table`` at ``version`` (immutable: cached, read file by file)."""
        key = (table, version)
        if key not in self._rows:
            t = self.tables[table]
            out: Rows = []
            for f in t.files(version=version):
                fk = (table, f.path)
                if fk not in self._files:
                    data = pq.read_table(t.writer.full_path(f.path), filesystem=t.writer.fs)
                    self._files[fk] = list(zip(data.column("k").to_pylist(), data.column("v").to_pylist()))
                out.extend(self._files[fk])
            self._rows[key] = sorted(out)
        return self._rows[key]

    # ------------------------------------------------------------------ steps
    def run(self, program: Sequence[tuple[Any, ...]]) -> None:
        for step in program:
            getattr(self, f"do_{step[0]}")(*step[1:])
            self.stats.steps += 1
        self.drain()
        self.check("global")
        # the end of every program: snapshot the caught-up state, read it repeatably,
        # and try to roll back below it (refused)
        self.snapshot()
        if self.p.snapshot_barrier() is not None:
            self.check_repeatable()
            self.do_rollback(0, True)
        self.stats.examples += 1
        self.stats.runs_weak_inconsistent += int(self.weak_bad)

    def do_root(self, which: str, data: Rows) -> None:
        targets = ROOTS if which == "both" else (f"s.{which}",)
        job = "roots" if which == "both" else f"{which}_in"
        self.batch_no[job] += 1
        n = self.batch_no[job]
        with self.catalog.transaction(job_id=job, batch_id=n) as tx:
            for t in targets:
                tx.append(self.tables[t], _table(data), barrier=OPEN_EPOCH)
        assert all(r.barrier == self.m_sealed + 1 for r in tx.results), tx.results  # the open epoch
        for t in targets:
            self.m_root[t].append((self.m_sealed + 1, list(data)))
        self.last_root = (job, which, n, data)

    def do_replay_root(self) -> None:
        """A root job restarted after a crash re-sends its last batch: nothing changes."""
        if self.last_root is None:
            return
        job, which, n, data = self.last_root
        heads = {t: self.tables[t].version for t in ROOTS}
        targets = ROOTS if which == "both" else (f"s.{which}",)
        with self.catalog.transaction(job_id=job, batch_id=n) as tx:
            for t in targets:
                tx.append(self.tables[t], _table(data), barrier=OPEN_EPOCH)
        assert all(r.replayed for r in tx.results)
        assert heads == {t: self.tables[t].version for t in ROOTS}

    def do_time(self, dt: int) -> None:
        self.clock += dt
        if self.clock - self.last_seal >= INTERVAL:  # what Coordinator.tick does
            self.seal()
            self.snapshot()
            self.last_seal = self.clock
            self.stats.seals += 1

    def do_compact(self, table: str) -> None:
        self.tables[table].compact(min_files=2)

    def do_snapshot(self) -> None:
        self.snapshot()
        if self.p.snapshot_barrier() is not None:
            self.check_repeatable()

    def do_rollback(self, back: int, below_snapshot: bool) -> None:
        with self.catalog.backend.read() as conn:
            g = self.p.topology.graph(conn)
            snap = newest_snapshot(conn, g.managed)
        floor = 0 if snap is None else snap[1]
        assert (None if snap is None else snap[1]) == self.m_snap_newest
        if below_snapshot:
            if floor == 0:
                return
            heads = {t: self.tables[t].version for t in TABLES}
            try:
                self.p.rollback(to=floor - 1)
            except RollbackRefusedError as e:
                assert e.snapshot_barrier == floor
                assert heads == {t: self.tables[t].version for t in TABLES}  # nothing happened
                self.stats.refused += 1
                return
            raise AssertionError("a rollback below a snapshot was not refused")
        sealed = self.p.open_epoch() - 1
        assert sealed == self.m_sealed
        to = max(floor, sealed - back)
        self.p.rollback(to=to)
        self.stats.rollbacks += 1
        self.forgot = {j: (None if f else f) for j, f in self.forgot.items()}
        for t in ROOTS:  # the model: every commit above `to` is gone, the open epoch's included
            self.m_root[t] = [(epoch, rows) for epoch, rows in self.m_root[t] if epoch <= to]
        for t in self.m_frontier:
            self.m_frontier[t] = min(self.m_frontier[t], to)
        self.m_snap_last = min(self.m_snap_last, to)
        for t in TABLES:  # every barrier from `to` on reads exactly the model's rows at `to`
            for e in range(to, sealed + 1):
                got = self.rows(t, self.p.version_at(t, e, strict=False))
                assert got == self.model_rows(t, min(e, to)), (t, e, to, got)
            if t not in ROOTS:
                assert (self.p.frontier(t) or 0) == self.m_frontier[t]

    def do_job(self, job: str, action: str) -> None:
        if action == "restart":
            self.pending[job] = None
            self.forgot[job] = False
            return
        spec = JOBS[job]
        if action == "plan" or self.pending[job] is None:
            self.pending[job] = fresh = self.p.next_batch(job)
            self.forgot[job] = False
            if fresh is not None:  # a new plan starts after the sink's frontier and covers only
                # barriers every source has precommitted (by the model). Checked here, when it is
                # made: a rollback before it runs makes it stale (its commit is refused then).
                assert fresh.lo == self.m_frontier[spec.sink] + 1, (job, fresh.lo, self.m_frontier)
                assert fresh.lo <= fresh.hi <= self.model_barrier(spec.sources), (job, fresh.lo, fresh.hi)
            if action == "plan":
                return
        plan = self.pending[job]
        if plan is None:
            return
        batch = self.p.batch(plan)
        srcs = [plan.sources[s] for s in spec.sources]
        if spec.incremental:
            new = collections.Counter(self.rows(spec.sources[0], srcs[0].to_version))
            old = collections.Counter(self.rows(spec.sources[0], srcs[0].from_version))
            assert not (old - new), "a root lost rows between two barriers of one batch"
            batch.append(spec.sink, _table(spec.fn(sorted((new - old).elements()))))
        else:
            batch.overwrite(spec.sink, _table(spec.fn(*[self.rows(s.table, s.to_version) for s in srcs])))
        if action == "crash_before_commit":  # files written, the process dies: nothing visible
            batch.abort()
            self.pending[job] = None
            return
        version = self.tables[spec.sink].version
        try:
            res = batch.commit()
        except StaleBatchError:
            self.stats.stale += 1
            self.pending[job] = None
            return
        if res.replayed:
            assert self.forgot[job] is not False, "only a batch that committed before can be a replay"
            assert self.tables[spec.sink].version == version
            assert self.m_frontier[spec.sink] >= plan.hi
            self.stats.replays += 1
        else:
            assert self.forgot[job] is not True, "a batch committed twice"
            assert plan.lo == self.m_frontier[spec.sink] + 1, (job, plan.lo, self.m_frontier)
            self.m_frontier[spec.sink] = plan.hi
            self.stats.batches += 1
        if action == "crash_after_commit":  # committed, but the job restarts with the same plan
            self.forgot[job] = True
        else:
            self.pending[job] = None

    def do_check(self, scope: str) -> None:
        self.check(scope)

    # ----------------------------------------------------------------- checks
    def equations(self, versions: dict[str, int]) -> list[str]:
        bad = []
        for sink, sources, fn in EQUATIONS:
            if sink in versions and all(s in versions for s in sources):
                got = self.rows(sink, versions[sink])
                want = sorted(fn(*[self.rows(s, versions[s]) for s in sources]))
                if got != want:
                    bad.append(f"{sink} = {got} but f({', '.join(sources)}) = {want}")
        return bad

    def check_model(self, c: Any, tables: Sequence[str]) -> None:
        """The choice is the model's barrier, and every table reads the model's rows there."""
        want = self.model_barrier(tables)
        assert c.barrier == want, f"read_committed chose barrier {c.barrier}, the model says {want}\n{c.explanation}"
        for t in tables:
            got = self.rows(t, c.versions[t])
            assert got == self.model_rows(t, want), f"{t} at barrier {want}: {got} != {self.model_rows(t, want)}"

    def check(self, scope: str) -> None:
        c = self.p.choose(list(TABLES), scope=scope)  # type: ignore[arg-type]
        bad = self.equations(c.versions)
        assert not bad, f"read_committed at barrier {c.barrier} is inconsistent: {bad}\n{c.explanation}"
        self.check_model(c, TABLES)
        # a fresh pipeline has no cached topology: its choice takes the general
        # path (several statements in a transaction) instead of the one-statement one
        slow = Pipeline(self.catalog).choose(list(TABLES), scope=scope)  # type: ignore[arg-type]
        assert (slow.barrier, slow.versions) == (c.barrier, c.versions)
        sub = self.p.choose(["s.by_region", "s.orders", "s.users"])  # transitively related, scope query
        assert not self.equations(sub.versions), sub.explanation
        self.check_model(sub, ["s.by_region", "s.orders", "s.users"])
        self.stats.strong_checks += 2
        weak = self.p.choose(list(TABLES), level="read_uncommitted")
        self.stats.weak_checks += 1
        if self.equations(weak.versions):
            self.stats.weak_inconsistent += 1
            self.weak_bad = True

    def check_repeatable(self) -> None:
        with self.p.choose(list(TABLES), level="repeatable_read") as c:
            assert not self.equations(c.versions), c.explanation
            assert c.barrier == self.m_snap_newest, (c.barrier, self.m_snap_newest)
            for t in TABLES:
                assert self.rows(t, c.versions[t]) == self.model_rows(t, c.barrier), t
            self.stats.repeatable_checks += 1

    def drain(self) -> None:
        """Seal, then let every job catch up: the heads are consistent again."""
        self.seal()
        for _ in range(50):
            progressed = False
            for job in JOBS:
                self.pending[job] = None
                self.forgot[job] = False
                if self.p.next_batch(job) is not None:
                    self.do_job(job, "run")
                    progressed = True
            if not progressed:
                break
        weak = self.p.choose(list(TABLES), level="read_uncommitted")
        assert not self.equations(weak.versions), "caught up, the heads must agree"
        assert self.model_barrier(TABLES) == self.m_sealed  # every job caught up with the sealed epochs
