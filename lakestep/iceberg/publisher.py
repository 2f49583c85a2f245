"""The publisher: lakestep tables kept in step with Iceberg tables, one tag per consistent barrier.

Every lakestep table is published as an Iceberg table of the same name in an
Iceberg SQL catalog (sqlcat.py), as metadata only: its snapshots list
lakestep's own Parquet files. One **round** (:meth:`Publisher.publish`):

1. **Lease.** Take or extend the publisher lease (``ls_publisher``, a fencing
   token, the database's clock, as the coordinator's). A publisher that does
   not hold it does nothing this round: two publishers never interleave
   their work, and a lapsed one cannot move the cut (step 6 is fenced).
2. **Plan, in one database snapshot** (planning.py). The barriers to
   publish are those ``read_committed`` at scope ``global`` could choose that
   have no tag yet: every barrier above the *complete cut* ``C`` (the newest
   barrier every published table has a tag for) up to the COMMIT barrier ``P`` (a first
   round: ``P`` alone); barriers the coordinator's snapshot retention has
   already dropped are skipped. For each, every table of the COMMIT set has a
   version (``version_at``, docs/design.md §3.4). Unmanaged tables (no active
   job) publish their newest version; derived tables still catching up wait
   until they have joined the COMMIT set. A rollback seen since the last
   round lowers ``C`` to its target and removes the tags above it (their
   barriers now hold other rows).
3. **Per table, one Iceberg commit** (writer.py, metadata.py): a snapshot
   per barrier at which the table's version changed (the table's newest
   snapshot is reused when its version did not), the tag ``barrier-B`` for every barrier ``B``
   of the plan (a tag that exists is never made again: a rerun after a crash
   makes each tag once), ``main`` moved to the tag of ``C``, and expiry
   (step 5). Before the commit, a row per new snapshot goes into
   ``ls_published_snapshot``: cleanup keeps the files of every version a row
   names (catalog/cleanup.py), so no retained Iceberg snapshot ever names a
   deleted file.
4. **Errors stay with their table.** A table Iceberg cannot represent
   (:class:`IcebergSchemaError`) is left out and reported (``lakestep
   doctor``); another failure of one table is recorded on it and the round goes
   on with the others, but ``C`` does not advance. An unavailable catalog
   database stops the round.
5. **Retention.** A tag is kept while lakestep keeps its barrier: from the
   oldest barrier the coordinator's snapshots retain on, or, without
   coordinator snapshots, while the tag's version is within the table's
   retention window; ``main``'s and newer tags are always kept. Snapshots no
   kept ref names expire (unmanaged tables keep the newest
   ``unmanaged_history`` within the window); their rows in
   ``ls_published_snapshot`` are deleted after the commit that removed them.
   A table keeps at most ``max_tags`` tags (default 1000, the oldest go
   first): without coordinator snapshots, a retention window of days at one
   seal a second would otherwise grow every metadata file without bound.
6. **Advance the cut.** When every table succeeded, ``C`` becomes ``P`` (fenced
   by the lease token). ``main`` of each table moves to it in the next round;
   ``settle=True`` (:meth:`publish_once`, ``lakestep publish --once``) does it
   in the same call, in a second commit per table.

**Crash safety.** Killed at any point, nothing half-written is visible: each
table's commit is one compare-and-swap of its catalog row, ``C`` moves only
after every table has its tags, and ``main`` only ever points at a barrier at
or below ``C``: at a complete cut. A rerun finds the tags that exist and makes
the missing ones. Files written by a commit that never swapped are swept by
:meth:`Publisher.sweep` (each table's first round, then every
``sweep_every`` rounds), once older than ``ORPHAN_SECONDS`` (orphans.py).

Not guaranteed: readers of ``main`` across several tables can straddle a round
(each table's ``main`` moves on its own); a tag never changes once made,
except that a rollback removes the tags above its target.

Where each step lives: this module holds the round (:meth:`Publisher.publish`),
the lease (step 1), the cut (step 6) and dropped tables; planning.py the plan
(step 2); writer.py's ``TableWriter`` each table's commit, its errors and
retention (steps 3-5, and ``settle``); orphans.py the sweep; reports.py
:class:`PublishReport` and :class:`TableReport`.
"""


from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Sequence

import sqlalchemy as sa

