"""Where the pipeline stands, in one read: the operator's view of barriers.

:func:`status` reads, in one database transaction, what the ``lakestep
barriers`` grid, ``lakestep doctor`` and the HTML report show: the open
epoch, the newest sealed and COMMIT barriers, the coordinator lease (with the
database's clock), and per table its kind, writer, frontier, lag and which
recent barriers it holds a SNAPSHOT of. :meth:`Status.states` answers the
same question as :meth:`Pipeline.states` for every (table, barrier) of the
window without another round trip.

Lag (docs/design.md §3.2): a managed table is ``behind`` the newest sealed
barrier by ``sealed - frontier(t)`` barriers; in seconds, by how long the
first barrier it has not precommitted has been sealed (0 when it is not
behind). A root's frontier is the newest sealed barrier, so roots never lag.

:func:`lag_history` replays the same two numbers over a time window from the
seal records and the table's commits (a step per event), for the report's
charts.

Not guaranteed: ``lag_history`` takes the frontier at a time to be the barrier
of the newest commit carrying one that had landed by then; a rollback shows
as the frontier going back at the RESTORE's time, which is what happened.
Commit rows that cleanup pruned (older than the retention window) are not
there to replay.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Sequence

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from ..catalog import epoch, retention
from ..catalog import schema as S
from ..errors import InvalidArgumentError
from .facts import facts
from .graph import Graph, Job, TableKind
from .progress import catching_up, committed_from, frontier
from .sealing import Lease, epoch_row, read_lease
from .snapshots import oldest_retained
from .topology import Topology

if TYPE_CHECKING:
    from ..catalog import Catalog


@dataclass(frozen=True)
class TableStatus:
    """One table: what it is in the topology and where it stands."""

    table: str
    table_id: int
    kind: TableKind
    job: str | None  # the writing job (root tables: the first of their writers)
    readers: tuple[str, ...]  # jobs reading it
    frontier: int | None  # None: unmanaged
    behind: int | None  # barriers behind the newest sealed one; None: unmanaged
    lag_seconds: float | None  # how long the first barrier it has not precommitted has been sealed
    catching_up: bool
    version: int
    data_version: int
    last_commit_at: float
    snapshots: frozenset[int] = frozenset()  # barriers of the window with a live SNAPSHOT of this table


@dataclass(frozen=True)
class Status:
    """The pipeline of one catalog at one moment (``now`` is the database's clock)."""

    now: float
    open_epoch: int
    opened_at: float
    committed: int  # the newest COMMIT barrier
    oldest_retained: int | None  # the oldest barrier the coordinator's snapshots retain (None: no retention)
    lease: Lease
    generation: int
    barriers: range  # the window of sealed barriers the snapshots and seals cover
    seals: dict[int, float]  # barrier -> sealed_at, for the window
    tables: dict[str, TableStatus] = field(default_factory=dict)

    @property
    def sealed(self) -> int:
        """The newest sealed barrier (0: none yet)."""
        return epoch.sealed(self.open_epoch)

    @property
    def coordinator_alive(self) -> bool:
        """Does a coordinator hold an unexpired lease?"""
        return self.lease.holder is not None and self.lease.expires_at > self.now

    def managed(self) -> list[TableStatus]:
        """The topology's tables, roots first, then derived tables in lineage order."""
        return [t for t in self.tables.values() if t.kind != "unmanaged"]

    def states(self, table: str, barrier: int) -> frozenset[str]:
        """The states (``PRECOMMIT``, ``COMMIT``, ``SNAPSHOT``) of ``table`` at ``barrier``,
        by the rules of :meth:`Pipeline.states` (SNAPSHOT only within :attr:`barriers`)."""
        t = self.tables[table]
        out: set[str] = set()
        if t.frontier is not None and barrier <= t.frontier:
            out.add("PRECOMMIT")
        if t.frontier is not None and barrier <= self.committed:
            out.add("COMMIT")
        if barrier in t.snapshots:
            out.add("SNAPSHOT")
        return frozenset(out)

    def job(self, job: Job) -> "JobLag | None":
        """Where ``job`` stands, read from its sinks' statuses (None: none of its sinks is here).
        A derived job is as far as its least advanced sink: its frontier is their smallest,
        its lag their largest; a root job has no frontier of its own."""
        sinks = [self.tables[s] for s in job.sinks if s in self.tables]
        if not sinks:
            return None
        last = max(t.last_commit_at for t in sinks)
        if job.external_input:
            return JobLag(job.job_id, "root", None, None, None, last)
        fr = min(t.frontier or 0 for t in sinks)
        return JobLag(job.job_id, "derived", fr, self.sealed - fr, max(t.lag_seconds or 0.0 for t in sinks), last)


@dataclass(frozen=True)
class JobLag:
    """:meth:`Status.job`: a job's position (``frontier``, ``behind`` and ``lag_seconds`` are
    None for a root job), as the doctor and ``lakestep serve``'s metrics show it."""

    job_id: str
    kind: str  # root, derived
    frontier: int | None
    behind: int | None  # sealed barriers past the frontier
    lag_seconds: float | None
    last_commit_at: float


def status(catalog: "Catalog", topology: Topology | None = None, *, last: int = 10,
           tables: Sequence[str] | None = None) -> Status:
    """Where the pipeline stands (module docstring); ``last``: how many recent sealed
    barriers the window holds. ``tables``: the tables to describe (default: every
    table of the catalog)."""
    if last < 1:
        raise InvalidArgumentError("last must be >= 1", argument="last", value=last)
    topology = topology or Topology(catalog)
    with catalog.backend.read() as conn:
        return _status(conn, topology, last, tables)


def _status(conn: Connection, topology: Topology, last: int, only: Sequence[str] | None) -> Status:
    t = S.tables.c
    graph = topology.graph(conn)
    clock = topology.catalog.clock
    now = clock.shared_now(conn)
    open_, opened_at = epoch_row(conn)
    sealed = epoch.sealed(open_)
    window = range(max(1, sealed - last + 1), sealed + 1)
    q = sa.select(t.table_id, t.namespace, t.name, t.version, t.data_version, t.last_commit_at)
    heads = {int(r[0]): r for r in conn.execute(q.order_by(t.namespace, t.name))}
    if only is not None:
        wanted = set(only)
        heads = {k: r for k, r in heads.items() if f"{r[1]}.{r[2]}" in wanted}
    fx = facts(conn, [i for i in heads if graph.kind(i) != "unmanaged"] + graph.derived)
    committed = committed_from(graph, {i: fx[i] for i in graph.derived if i in fx}, open_)
    sc = S.snapshots.c
    snaps: dict[int, set[int]] = {}
    if window:
        for tid, b in conn.execute(sa.select(sc.table_id, sc.barrier).where(
                sc.barrier >= window.start, sc.barrier < window.stop,
                retention.live(S.snapshots, clock.now()))):
            snaps.setdefault(int(tid), set()).add(int(b))
    frontiers = {i: frontier(graph, f, open_) for i, f in fx.items()}
    need = {window.start} | {f + 1 for f in frontiers.values() if f is not None and f < sealed}
    seals = _seal_times(conn, [b for b in need if b <= sealed] + list(window))
    out: dict[str, TableStatus] = {}
    for tid in _lineage_order(graph, heads):
        r = heads[tid]
        ident = f"{r[1]}.{r[2]}"
        fr = frontiers.get(tid)
        behind = None if fr is None else sealed - fr
        lag = None if fr is None else (0.0 if fr >= sealed else max(0.0, now - seals.get(fr + 1, now)))
        w = graph.writers.get(tid, ())
        out[ident] = TableStatus(
            table=ident, table_id=tid, kind=graph.kind(tid), job=w[0] if w else None,
            readers=graph.readers.get(tid, ()), frontier=fr, behind=behind, lag_seconds=lag,
            catching_up=tid in fx and catching_up(graph, fx[tid], open_), version=int(r[3]),
            data_version=int(r[4]), last_commit_at=float(r[5]), snapshots=frozenset(snaps.get(tid, ())))
    return Status(now=now, open_epoch=open_, opened_at=opened_at, committed=committed,
                  oldest_retained=oldest_retained(conn, clock.now()), lease=read_lease(conn), generation=graph.generation,
                  barriers=window, seals={b: seals[b] for b in window}, tables=out)


def _seal_times(conn: Connection, barriers: Sequence[int]) -> dict[int, float]:
    c = S.seals.c
    ids = sorted(set(barriers))
    out: dict[int, float] = {}
    for i in range(0, len(ids), 5000):  # one statement up to 5,000 distinct barriers (facts._CHUNK)
        for b, at in conn.execute(sa.select(c.barrier, c.sealed_at).where(c.barrier.in_(ids[i:i + 5000]))):
            out[int(b)] = float(at)
    return out


def _lineage_order(graph: Graph, heads: dict[int, Any]) -> list[int]:
    """Roots, then derived tables by depth in the lineage, then unmanaged tables; by name within."""
    ups: dict[int, set[int]] = {}
    for src, sinks in graph.edges().items():
        for k in sinks:
            ups.setdefault(k, set()).add(src)
    depth: dict[int, int] = {}

    def d(tid: int) -> int:  # the topology has no cycles (topology.py refuses them)
        if tid not in depth:
            depth[tid] = 1 + max((d(s) for s in ups.get(tid, ())), default=-1)
        return depth[tid]

    rank = {"root": 0, "derived": 1, "unmanaged": 2}
    return sorted(heads, key=lambda tid: (rank[graph.kind(tid)], d(tid), f"{heads[tid][1]}.{heads[tid][2]}"))


# ------------------------------------------------------------------- history
@dataclass(frozen=True)
class LagSample:
    """The lag of a table from ``at`` until the next sample: ``barriers`` behind the newest
    sealed barrier, and ``seconds`` that the first barrier it lacks had been sealed at ``at``
    (it grows by one second per second until the next sample when ``barriers > 0``)."""

    at: float
    barriers: int
    seconds: float
    frontier: int
    sealed: int


_TAGGED = sa.text("""
SELECT version, barrier, committed_at FROM ls_commit
 WHERE table_id = :t AND barrier IS NOT NULL AND committed_at > :since AND committed_at <= :now
 ORDER BY version
""")
_TAGGED_BEFORE = sa.text("""
SELECT barrier FROM ls_commit
 WHERE table_id = :t AND barrier IS NOT NULL AND committed_at <= :since
 ORDER BY version DESC LIMIT 1
""")
_SEALED_BEFORE = sa.text("SELECT COALESCE(max(barrier), 0) FROM ls_seal WHERE sealed_at <= :since")
_SEALS = sa.text("SELECT barrier, sealed_at FROM ls_seal WHERE sealed_at > :since AND sealed_at <= :now ORDER BY barrier")


def lag_history(catalog: "Catalog", table: str, *, seconds: float = 3600.0, now: float | None = None,
                topology: Topology | None = None) -> list[LagSample]:
    """The lag of a derived table over the last ``seconds`` (up to ``now``, default the
    database's clock): one sample at the window's start, one at each seal and each
    barrier-carrying commit of the table, one at ``now``. Empty for a table that is
    not derived."""
    from ..catalog import parse_ident

    ns, name = parse_ident(table)
    topology = topology or Topology(catalog)
    with catalog.backend.read() as conn:
        t = S.tables.c
        tid = conn.execute(sa.select(t.table_id).where(t.namespace == ns, t.name == name)).scalar()
        if tid is None:
            from ..errors import TableNotFoundError

            raise TableNotFoundError(f"{ns}.{name}")
        if topology.graph(conn).kind(int(tid)) != "derived":
            return []
        now = catalog.clock.shared_now(conn) if now is None else float(now)
        since = now - seconds
        events: list[tuple[float, int, str, int]] = []  # (time, order, kind, barrier)
        for v, b, at in conn.execute(_TAGGED, {"t": tid, "since": since, "now": now}):
            events.append((float(at), int(v), "commit", int(b)))
        for b, at in conn.execute(_SEALS, {"since": since, "now": now}):
            events.append((float(at), int(b), "seal", int(b)))
        sealed = int(conn.execute(_SEALED_BEFORE, {"since": since}).scalar_one())
        f0 = conn.execute(_TAGGED_BEFORE, {"t": tid, "since": since}).scalar()
        fr = 0 if f0 is None else int(f0)
        events.sort(key=lambda e: (e[0], 0 if e[2] == "seal" else 1, e[1]))
        frontiers = {fr} | {e[3] for e in events if e[2] == "commit"}
        seal_at = _seal_times(conn, [f + 1 for f in frontiers])
    out = [_sample(since, fr, sealed, seal_at)]
    for at, _, kind, b in events:
        if kind == "seal":
            sealed = max(sealed, b)
        else:
            fr = b
        out.append(_sample(at, fr, sealed, seal_at))
    out.append(_sample(now, fr, sealed, seal_at))
    return out


def _sample(at: float, fr: int, sealed: int, seal_at: dict[int, float]) -> LagSample:
    fr = min(fr, sealed)
    behind = sealed - fr
    secs = 0.0 if behind == 0 else max(0.0, at - seal_at.get(fr + 1, at))
    return LagSample(at, behind, secs, fr, sealed)
