"""The coordinator: the one process (or thread) that seals epochs and snapshots barriers.

Run it inside a job's driver (:meth:`Coordinator.start`, a daemon thread) or
as its own process, the command ``lakestep coordinator`` (lakestep/cli/services.py;
``python -m lakestep coordinator`` runs the same command)::

    lakestep coordinator --catalog postgresql://... --interval 1.0

Any number may run; exactly one holds the lease and seals, the others stand
by and take over when the lease expires (or at once when the holder stops
cleanly and releases it). The loop is a :class:`~lakestep.services.base.Service`
(start, stop, health); each round is one :meth:`Coordinator.tick`:

1. hold the lease: acquire it if free or expired, extend it when a third of
   it has passed; a standby returns here;
2. decide whether the open epoch is due: ``seal="interval"`` when ``interval``
   seconds have passed since it opened (database clock, so the cadence
   survives a takeover) and a root table has a commit in it, or when ``idle``
   seconds have passed (default ``10 * interval``; ``idle=interval`` seals on
   the clock alone, as lakestep 0.1 did); ``seal="per_batch"`` when a root
   table has a commit in it (after every root micro-batch);
3. in one transaction (sealing.seal_and_snapshot), fenced by the lease
   token: snapshot the barriers committed so far (every
   ``snapshot_every``-th; retention: ``retain_count``, ``retain_seconds``,
   and the seal rows of barriers no longer retained, keeping the newest
   ``seal_history``: :class:`~lakestep.barrier.sealing.SnapshotPolicy`), then
   seal the open epoch (waits for the root commits in flight).

A :class:`NotCoordinatorError` (the lease was lost, e.g. after a long pause)
turns the coordinator into a standby; it never seals with a stale lease.
**A coordinator paused inside its transaction** (step 3 holds the lease row
and the epoch row locked) would block the standby and every root commit
until it resumed: ``lakestep coordinator`` opens its catalog with
``DatabaseTimeouts(idle_in_transaction=lease)``, so on PostgreSQL the server
ends its session once it has waited that long, and the standby takes over
when the lease expires. Open a catalog the same way for a coordinator you run
yourself. Not guaranteed on SQLite: a paused holder of its write lock stops
every writer until it resumes or dies.
While the catalog database is unavailable the loop waits through
:func:`lakestep.retry.retrying` (``retry``: bounded exponential backoff, one
log line when the wait starts and one when it ends; by default it waits as
long as it takes). A seal whose answer was lost is simply tried again: it is
fenced by the lease and by the epoch it expects, so it never seals twice.

**A restarted coordinator** (its process killed, a new one started later):
nothing of a coordinator lives outside the database. The new one takes the
lease when the old one's expires (database clock) and seals the epoch that is
open, the one after the last sealed; root commits made while no coordinator
ran are in that epoch.

**Why an epoch waits for data.** Sealing on the clock alone made a root commit
wait for the next tick (half an interval on average: 100 ms of a 0.2 s
interval, the largest part of the cost of consistency in
``benchmarks.freshness``), and every epoch without data still cost a seal, a
snapshot and an empty commit per derived table. Past ``interval`` the
coordinator checks every ``poll`` seconds (the same two statements a tick read
before: the epoch row, with the check folded in, and the clock) and seals as
soon as a root commit lands; an epoch without any is sealed after ``idle``, so
an idle pipeline's barriers still move, and its derived jobs with them.

Not guaranteed: the interval is a lower bound (a seal waits for root commits
in flight, and a loaded database delays it); ``per_batch`` and ``interval``
poll, so several root batches landing within one poll share an epoch.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from .. import _failpoints
from .. import retry as _retry
from ..barrier import sealing
from ..barrier.errors import NotCoordinatorError
from ..barrier.sealing import Lease, Seal, default_holder, epoch_row
from ..barrier.topology import Topology
from ..errors import CatalogUnavailableError, InvalidArgumentError
from .base import Service

if TYPE_CHECKING:
    from ..catalog import Catalog

log = logging.getLogger(__name__)

SealMode = Literal["interval", "per_batch"]


@dataclass(frozen=True)
class Tick:
    """What one :meth:`Coordinator.tick` did."""

    leader: bool
    sealed: Seal | None = None
    snapshots: tuple[int, ...] = ()
    next_in: float = 0.0  # seconds until the next tick is useful


class Coordinator(Service):
    """Seals epochs and snapshots committed barriers for one catalog.

    Example::

        coord = Coordinator(catalog, interval=1.0)    # at most a seal a second; or seal="per_batch"
        coord.start()                                 # a daemon thread
        ...
        coord.stop()                                  # releases the lease
    """

    survives_errors = False  # a seal is fenced: an error other than the database's is a bug to see

    def __init__(
        self,
        catalog: "Catalog",
        *,
        interval: float = 1.0,
        seal: SealMode = "interval",
        lease_seconds: float = 10.0,
        snapshot_every: int | None = 1,
        retain_count: int | None = 100,
        retain_seconds: float | None = None,
        seal_history: int | None = 10_000,
        poll: float = 0.05,
        holder: str | None = None,
        retry: "_retry.RetryPolicy | None" = None,
        idle: float | None = None,
    ) -> None:
        if seal not in ("interval", "per_batch"):
            raise InvalidArgumentError(f"seal must be 'interval' or 'per_batch', not {seal!r}", argument="seal",
                                       value=seal)
        if interval <= 0 or lease_seconds <= 0 or poll <= 0:
            raise InvalidArgumentError("interval, lease_seconds and poll must be positive", argument="interval",
                                       value=(interval, lease_seconds, poll))
        idle = 10.0 * interval if idle is None else idle
        if not idle >= interval:
            raise InvalidArgumentError(f"idle must be at least the interval ({interval:g} s), got {idle!r}",
                                       argument="idle", value=idle)
        self.policy = None if snapshot_every is None else sealing.SnapshotPolicy(
            snapshot_every, retain_count, retain_seconds, seal_history)  # checks the values
        self.holder = holder or default_holder()
        # waiting out the database: backoff up to a quarter of the lease, no deadline by default
        super().__init__(f"coordinator {self.holder}", interval=interval,
                         retry=retry or _retry.RetryPolicy(initial=0.05, max_delay=min(5.0, float(lease_seconds) / 4),
                                                           deadline=None))
        self.catalog = catalog
        self.mode: SealMode = seal
        self.lease_seconds = float(lease_seconds)
        self.snapshot_every = snapshot_every
        self.retain_count = retain_count
        self.retain_seconds = retain_seconds
        self.poll = float(poll)
        self.idle = float(idle)
        self.topology = Topology(catalog)
        self.lease: Lease | None = None
        self._renewed_at = 0.0
        self._max_seals: int | None = None
        self._sealed = 0
        self.seals: list[Seal] = []  # sealed by this coordinator (the most recent 1000)

    # ------------------------------------------------------------------ lease
    @property
    def is_leader(self) -> bool:
        return self.lease is not None

    def acquire(self) -> bool:
        """Take or extend the lease; False when another live coordinator holds it."""
        lease = sealing.acquire(self.catalog, self.holder, self.lease_seconds, held=self.lease)
        if lease is not None and (self.lease is None or lease.token != self.lease.token):
            log.info("coordinator %s took the lease (token %d)", self.holder, lease.token)
        self.lease = lease
        self._renewed_at = self.catalog.clock.monotonic()
        return lease is not None

    def release(self) -> None:
        if self.lease is not None:
            sealing.release(self.catalog, self.lease)
            log.info("coordinator %s released the lease (token %d)", self.holder, self.lease.token)
            self.lease = None

    def _hold(self) -> bool:
        if self.lease is None or self.catalog.clock.monotonic() - self._renewed_at > self.lease_seconds / 3:
            return self.acquire()
        return True

    # -------------------------------------------------------------- operations
    def seal(self, *, expected: int | None = None) -> Seal | None:
        """Seal the open epoch now (taking the lease if it is free). Raises
        :class:`NotCoordinatorError` if another coordinator holds the lease."""
        return self._seal(expected=expected, snapshot=False)[0]

    def _seal(self, *, expected: int | None, snapshot: bool) -> tuple[Seal | None, list[int]]:
        token = self.lease.token if self.lease is not None else -1
        if not self._hold():
            cur = self._read_lease()
            raise NotCoordinatorError(holder=self.holder, token=token, current_holder=cur.holder,
                                      current_token=cur.token, expires_at=cur.expires_at)
        assert self.lease is not None
        try:
            s, snaps = sealing.seal_and_snapshot(self.catalog, self.lease, self.lease_seconds, expected=expected,
                                                topology=self.topology, policy=self.policy if snapshot else None)
        except NotCoordinatorError:
            self.lease = None
            raise
        self._renewed_at = self.catalog.clock.monotonic()
        if s is not None:
            self.seals.append(s)
            del self.seals[:-1000]
            log.debug("sealed barrier %d", s.barrier)
        return s, snaps

    def snapshot(self) -> list[int]:
        """Snapshot the committed barriers not yet snapshotted (every k-th); apply retention."""
        if self.snapshot_every is None or self.lease is None:
            return []
        try:
            assert self.policy is not None
            return sealing.take_snapshots(self.catalog, self.lease, self.topology, every=self.snapshot_every,
                                         retain_count=self.retain_count, retain_seconds=self.retain_seconds,
                                         seal_history=self.policy.seal_history)
        except NotCoordinatorError:
            self.lease = None
            raise

    def _read_lease(self) -> Lease:
        with self.catalog.backend.read() as conn:
            return sealing.read_lease(conn)

    def _due(self) -> tuple[bool, float, int]:
        """(is the open epoch due, seconds until it is, the open epoch)."""
        if self.mode == "interval":
            # two statements, each its own snapshot (PostgreSQL: no BEGIN / ROLLBACK round trips): they
            # need no common one, as a seal between them only makes the epoch read stale, and the seal,
            # fenced by the epoch it expects, then does nothing. The first also says whether a root
            # table has a commit in the open epoch, by the cached graph's roots if its generation is
            # still the topology's (else the graph is read again, in a transaction, and checked again).
            graph = self.topology.cached
            for _ in range(2):
                if graph is None:
                    with self.catalog.backend.read() as conn:
                        graph = self.topology.graph(conn)
                with self.catalog.backend.statement() as conn:
                    open_, opened_at, gen, pending = sealing.epoch_and_pending(conn, graph.roots)
                    age = self.catalog.clock.shared_now(conn) - opened_at
                if gen == graph.generation:
                    break
                graph = None
            if age < self.interval:
                return False, self.interval - age, open_
            due = pending or age >= self.idle
            return due, 0.0 if due else min(self.poll, self.idle - age), open_
        with self.catalog.backend.read() as conn:
            open_, opened_at = epoch_row(conn)
            roots = self.topology.graph(conn).roots
            return sealing.root_batch_pending(conn, roots, open_), self.poll, open_

    def tick(self) -> Tick:
        """One step of the loop (module docstring). Safe to call by hand, e.g. in tests."""
        _failpoints.hit("coordinator.tick")  # between transactions: nothing of the database held
        try:
            if not self._hold():
                return Tick(False, next_in=min(self.lease_seconds / 4, 1.0))
            due, wait, open_ = self._due()
            sealed, made = self._seal(expected=open_, snapshot=True) if due else (None, [])
            snaps = tuple(made)
            if sealed is not None and self.mode == "interval":
                wait = self.interval
            lease_left = self.lease_seconds / 3 - (self.catalog.clock.monotonic() - self._renewed_at)
            return Tick(True, sealed, snaps, max(0.0, min(wait, lease_left)))
        except NotCoordinatorError as e:
            log.warning("coordinator %s lost the lease: %s", self.holder, e)
            self.lease = None
            return Tick(False, next_in=self.poll)

    # -------------------------------------------------------------------- loop
    def round(self) -> Tick:
        return self.tick()

    def pause(self, result: Any) -> float:
        t: Tick = result
        return min(t.next_in, self.poll) if t.leader and self.mode == "per_batch" else t.next_in

    def enough(self, result: Any) -> bool:
        if result.sealed is not None:
            self._sealed += 1
        return self._max_seals is not None and self._sealed >= self._max_seals

    def finish(self) -> None:
        try:
            self.release()
        except CatalogUnavailableError as e:  # the lease then lapses by itself
            log.warning("could not release the coordinator lease: %s", e)

    def run(self, *, duration: float | None = None, max_seals: int | None = None,
            max_rounds: int | None = None, on_round: Any = None) -> list[Tick]:
        """Tick until :meth:`stop`, ``duration`` seconds, or ``max_seals`` seals by this coordinator
        (or ``max_rounds`` ticks); then release the lease (a standby takes over at once)."""
        self._max_seals, self._sealed = max_seals, 0
        return super().run(max_rounds=max_rounds, duration=duration, on_round=on_round)
