"""Rollback of the whole topology to a barrier, by new commits (history kept).

:func:`rollback` makes every commit with a barrier above ``to`` invisible in
every table of the topology, in one database transaction:

1. lock the coordinator lease row FOR UPDATE: no seal and no snapshot of
   the coordinator runs meanwhile (a snapshot taken between the check of
   step 4 and the commit would be rolled back);
2. lock the topology row (shared): no job changes meanwhile;
3. lock the rows of every topology table FOR UPDATE, in table-id order:
   commits in flight on them finish first, new ones (root commits included,
   on either commit path) wait until the rollback has committed, so every
   decision below is taken on the final state (SQLite: the writer lock does
   all three);
4. refuse (:class:`RollbackRefusedError`) when a live snapshot of a topology
   table carries a barrier above ``to``: snapshots are never rolled back;
5. for every table of the topology: its version at ``to`` (rules.py, rule 9); a
   RESTORE to that version is needed when its rows differ from the head's,
   or, for a derived table, when its frontier is past ``to``;
6. commit those RESTOREs, each tagged with barrier ``to``: the whole topology
   rolls back, or none of it; record the rollback in ``ls_rollback`` and
   lower the coordinator's snapshot progress to ``to``.

The epoch row is not locked: root commits take it FOR SHARE before or after
their table row depending on the commit path, so holding it exclusively
while locking table rows could deadlock. A root commit that waited for the
rollback lands after it, in the open epoch, and stays visible.

After it, reads at any barrier ``>= to`` see the rows of ``to`` (the restore
is the newest commit with a barrier ``<= e``), reads below ``to`` see the
untouched history; derived tables' frontiers are back at ``to``, so their
jobs plan ``to+1`` next and process the (now unchanged) barriers up to the
open epoch in one batch. Root jobs keep committing into the open epoch.

Not guaranteed: the rolled-back input is gone from the root tables;
re-ingesting it (rewinding a Kafka offset, re-reading files) is the root
jobs' business. A derived job's batch planned before the rollback fails its
commit check (:class:`StaleBatchError`) and must be planned again.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from ..catalog import schema as S
from ..catalog.changes import CommitResult, Operation, TableChange
from ..errors import InvalidArgumentError
from .errors import RollbackRefusedError, RollbackRetriesExhaustedError
from .facts import facts, versions_at
from .progress import frontier
from .sealing import open_epoch
from .snapshots import newest_snapshot
from .topology import Topology, read_generation

if TYPE_CHECKING:
    from ..catalog import Catalog, Table

_ATTEMPTS = 5  # the topology gained a table between loading and locking: load and lock again
_LOCK_LEASE = sa.select(S.coordinator.c.token).where(S.coordinator.c.id == 1).with_for_update()
_LOCK_TABLES = (
    sa.select(S.tables.c.table_id)
    .where(S.tables.c.table_id.in_(sa.bindparam("ids", expanding=True)))
    .order_by(S.tables.c.table_id)
    .with_for_update()
)


@dataclass(frozen=True)
class TableRollback:
    table: str
    from_version: int  # the head before the rollback
    to_version: int  # the version at the barrier, restored
    restore_version: int  # the RESTORE commit's version


@dataclass(frozen=True)
class RollbackResult:
    to_barrier: int
    open_epoch: int
    tables: dict[str, TableRollback]  # the tables that needed a RESTORE
    rollback_id: int | None


def rollback(catalog: "Catalog", topology: Topology, to: int, *,
             load: "Callable[[str, int], Table] | None" = None) -> RollbackResult:
    """Roll every table of the topology back to barrier ``to`` (module docstring)."""
    if to < 0:
        raise InvalidArgumentError("a barrier is >= 0", argument="to", value=to)
    load = load or (lambda ident, _tid: catalog.load_table(ident))
    tables: dict[int, "Table"] = {}
    with catalog.backend.read() as conn:
        g = topology.graph(conn)
    for tid in g.managed:
        tables[tid] = load(g.names[tid], tid)
    changes: list[TableChange] = []
    plan: dict[int, tuple[int, int]] = {}  # table id -> (head, version at `to`)
    state: dict[str, int] = {}

    def guard(conn: Connection) -> list[CommitResult] | None:
        changes.clear()
        plan.clear()
        conn.execute(_LOCK_LEASE)
        read_generation(conn, lock="share")
        graph = topology.graph(conn)
        ids = graph.managed
        missing = [t for t in ids if t not in tables or tables[t].table_id != t]
        if missing:  # the topology changed since we looked: start over
            raise _Retry()
        if catalog.backend.row_locks:
            conn.execute(_LOCK_TABLES, {"ids": sorted(ids)})
        state["open"] = open_epoch(conn)
        snap = newest_snapshot(conn, ids, catalog.clock.now())
        if snap is not None and snap[1] > to:
            raise RollbackRefusedError(to_barrier=to, snapshot_barrier=snap[1], table=graph.names[snap[0]])
        fx = facts(conn, ids)
        heads = {int(r[0]): int(r[1]) for r in conn.execute(
            sa.select(S.tables.c.table_id, S.tables.c.data_version).where(S.tables.c.table_id.in_(ids)))}
        at = versions_at(conn, ids, to)
        for tid in sorted(ids):
            f = fx[tid]
            behind = graph.kind(tid) == "derived" and (frontier(graph, f, state["open"]) or 0) > to
            if at[tid].data_version == heads[tid] and not behind:
                continue
            t = tables[tid]
            plan[tid] = (f.head, at[tid].version)
            changes.append(TableChange(
                table_id=tid, ident=t.ident, location=t.location, operation=Operation.RESTORE,
                base_version=at[tid].version, barrier=to, retention_seconds=t.retention_seconds,
                summary={"restored_to": at[tid].version, "rollback_to_barrier": to},
            ))
        return [] if not changes else None

    def after(conn: Connection, results: list[CommitResult]) -> None:
        summary = {r.table: {"from_version": plan[c.table_id][0], "to_version": plan[c.table_id][1],
                             "restore_version": r.version} for c, r in zip(changes, results)}
        state["id"] = int(conn.execute(sa.insert(S.rollbacks).values(
            to_barrier=to, open_epoch=state["open"], created_at=catalog.clock.now(), summary=json.dumps(summary),
        ).returning(S.rollbacks.c.rollback_id)).scalar_one())
        c = S.coordinator.c
        conn.execute(sa.update(S.coordinator).where(c.id == 1, c.snapshot_barrier > to).values(snapshot_barrier=to))

    for _ in range(_ATTEMPTS):
        try:
            committed, results = catalog.commit_guarded(changes, guard=guard, after=after)
            break
        except _Retry:
            with catalog.backend.read() as conn:
                g = topology.graph(conn)
            for tid in g.managed:
                tables.setdefault(tid, load(g.names[tid], tid))
    else:
        raise RollbackRetriesExhaustedError(to_barrier=to, attempts=_ATTEMPTS)
    out = {}
    for c, r in zip(changes, results if committed else []):
        out[c.ident] = TableRollback(c.ident, plan[c.table_id][0], plan[c.table_id][1], r.version)
    return RollbackResult(to, state.get("open", 0), out, state.get("id"))


class _Retry(Exception):
    """Internal: the topology gained a table between loading and locking."""
