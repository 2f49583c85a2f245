"""Sealing epochs: the coordinator lease, sealing, and the snapshots of committed barriers (the
open epoch itself is catalog/epoch.py's; named epochs.py until 0.2).

**The open epoch** ``O`` (row ``ls_epoch``) has one owner, ``lakestep.catalog.epoch``:
its reads, the ``OPEN_EPOCH`` placeholder and its substitution, and the newest
sealed barrier ``O - 1``. The catalog's commit path stamps root commits with it
inside the commit's own database transaction; this module seals it (the only
writer) and re-exports the reads (:func:`open_epoch`, :func:`epoch_row`).

Each protocol below is one database transaction (``backend.write()``); times
are the catalog clock's ``shared_now`` (lakestep/clock.py): the database's
clock in production, so coordinators on several hosts agree on expiry.

**Acquire** the lease (:func:`acquire`):

1. lock the lease row ``ls_coordinator`` (FOR UPDATE; SQLite: the one writer);
2. if it is free or expired, take it: ``holder`` = me, ``token`` = token + 1,
   ``expires_at`` = now + lease; if I hold it, extend it; else change nothing.

**Seal** the open epoch ``e`` (:func:`seal`):

1. lock the lease row and refuse (:class:`NotCoordinatorError`) unless holder
   and token are mine and the lease has not expired. This is the fencing: a
   takeover bumps the token, so a coordinator that lost its lease (paused,
   partitioned, slow) can never seal;
2. lock the epoch row FOR UPDATE. Root commits read the open epoch FOR SHARE
   inside their own commit transaction (commit.py; appends.py's one-statement
   fast path), so this waits for every root commit in flight; on SQLite
   writers are serialized anyway;
3. open ``e + 1`` (compare-and-set on ``e``), record the seal in ``ls_seal``
   (its primary key: a barrier is sealed at most once), extend the lease;
   commit. On PostgreSQL steps 2 and 3 are one statement (a CTE whose first
   part takes the lock: one round trip instead of four).

Once step 3 commits, no commit can carry ``e``: sealed is final. Epochs are
never skipped: each seal moves the open epoch by exactly one.

**Snapshots** of committed barriers (:func:`take_snapshots`), fenced the same
way: for every multiple of ``every`` among the barriers committed since the
last run, one ``ls_snapshot`` row per table of the COMMIT set, named
``lakestep-barrier-<e>``, at that table's version at ``e``; all in one
transaction, so a barrier is snapshotted in every table or in none. Then
retention: by count (the newest ``retain_count`` barriers) and by age
(``expires_at``). Snapshot rows protect their versions from cleanup. The
running coordinator does this inside its seal transaction, between steps 1
and 2 (:func:`seal_and_snapshot`): one write transaction per tick.

Not guaranteed: while the lease holder is alive but cannot reach the
database, nobody seals until its lease expires (a standby takes over then).
"""

from __future__ import annotations

import os
import socket
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, Sequence

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from .. import _failpoints
from ..catalog import epoch, retention
from ..catalog import schema as S
from ..clock import database_now
from ..errors import InternalError, InvalidArgumentError
from .errors import NotCoordinatorError
from .facts import facts, facts_ex, versions_at
from .graph import Graph
from .progress import commit_set, committed_barrier, committed_from
from .snapshots import SNAPSHOT_PREFIX

if TYPE_CHECKING:
    from ..catalog import Catalog

_LEASE = sa.select(S.coordinator).where(S.coordinator.c.id == 1)
_LOCK_LEASE = _LEASE.with_for_update()
_PENDING = sa.text(
    "SELECT 1 FROM ls_commit WHERE table_id IN :ids AND barrier = :e LIMIT 1"
).bindparams(sa.bindparam("ids", expanding=True))


class GraphSource(Protocol):
    """Where the snapshots read the topology from (a :class:`~lakestep.barrier.Topology`)."""

    def graph(self, conn: Connection) -> Graph: ...

    def graph_at(self, conn: Connection, generation: int) -> Graph: ...

    @property
    def cached(self) -> Graph | None: ...


open_epoch = epoch.open_epoch  # the open epoch O (catalog/epoch.py)
epoch_row = epoch.read  # (open epoch, when it was opened)