from .. import _failpoints
from .. import retry as _retry
from ..barrier.sealing import default_holder, holder_gone
from ..barrier.topology import Topology
from ..catalog import schema as S
from ..errors import CatalogUnavailableError, LakestepError
from . import deletes as D
from .metadata import IcebergTable, StorageFileIO
from .orphans import delete_metadata_dir
from .planning import Plan, Row, plan_round, wanted
from .reports import PublishReport, TableReport
from .sqlcat import DEFAULT_NAME, SqlCatalogRows
from .writer import Prepared, TableWriter

if TYPE_CHECKING:
    from ..catalog import Catalog
    from ..catalog.backend import Backend

__all__ = ["Publisher", "PublishReport", "TableReport"]

log = logging.getLogger(__name__)


class Publisher:
    """Publishes a catalog's tables as Iceberg tables (module docstring).

    Example::

        from lakestep.iceberg import Publisher
        pub = Publisher(catalog)          # Iceberg catalog 'lakestep' in the same database
        pub.publish_once()                # tags every committed barrier, moves main
        # keep publishing in a thread: lakestep.services.PublishLoop(pub, interval=1.0).start()
    """

    def __init__(
        self,
        catalog: "Catalog",
        *,
        iceberg_url: str | None = None,
        name: str = DEFAULT_NAME,
        holder: str | None = None,
        lease_seconds: float = 30.0,
        unmanaged_history: int = 100,
        max_tags: int | None = 1000,
        sweep_every: int = 100,
        retry: "_retry.RetryPolicy" = _retry.SERVICE,
    ) -> None:
        self.catalog = catalog
        self.topology = Topology(catalog)
        self._own_backend: "Backend | None" = None
        if iceberg_url is not None:
            from ..catalog.backend import create_backend

            self._own_backend = create_backend(iceberg_url)
        self.rows = SqlCatalogRows(self._own_backend or catalog.backend, name)
        self.io = StorageFileIO(catalog.storage)
        self.holder = holder or default_holder()
        self.lease_seconds = float(lease_seconds)
        self.sweep_every = int(sweep_every)
        self.retry = retry
        self.keys = D.KeyCache()
        self.rounds = 0
        self._token: int | None = None
        # steps 3-5, and what it keeps across rounds: each table's Iceberg table, position deletes, sweeps
        self.writer = TableWriter(catalog, self.rows, self.io, self.keys,
                                  unmanaged_history=int(unmanaged_history), max_tags=max_tags)

    @property
    def unmanaged_history(self) -> int:
        """Snapshots an unmanaged table keeps within its retention window (step 5)."""
        return self.writer.unmanaged_history

    @unmanaged_history.setter
    def unmanaged_history(self, value: int) -> None:
        self.writer.unmanaged_history = value

    @property
    def max_tags(self) -> int | None:
        """Tags a table keeps at most, the oldest going first (step 5; None: no limit)."""
        return self.writer.max_tags

    @max_tags.setter
    def max_tags(self, value: int | None) -> None:
        self.writer.max_tags = value

    def close(self) -> None:
        """Give the lease up, close the Iceberg catalog's own database connection."""
        try:
            self.release()
        except LakestepError as e:  # the lease then lapses by itself
            log.debug("could not release the publisher lease: %s", e)
        if self._own_backend is not None:
            self._own_backend.dispose()

    # ------------------------------------------------------------------ lease
    def _acquire(self) -> tuple[bool, str | None]:
        p = S.publisher.c
        with self.catalog.backend.write() as conn:
            row = conn.execute(sa.select(S.publisher).where(p.id == 1).with_for_update()).mappings().one()
            now = self.catalog.clock.shared_now(conn)
            mine = row["holder"] == self.holder and row["token"] == self._token
            # a publisher restarted under the same name (--holder) takes its own lease back at once, as
            # any does from a holder whose process has exited (sealing.holder_gone)
            if not mine and row["holder"] not in (None, self.holder) and row["expires_at"] > now \
                    and not holder_gone(row["holder"]):
                self._token = None
                return False, row["holder"]
            token = int(row["token"]) if mine else int(row["token"]) + 1
            conn.execute(sa.update(S.publisher).where(p.id == 1, p.token == row["token"]).values(
                holder=self.holder, token=token, expires_at=now + self.lease_seconds,
                **({} if mine else {"acquired_at": now})))
            self._token = token
            return True, self.holder

    def release(self) -> None:
        """Give the lease up (a standby publisher takes over without waiting for it to expire)."""
        if self._token is None:
            return
        p = S.publisher.c
        with self.catalog.backend.write() as conn:
            conn.execute(sa.update(S.publisher).where(p.id == 1, p.holder == self.holder, p.token == self._token)
                         .values(holder=None, expires_at=0.0))
        self._token = None

    # ------------------------------------------------------------------ round
    def publish_once(self) -> PublishReport:
        """One round that also moves ``main`` to the cut it completes (step 6's ``settle``), then
        gives the lease up: a script or another ``--once`` run can publish right after."""
        try:
            return self.publish(settle=True)
        finally:
            self.release()

    def publish(self, *, settle: bool = False) -> PublishReport:
        """One round (module docstring, steps 1-6)."""
        started = time.perf_counter()
        if self.sweep_every and self.rounds and self.rounds % self.sweep_every == 0:
            self.writer.swept.clear()  # every sweep_every-th round looks for orphan metadata again
        leader, holder = self._acquire()
        if not leader:
            return PublishReport(False, holder)
        self.rows.ensure()
        plan = plan_round(self.catalog, self.topology)
        _failpoints.hit("publish.planned")
        report = PublishReport(True, self.holder, plan.barriers, plan.complete)
        ok = True
        ready: list[Prepared] = []
        for tid in sorted(plan.rows):
            row = plan.rows[tid]
            if not wanted(row):
                continue
            tr = report.tables.setdefault(row.ident, TableReport())
            try:
                got = self.writer.prepare(plan, row, tr)
            except CatalogUnavailableError:
                raise
            except Exception as e:  # noqa: BLE001 - one table's trouble must not stop the others
                ok = self.writer.failed(row, tr, e) and ok
                continue
            if got is not None:
                ready.append(got)
        ok = self.writer.commit(plan, ready) and ok
        self._drop_gone(plan)
        _failpoints.hit("publish.tables_done")  # every table has its tags; the cut has not moved
        if ok and plan.barriers:
            report.complete = plan.barriers[-1]
        self._finish(plan, report.complete, None if ok else "; ".join(f"{t}: {e}" for t, e in report.errors.items()))
        _failpoints.hit("publish.cut_moved")
        if settle and ok and report.complete is not None and report.complete != plan.complete:
            self.writer.settle(plan, report.complete, report)
        self.rounds += 1
        report.seconds = time.perf_counter() - started
        log.info("publish round %d: barriers %s, complete %s, %d table(s) in %.3fs%s", self.rounds,
                 _span(report.barriers), report.complete, len(report.tables), report.seconds,
                 f"; errors: {report.errors}" if report.errors else "")
        return report

    # ------------------------------------------------------ the publisher's row
    def _finish(self, plan: Plan, complete: int | None, error: str | None) -> None:
        p = S.publisher.c
        with self.catalog.backend.write() as conn:
            conn.execute(sa.update(S.publisher).where(p.id == 1, p.token == self._token).values(
                # a rollback counts as handled once every table has dropped its tags above it
                complete_barrier=complete, rollback_id=plan.rollback_id if error is None else plan.handled,
                round_at=self.catalog.clock.now(),
                error=None if error is None else error[:4000]))

    # ----------------------------------------------------- dropped tables, orphans
    def _drop_gone(self, plan: Plan) -> None:
        """Iceberg tables whose lakestep table was dropped: their row, metadata files and records go."""
        for tid, pubrow in plan.published.items():
            if tid in plan.rows:
                continue
            ns, name = pubrow["namespace"], pubrow["name"]
            loc = self.rows.location(ns, name)
            self.rows.drop(ns, name)
            if loc:
                delete_metadata_dir(self.catalog.storage, loc)
            self.writer.forget(tid)
            with self.catalog.backend.write() as conn:
                conn.execute(sa.delete(S.published_snapshots).where(S.published_snapshots.c.table_id == tid))
                conn.execute(sa.delete(S.published_tables).where(S.published_tables.c.table_id == tid))
            log.info("dropped the Iceberg table %s.%s (its lakestep table is gone)", ns, name)

    def sweep(self, row: Row, pub: IcebergTable) -> list[str]:
        """Delete files under the table's ``metadata/`` that its metadata does not name and
        that are older than ``ORPHAN_SECONDS`` (left by commits that never swapped; orphans.py)."""
        return self.writer.sweep(row, pub)


def _span(barriers: Sequence[int]) -> str:
    if not barriers:
        return "none"
    return str(barriers[0]) if len(barriers) == 1 else f"{barriers[0]}..{barriers[-1]}"
