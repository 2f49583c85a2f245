"""Writing one table's Iceberg metadata (publisher.py, steps 3-5): :class:`TableWriter`.

A round hands the writer each published table of its plan (planning.py):

* :meth:`TableWriter.prepare` is step 3 up to the swap: the table's Iceberg
  table opened (loaded from the Iceberg catalog, or made), renamed when lakestep's
  table was, its schema and partition spec brought up to date, a snapshot per
  barrier at which its version changed (position deletes of primary-key tables,
  deletes.py), the tags, ``main``, and step 5's retention and expiry, written
  as a new metadata file (metadata.py) that nothing names yet;
* :meth:`TableWriter.commit` pins the new snapshots (``ls_published_snapshot``),
  swaps every prepared table's metadata in one batch (each on its own when the
  batch conflicts), then records the outcome and unpins what expired;
* :meth:`TableWriter.failed` is step 4: a table's failure recorded on it;
* :meth:`TableWriter.settle` is step 6's ``settle``: ``main`` moved to the cut
  the round completed.

The writer keeps, across rounds, each table's opened Iceberg table, its
position deletes, and which tables were swept (orphans.py).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Mapping, Sequence

import sqlalchemy as sa
from pyiceberg.manifest import ManifestContent
from pyiceberg.table.snapshots import Operation

from .. import _failpoints
from ..catalog import schema as S
from ..catalog.changes import FILE_COLS, row_to_file
from ..catalog.columns import stored_names, stored_paths
from ..catalog.files import DataFile as LakestepFile
from ..catalog.handle import TableHandle
from ..errors import IcebergConflictError, IcebergSchemaError, LakestepError
from . import deletes as D
from .mapping import FileMapper, ids_of, mapping_ids, shape
from .metadata import NAME_MAPPING, Draft, IcebergTable, StorageFileIO, summary_version, tag_name
from .orphans import ORPHAN_SECONDS, sweep_orphans
from .planning import Plan, Row
from .reports import PublishReport, TableReport
from .sqlcat import SqlCatalogRows

if TYPE_CHECKING:
    from ..catalog import Catalog

log = logging.getLogger("lakestep.iceberg.publisher")  # the publisher's logger (the module it was split from)


@dataclass
class Prepared:
    """A table's draft, written and waiting for the round's batched commit."""

    row: Row
    pub: IcebergTable
    draft: Draft
    new: list[tuple[int, int, int | None]]  # the snapshots it adds: (id, version, barrier)
    expired: list[int]  # the snapshots it removes
    tags: dict[int, int]
    report: TableReport


class TableWriter:
    """Writes the Iceberg metadata of a publisher's tables (module docstring).

    ``rows`` is the Iceberg SQL catalog's table, ``io`` reads and writes the metadata
    files, ``keys`` caches primary keys for position deletes; ``unmanaged_history`` and
    ``max_tags`` are :class:`~lakestep.iceberg.Publisher`'s (step 5)."""

    def __init__(self, catalog: "Catalog", rows: SqlCatalogRows, io: StorageFileIO, keys: D.KeyCache, *,
                 unmanaged_history: int, max_tags: int | None) -> None:
        self.catalog = catalog
        self.rows = rows
        self.io = io
        self.keys = keys
        self.unmanaged_history = unmanaged_history
        self.max_tags = max_tags
        self.tables: dict[int, IcebergTable] = {}  # by lakestep table id
        self.pk: dict[int, dict[str, tuple[str, str]]] = {}  # table id -> data uri -> (delete uri, digest)
        self.swept: set[int] = set()  # the tables swept since the last sweep_every-th round

    def forget(self, tid: int) -> None:
        """Read the table's Iceberg table again next time (its state may be half changed, or gone)."""
        self.tables.pop(tid, None)

    def sweep(self, row: Row, pub: IcebergTable) -> list[str]:
        """The table's orphan metadata files deleted (orphans.py); the table counts as swept."""
        self.swept.add(row.meta.table_id)
        return sweep_orphans(self.catalog, row, pub)

    def open_table(self, row: Row, published: sa.RowMapping | None) -> IcebergTable:
        tid = row.meta.table_id
        pub = self.tables.get(tid)
        if pub is not None:
            return pub
        ns, name = row.meta.namespace, row.meta.name
        # under the name it was last published as (prepare renames it when lakestep's changed)
        old: tuple[str, str] = (ns, name) if published is None else (published["namespace"], published["name"])
        location = self.rows.location(*old)
        if location is None and old != (ns, name):
            old, location = (ns, name), self.rows.location(ns, name)
        if location is not None:
            pub = IcebergTable.load(*old, location, self.io)
            self.pk[tid] = self._pk_deletes(pub)
        else:
            ids = row.meta.column_ids  # Iceberg's field ids are the catalog's column ids (catalog/columns.py)
            sh = shape(row.meta.schema, row.meta.partition_by, row.meta.primary_key,
                       known=None if ids is None else ids.ids, last=0 if ids is None else ids.last,
                       stored=stored_paths(row.meta.schema))
            pub = IcebergTable.new(ns, name, row.meta.location, sh, self.io, {
                "lakestep.table-id": str(tid), "format-version": "2",
                "write.parquet.compression-codec": "snappy"})
            self.pk[tid] = {}
        self.tables[tid] = pub
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

    def failed(self, row: Row, tr: TableReport, e: BaseException) -> bool:
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
        self.tables.pop(row.meta.table_id, None)  # read it again next round: its state may be half changed
        return False

    def prepare(self, plan: Plan, row: Row, tr: TableReport) -> Prepared | None:
        """Step 3 up to the swap: the table's draft, its files written (None: nothing to do)."""
        tid = row.meta.table_id
        pub = self.open_table(row, plan.published.get(tid))
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
        if tid not in self.swept:
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
        return Prepared(row, pub, draft, new, expired, tags, tr)

    def commit(self, plan: Plan, ready: list[Prepared]) -> bool:
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
        landed: list[Prepared] = []
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
                    self.failed(p.row, p.report, e)
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
                _upsert_state(conn, p.row.meta.table_id, _state_values(p.row, p.pub, p.tags, now))
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
        mine = self.pk.setdefault(tid, {})
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

    def settle(self, plan: Plan, complete: int, report: PublishReport) -> None:
        """Step 6 at once: ``main`` of every managed table to the tag of the cut this round
        completed (one more batched commit)."""
        ready: list[Prepared] = []
        for tid in sorted(plan.members):
            row, pub = plan.rows.get(tid), self.tables.get(tid)
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
            ready.append(Prepared(row, pub, draft, [], [], tags, tr))
        self.commit(plan, ready)

    def _record_error(self, row: Row, error: str) -> None:
        now = self.catalog.clock.now()
        with self.catalog.backend.write() as conn:
            _upsert_state(conn, row.meta.table_id, {"namespace": row.meta.namespace, "name": row.meta.name,
                                                    "error": error[:2000], "error_at": now, "updated_at": now})


# ------------------------------------------------------ catalog records

def _state_values(row: Row, pub: IcebergTable, tags: Mapping[int, int], now: float) -> dict[str, Any]:
    return {"namespace": row.meta.namespace, "name": row.meta.name,
            "metadata_location": pub.metadata_location, "version": pub.head_version(),
            "barrier": max(tags) if tags else None,
            "main_version": pub.version_of(pub.metadata.current_snapshot_id),
            "error": None, "error_at": None, "updated_at": now}


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