db_now = database_now  # the database server's clock (SystemClock.shared_now)


@dataclass(frozen=True)
class Lease:
    """The coordinator lease as read from the catalog (or as held by this process)."""

    holder: str | None
    token: int
    acquired_at: float | None
    expires_at: float
    snapshot_barrier: int


@dataclass(frozen=True)
class Seal:
    """One sealed epoch."""

    barrier: int
    opened_at: float
    sealed_at: float
    holder: str
    token: int


def _lease(row: sa.RowMapping) -> Lease:
    return Lease(row["holder"], int(row["token"]), row["acquired_at"], float(row["expires_at"]),
                 int(row["snapshot_barrier"]))


def read_lease(conn: Connection, *, lock: bool = False) -> Lease:
    return _lease(conn.execute(_LOCK_LEASE if lock else _LEASE).mappings().one())


def _fence(catalog: "Catalog", conn: Connection, lease: Lease) -> tuple[float, Lease]:
    """Step 1 of seal and snapshots: lock the lease row, check it is still ours.
    Returns the shared clock and the lease row."""
    cur = read_lease(conn, lock=True)
    now = catalog.clock.shared_now(conn)
    if cur.holder != lease.holder or cur.token != lease.token or cur.expires_at <= now:
        raise NotCoordinatorError(holder=str(lease.holder), token=lease.token, current_holder=cur.holder,
                                  current_token=cur.token, expires_at=cur.expires_at)
    return now, cur


def default_holder() -> str:
    """A lease holder's name, unique per process: ``host:pid:random:where`` (the coordinator's and
    the Iceberg publisher's leases, when no name is given); ``where`` names the machine's boot and
    the process's PID namespace (:func:`_where`), so that :func:`holder_gone` can tell a process of
    its own host and namespace from one elsewhere."""
    where = _where()
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}" + (f":{where}" if where else "")


def _where() -> str:
    """This boot of this machine and this process's PID namespace ("" where /proc does not say)."""
    try:
        boot = open("/proc/sys/kernel/random/boot_id").read().strip().replace("-", "")[:12]
        return f"{boot}.{os.stat('/proc/self/ns/pid').st_ino}"
    except OSError:
        return ""


def holder_gone(holder: str | None) -> bool:
    """Whether ``holder`` is a :func:`default_holder` name of a process that has exited: one of this
    host, boot and PID namespace (the same ``where``) whose PID no live process has. A lease such a
    holder still has is taken over at once instead of when it expires: a supervisor that restarts a
    killed coordinator or publisher gets its work going again in a second, not a lease later.

    Never true for a name given by the user, one from another machine, boot or namespace, one
    without ``where`` (an older lakestep), this process's own PID, or a PID some process has now
    (even a new process that reused it: then the lease expires as it always did). A wrong answer
    would cost no correctness, only liveness: every lease is fenced by its token."""
    parts = (holder or "").split(":")
    if len(parts) != 4 or not parts[1].isdigit():
        return False
    host, pid, _, where = parts
    if host != socket.gethostname() or not where or where != _where() or int(pid) == os.getpid():
        return False
    return not _alive(int(pid))


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: it exists
        return True
    try:  # a zombie (exited, not reaped yet) is gone
        return open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


def acquire(catalog: "Catalog", holder: str, lease_seconds: float, *, held: Lease | None = None) -> Lease | None:
    """Take (or extend) the lease; None when another live coordinator holds it."""
    with catalog.backend.write() as conn:
        cur = read_lease(conn, lock=True)
        now = catalog.clock.shared_now(conn)
        c = S.coordinator.c
        if held is not None and cur.holder == holder and cur.token == held.token and cur.expires_at > now:
            conn.execute(sa.update(S.coordinator).where(c.id == 1).values(expires_at=now + lease_seconds))
            return Lease(holder, cur.token, cur.acquired_at, now + lease_seconds, cur.snapshot_barrier)
        if cur.holder is not None and cur.expires_at > now and not holder_gone(cur.holder):
            return None
        token = cur.token + 1
        conn.execute(sa.update(S.coordinator).where(c.id == 1, c.token == cur.token).values(
            holder=holder, token=token, acquired_at=now, expires_at=now + lease_seconds))
        return Lease(holder, token, now, now + lease_seconds, cur.snapshot_barrier)


