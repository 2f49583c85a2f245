"""The barrier rules, each defined once: pure functions, no database.

Everything else in the barrier layer that answers one of these questions is a
cache or an accelerator of a rule here, and is checked against it
(tests/barrier/test_rules.py, a property test over random topologies, commit
histories and seals): the SQL of ``facts.py`` (one statement for a choice, for
the versions of many tables), the era loop of ``facts.py``, the
``FrontierIndex`` and the kept answers of ``facts_cache.py``.

Inputs are plain values: ``O`` (the open epoch), a table's kind in the
topology (``root``, ``derived``, ``unmanaged``), its *tag*, its joined
barrier, and its commit history.

1. **sealed** ``e``: ``e < O``; the newest sealed barrier is ``O - 1``
   (``lakestep.catalog.epoch.sealed``, which the catalog shares).
2. **tag(t)** (:func:`tag`): the barrier of t's newest barriered commit of
   the newest era (the commits from its newest RESTORE on); with none there,
   but a RESTORE without a barrier, the barrier of its newest barriered commit.
3. **tag frontier** (:func:`tag_frontier`): the tag (0 if none), at most
   ``O - 1``: what a table's own commits say it has reached.
4. **frontier(t)** (:func:`frontier`): root ``O - 1`` (sealing ``e``
   precommits ``e`` for every root); derived its tag frontier (a derived job
   commits its barriers in order); unmanaged none (barriers do not apply).
5. **catching up** (:func:`catching_up`): a derived table whose frontier is
   still below its joined barrier (> 0): the barrier its job must reach
   before the table joins the COMMIT set.
6. **job frontier** (:func:`job_frontier`): the lowest frontier of a job's
   sinks (0 if none): the barriers its batches have reached. **ready**
   (:func:`ready`): the newest barrier a job may process, the lowest
   frontier of its managed sources and ``O - 1``.
7. **committed** (:func:`committed`): the newest COMMIT barrier, ``min(O -
   1, frontier(t))`` over the COMMIT set, the topology minus the derived
   tables catching up (:func:`commit_set`).
8. **scope** (:func:`scope`) and **e\\*** (:func:`e_star`): a read_committed
   read of the queried tables Q at scope ``query`` takes Q; ``related`` adds
   every managed table connected to Q through jobs; ``global`` takes every
   managed table and Q. e* is the lowest frontier over the scope's managed
   tables, leaving out derived tables catching up unless queried; ``O - 1``
   when none is managed. The tables at e* below ``O - 1`` hold it back.
9. **the version of t at barrier e** (:func:`version_at`): ``m``, the newest
   version whose commit carries a barrier ``<= e`` (searched era by era, the
   newest first; a RESTORE carries its target barrier; 0, the creation, if
   none); the answer is the newest version with the data version of ``m``
   (commits that change no rows, such as compactions, are included). A
   history whose record of ``m``, or of the commit after ``m``, was pruned
   cannot answer (:class:`BarrierNotRetainedError`).

Not guaranteed: the rules describe a catalog written as the protocols say (a
derived table's barriers in order, barriers increasing within an era); a
history that breaks that gives answers consistent with these rules, not
consistent reads.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Literal, Mapping, Sequence

from ..catalog.epoch import sealed
from .errors import BarrierNotRetainedError
from .graph import Graph, TableKind

Scope = Literal["query", "related", "global"]

__all__ = [
    "Commit", "EStar", "Member", "catching_up", "commit_set", "committed", "e_star", "frontier", "job_frontier",
    "ready", "scope", "sealed", "tag", "tag_frontier", "version_at",
]


@dataclass(frozen=True)
class Commit:
    """One commit of a table's history, as the catalog records it."""

    version: int
    barrier: int | None
    data_version: int
    restore: bool = False  # a RESTORE: barrier is the restored-to barrier (None: a manual restore)


@dataclass(frozen=True)
class Member:
    """A table as the rules see it."""

    table_id: int
    kind: TableKind
    tag: int | None = None
    joined: int = 0  # the joined barrier of its writer (derived tables)


# -- 2-5: one table ----------------------------------------------------------------------------

def tag(history: Sequence[Commit]) -> int | None:
    """Rule 2: the barrier of the newest barriered commit of the newest era."""
    restores = [c.version for c in history if c.restore]
    start = max(restores, default=0)
    era = [c.barrier for c in history if c.version >= start and c.barrier is not None]
    if era:
        return max(era)
    if not restores:
        return None
    older = [c for c in history if c.barrier is not None]
    return max(older, key=lambda c: c.version).barrier if older else None


def tag_frontier(tag_: int | None, open_: int) -> int:
    """Rule 3: the tag (0 if none), at most ``O - 1``."""
    return 0 if tag_ is None else min(tag_, sealed(open_))


