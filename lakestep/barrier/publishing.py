"""Where Iceberg publishing stands, read from the catalog alone (no PyIceberg needed):
``lakestep doctor``, ``describe`` and the report read it; :func:`enable` switches it on.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa

from ..catalog import schema as S
from .facts import facts
from .progress import committed_from
from .sealing import open_epoch
from .topology import Topology

if TYPE_CHECKING:
    from ..catalog import Catalog


@dataclass(frozen=True)
class PublisherStatus:
    """What ``lakestep doctor`` and ``describe`` show of publishing."""

    enabled: bool
    holder: str | None
    expires_at: float
    complete: int | None
    committed: int
    round_at: float | None
    error: str | None
    tables: dict[str, dict[str, Any]]  # per published table: its ls_published_table row
    behind_since: float | None = None  # when the oldest barrier not complete yet was sealed

    @property
    def published(self) -> bool:
        return self.enabled or bool(self.tables)

    @property
    def lag(self) -> int | None:
        """Barriers committed but not yet complete in Iceberg (None: nothing published yet)."""
        return None if self.complete is None else max(0, self.committed - self.complete)


def enable(catalog: "Catalog", on: bool = True) -> None:
    """Turn publishing on (or off) for the catalog: the maintenance loop publishes while it is on."""
    with catalog.backend.write() as conn:
        conn.execute(sa.update(S.publisher).where(S.publisher.c.id == 1).values(enabled=bool(on)))


def enabled(catalog: "Catalog") -> bool:
    with catalog.backend.read() as conn:
        return bool(conn.execute(sa.select(S.publisher.c.enabled).where(S.publisher.c.id == 1)).scalar())


def status(catalog: "Catalog", topology: Topology | None = None) -> PublisherStatus:
    """Where publishing stands (``lakestep doctor``, ``describe``); ``topology``: one to reuse
    (its graph is cached by generation)."""
    topo = topology or Topology(catalog)
    with catalog.backend.read() as conn:
        st = conn.execute(sa.select(S.publisher).where(S.publisher.c.id == 1)).mappings().one()
        graph = topo.graph(conn)
        o = open_epoch(conn)
        committed = committed_from(graph, facts(conn, graph.derived), o)
        sealed_at = None
        if st["complete_barrier"] is not None and committed > st["complete_barrier"]:
            sealed_at = conn.execute(sa.select(S.seals.c.sealed_at).where(
                S.seals.c.barrier == int(st["complete_barrier"]) + 1)).scalar()
        tables = {f"{r['namespace']}.{r['name']}": dict(r) for r in conn.execute(S.published_tables.select()).mappings()}
    return PublisherStatus(bool(st["enabled"]), st["holder"], float(st["expires_at"]),
                           None if st["complete_barrier"] is None else int(st["complete_barrier"]), committed,
                           st["round_at"], st["error"], tables, sealed_at)