def release(catalog: "Catalog", lease: Lease) -> bool:
    """Give the lease up at once (a standby takes over without waiting for expiry)."""
    with catalog.backend.write() as conn:
        c = S.coordinator.c
        res = conn.execute(sa.update(S.coordinator).where(c.id == 1, c.holder == lease.holder, c.token == lease.token)
                           .values(holder=None, expires_at=0.0))
        return res.rowcount == 1


@dataclass(frozen=True)
class SnapshotPolicy:
    """Snapshot every ``every``-th committed barrier; keep the newest ``retain_count``
    barriers (None: all) and expire each after ``retain_seconds`` (None: never).

    Seal rows (``ls_seal``, one per barrier) go with retention too, but later: a seal is
    deleted once its barrier is older than every barrier snapshot retained, than the
    barrier after the one Iceberg publishing has completed (while publishing is on), and
    than the newest ``seal_history`` seals; checked every ``seal_history // 10`` barriers
    (one statement). None keeps every seal, as does a policy that keeps every snapshot."""

    every: int = 1
    retain_count: int | None = 100
    retain_seconds: float | None = None
    seal_history: int | None = 10_000

    def __post_init__(self) -> None:
        if self.every < 1:
            raise InvalidArgumentError("snapshot every k-th committed barrier needs k >= 1", argument="snapshot_every",
                                       value=self.every)
        if self.retain_count is not None and self.retain_count < 1:
            raise InvalidArgumentError("retain_count is None (keep all) or >= 1", argument="retain_count",
                                       value=self.retain_count)
        if self.seal_history is not None and self.seal_history < 1:
            raise InvalidArgumentError("seal_history is None (keep every seal) or >= 1", argument="seal_history",
                                       value=self.seal_history)

    @property
    def prunes_seals(self) -> bool:
        return self.seal_history is not None and (self.retain_count is not None or self.retain_seconds is not None)


def seal(catalog: "Catalog", lease: Lease, lease_seconds: float, *, expected: int | None = None) -> Seal | None:
    """Seal the open epoch (the protocol in the module docstring).

    With ``expected``, seal only if the open epoch is still ``expected``
    (returns None otherwise): a retried seal never seals twice.
    """
    return seal_and_snapshot(catalog, lease, lease_seconds, expected=expected)[0]


def seal_and_snapshot(
    catalog: "Catalog",
    lease: Lease,
    lease_seconds: float,
    *,
    expected: int | None = None,
    topology: GraphSource | None = None,
    policy: SnapshotPolicy | None = None,
) -> tuple[Seal | None, list[int]]:
    """The seal protocol, with the coordinator's snapshots in the same transaction.

    Between step 1 (the fence) and step 2 (the epoch lock), the barriers
    committed so far are snapshotted (:func:`take_snapshots`' work): one
    write transaction per tick instead of two, and the epoch row stays locked
    only for the seal itself. A barrier sealed now is snapshotted at the next
    seal, once its tables have all precommitted it.
    """
    wall = catalog.clock.now()
    with catalog.backend.write() as conn:
        now, cur = _fence(catalog, conn, lease)
        _failpoints.hit("seal.locked")  # the lease row locked (a pause here must not block the standby forever)
        made = _snapshot_in(conn, topology, policy, wall, cur.snapshot_barrier) if (policy and topology) else []
        if conn.dialect.name == "postgresql":  # steps 2-4 in one statement: one round trip, not four
            return _seal_pg(conn, lease, lease_seconds, now, expected), made
        row = conn.execute(epoch.LOCK_FOR_SEAL).one()
        e, opened_at = int(row[0]), float(row[1])
        if expected is not None and e != expected:
            return None, made
        upd = conn.execute(sa.update(S.epoch).where(S.epoch.c.id == 1, S.epoch.c.open_epoch == e)
                           .values(open_epoch=e + 1, opened_at=now))
        if upd.rowcount != 1:  # impossible under the lock; never seal blindly
            raise InternalError(f"the open epoch moved while sealing {e}")
        conn.execute(sa.insert(S.seals).values(barrier=e, opened_at=opened_at, sealed_at=now,
                                               holder=str(lease.holder), token=lease.token))
        conn.execute(sa.update(S.coordinator).where(S.coordinator.c.id == 1)
                     .values(expires_at=now + lease_seconds))
        return Seal(e, opened_at, now, str(lease.holder), lease.token), made


