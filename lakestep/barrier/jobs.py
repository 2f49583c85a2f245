"""Derived jobs: which barriers to process next, and committing them safely.

A derived job processes barriers in order. The protocol of one micro-batch:

1. **plan** (:func:`plan_batch`): ``lo`` = the lowest barrier the job has not
   processed (its sinks' frontier + 1); it is ready once every managed source
   has precommitted it. The batch covers ``lo..hi``: ``hi`` is the newest
   barrier all sources have precommitted, lowered to the first barrier at
   which a source's data changes. So the sources hold the same rows at every
   barrier of ``lo..hi-1`` as at ``lo-1``, and every barrier stays a
   consistent point of the sink (the sink's state at those barriers is its
   previous one, which is right). Each source comes with ``from_version``
   (its version at ``lo-1``) and ``to_version`` (at ``hi``): the batch reads
   the rows between them, or all rows at ``to_version``;
2. **compute and write** the output (data files, nothing visible yet);
3. **commit** (:class:`JobBatch`): one database transaction that
   a. locks the topology row (shared) and the sink rows;
   b. checks the plan still holds: the job is active, every sink's frontier is
      still ``lo-1``, and every source still holds, at ``lo-1`` and at
      ``hi``, the data versions the plan read (a rollback or a second
      instance of the job makes the batch *stale*: :class:`StaleBatchError`);
   c. commits the writes to every sink, tagged ``hi`` (a sink with no output
      gets an empty commit: it still precommits the barriers). That commit
      precommits ``lo..hi`` for the sinks.
   If every sink has already precommitted ``hi`` the batch is a **replay**
   (a restarted job redoing a batch that committed before its crash):
   nothing is committed, the earlier commits are returned with
   ``replayed=True``.

Idempotency therefore rests on (job, barrier) checked in the commit
transaction, not on a batch id: after a rollback the same barriers are
processed again, as they must be.

Not guaranteed: a job that reads its sources at other versions than the
plan's, or writes its sinks outside a :class:`JobBatch`, gets no consistency
check. Files written by a batch that does not commit are deleted on a best
effort basis (cleanup collects the rest).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from ..catalog import schema as S
from ..catalog.changes import CommitResult, FilesMode, Isolation
from ..errors import InvalidArgumentError
from . import rules
from .errors import JobNotFoundError, StaleBatchError
from .facts import facts, facts_ex, heads, versions_and_changes, versions_at, versions_at_both
from .graph import Graph, Job, TableKind
from .progress import frontier, job_frontier, tag_frontier
from .topology import Topology, read_generation

if TYPE_CHECKING:
    from ..catalog import Catalog, Table
    from ..catalog.files import NewFile
    from ..catalog.predicates import Filter, Predicate

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SourceRange:
    """What a batch reads of one source: the rows of ``to_version`` not in ``from_version``
    (or all rows at ``to_version``). Unmanaged sources are read at their head."""

    table: str
    table_id: int
    kind: TableKind
    from_version: int
    to_version: int
    from_data_version: int
    to_data_version: int


@dataclass(frozen=True)
class BatchPlan:
    """The barriers ``lo..hi`` a derived job may process now, and what to read."""

    job_id: str
    lo: int
    hi: int
    sources: dict[str, SourceRange]
    sinks: tuple[str, ...]  # the sinks this batch commits (those at frontier lo-1)
    sink_ids: tuple[int, ...]
    planned_at: float = field(default_factory=time.time)

    @property
    def barrier(self) -> int:
        """The barrier the batch's commits carry (``hi``)."""
        return self.hi

    @property
    def barriers(self) -> range:
        return range(self.lo, self.hi + 1)


@dataclass(frozen=True)
class BatchResult:
    plan: BatchPlan
    replayed: bool
    results: list[CommitResult]


def _job(graph: Graph, job_id: str) -> Job:
    job = graph.jobs.get(job_id)
    if job is None:
        raise JobNotFoundError(job_id)
    return job


