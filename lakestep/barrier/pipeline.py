"""The barrier API of one catalog, in one object.

Example::

    from lakestep import Catalog, Coordinator, Pipeline

    cat = Catalog(warehouse="./wh")
    p = Pipeline(cat)
    p.register_job("ingest", sinks=["shop.orders"], external_input=True)
    p.register_job("daily", sources=["shop.orders"], sinks=["shop.daily"])
    coord = Coordinator(cat, interval=1.0)          # lakestep.services: seals an epoch every second
    coord.start()

    orders.append(rows, barrier=OPEN_EPOCH)         # the root job's commits

    plan = p.next_batch("daily")                    # the derived job's loop
    if plan is not None:
        with p.batch(plan) as b:
            b.overwrite("shop.daily", f(orders.to_arrow(version=plan.sources["shop.orders"].to_version)))

    c = p.choose(["shop.orders", "shop.daily"])     # read_committed, scope query
    c.barrier, c.versions, print(c.explanation)
"""

from __future__ import annotations

import threading
import weakref
from typing import TYPE_CHECKING, Any, Sequence

import sqlalchemy as sa

from ..catalog import schema as S
from ..catalog.checks import check_barrier
from ..errors import VersionNotFoundError
from . import rules
from .choose import Choice, Level, Scope, TableIds, choose, norm_idents
from .errors import BarrierNotRetainedError, JobNotFoundError
from .facts import At, facts, heads, version_at
from .graph import Job
from .jobs import BatchPlan, JobBatch, plan_batch
from .progress import BarrierState, catching_up, committed_barrier, frontier, job_frontier, table_states
from .rollback import RollbackResult, rollback
from .sealing import Seal, epoch_row, open_epoch
from .snapshots import common_snapshot, oldest_retained
from .topology import Topology

if TYPE_CHECKING:
    from ..catalog import Catalog, Table
    from .status import LagSample, Status


#: Pipeline.change_token: the open epoch, the topology's generation, and each table's newest version.
_TOKEN = (sa.select(S.epoch.c.open_epoch, S.topology.c.generation, S.tables.c.table_id, S.tables.c.version)
          .select_from(S.epoch.join(S.topology, sa.true()).join(S.tables, sa.true()))  # one row each: no product
          .where(S.epoch.c.id == 1, S.topology.c.id == 1,
                 S.tables.c.table_id.in_(sa.bindparam("ids", expanding=True))))