# PostgreSQL: the epoch row locked, moved (when it is the expected one), the seal recorded and
# the lease extended, in one statement. Its sub-statements share one snapshot and the epoch row is
# locked by the first, so the others see exactly the epoch it read; nothing is written when the
# open epoch is not the expected one.
_SEAL_PG = sa.text("""
WITH e AS (SELECT open_epoch, opened_at FROM ls_epoch WHERE id = 1 FOR UPDATE),
u AS (UPDATE ls_epoch SET open_epoch = e.open_epoch + 1, opened_at = :now FROM e
       WHERE ls_epoch.id = 1 AND ls_epoch.open_epoch = e.open_epoch
         AND (CAST(:expected AS bigint) IS NULL OR e.open_epoch = CAST(:expected AS bigint))
       RETURNING e.open_epoch AS barrier, e.opened_at AS opened_at),
s AS (INSERT INTO ls_seal (barrier, opened_at, sealed_at, holder, token)
      SELECT barrier, opened_at, :now, :holder, :token FROM u RETURNING barrier),
c AS (UPDATE ls_coordinator SET expires_at = :expires WHERE id = 1 AND EXISTS (SELECT 1 FROM u))
SELECT e.open_epoch, e.opened_at, (SELECT barrier FROM s) FROM e
""")


def _seal_pg(conn: Connection, lease: Lease, lease_seconds: float, now: float, expected: int | None) -> Seal | None:
    row = conn.execute(_SEAL_PG, {"now": now, "expected": expected, "holder": str(lease.holder),
                                  "token": lease.token, "expires": now + lease_seconds}).one()
    e, opened_at, sealed = int(row[0]), float(row[1]), row[2]
    if expected is not None and e != expected:
        return None
    if sealed is None or int(sealed) != e:  # impossible under the lock; never seal blindly
        raise InternalError(f"the open epoch moved while sealing {e}")
    return Seal(e, opened_at, now, str(lease.holder), lease.token)


_DUE = sa.text(
    "SELECT e.open_epoch, e.opened_at, (SELECT generation FROM ls_topology WHERE id = 1), "
    "EXISTS (SELECT 1 FROM ls_commit c WHERE c.table_id IN :ids AND c.barrier = e.open_epoch) "
    "FROM ls_epoch e WHERE e.id = 1"
).bindparams(sa.bindparam("ids", expanding=True))


def epoch_and_pending(conn: Connection, root_ids: Sequence[int]) -> tuple[int, float, int, bool]:
    """In one statement: the open epoch, when it opened, the topology's generation, and whether
    any of ``root_ids`` (the roots of that generation's graph, if the caller's is current) has
    a commit in the open epoch (the coordinator's check, ``seal="interval"``)."""
    row = conn.execute(_DUE, {"ids": sorted(root_ids) or [-1]}).one()
    return int(row[0]), float(row[1]), int(row[2]), bool(row[3])


def root_batch_pending(conn: Connection, root_ids: Sequence[int], open_: int) -> bool:
    """Has any root table a commit in the open epoch? (``seal="per_batch"``)"""
    if not root_ids:
        return False
    return conn.execute(_PENDING, {"ids": sorted(root_ids), "e": open_}).first() is not None


def snapshot_name(barrier: int) -> str:
    return f"{SNAPSHOT_PREFIX}{barrier}"


def take_snapshots(
    catalog: "Catalog",
    lease: Lease,
    topology: GraphSource,
    *,
    every: int = 1,
    retain_count: int | None = 100,
    retain_seconds: float | None = None,
    seal_history: int | None = 10_000,
) -> list[int]:
    """Snapshot the committed barriers not snapshotted yet; apply retention (SnapshotPolicy).
    Returns the barriers."""
    policy = SnapshotPolicy(every, retain_count, retain_seconds, seal_history)
    with catalog.backend.read() as conn:  # most calls have nothing to do: take no write lock for them
        graph = topology.graph(conn)
        if committed_barrier(conn, graph, open_epoch(conn)) <= read_lease(conn).snapshot_barrier:
            return []
    with catalog.backend.write() as conn:
        _, cur = _fence(catalog, conn, lease)
        return _snapshot_in(conn, topology, policy, catalog.clock.now(), cur.snapshot_barrier)