def plan_batch(conn: Connection, graph: Graph, job_id: str, *, max_barriers: int | None = None,
               refresh: "Callable[[Connection], Graph] | None" = None) -> BatchPlan | None:
    """Step 1 of the protocol, in ``conn``'s read transaction; None when nothing is ready.
    ``graph`` may be a cached one: ``refresh`` reads the current one when the generation read
    with the facts differs (without it, ``graph`` is taken as read in this transaction)."""
    if refresh is not None and job_id not in graph.jobs:  # registered since the graph was read?
        graph = refresh(conn)
    job = _job(graph, job_id)
    if job.external_input:
        raise InvalidArgumentError(f"job {job_id!r} has external input: its commits carry barrier=OPEN_EPOCH, "
                                   "it does not plan barriers", argument="job_id", value=job_id)
    if max_barriers is not None and max_barriers < 1:
        raise InvalidArgumentError("max_barriers must be >= 1", argument="max_barriers", value=max_barriers)
    # the facts with the generation and the open epoch in one statement; a graph that is not the
    # generation read there is read again (the caller's may be the cached one)
    gen, open_, fx = facts_ex(conn, set(job.sink_ids) | set(job.source_ids))
    if refresh is not None and gen != graph.generation:
        graph = refresh(conn)
        job = _job(graph, job_id)
        fx.update(facts(conn, (set(job.sink_ids) | set(job.source_ids)) - set(fx)))
    managed = [s for s in job.source_ids if graph.kind(s) != "unmanaged"]
    sink_fr = {t: tag_frontier(fx[t], open_) for t in job.sink_ids}
    processed = job_frontier(graph, fx, job, open_)
    lo = processed + 1
    ready = rules.ready((frontier(graph, fx[s], open_) for s in managed), open_)
    if lo > ready:
        return None
    hi = ready if max_barriers is None else min(ready, lo + max_barriers - 1)
    start, changes = versions_and_changes(conn, managed, lo - 1)
    for s in managed:
        b = changes[s]
        if b is not None:
            hi = max(lo, min(hi, b))
    end = versions_at(conn, managed, hi)
    sources: dict[str, SourceRange] = {}
    head = heads(conn, [s for s in job.source_ids if s not in managed])
    for s in job.source_ids:
        name = fx[s].ident
        if s in start:
            a, b_ = start[s], end[s]
        else:
            a = b_ = head[s]
        sources[name] = SourceRange(name, s, graph.kind(s), a.version, b_.version, a.data_version, b_.data_version)
    sinks = tuple(t for t in job.sink_ids if sink_fr[t] == processed)
    return BatchPlan(job_id, lo, hi, sources, tuple(fx[t].ident for t in sinks), sinks)


# ---------------------------------------------------------------------------
_LOCK_TABLES = (
    sa.select(S.tables.c.table_id)
    .where(S.tables.c.table_id.in_(sa.bindparam("ids", expanding=True)))
    .order_by(S.tables.c.table_id)
    .with_for_update()
)
_TAGGED = sa.text("""
SELECT version, data_version, operation, base_version, barrier, committed_at, added_files, removed_files,
       added_rows, removed_rows
  FROM ls_commit WHERE table_id = :t AND barrier = :b ORDER BY version DESC LIMIT 1
""")


