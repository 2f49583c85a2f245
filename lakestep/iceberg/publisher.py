"""The publisher: lakestep tables kept in step with Iceberg tables, one tag per consistent barrier.

Every lakestep table is published as an Iceberg table of the same name in an
Iceberg SQL catalog (sqlcat.py), as metadata only: its snapshots list
lakestep's own Parquet files. One **round** (:meth:`Publisher.publish`):

1. **Lease.** Take or extend the publisher lease (``ls_publisher``, a fencing
   token, the database's clock, as the coordinator's). A publisher that does
   not hold it does nothing this round: two publishers never interleave
   their work, and a lapsed one cannot move the cut (step 6 is fenced).
2. **Plan, in one database snapshot.** The barriers to publish are those
   ``read_committed`` at scope ``global`` could choose that have no tag yet:
   every barrier above the *complete cut* ``C`` (the newest barrier every
   published table has a tag for) up to the COMMIT barrier ``P`` (a first
   round: ``P`` alone); barriers the coordinator's snapshot retention has
   already dropped are skipped. For each, every table of the COMMIT set has a
   version (``version_at``, docs/design.md §3.4). Unmanaged tables (no active
   job) publish their newest version; derived tables still catching up wait
   until they have joined the COMMIT set. A rollback seen since the last
   round lowers ``C`` to its target and removes the tags above it (their
   barriers now hold other rows).
3. **Per table, one Iceberg commit** (metadata.py): a snapshot per barrier at
   which the table's version changed (the table's newest snapshot is reused
   when its version did not), the tag ``barrier-B`` for every barrier ``B``
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
``sweep_every`` rounds), once older than :data:`ORPHAN_SECONDS`.

Not guaranteed: readers of ``main`` across several tables can straddle a round
(each table's ``main`` moves on its own); a tag never changes once made,
except that a rollback removes the tags above its target.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Mapping, Sequence

import sqlalchemy as sa
from pyiceberg.manifest import ManifestContent
from pyiceberg.table.snapshots import Operation

from .. import _failpoints
from .. import retry as _retry
from ..barrier.sealing import default_holder
from ..barrier.topology import Topology
from ..catalog import schema as S
from ..catalog.changes import FILE_COLS, row_to_file
from ..catalog.columns import stored_names, stored_paths
from ..catalog.files import DataFile as LakestepFile
from ..catalog.handle import TableHandle
from ..errors import CatalogUnavailableError, IcebergConflictError, IcebergSchemaError, LakestepError
from . import deletes as D
from .mapping import FileMapper, ids_of, mapping_ids, shape
from .metadata import NAME_MAPPING, Draft, IcebergTable, StorageFileIO, summary_version, tag_name
from .orphans import ORPHAN_SECONDS, delete_metadata_dir, sweep_orphans
from .planning import Plan, Row, plan_round, wanted
from .reports import PublishReport, TableReport
from .sqlcat import DEFAULT_NAME, SqlCatalogRows

if TYPE_CHECKING:
    from ..catalog import Catalog
    from ..catalog.backend import Backend

__all__ = ["Publisher", "PublishReport", "TableReport"]

log = logging.getLogger(__name__)

@dataclass
class _Prepared:
    """A table's draft, written and waiting for the round's batched commit."""

    row: "Row"
    pub: IcebergTable
    draft: Draft
    new: list[tuple[int, int, int | None]]  # the snapshots it adds: (id, version, barrier)
    expired: list[int]  # the snapshots it removes
    tags: dict[int, int]
    report: TableReport


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
        self.unmanaged_history = int(unmanaged_history)
        self.max_tags = max_tags
        self.sweep_every = int(sweep_every)
        self.retry = retry
        self.keys = D.KeyCache()
        self.rounds = 0
        self._token: int | None = None
        self._tables: dict[int, IcebergTable] = {}  # by lakestep table id
        self._pk: dict[int, dict[str, tuple[str, str]]] = {}  # table id -> data uri -> (delete uri, digest)
        self._swept: set[int] = set()

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
            # a publisher restarted under the same name (--holder) takes its own lease back at once
            if not mine and row["holder"] not in (None, self.holder) and row["expires_at"] > now:
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
            self._swept.clear()  # every sweep_every-th round looks for orphan metadata again
        leader, holder = self._acquire()
        if not leader:
            return PublishReport(False, holder)
        self.rows.ensure()
        plan = plan_round(self.catalog, self.topology)
        _failpoints.hit("publish.planned")
        report = PublishReport(True, self.holder, plan.barriers, plan.complete)
        ok = True
        ready: list[_Prepared] = []
        for tid in sorted(plan.rows):
            row = plan.rows[tid]
            if not wanted(row):
                continue
            tr = report.tables.setdefault(row.ident, TableReport())
            try:
                got = self._prepare(plan, row, tr)
            except CatalogUnavailableError:
                raise
            except Exception as e:  # noqa: BLE001 - one table's trouble must not stop the others
                ok = self._failed(row, tr, e) and ok
                continue
            if got is not None:
                ready.append(got)
        ok = self._commit(plan, ready) and ok
        self._drop_gone(plan)
        _failpoints.hit("publish.tables_done")  # every table has its tags; the cut has not moved
        if ok and plan.barriers:
            report.complete = plan.barriers[-1]
        self._finish(plan, report.complete, None if ok else "; ".join(f"{t}: {e}" for t, e in report.errors.items()))
        _failpoints.hit("publish.cut_moved")
        if settle and ok and report.complete is not None and report.complete != plan.complete:
            self._settle(plan, report.complete, report)
        self.rounds += 1
        report.seconds = time.perf_counter() - started
        log.info("publish round %d: barriers %s, complete %s, %d table(s) in %.3fs%s", self.rounds,
                 _span(report.barriers), report.complete, len(report.tables), report.seconds,
                 f"; errors: {report.errors}" if report.errors else "")
        return report

    # -------------------------------------------------------------- one table
    def _open(self, row: Row, published: sa.RowMapping | None) -> IcebergTable:
        tid = row.meta.table_id
        pub = self._tables.get(tid)
        if pub is not None:
            return pub
        ns, name = row.meta.namespace, row.meta.name
        # under the name it was last published as (_prepare renames it when lakestep's changed)
        old: tuple[str, str] = (ns, name) if published is None else (published["namespace"], published["name"])
        location = self.rows.location(*old)
        if location is None and old != (ns, name):
            old, location = (ns, name), self.rows.location(ns, name)
        if location is not None:
            pub = IcebergTable.load(*old, location, self.io)
            self._pk[tid] = self._pk_deletes(pub)
        else:
            ids = row.meta.column_ids  # Iceberg's field ids are the catalog's column ids (catalog/columns.py)
            sh = shape(row.meta.schema, row.meta.partition_by, row.meta.primary_key,
                       known=None if ids is None else ids.ids, last=0 if ids is None else ids.last,
                       stored=stored_paths(row.meta.schema))
            pub = IcebergTable.new(ns, name, row.meta.location, sh, self.io, {
                "lakestep.table-id": str(tid), "format-version": "2",
                "write.parquet.compression-codec": "snappy"})
            self._pk[tid] = {}
        self._tables[tid] = pub
        self._reconcile_pins(tid, pub)
        return pub

    def _reconcile_pins(self, tid: int, pub: IcebergTable) -> None:
        """Pins of snapshots that never became visible (a publisher killed between step 3's pin
        and its commit) go once they are older than :data:`ORPHAN_SECONDS`: a younger one may be
        another publisher's, about to commit."""
        c = S.published_snapshots.c
        live = {s.snapshot_id for s in pub.metadata.snapshots}
        cutoff = self.catalog.clock.now() - ORPHAN_SECONDS
        with self.catalog.backend.read() as conn:
            stale = [int(r[0]) for r in conn.execute(sa.select(c.snapshot_id).where(
                c.table_id == tid, c.created_at < cutoff)) if int(r[0]) not in live]
        if stale:
            with self.catalog.backend.write() as conn:
                _unpin(conn, tid, stale)
            log.info("%s: dropped %d pin(s) of snapshots that never landed", pub.ident, len(stale))

    @staticmethod
    def _pk_deletes(pub: IcebergTable) -> dict[str, tuple[str, str]]:
        from pyiceberg.conversions import from_bytes
        from pyiceberg.types import StringType

        from .metadata import FILE_PATH_ID

        out = {}
        for path, e in pub.state.live(ManifestContent.DELETES).items():
            b = (e.file.lower_bounds or {}).get(FILE_PATH_ID)
            if b is not None:
                out[str(from_bytes(StringType(), b))] = (path, "")
        return out

    def _failed(self, row: Row, tr: TableReport, e: BaseException) -> bool:
        """Step 4: record a table's failure; False when it must hold the cut back (anything but a
        table Iceberg cannot represent, which is simply left out)."""
        tr.error = f"{type(e).__name__}: {e}"
        if isinstance(e, IcebergSchemaError):
            self._record_error(row, tr.error)
            return True
        if not isinstance(e, (LakestepError, OSError)):
            log.error("publishing %s failed", row.ident, exc_info=e)
        else:
            log.warning("publishing %s failed: %s", row.ident, e)
        self._record_error(row, tr.error)
        self._tables.pop(row.meta.table_id, None)  # read it again next round: its state may be half changed
        return False

    def _prepare(self, plan: Plan, row: Row, tr: TableReport) -> "_Prepared | None":
        """Step 3 up to the swap: the table's draft, its files written (None: nothing to do)."""
        tid = row.meta.table_id
        pub = self._open(row, plan.published.get(tid))
        if (pub.namespace, pub.name) != (row.meta.namespace, row.meta.name):  # renamed since published
            self.rows.rename((pub.namespace, pub.name), (row.meta.namespace, row.meta.name))
            pub.namespace, pub.name = row.meta.namespace, row.meta.name
        known = mapping_ids(pub.metadata.properties.get(NAME_MAPPING)) or ids_of(pub.metadata.schema())
        last = pub.metadata.last_column_id
        ids = row.meta.column_ids
        stored = stored_paths(row.meta.schema)
        if ids is not None:
            # the files carry the catalog's ids as Parquet field ids, and Iceberg readers resolve
            # columns by them: the published ids must be the same (they are, being given in the
            # same order: columns.py rule 2), or the table is not published. The published name
            # mapping names stored names (columns.py rule 6): compared by them.
            differ = sorted(p for p, i in ids.ids.items() if stored.get(p, p) in known and known[stored.get(p, p)] != i)
            if differ:
                raise IcebergSchemaError(f"{row.meta.namespace}.{row.meta.name}: the published Iceberg field ids of "
                                         f"{['.'.join(p) for p in differ[:5]]} differ from the catalog's column ids; "
                                         "readers would resolve the files' columns wrongly (drop the Iceberg table "
                                         "and publish it again)")
            known = {**known, **ids.ids}
            last = max(last, ids.last)
        sh = shape(row.meta.schema, row.meta.partition_by, row.meta.primary_key, known=known,
                   last=last, schema_id=pub.metadata.current_schema_id, stored=stored)
        if tid not in self._swept:
            self.sweep(row, pub)
        draft = pub.draft()
        draft.set_shape(sh)
        handle = TableHandle(self.catalog, row.meta)
        mapper = FileMapper(row.meta.location, draft.schema, draft.spec, row.meta.partition_by,
                            stored_names(row.meta.schema))
        tags = pub.tags()
        if plan.rollback_to is not None:
            for b in sorted(tags):
                if b > plan.rollback_to:
                    draft.remove_ref(tag_name(b))
                    tr.removed_tags.append(b)
                    del tags[b]
        head = [pub.state.head, pub.head_version()]  # the draft's newest snapshot and its version
        new: list[tuple[int, int, int | None]] = []  # (snapshot id, version, barrier)

        def snapshot_at(version: int, barrier: int | None) -> int:
            if head[0] is not None and head[1] == version:
                return head[0]
            sid = self._snapshot(draft, handle, mapper, head[1], version, barrier)
            head[0], head[1] = sid, version
            new.append((sid, version, barrier))
            tr.snapshots += 1
            return sid

        if tid in plan.members:
            for b in plan.barriers:
                if b in tags:
                    continue
                v = plan.versions[b].get(tid)
                if v is None:
                    continue
                tags[b] = snapshot_at(v, b)
                draft.tag(b, tags[b])
                tr.tags.append(b)
            if plan.complete is not None and plan.complete in tags:
                draft.main(tags[plan.complete])
        elif plan.kinds.get(tid, "unmanaged") == "unmanaged":
            draft.main(snapshot_at(row.version, None))
        expired = self._retention(plan, row, pub, draft, tags, tr)
        if not draft.changed:
            tr.main = pub.version_of(pub.metadata.current_snapshot_id)
            return None
        draft.write()
        return _Prepared(row, pub, draft, new, expired, tags, tr)

    def _commit(self, plan: Plan, ready: "list[_Prepared]") -> bool:
        """Step 3's commits, batched: one transaction pins every new snapshot, one swaps every
        table's metadata (the Iceberg catalog's database), one records the outcome. When the
        batch's swap fails (a table moved under us), each table is swapped on its own, so only
        that one fails. Returns whether every table landed."""
        if not ready:
            return True
        rows = [{"table_id": p.row.meta.table_id, "snapshot_id": sid, "version": v, "barrier": b,
                 "created_at": plan.now} for p in ready for sid, v, b in p.new]
        if rows:
            with self.catalog.backend.write() as conn:
                conn.execute(sa.insert(S.published_snapshots), rows)
        _failpoints.hit("publish.table.pinned")
        swaps = [(p.pub.namespace, p.pub.name, p.pub.metadata_location or None, p.draft.location) for p in ready]
        landed: list[_Prepared] = []
        try:
            self.rows.commit(swaps)
            landed = list(ready)
        except IcebergConflictError:
            for p, swap in zip(ready, swaps):
                try:
                    self.rows.commit([swap])
                    landed.append(p)
                except IcebergConflictError as e:
                    p.draft.discard()
                    self._failed(p.row, p.report, e)
        except BaseException:
            for p in ready:
                p.draft.discard()
            raise
        for p in landed:
            p.draft.finish()
            p.report.main = p.pub.version_of(p.pub.metadata.current_snapshot_id)
        now = self.catalog.clock.now()
        with self.catalog.backend.write() as conn:
            for p in landed:
                _unpin(conn, p.row.meta.table_id, p.expired)
                _upsert_state(conn, p.row.meta.table_id, self._state_values(p.row, p.pub, p.tags, now))
        return len(landed) == len(ready)

    def _snapshot(self, draft: Draft, handle: TableHandle, mapper: FileMapper, prev: int | None, version: int,
                  barrier: int | None) -> int:
        """A snapshot of ``handle`` at ``version`` on top of the draft's newest (at ``prev``)."""
        added, removed, same_rows = self._delta(handle, prev, version)
        add = [mapper.data_file(f) for f in added]
        rm = {mapper.path(p) for p in removed}
        add_del: list[Any] = []
        rm_del: set[str] = set()
        if handle.primary_key:
            add_del, rm_del = self._deletes(draft, handle, mapper, version, added, removed)
        if same_rows and not add_del and not rm_del:
            op = Operation.REPLACE
        elif not rm and not rm_del and not add_del:
            op = Operation.APPEND
        elif not add and not add_del:
            op = Operation.DELETE
        else:
            op = Operation.OVERWRITE
        return draft.snapshot(version=version, barrier=barrier, operation=op, added=add, removed=rm,
                              added_deletes=add_del, removed_deletes=rm_del)

    def _delta(self, handle: TableHandle, a: int | None, b: int
               ) -> tuple[list[LakestepFile], dict[str, LakestepFile], bool]:
        """The files live at ``b`` and not at ``a``, the paths live at ``a`` and not at ``b``,
        and whether ``a`` and ``b`` hold the same rows (same data version). One read, two statements."""
        f, c = S.files.c, S.commits.c
        tid = handle.table_id
        with self.catalog.backend.read() as conn:
            if a is None:
                return handle.files_at(conn, b, head=-1), {}, False
            lo, hi = min(a, b), max(a, b)
            q = sa.union_all(
                sa.select(*FILE_COLS).where(f.table_id == tid, f.added_version > lo, f.added_version <= hi),
                sa.select(*FILE_COLS).where(f.table_id == tid, f.removed_version > lo, f.removed_version <= hi))
            rows = {r.file_id: row_to_file(r) for r in conn.execute(q)}
            dvs = dict(conn.execute(sa.select(c.version, c.data_version).where(
                c.table_id == tid, c.version.in_([a, b]))).all())

        def live(d: LakestepFile, v: int) -> bool:
            return d.added_version <= v and (d.removed_version is None or d.removed_version > v)
        at_b = {d.path: d for d in rows.values() if live(d, b) and not live(d, a)}
        at_a = {d.path: d for d in rows.values() if live(d, a) and not live(d, b)}
        both = set(at_b) & set(at_a)  # a path removed and recorded again (a compaction undone): unchanged
        added = [d for p, d in sorted(at_b.items()) if p not in both]
        removed = {p: d for p, d in at_a.items() if p not in both}
        same = a in dvs and b in dvs and dvs[a] == dvs[b]
        return added, removed, same

    def _deletes(self, draft: Draft, handle: TableHandle, mapper: FileMapper, version: int,
                 added: Sequence[LakestepFile], removed: Mapping[str, LakestepFile]) -> tuple[list[Any], set[str]]:
        """Position deletes (deletes.py) of the partitions ``added`` and ``removed`` touch."""
        from .metadata import delete_file_entry

        tid = handle.table_id
        mine = self._pk.setdefault(tid, {})
        touched = {f.partition_json for f in added} | {f.partition_json for f in removed.values()}
        add_del: list[Any] = []
        rm_del: set[str] = set()
        for p in removed:  # a removed data file's deletes go with it
            got = mine.pop(mapper.path(p), None)
            if got is not None:
                rm_del.add(got[0])
        live: list[LakestepFile] = []
        if touched:
            with self.catalog.backend.read() as conn:
                live = handle.files_at(conn, version, head=-1, partitions=frozenset(touched))
        groups: dict[str, list[LakestepFile]] = {}
        for f in live:
            groups.setdefault(f.partition_json, []).append(f)
        for part, files in groups.items():
            pos = D.positions(handle, files, self.keys)
            for f in files:
                uri = mapper.path(f.path)
                got = pos.get(f.path)
                old = mine.get(uri)
                dg = D.digest(got) if got is not None else None
                if old is not None and (dg is None or old[1] != dg):
                    rm_del.add(old[0])
                    del mine[uri]
                if got is not None and (old is None or old[1] != dg):
                    w = D.write(self.io, draft.base.location, uri, got)
                    draft.written.append(w.path)
                    add_del.append(delete_file_entry(w.path, w.size, w.rows, mapper.partition(f.partition),
                                                     mapper.spec.spec_id, uri))
                    mine[uri] = (w.path, dg or "")
        return add_del, rm_del

    def _retention(self, plan: Plan, row: Row, pub: IcebergTable, draft: Draft,
                   tags: dict[int, int], tr: TableReport) -> list[int]:
        """Step 5: drop tags lakestep no longer retains and snapshots no ref keeps."""
        managed = row.meta.table_id in plan.members
        floor = plan.floors.get(row.meta.table_id)
        keep_from = plan.complete if plan.complete is not None else (plan.barriers[-1] if plan.barriers else None)
        for b in sorted(tags):
            if keep_from is not None and b >= keep_from:
                continue
            v = _summary_version(draft, tags[b])
            retained = (b >= plan.since) if plan.since is not None else (v is not None and floor is not None
                                                                           and v >= floor)
            over = self.max_tags is not None and len(tags) > self.max_tags
            if not retained or over:
                draft.remove_ref(tag_name(b))
                tr.removed_tags.append(b)
                del tags[b]
        keep = set(draft.refs.values())
        if draft.state.head is not None:
            keep.add(draft.state.head)
        if not managed and floor is not None:
            recent = sorted((s for s in draft.summaries if s not in draft.expired),
                            key=lambda s: _summary_version(draft, s) or -1, reverse=True)[:self.unmanaged_history]
            keep |= {s for s in recent if (_summary_version(draft, s) or -1) >= floor}
        gone = [s for s in draft.summaries if s not in keep and s not in draft.expired]
        draft.expire(gone)
        tr.expired += len(gone)
        return gone

    def _settle(self, plan: Plan, complete: int, report: PublishReport) -> None:
        """Step 6 at once: ``main`` of every managed table to the tag of the cut this round
        completed (one more batched commit)."""
        ready: list[_Prepared] = []
        for tid in sorted(plan.members):
            row, pub = plan.rows.get(tid), self._tables.get(tid)
            tr = None if row is None else report.tables.get(row.ident)
            if row is None or pub is None or tr is None or tr.error:
                continue
            tags = pub.tags()
            sid = tags.get(complete)
            if sid is None or pub.metadata.current_snapshot_id == sid:
                continue
            draft = pub.draft()
            draft.main(sid)
            draft.write()
            ready.append(_Prepared(row, pub, draft, [], [], tags, tr))
        self._commit(plan, ready)

    # ------------------------------------------------------ catalog records
    @staticmethod
    def _state_values(row: Row, pub: IcebergTable, tags: Mapping[int, int], now: float) -> dict[str, Any]:
        return {"namespace": row.meta.namespace, "name": row.meta.name,
                "metadata_location": pub.metadata_location, "version": pub.head_version(),
                "barrier": max(tags) if tags else None,
                "main_version": pub.version_of(pub.metadata.current_snapshot_id),
                "error": None, "error_at": None, "updated_at": now}

    def _record_error(self, row: Row, error: str) -> None:
        now = self.catalog.clock.now()
        with self.catalog.backend.write() as conn:
            _upsert_state(conn, row.meta.table_id, {"namespace": row.meta.namespace, "name": row.meta.name,
                                                    "error": error[:2000], "error_at": now, "updated_at": now})

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
            self._tables.pop(tid, None)
            with self.catalog.backend.write() as conn:
                conn.execute(sa.delete(S.published_snapshots).where(S.published_snapshots.c.table_id == tid))
                conn.execute(sa.delete(S.published_tables).where(S.published_tables.c.table_id == tid))
            log.info("dropped the Iceberg table %s.%s (its lakestep table is gone)", ns, name)

    def sweep(self, row: Row, pub: IcebergTable) -> list[str]:
        """Delete files under the table's ``metadata/`` that its metadata does not name and
        that are older than ``ORPHAN_SECONDS`` (left by commits that never swapped; orphans.py)."""
        self._swept.add(row.meta.table_id)
        return sweep_orphans(self.catalog, row, pub)


def _summary_version(draft: Draft, sid: int) -> int | None:
    return summary_version(draft.summaries.get(sid))


def _unpin(conn: sa.Connection, tid: int, snapshot_ids: Sequence[int]) -> None:
    """Delete the pins of ``snapshot_ids`` (snapshots gone from the table's metadata)."""
    c = S.published_snapshots.c
    for i in range(0, len(snapshot_ids), 500):
        conn.execute(sa.delete(S.published_snapshots).where(
            c.table_id == tid, c.snapshot_id.in_(list(snapshot_ids[i:i + 500]))))


def _upsert_state(conn: sa.Connection, tid: int, values: Mapping[str, Any]) -> None:
    """A table's ``ls_published_table`` row, updated or made."""
    c = S.published_tables.c
    if conn.execute(sa.update(S.published_tables).where(c.table_id == tid).values(**values)).rowcount == 0:
        conn.execute(sa.insert(S.published_tables).values(table_id=tid, **values))


def _span(barriers: Sequence[int]) -> str:
    if not barriers:
        return "none"
    return str(barriers[0]) if len(barriers) == 1 else f"{barriers[0]}..{barriers[-1]}"
