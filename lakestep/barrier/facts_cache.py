"""The barrier facts of every table, kept between reads (a cache of facts.py's answers).

:class:`FactsCache` keeps every table's :class:`~lakestep.barrier.facts.Facts`
up to date by change stamp, and each queried table's version at a barrier
with the span of barriers over which it holds; :class:`FrontierIndex` keeps
the tag frontiers grouped by value, so e* of a wide scope (rules.py, rule 8)
is found without a pass over the scope. Both are accelerators of rules.py,
checked against it by tests/barrier/test_rules.py.
"""

from __future__ import annotations

import collections
import threading
from dataclasses import dataclass, replace
from typing import Iterable

from sqlalchemy.engine import Connection

from ..catalog import schema as S
from . import rules
from ._sql import Query
from .facts import At, Facts, row_facts, versions_at, versions_spans
from .graph import Graph


def _changed_query(dialect: str) -> Query:
    """The facts of the tables changed since ``:since`` (schema.py, version 9), with the
    open epoch, the topology generation and the next ``since``, in one statement; one
    row with NULL facts when nothing changed."""
    return Query(f"changed_{dialect}", f"""
WITH o AS MATERIALIZED (
    SELECT ep.open_epoch, g.generation, {S.WATERMARK_SQL[dialect]} AS since
      FROM ls_epoch ep CROSS JOIN ls_topology g WHERE ep.id = 1 AND g.id = 1),
w AS MATERIALIZED (
    SELECT t.table_id, t.namespace, t.name, t.version AS head,
           (SELECT max(r.version) FROM ls_commit r
             WHERE r.table_id = t.table_id AND r.operation = 'RESTORE') AS restore_v
      FROM ls_table t WHERE t.stamp >= :since)
SELECT o.open_epoch, o.generation, o.since, w.table_id, w.namespace, w.name, w.head, w.restore_v,
       (SELECT c.barrier FROM ls_commit c
         WHERE c.table_id = w.table_id AND c.barrier IS NOT NULL AND c.version >= COALESCE(w.restore_v, 0)
         ORDER BY c.barrier DESC, c.version DESC LIMIT 1) AS tag
  FROM o LEFT JOIN w ON 1 = 1
""", {"since": "bigint"})


_CHANGED = {d: _changed_query(d) for d in ("sqlite", "postgresql")}


@dataclass(frozen=True)
class Known:
    """Every table's :class:`Facts` in one database snapshot, with the open epoch and the
    topology generation of that snapshot (:meth:`FactsCache.look`)."""

    generation: int
    open_epoch: int
    facts: dict[int, Facts]  # never changed once published
    seq: int = 0  # numbers the looks that changed a fact (FactsCache.changed_since)
    look: int = 0  # numbers every look (FactsCache.versions_at: kept answers serve the newest look only)