class JobBatch:
    """The writes of one derived-job micro-batch, committed with the checks of step 3.

    Example::

        plan = pipeline.next_batch("daily")
        if plan is not None:
            src = plan.sources["shop.orders"]
            rows = orders.to_arrow(version=src.to_version)
            with pipeline.batch(plan) as b:
                b.overwrite("shop.daily", aggregate(rows))
            b.result.replayed   # True if an earlier run had committed it
    """

    def __init__(self, catalog: "Catalog", topology: Topology, plan: BatchPlan,
                 tables: "Callable[[str, int], Table] | None" = None, *, job_id: str | None = None,
                 batch_id: int | None = None) -> None:
        self.catalog = catalog
        self.topology = topology
        self.plan = plan
        # (job_id, batch_id): the key of a streaming micro-batch, so that a replay of it finds it
        self.tx = catalog.transaction(job_id=job_id, batch_id=batch_id, guard=self._guard)
        self.result: BatchResult | None = None
        self._load: "Callable[[str, int], Table]" = tables or (lambda ident, _tid: catalog.load_table(ident))

    def __enter__(self) -> "JobBatch":
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if self.result is not None or self.tx.closed:
            return
        if exc_type is None:
            self.commit()
        else:
            self.abort()

    def _sink(self, table: "Table | str") -> "Table":
        if not isinstance(table, str):
            t = table
        elif table in self.plan.sinks:
            t = self._load(table, self.plan.sink_ids[self.plan.sinks.index(table)])
        else:  # another spelling of a sink's name, or not a sink
            t = self.catalog.load_table(table)
        if t.table_id not in self.plan.sink_ids:
            raise InvalidArgumentError(f"{t.ident} is not a sink this batch commits ({list(self.plan.sinks)})",
                                       argument="table", value=t.ident)
        return t

    def append(self, table: "Table | str", data: Any, *, prefix: str = "") -> None:
        self.tx.append(self._sink(table), data, barrier=self.plan.hi, prefix=prefix)

    def overwrite(self, table: "Table | str", data: Any, *, partitions: Any = None,
                  where: "Filter | Predicate | None" = None, prefix: str = "") -> None:
        self.tx.overwrite(self._sink(table), data, partitions=partitions, where=where, barrier=self.plan.hi,
                          prefix=prefix)

    def upsert(self, table: "Table | str", data: Any, *, prefix: str = "") -> None:
        self.tx.upsert(self._sink(table), data, barrier=self.plan.hi, prefix=prefix)

    def delete(self, table: "Table | str", where: "Filter | Predicate", *, isolation: Isolation | None = None) -> None:
        self.tx.delete(self._sink(table), where, isolation=isolation, barrier=self.plan.hi)

    def update(self, table: "Table | str", set: Mapping[str, Any], where: "Filter | Predicate", *,
               isolation: Isolation | None = None) -> None:
        self.tx.update(self._sink(table), set, where, isolation=isolation, barrier=self.plan.hi)

    def add_files(self, table: "Table | str", files: "Sequence[NewFile]", *, mode: FilesMode = "append") -> None:
        """Files written elsewhere (Spark executors), tagged ``hi`` (:meth:`Transaction.add_files`)."""
        self.tx.add_files(table, files, mode=mode, barrier=self.plan.hi)

    def abort(self) -> None:
        self.tx.abort()

    def commit(self) -> BatchResult:
        """Step 3: check the plan and commit every sink, tagged ``hi``, in one transaction."""
        plan = self.plan
        for ident, tid in zip(plan.sinks, plan.sink_ids):
            if tid not in self.tx.changes:
                t = self._load(ident, tid)
                self.tx.append(t, t.schema.empty_table(), barrier=plan.hi)
        results = self.tx.commit()  # the guard checks the plan (step 3b); its errors discard the files
        self.result = BatchResult(plan, self.tx.replayed, results)
        return self.result

    def _guard(self, conn: Connection) -> list[CommitResult] | None:
        plan = self.plan
        gen = read_generation(conn, lock="share")
        if self.catalog.backend.row_locks:
            conn.execute(_LOCK_TABLES, {"ids": sorted(plan.sink_ids)})
        graph = self.topology.graph_at(conn, gen)  # the generation is locked: a graph of it is current
        job = graph.jobs.get(plan.job_id)
        if job is None:
            raise StaleBatchError(job_id=plan.job_id, barrier=plan.hi, table="-", reason="the job is retired")
        src_ids = [s.table_id for s in plan.sources.values()]
        _, open_, fx = facts_ex(conn, set(plan.sink_ids) | set(src_ids))
        fr = {t: tag_frontier(fx[t], open_) for t in plan.sink_ids}
        if all(f >= plan.hi for f in fr.values()):
            log.info("job %s: barriers %d..%d were committed before: replay", plan.job_id, plan.lo, plan.hi)
            return [self._replayed(conn, t, fx[t].ident) for t in plan.sink_ids]
        for t, f in fr.items():
            if t not in job.sink_ids:
                raise StaleBatchError(job_id=plan.job_id, barrier=plan.hi, table=fx[t].ident,
                                      reason="no longer a sink of the job")
            if f != plan.lo - 1:
                raise StaleBatchError(job_id=plan.job_id, barrier=plan.hi, table=fx[t].ident,
                                      reason=f"its frontier is {f}, the batch starts at {plan.lo}")
        managed = [s for s in plan.sources.values() if s.kind != "unmanaged"]
        now_lo, now_hi = versions_at_both(conn, [s.table_id for s in managed], plan.lo - 1, plan.hi)
        for s in managed:
            sf = frontier(graph, fx[s.table_id], open_)
            if sf is None or sf < plan.hi:
                raise StaleBatchError(job_id=plan.job_id, barrier=plan.hi, table=s.table,
                                      reason=f"source frontier is {sf}, below barrier {plan.hi}")
            if (now_lo[s.table_id].data_version, now_hi[s.table_id].data_version) != (
                    s.from_data_version, s.to_data_version):
                raise StaleBatchError(job_id=plan.job_id, barrier=plan.hi, table=s.table,
                                      reason="the source's data at the batch's barriers changed since it was "
                                             "planned (a rollback?)")
        return None

    def _replayed(self, conn: Connection, table_id: int, ident: str) -> CommitResult:
        r = conn.execute(_TAGGED, {"t": table_id, "b": self.plan.hi}).mappings().first()
        if r is None:  # precommitted hi by a later batch covering it
            return CommitResult(table=ident, version=-1, data_version=-1, operation="APPEND", base_version=-1,
                                barrier=self.plan.hi, replayed=True)
        return CommitResult(
            table=ident, version=r["version"], data_version=r["data_version"], operation=r["operation"],
            base_version=r["base_version"], added_files=r["added_files"], removed_files=r["removed_files"],
            added_rows=r["added_rows"], removed_rows=r["removed_rows"], barrier=r["barrier"],
            committed_at=r["committed_at"], replayed=True,
        )