def frontier(kind: TableKind, tag_: int | None, open_: int) -> int | None:
    """Rule 4: root ``O - 1``; derived its tag frontier; unmanaged None."""
    if kind == "root":
        return sealed(open_)
    if kind == "derived":
        return tag_frontier(tag_, open_)
    return None


def catching_up(m: Member, open_: int) -> bool:
    """Rule 5: a derived table below the joined barrier it must reach."""
    return m.kind == "derived" and tag_frontier(m.tag, open_) < m.joined  # joined 0: never (frontiers >= 0)


# -- 6-7: jobs and the COMMIT set --------------------------------------------------------------

def job_frontier(sink_frontiers: Iterable[int | None]) -> int:
    """Rule 6: the lowest frontier of a job's sinks (an unmanaged one counts 0; 0 if none)."""
    return min(((f or 0) for f in sink_frontiers), default=0)


def ready(source_frontiers: Iterable[int | None], open_: int) -> int:
    """Rule 6: the newest barrier a job may process: ``O - 1`` and its managed sources' frontiers."""
    return min([sealed(open_), *((f or 0) for f in source_frontiers)])


def commit_set(members: Iterable[Member], open_: int) -> list[int]:
    """Rule 7: the managed tables minus the derived ones catching up."""
    return [m.table_id for m in members if m.kind != "unmanaged" and not catching_up(m, open_)]


def committed(members: Iterable[Member], open_: int) -> int:
    """Rule 7: the newest COMMIT barrier."""
    out = sealed(open_)
    for m in members:
        if m.kind == "derived" and not catching_up(m, open_):
            out = min(out, tag_frontier(m.tag, open_))
    return out


# -- 8: a read's scope and e* ------------------------------------------------------------------

def scope(graph: Graph, queried: "set[int] | frozenset[int]", which: Scope) -> set[int]:
    """Rule 8: the tables whose frontiers bound a read of ``queried``."""
    if which == "query":
        return set(queried)
    if which == "related":
        return graph.component(queried) & (graph.managed_set | queried)
    return set(graph.managed_set | queried)


@dataclass(frozen=True)
class EStar:
    """e* of a scope and what it rests on."""

    barrier: int  # e*; O - 1 if no table of the scope is managed
    managed: dict[int, int]  # table id -> frontier, the managed tables that bound e*
    held: frozenset[int]  # the tables at e* below O - 1: they hold it back


def e_star(members: Iterable[Member], open_: int, queried: "set[int] | frozenset[int]" = frozenset()) -> EStar:
    """Rule 8: the lowest frontier of the managed members, derived ones catching up left
    out unless queried."""
    top = sealed(open_)
    managed: dict[int, int] = {}
    for m in members:
        f = frontier(m.kind, m.tag, open_)
        if f is None or (m.table_id not in queried and catching_up(m, open_)):
            continue
        managed[m.table_id] = f
    barrier = min(managed.values(), default=top)
    return EStar(barrier, managed, frozenset(t for t, f in managed.items() if f == barrier and f < top))


def member(graph: Graph, table_id: int, tag: int | None) -> Member:
    """A table as the rules see it: its kind and joined barrier from the topology, its tag."""
    return Member(table_id, graph.kinds.get(table_id, "unmanaged"), tag, graph.joined_barriers.get(table_id, 0))


def members(graph: Graph, tags: Mapping[int, int | None], ids: Iterable[int]) -> list[Member]:
    """The :class:`Member` of each of ``ids`` (:func:`member`), their tags from ``tags``."""
    return [member(graph, t, tags.get(t)) for t in ids]


# -- 9: the version at a barrier ---------------------------------------------------------------

def version_at(history: Sequence[Commit], e: int, *, name: str = "?") -> tuple[int, int]:
    """Rule 9: (version, data version) of a table at barrier ``e``."""
    by_version = {c.version: c for c in history}
    head = max(by_version)
    eras = sorted((c for c in history if c.restore), key=lambda c: -c.version)
    m: int | None = None
    hi = head + 1
    for r in [*eras, None]:
        lo = -1 if r is None else r.version
        best = max(((c.barrier, c.version) for c in history
                    if c.barrier is not None and c.barrier <= e and lo < c.version < hi), default=None)
        if best is not None:
            m = best[1]
            break
        if r is not None and r.barrier is not None and r.barrier <= e:
            m = r.version
            break
        hi = lo
    m = 0 if m is None else m
    if m not in by_version or (m < head and m + 1 not in by_version):
        raise BarrierNotRetainedError(name, e, None)
    dv = by_version[m].data_version
    nxt = min((c.version for c in history if c.version > m and c.data_version > dv), default=None)
    return (head if nxt is None else nxt - 1), dv