class FactsCache:
    """The facts of every table of the catalog, kept up to date by change stamp.

    A read whose scope is the whole topology (``choose(scope="global")``) needs
    the facts of hundreds of tables; :func:`facts` costs a seek per table. This
    cache asks only for the tables whose ``ls_table.stamp`` is at or above the
    watermark of its previous look (schema.py, version 9), so a look costs what
    changed, not what exists. A new topology generation (a job registered or
    retired, a table dropped) starts over from nothing.

    1. :meth:`look` must be the first statement of a read transaction: its rows and
       the kept facts then describe that transaction's snapshot exactly.
    2. Looks are serialised by a lock held over the statement, so snapshots reach
       the cache in order; each look publishes a new :class:`Known` (copy on write),
       which callers may keep and share.

    3. :meth:`versions_at` keeps each queried table's version at a barrier with the
       span of barriers over which that answer holds, and serves it again while the
       table's stamp is unchanged: every look drops the answers of the tables its
       rows name (a commit, a cleanup that pruned commit rows, a rename), and a new
       generation drops them all. Kept answers are read and written only by a call
       whose look is the newest, so each describes the caller's snapshot.

    Not guaranteed: a transaction left open anywhere on a PostgreSQL server holds
    the watermark back (its xmin), so every look re-reads the tables changed since
    it began: correct, but as slow as the changes that piled up.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._known: Known | None = None
        self._since = 0
        self._seq = 0
        self._looks = 0
        self._spans: dict[int, tuple[int, int | None, At]] = {}  # table -> (lo, hi or None, answer)
        #: answers served from ``_spans`` and asked of the database (tests read them)
        self.kept_hits = 0
        self.kept_misses = 0
        self._log: collections.deque[tuple[int, frozenset[int]]] = collections.deque(maxlen=256)
        self._index: FrontierIndex | None = None

    def look(self, conn: Connection) -> Known:
        with self._lock:
            query = _CHANGED["postgresql" if conn.dialect.name == "postgresql" else "sqlite"]
            old = self._known
            since = 0 if old is None else self._since
            rows = query(conn, since=since).all()
            gen = int(rows[0][1])
            if old is not None and gen != old.generation:  # dropped rows are not stamped: start over
                old, since = None, 0
                rows = query(conn, since=0).all()
                gen = int(rows[0][1])
                self._log.clear()
            self._looks += 1
            if old is None:
                self._spans.clear()
            new: dict[int, Facts] = {}
            for r in rows:
                if r[3] is None:
                    continue
                self._spans.pop(int(r[3]), None)  # stamped since the last look: its answers may have changed
                f = row_facts(conn, r[3:9])
                if old is None or old.facts.get(f.table_id) != f:  # rows at the watermark come again, unchanged
                    new[f.table_id] = f
            self._since = int(rows[0][2])
            if old is not None and not new and int(rows[0][0]) == old.open_epoch:
                self._known = replace(old, look=self._looks)
                return self._known
            self._seq += 1
            if old is not None:
                self._log.append((self._seq, frozenset(new)))
            self._known = Known(gen, int(rows[0][0]), {**old.facts, **new} if old is not None else new, self._seq,
                                self._looks)
            return self._known

    def versions_at(self, conn: Connection, known: Known, ids: Iterable[int], barrier: int) -> dict[int, At]:
        """:func:`versions_at` in the snapshot of ``known``'s look, from the kept answers where
        they hold (3.); the others are asked of the database, and kept if no look came since."""
        ids = list(ids)
        out: dict[int, At] = {}
        with self._lock:
            newest = known.look == self._looks
            if newest:
                for t in ids:
                    kept = self._spans.get(t)
                    if kept is not None and kept[0] <= barrier and (kept[1] is None or barrier < kept[1]):
                        out[t] = kept[2]
                self.kept_hits += len(out)
        ask = [t for t in ids if t not in out]
        if not ask:
            return out
        if not newest:
            out.update(versions_at(conn, ask, barrier))
            return out
        got, spans = versions_spans(conn, ask, barrier)
        out.update(got)
        with self._lock:
            self.kept_misses += len(ask)
            if known.look == self._looks:
                self._spans.update(spans)
        return out

    def changed_since(self, seq: int, upto: int) -> frozenset[int] | None:
        """The tables whose facts changed between two looks (None: no longer known). Lock held."""
        if seq == upto:
            return frozenset()
        if seq > upto or not self._log or self._log[0][0] > seq + 1 or self._log[-1][0] < upto:
            return None
        out: set[int] = set()
        for s, ids in self._log:
            if seq < s <= upto:
                out |= ids
        return frozenset(out)

    def wide_barrier(self, known: Known, graph: Graph, queried: set[int], scope: str
                     ) -> tuple[int, set[int], tuple[int, ...], bool] | None:
        """e* of scope ``related`` or ``global`` from a :class:`FrontierIndex` kept up to date
        with the looks (:meth:`FrontierIndex.e_star`).
        None: the index cannot describe ``known`` (an older look); use the full pass."""
        with self._lock:
            ix = self._index
            if ix is None or ix.graph is not graph or ix.seq > known.seq:
                ix = None
            elif ix.seq < known.seq:
                ids = self.changed_since(ix.seq, known.seq)
                if ids is None:
                    ix = None
                else:
                    ix.update(known, ids)
            if ix is None:
                if self._known is not known:
                    return None  # an older snapshot than the newest look: not worth an index
                ix = self._index = FrontierIndex(graph, known)
            return ix.e_star(known, queried, scope)


class FrontierIndex:
    """The tag frontiers of the derived tables of one graph that are not catching up,
    grouped by value, over all tables and per weakly connected component: e* of a wide
    scope is the lowest value of its groups (and of its queried tables), found without
    a pass over the scope. A derived table is catching up while its newest tag is below
    its joined barrier (the joined barrier is at most ``O - 1`` since it was registered,
    so the open epoch does not enter). Updated in place by :meth:`FactsCache.wide_barrier`
    under its lock."""

    def __init__(self, graph: Graph, known: Known) -> None:
        self.graph = graph
        self.seq = known.seq
        self.value: dict[int, int] = {}  # derived table -> its tag (0 if none), if not catching up
        self.groups: dict[object, dict[int, set[int]]] = {None: {}}  # None: all; else a component
        self.roots: dict[object, int] = {None: len(graph.roots)}
        for t in graph.roots:
            comp = graph.component_of(t)
            self.roots[comp] = self.roots.get(comp, 0) + 1
        for t in graph.kinds:
            if graph.kinds[t] == "derived":
                self._put(t, known.facts.get(t), known.open_epoch)

    def _buckets(self, t: int) -> list[dict[int, set[int]]]:
        return [self.groups[None], self.groups.setdefault(self.graph.component_of(t), {})]

    def _put(self, t: int, f: Facts | None, open_: int) -> None:
        old = self.value.pop(t, None)
        if old is not None:
            for b in self._buckets(t):
                members = b[old]
                members.discard(t)
                if not members:
                    del b[old]
        if f is None:
            return
        if rules.catching_up(rules.member(self.graph, t, f.tag), open_):
            return  # rule 5: left out until it reaches its joined barrier (<= open_ - 1, so this never flips later)
        v = 0 if f.tag is None else f.tag
        self.value[t] = v
        for b in self._buckets(t):
            b.setdefault(v, set()).add(t)

    def update(self, known: Known, ids: frozenset[int]) -> None:
        for t in ids:
            if self.graph.kinds.get(t) == "derived":
                self._put(t, known.facts.get(t), known.open_epoch)
        self.seq = known.seq

    def e_star(self, known: Known, queried: set[int], scope: str) -> tuple[int, set[int], tuple[int, ...], bool]:
        """(e*, the managed queried tables, the ids holding e* back, whether the scope
        holds a managed table): what choose.e_star finds with a pass over the scope."""
        sealed = rules.sealed(known.open_epoch)
        keys: set[object] = {None}
        if scope == "related":
            keys = {c for c in (self.graph.component_of(t) for t in queried) if c is not None}
        barrier = sealed
        any_managed = False
        low: list[dict[int, set[int]]] = []
        for k in keys:
            any_managed = any_managed or self.roots.get(k, 0) > 0
            b = self.groups.get(k)
            if b:
                any_managed = True
                low.append(b)
                barrier = min(barrier, min(b))
        kinds = self.graph.kinds
        managed_q = queried & kinds.keys()
        # The queried derived tables that are not catching up are in the groups above already
        # (their frontier is their tag, capped at O - 1 by ``sealed``); a root's frontier is
        # O - 1, which neither lowers e* nor holds it back. Left: the derived ones catching up.
        fq: dict[int, int] = {}
        for t in managed_q - self.value.keys():
            if kinds[t] != "root":
                fq[t] = f = rules.tag_frontier(known.facts[t].tag, known.open_epoch)
                barrier = min(barrier, f)
        held: set[int] = set()
        if barrier < sealed:
            for b in low:
                held |= b.get(barrier, set())
            held |= {t for t, f in fq.items() if f == barrier}
        return barrier, managed_q, tuple(held), any_managed or bool(managed_q)
