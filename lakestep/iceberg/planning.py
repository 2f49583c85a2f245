"""A publish round's plan (publisher.py, step 2): what the round tags, read in one database snapshot.

:func:`plan_round` reads the publisher's row (the complete cut ``C``, the newest
rollback handled), the topology, the COMMIT barrier ``P`` and set, every lakestep
table, the published tables' records, rollbacks since the last round and the
coordinator's snapshot retention, and returns the :class:`Plan`: the barriers
above ``C`` up to ``P`` (at most :data:`MAX_BARRIERS_PER_ROUND`; barriers
already pruned skipped) with each published table's version at each, and the
cleanup floors step 5's retention needs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Sequence

import sqlalchemy as sa

from ..barrier.errors import BarrierNotRetainedError
from ..barrier.facts import facts, versions_at
from ..barrier.progress import commit_set, committed_from
from ..barrier.sealing import open_epoch
from ..barrier.snapshots import oldest_retained
from ..barrier.topology import Topology
from ..catalog import properties as P
from ..catalog import retention
from ..catalog import schema as S
from ..catalog.handle import TableMeta

if TYPE_CHECKING:
    from ..catalog import Catalog

#: Barriers one round tags at most (a publisher far behind catches up over several rounds).
MAX_BARRIERS_PER_ROUND = 500


@dataclass
class Row:
    """A lakestep table as the plan reads it."""

    meta: TableMeta
    version: int

    @property
    def ident(self) -> str:
        return f"{self.meta.namespace}.{self.meta.name}"


@dataclass
class Plan:
    """One round's plan (publisher.py, step 2)."""

    complete: int | None
    barriers: list[int]
    rows: dict[int, Row]
    members: set[int]  # managed tables of the COMMIT set
    kinds: dict[int, str]  # root / derived (unmanaged tables are missing)
    versions: dict[int, dict[int, int]]  # barrier -> table -> its version there
    published: dict[int, sa.RowMapping]
    rollback_to: int | None
    rollback_id: int  # the newest rollback seen
    handled: int  # the newest rollback every table had handled before this round
    since: int | None  # the oldest barrier the coordinator's snapshots retain
    now: float
    floors: dict[int, int]  # table -> its cleanup floor (the tables whose retention follows versions)


def wanted(row: Row) -> bool:
    """Whether the table is published (its ``iceberg.publish`` property)."""
    return bool(P.value(row.ident, row.meta.properties, P.ICEBERG_PUBLISH))


def plan_round(catalog: "Catalog", topology: Topology) -> Plan:
    """Step 2: the round's plan, in one database snapshot of ``catalog``."""
    p, t = S.publisher.c, S.tables
    now = catalog.clock.now()
    with catalog.backend.read() as conn:
        st = conn.execute(sa.select(S.publisher).where(p.id == 1)).mappings().one()
        graph = topology.graph(conn)
        open_ = open_epoch(conn)
        fx = facts(conn, graph.derived)
        committed = committed_from(graph, fx, open_)
        members = set(commit_set(graph, fx, open_))
        rows = {int(r["table_id"]): Row(TableMeta.from_row(r), int(r["version"]))
                for r in conn.execute(t.select()).mappings()}
        published = {int(r["table_id"]): r for r in conn.execute(S.published_tables.select()).mappings()}
        rb = conn.execute(sa.select(sa.func.min(S.rollbacks.c.to_barrier), sa.func.max(S.rollbacks.c.rollback_id))
                          .where(S.rollbacks.c.rollback_id > st["rollback_id"])).one()
        since = oldest_retained(conn, now)
        complete = st["complete_barrier"]
        rollback_to = None if rb[0] is None else int(rb[0])
        if rollback_to is not None and complete is not None and complete > rollback_to:
            complete = rollback_to
        if complete is None:  # the first round: the newest barriers lakestep still retains
            first = max(1, since or 1, committed - MAX_BARRIERS_PER_ROUND + 1)
        else:
            first = max(int(complete) + 1, since or 1)
        barriers = list(range(first, committed + 1))[:MAX_BARRIERS_PER_ROUND]
        ids = sorted(i for i in members if i in rows and wanted(rows[i]))
        versions: dict[int, dict[int, int]] = {}
        for b in list(barriers):
            try:
                at = versions_at(conn, ids, b)
            except BarrierNotRetainedError:  # pruned by cleanup: no tag can show it any more
                if complete is None or b <= min(versions, default=b):
                    barriers.remove(b)
                    continue
                raise
            versions[b] = {tid: a.version for tid, a in at.items()}
        floors = cleanup_floors(conn, [r for tid, r in rows.items() if wanted(r) and (
            since is None or tid not in members)], now)
    return Plan(None if complete is None else int(complete), barriers, rows, members,
                dict(graph.kinds), versions,
                published, rollback_to, int(rb[1] or st["rollback_id"]), int(st["rollback_id"]),
                since, now, floors)


def cleanup_floors(conn: sa.Connection, rows: Sequence[Row], now: float) -> dict[int, int]:
    """Each table's cleanup floor (catalog/retention.py step 3)."""
    return retention.floors(conn, {r.meta.table_id: float(P.value(r.ident, r.meta.properties, P.RETENTION))
                                   for r in rows}, now)