class Pipeline:
    """Topology, epochs, states, derived-job batches, consistent reads and rollback of one catalog."""

    def __init__(self, catalog: "Catalog") -> None:
        self.catalog = catalog
        self.topology = Topology(catalog)
        self._resolver = TableIds()
        self._tables: dict[str, "Table"] = {}

    def table(self, ident: str, table_id: int | None = None) -> "Table":
        """A table handle, cached by name; loaded again when ``table_id`` says the
        name now belongs to another table (dropped and created again)."""
        t = self._tables.get(ident)
        if t is None or (table_id is not None and t.table_id != table_id):
            t = self._tables[ident] = self.catalog.load_table(ident)
        return t

    def __repr__(self) -> str:
        return f"Pipeline({self.catalog!r})"

    # ---------------------------------------------------------------- topology
    def register_job(self, job_id: str, *, sources: Sequence[str] = (), sinks: Sequence[str],
                     external_input: bool = False, description: str = "") -> Job:
        """See :meth:`Topology.register_job`."""
        return self.topology.register_job(job_id, sources=sources, sinks=sinks, external_input=external_input,
                                          description=description)

    def retire_job(self, job_id: str) -> Job:
        return self.topology.retire_job(job_id)

    # ------------------------------------------------------------------ epochs
    def open_epoch(self) -> int:
        with self.catalog.backend.read() as conn:
            return open_epoch(conn)

    def opened_at(self) -> float:
        with self.catalog.backend.read() as conn:
            return epoch_row(conn)[1]

    def seals(self, *, since: int = 0) -> list[Seal]:
        """The seal records of barriers > ``since``, oldest first."""
        c = S.seals.c
        with self.catalog.backend.read() as conn:
            rows = conn.execute(sa.select(S.seals).where(c.barrier > since).order_by(c.barrier)).mappings().all()
        return [Seal(int(r["barrier"]), r["opened_at"], r["sealed_at"], r["holder"], int(r["token"])) for r in rows]

    # ------------------------------------------------------------------ states
    def _id(self, conn: Any, table: "str | Table") -> int:
        ident = norm_idents([table])[0]
        return self._resolver.resolve(conn, [ident])[ident]

    def frontier(self, table: "str | Table") -> int | None:
        """The highest barrier ``e`` such that ``table`` precommitted every barrier ``<= e``
        (None for a table outside the topology)."""
        with self.catalog.backend.read() as conn:
            tid = self._id(conn, table)
            g = self.topology.graph(conn)
            return frontier(g, facts(conn, [tid])[tid], open_epoch(conn))

    def change_token(self, tables: Sequence["str | Table"]) -> tuple[Any, ...]:
        """A value that stays equal while nothing that a plan (:meth:`next_batch`) or a choice
        (:meth:`choose`) over ``tables`` depends on has changed: the open epoch, the topology's
        generation, and each table's newest version. Cheap (one statement of indexed reads): a
        poller compares it and plans or chooses again only when it differs.

        Not guaranteed: the converse. A changed token may bring the same answer (a commit
        that precommits nothing new)."""
        with self.catalog.backend.statement() as conn:  # one statement, its own snapshot
            ids = self._resolver.resolve(conn, norm_idents(list(tables)))
            rows = conn.execute(_TOKEN, {"ids": sorted(ids.values())}).all()
            return tuple(sorted(tuple(r) for r in rows)) or (None,)

    def job_frontier(self, job_id: str) -> int:
        """The barrier the job's sinks have all precommitted (what its batches reached; 0 if none)."""
        with self.catalog.backend.read() as conn:
            g = self.topology.graph(conn)
            job = g.jobs.get(job_id)
            if job is None:
                raise JobNotFoundError(job_id)
            return job_frontier(g, facts(conn, job.sink_ids), job, open_epoch(conn))

    def ready_barrier(self, job_id: str) -> int:
        """The newest barrier every managed source of the job has precommitted (what it could
        read up to); the job's own frontier when no source is managed."""
        with self.catalog.backend.read() as conn:
            g = self.topology.graph(conn)
            job = g.jobs.get(job_id)
            if job is None:
                raise JobNotFoundError(job_id)
            o = open_epoch(conn)
            fx = facts(conn, set(job.source_ids) | set(job.sink_ids))
            known = [f for f in (frontier(g, fx[s], o) for s in job.source_ids) if f is not None]
            return rules.ready(known, o) if known else job_frontier(g, fx, job, o)

    def committed_barrier(self) -> int:
        """The newest barrier in state COMMIT (every table of the COMMIT set precommitted it)."""
        with self.catalog.backend.read() as conn:
            return committed_barrier(conn, self.topology.graph(conn), open_epoch(conn))

    def snapshot_barrier(self, tables: Sequence["str | Table"] | None = None) -> int | None:
        """The newest barrier that is a SNAPSHOT of every table given (default: the COMMIT set)."""
        with self.catalog.backend.read() as conn:
            g = self.topology.graph(conn)
            if tables is None:
                o = open_epoch(conn)
                fx = facts(conn, g.managed)
                ids = [t for t in g.managed if not catching_up(g, fx[t], o)]
            else:
                ids = [self._id(conn, t) for t in tables]
            found = common_snapshot(conn, ids, self.catalog.clock.now())
            return None if found is None else found[0]

    def states(self, table: "str | Table", barrier: int) -> frozenset[BarrierState]:
        """The states ``table`` holds for ``barrier`` (empty: none yet)."""
        barrier = check_barrier(barrier)
        with self.catalog.backend.read() as conn:
            tid = self._id(conn, table)
            return table_states(conn, self.topology.graph(conn), tid, barrier, open_epoch(conn),
                                self.catalog.clock.now())

    def version_at(self, table: "str | Table", barrier: int, *, strict: bool = True) -> int:
        """Time travel by barrier: the version of ``table`` at ``barrier`` (:meth:`at`)."""
        return self.at(table, barrier, strict=strict).version

    def at(self, table: "str | Table", barrier: int, *, strict: bool = True) -> At:
        """The version of ``table`` at ``barrier`` (rules.py, rule 9), with its data version.

        Refused (:class:`BarrierNotRetainedError`) below the oldest barrier the
        coordinator's snapshots retain, when retention is in force; with
        ``strict``, refused (:class:`VersionNotFoundError`) above the table's
        frontier, where it has not precommitted the barrier yet (``strict=False``
        gives its newest state then). An unmanaged table answers its head. A
        barrier below 0 raises :class:`InvalidArgumentError`.
        """
        barrier = check_barrier(barrier)
        with self.catalog.backend.read() as conn:
            tid = self._id(conn, table)
            since = oldest_retained(conn, self.catalog.clock.now())
            if since is not None and barrier < since:
                raise BarrierNotRetainedError(str(table), barrier, since)
            g = self.topology.graph(conn)
            f = facts(conn, [tid])[tid]
            if g.kind(tid) == "unmanaged":
                return heads(conn, [tid])[tid]
            fr = frontier(g, f, open_epoch(conn))
            if strict and fr is not None and barrier > fr:
                raise VersionNotFoundError(f.ident, f"state at barrier {barrier} (precommitted up to {fr})")
            return version_at(conn, tid, barrier)

    # -------------------------------------------------------------------- jobs
    def next_batch(self, job_id: str, *, max_barriers: int | None = None) -> BatchPlan | None:
        """What the derived job may process now (jobs.py); None when nothing is ready."""
        with self.catalog.backend.read() as conn:
            # the cached graph, checked against the generation plan_batch reads with the facts
            return plan_batch(conn, self.topology.cached or self.topology.graph(conn), job_id,
                              max_barriers=max_barriers, refresh=self.topology.graph)

    def next_barrier(self, job_id: str) -> int | None:
        """The lowest barrier the job has not processed that all its sources have precommitted."""
        plan = self.next_batch(job_id, max_barriers=1)
        return None if plan is None else plan.lo

    def batch(self, plan: BatchPlan, *, job_id: str | None = None, batch_id: int | None = None) -> JobBatch:
        """The writes of a planned batch; committed on a clean ``with`` exit (jobs.py).
        ``(job_id, batch_id)``: a streaming micro-batch's idempotency key, recorded with it."""
        return JobBatch(self.catalog, self.topology, plan, self.table, job_id=job_id, batch_id=batch_id)

    # ------------------------------------------------------------------- reads
    def choose(self, tables: Sequence["str | Table"], *, level: Level = "read_committed", scope: Scope = "query",
               locker: str | None = None, lease_seconds: float | None = 300.0) -> Choice:
        """The versions to read ``tables`` at, consistently (choose.py)."""
        return choose(self.catalog, self.topology, self._resolver, tables, level=level, scope=scope, locker=locker,
                      lease_seconds=lease_seconds, load=self.table)

    # ------------------------------------------------------------------ status
    def status(self, *, last: int = 10) -> "Status":
        """Where every table stands, and the states of the ``last`` sealed barriers (status.py)."""
        from .status import status

        return status(self.catalog, self.topology, last=last)

    def lag_history(self, table: "str | Table", *, seconds: float = 3600.0) -> "list[LagSample]":
        """A derived table's lag over the last ``seconds``, barriers and seconds (status.py)."""
        from .status import lag_history

        return lag_history(self.catalog, table if isinstance(table, str) else table.ident, seconds=seconds,
                           topology=self.topology)

    # ---------------------------------------------------------------- rollback
    def rollback(self, to: int) -> RollbackResult:
        """Make every commit with a barrier above ``to`` invisible in every table (rollback.py)."""
        to = check_barrier(to, "to")
        return rollback(self.catalog, self.topology, to, load=self.table)


_shared: "weakref.WeakKeyDictionary[Catalog, Pipeline]" = weakref.WeakKeyDictionary()
_shared_lock = threading.Lock()


def shared_pipeline(catalog: "Catalog") -> Pipeline:
    """One :class:`Pipeline` per catalog for the whole process: its topology, name and table caches
    serve every read (lakestep.query's consistent reads, the ``lakestep`` Spark batch source)."""
    with _shared_lock:
        p = _shared.get(catalog)
        if p is None:
            p = _shared[catalog] = Pipeline(catalog)
        return p
