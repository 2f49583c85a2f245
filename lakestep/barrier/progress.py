"""How far each table and the pipeline have come: frontiers, the COMMIT set, the committed
barrier and a table's states at a barrier (the rules of rules.py applied to the catalog's
facts). The operator's overview built from these is status.py's.

Nothing is stored per (table, barrier): every state is computed from
``ls_epoch``, ``ls_commit`` (its ``barrier`` column) and ``ls_snapshot``.
``O`` is the open epoch; ``t`` a table. The rules themselves are defined once,
in rules.py; the facts they need (a table's head and tag, its version at a
barrier) are read by facts.py; snapshots by snapshots.py.

* **sealed** ``e``: ``e < O`` (rule 1).
* **PRECOMMIT(t, e)**: ``e <= frontier(t)`` (rule 4).
* **COMMIT(e)**: ``e <= committed``, the newest COMMIT barrier (rule 7).
* **SNAPSHOT(t, e)**: a live row of ``ls_snapshot`` names a version of ``t``
  with barrier ``e`` (snapshots.py).

The functions here are the rules' adapters to a :class:`Graph` and
:class:`Facts`. (Named states.py until 0.2, when it also re-exported what facts.py,
facts_cache.py and snapshots.py define.)
"""

from __future__ import annotations

import enum
import time

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from ..catalog import retention
from ..catalog import schema as S
from . import rules
from .facts import Facts, facts
from .graph import Graph, Job


def member(graph: Graph, f: Facts) -> rules.Member:
    """A table as the rules see it: its kind and joined barrier from ``graph``, its tag from ``f``."""
    return rules.member(graph, f.table_id, f.tag)


def frontier(graph: Graph, f: Facts, open_: int) -> int | None:
    """frontier(t) (rules.py, rule 4)."""
    return rules.frontier(graph.kind(f.table_id), f.tag, open_)


def tag_frontier(f: Facts, open_: int) -> int:
    """The frontier a table's own commits give it, whatever the topology says now (rules.py,
    rule 3): the rule of a derived table, and of a sink a batch judges (which may have left
    the topology meanwhile)."""
    return rules.tag_frontier(f.tag, open_)


def job_frontier(graph: Graph, fx: dict[int, Facts], job: Job, open_: int) -> int:
    """The barrier a job's batches have reached (rules.py, rule 6); ``fx`` covers the sinks."""
    return rules.job_frontier(frontier(graph, fx[t], open_) for t in job.sink_ids)


def catching_up(graph: Graph, f: Facts, open_: int) -> bool:
    """A derived table that has not yet reached the barrier it must reach to join the COMMIT
    set (rules.py, rule 5)."""
    return rules.catching_up(member(graph, f), open_)


def commit_set(graph: Graph, fx: dict[int, Facts], open_: int) -> list[int]:
    """The topology's tables minus the derived ones catching up (rules.py, rule 7; ``fx``
    covers the derived ones)."""
    return rules.commit_set(_members(graph, fx, graph.managed), open_)


def committed_barrier(conn: Connection, graph: Graph, open_: int) -> int:
    """The newest COMMIT barrier: every table of the COMMIT set has precommitted it."""
    return committed_from(graph, facts(conn, graph.derived), open_)


def committed_from(graph: Graph, fx: dict[int, Facts], open_: int) -> int:
    """:func:`committed_barrier` from the facts of the derived tables (rules.py, rule 7); a
    derived table missing from ``fx`` (dropped meanwhile) is not counted."""
    return rules.committed(_members(graph, fx, [t for t in graph.derived if t in fx]), open_)


def _members(graph: Graph, fx: dict[int, Facts], ids: list[int]) -> list[rules.Member]:
    tags = {t: f.tag for t, f in fx.items()}
    return rules.members(graph, tags, ids)


class BarrierState(str, enum.Enum):
    """The states of a table at a barrier (module docstring)."""

    PRECOMMIT = "PRECOMMIT"
    COMMIT = "COMMIT"
    SNAPSHOT = "SNAPSHOT"


def table_states(conn: Connection, graph: Graph, table_id: int, barrier: int, open_: int,
                 now: float | None = None) -> frozenset[BarrierState]:
    """The states table ``table_id`` holds for ``barrier`` (empty: none yet); ``now``: the
    catalog clock's time, against which snapshots expire."""
    now = time.time() if now is None else now
    out: set[BarrierState] = set()
    f = frontier(graph, facts(conn, [table_id])[table_id], open_)
    if f is not None and barrier <= f:
        out.add(BarrierState.PRECOMMIT)
    if f is not None and barrier <= committed_barrier(conn, graph, open_):
        out.add(BarrierState.COMMIT)
    c = S.snapshots.c
    if conn.execute(sa.select(c.name).where(
            c.table_id == table_id, c.barrier == barrier,
            retention.live(S.snapshots, now)).limit(1)).first() is not None:
        out.add(BarrierState.SNAPSHOT)
    return frozenset(out)