def _snapshot_in(conn: Connection, topology: GraphSource, policy: SnapshotPolicy, wall: float, last: int) -> list[int]:
    """Inside a fenced write transaction: snapshot every multiple of ``policy.every``
    committed since ``last`` (the lease row's progress), in every table of the
    COMMIT set; retention."""
    # the generation, the open epoch and the facts in one statement; the cached graph is used
    # when that generation is its own
    graph = topology.cached or topology.graph(conn)
    gen, open_, fx = facts_ex(conn, graph.derived)
    if gen != graph.generation:
        graph = topology.graph_at(conn, gen)
        fx = facts(conn, graph.derived)
    committed = committed_from(graph, fx, open_)
    if committed <= last:
        return []
    first = (last // policy.every + 1) * policy.every
    targets = list(range(first, committed + 1, policy.every))
    if policy.retain_count is not None:
        targets = targets[-policy.retain_count:]
    ids = commit_set(graph, fx, open_) if targets else []
    for b in targets:
        _insert_snapshots(conn, graph, ids, b, wall, policy.retain_seconds)
    conn.execute(sa.update(S.coordinator).where(S.coordinator.c.id == 1).values(snapshot_barrier=committed))
    if targets:
        _retention(conn, policy.retain_count, wall)
        if policy.prunes_seals:
            assert policy.seal_history is not None
            every = max(1, policy.seal_history // 10)
            if targets[-1] // every > (targets[0] - 1) // every:  # a multiple of ``every`` among the targets
                _prune_seals(conn, open_ - policy.seal_history)
    return targets


def _prune_seals(conn: Connection, below: int) -> int:
    """Delete the seals of barriers below ``below``, below every retained barrier snapshot
    and, while publishing is on, above none Iceberg publishing still needs (SnapshotPolicy)."""
    se, sc, pub = S.seals.c, S.snapshots.c, S.publisher.c
    oldest = (sa.select(sa.func.min(sc.barrier)).where(sc.name.like(f"{SNAPSHOT_PREFIX}%"))
              .scalar_subquery())
    publishing_needs = sa.exists().where(pub.id == 1, pub.enabled.is_(True),
                                         sa.or_(pub.complete_barrier.is_(None), se.barrier > pub.complete_barrier))
    # no snapshot retained: min() is NULL, the comparison is not true, nothing is deleted
    return conn.execute(sa.delete(S.seals).where(se.barrier < below, se.barrier < oldest,
                                                 ~publishing_needs)).rowcount or 0


def _insert_snapshots(conn: Connection, graph: Graph, ids: Sequence[int], barrier: int, wall: float,
                      retain_seconds: float | None) -> None:
    if not ids:
        return
    name = snapshot_name(barrier)
    sc = S.snapshots.c
    exists = {int(r[0]) for r in conn.execute(sa.select(sc.table_id).where(sc.name == name, sc.table_id.in_(ids)))}
    at = versions_at(conn, [i for i in ids if i not in exists], barrier)
    rows = [
        {"table_id": tid, "name": name, "version": a.version, "barrier": barrier, "created_at": wall,
         "expires_at": None if retain_seconds is None else wall + retain_seconds}
        for tid, a in sorted(at.items())
    ]
    if rows:
        conn.execute(sa.insert(S.snapshots), rows)


def _retention(conn: Connection, retain_count: int | None, wall: float) -> None:
    sc = S.snapshots.c
    ours = sc.name.like(f"{SNAPSHOT_PREFIX}%")
    conn.execute(sa.delete(S.snapshots).where(ours, retention.lapsed(S.snapshots, wall)))
    if retain_count is None:
        return
    cutoff = conn.execute(
        sa.select(sc.barrier).where(ours, sc.barrier.is_not(None)).distinct()
        .order_by(sc.barrier.desc()).offset(retain_count - 1).limit(1)
    ).scalar()
    if cutoff is not None:
        conn.execute(sa.delete(S.snapshots).where(ours, sc.barrier < cutoff))
