"""Barrier states, derived exactly from commits, seals and snapshots.

Nothing is stored per (table, barrier): every state below is computed from
``ls_epoch``, ``ls_commit`` (its ``barrier`` column) and ``ls_snapshot``, with
index seeks (``ls_commit_barrier (table_id, barrier, version)``, the partial
``ls_commit_restore`` index and the primary key), so the cost does not grow
with the number of barriers. ``O`` is the open epoch; ``t`` a table.

* **sealed** ``e``: ``e < O``.
* **frontier(t)** (:func:`frontier`, the one definition): root: ``O - 1`` (sealing ``e`` precommits ``e`` for every
  root, docs/design.md §3.2); derived: the barrier of its newest commit carrying
  one (0 if none), since a derived job commits its barriers in order;
  unmanaged: none (barriers do not apply).
* **PRECOMMIT(t, e)**: ``e <= frontier(t)``.
* **COMMIT(e)**: ``e <= committed = min(O - 1, frontier(t) for every derived t
  of the COMMIT set)``; the COMMIT set is the topology minus the derived
  tables still catching up (topology.py).
* **SNAPSHOT(t, e)**: a live row of ``ls_snapshot`` names a version of ``t``
  with barrier ``e``.

**The version of t at barrier e** (``version_at``), the rule for commits
without a barrier included:

1. ``m`` = the newest version whose commit carries a barrier ``<= e``
   (0, the creation, if none). A commit without a barrier (compaction, a
   manual fix) therefore counts with the next commit that has one: it is
   never attributed to a barrier already precommitted.
2. The answer is the newest version with the *data version* of ``m``: commits
   after ``m`` that change no rows (compactions, empty appends) are
   included, so the files read are as compacted as possible and the rows are
   exactly those of ``m``.

Rollback (rollback.py) writes RESTORE commits tagged with the target barrier
``r``, so that "newest version with barrier <= e" is right across a rollback:
for ``e >= r`` it is the restore or later, for ``e < r`` it is untouched
history. Barriers increase with versions between two RESTOREs (an *era*);
the query seeks in the newest era and only falls back to older eras (a
short loop) when ``e`` is older than the last restore's barrier.

Not guaranteed: a derived table written out of barrier order (bypassing
:class:`~lakestep.barrier.jobs.JobBatch`), or data-changing commits without a
barrier on topology tables, void the consistency of the reads that involve
them. Cleanup prunes commit rows (and files) older than the retention window
that no snapshot or lock pins: a barrier whose versions are gone raises
:class:`BarrierNotRetainedError` (detected when the commit after ``m`` is
missing); a job lagging more than the retention window cannot be read
consistently at its frontier any more.
"""

from __future__ import annotations

import collections
import enum
import threading
import time
from dataclasses import dataclass, replace
from typing import Any, Iterable, Iterator, Sequence

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from ..catalog import schema as S
from ._sql import Query
from .errors import BarrierNotRetainedError
from .graph import Graph, Job

SNAPSHOT_PREFIX = "lakestep-barrier-"

# Per table: head, newest RESTORE, and the barrier of the newest barriered
# commit of the newest era (the frontier of a derived table); with the
# topology generation and the open epoch, so that one statement does.
_FACTS = Query("facts", """
WITH w AS MATERIALIZED (
    SELECT t.table_id, t.namespace, t.name, t.version AS head,
           (SELECT max(r.version) FROM ls_commit r
             WHERE r.table_id = t.table_id AND r.operation = 'RESTORE') AS restore_v
      FROM ls_table t WHERE t.table_id IN :ids)
SELECT w.table_id, w.namespace, w.name, w.head, w.restore_v,
       (SELECT c.barrier FROM ls_commit c
         WHERE c.table_id = w.table_id AND c.barrier IS NOT NULL AND c.version >= COALESCE(w.restore_v, 0)
         ORDER BY c.barrier DESC, c.version DESC LIMIT 1) AS tag,
       g.generation, o.open_epoch
  FROM w CROSS JOIN ls_topology g CROSS JOIN ls_epoch o
 WHERE g.id = 1 AND o.id = 1
""", {"ids": "bigint[]"})

# Per table at barrier :e: m (newest era; NULL means "look in older eras"),
# its data version, the first later version that changes data, and whether
# the commit after m is still recorded. MATERIALIZED: each subquery runs once.
_VERSIONS_SQL = """
WITH w AS MATERIALIZED (
    SELECT t.table_id, t.version AS head,
           (SELECT max(r.version) FROM ls_commit r
             WHERE r.table_id = t.table_id AND r.operation = 'RESTORE') AS restore_v
      FROM ls_table t WHERE t.table_id IN :ids),
x AS MATERIALIZED (
    SELECT w.table_id, w.head, w.restore_v,
           COALESCE((SELECT c.version FROM ls_commit c
                      WHERE c.table_id = w.table_id AND c.barrier <= :e AND c.version >= COALESCE(w.restore_v, 0)
                      ORDER BY c.barrier DESC, c.version DESC LIMIT 1),
                    CASE WHEN w.restore_v IS NULL THEN 0 END) AS m
      FROM w)
SELECT x.table_id, x.head, x.restore_v, x.m, d.data_version AS dv,
       (SELECT n.version FROM ls_commit n
         WHERE n.table_id = x.table_id AND n.version > x.m AND n.data_version > d.data_version
         ORDER BY n.version LIMIT 1) AS nxt,
       s.version AS succ{span}
  FROM x
  LEFT JOIN ls_commit d ON d.table_id = x.table_id AND d.version = x.m
  LEFT JOIN ls_commit s ON s.table_id = x.table_id AND s.version = x.m + 1
"""
_VERSIONS = Query("versions", _VERSIONS_SQL.format(span=""), {"ids": "bigint[]", "e": "bigint"})
# The same, with the barriers over which each answer holds (FactsCache.versions_at):
# from the barrier of m (0 if none) up to the lowest barrier above :e of the newest era (NULL: none).
_VERSIONS_SPAN = Query("versions_span", _VERSIONS_SQL.format(span=""",
       d.barrier AS lo,
       (SELECT min(h.barrier) FROM ls_commit h
         WHERE h.table_id = x.table_id AND h.barrier > :e AND h.version >= COALESCE(x.restore_v, 0)) AS hi"""),
                        {"ids": "bigint[]", "e": "bigint"})

# The whole read_committed choice in ONE statement (one round trip, one
# snapshot): facts of the scope tables, kinds and joined barriers from the
# topology tables, e* = min(frontier), and each queried table's version at e*.
# choose.py recomputes e* from the returned facts with the Python rules and
# falls back to the multi-statement path on any disagreement.
_CHOICE = Query("choice", """
WITH js AS MATERIALIZED (
    SELECT k.table_id,
           max(CASE WHEN j.external_input THEN 2 ELSE 1 END) AS kind,
           max(CASE WHEN j.external_input THEN 0 ELSE j.joined_barrier END) AS joined
      FROM ls_job_sink k JOIN ls_job j ON j.job_id = k.job_id
     WHERE j.retired_at IS NULL AND k.table_id IN :ids
     GROUP BY k.table_id),
w AS MATERIALIZED (
    SELECT t.table_id, t.namespace, t.name, t.version AS head,
           (SELECT max(r.version) FROM ls_commit r
             WHERE r.table_id = t.table_id AND r.operation = 'RESTORE') AS restore_v,
           js.kind, js.joined,
           CASE WHEN t.table_id IN :q THEN 1 ELSE 0 END AS queried
      FROM ls_table t LEFT JOIN js ON js.table_id = t.table_id
     WHERE t.table_id IN :ids),
o AS MATERIALIZED (
    SELECT ep.open_epoch, g.generation FROM ls_epoch ep CROSS JOIN ls_topology g WHERE ep.id = 1 AND g.id = 1),
f AS MATERIALIZED (
    SELECT w.table_id, w.namespace, w.name, w.head, w.restore_v, w.kind, w.joined, w.queried,
           (SELECT c.barrier FROM ls_commit c
             WHERE c.table_id = w.table_id AND c.barrier IS NOT NULL AND c.version >= COALESCE(w.restore_v, 0)
             ORDER BY c.barrier DESC, c.version DESC LIMIT 1) AS tag
      FROM w),
fr AS MATERIALIZED (
    SELECT f.table_id, f.namespace, f.name, f.head, f.restore_v, f.kind, f.joined, f.queried, f.tag,
           CASE WHEN f.kind = 2 THEN o.open_epoch - 1
                WHEN f.kind = 1 AND COALESCE(f.tag, 0) < o.open_epoch - 1 THEN COALESCE(f.tag, 0)
                WHEN f.kind = 1 THEN o.open_epoch - 1 END AS frontier
      FROM f CROSS JOIN o),
b AS MATERIALIZED (
    SELECT COALESCE(min(fr.frontier), (SELECT o.open_epoch - 1 FROM o)) AS e FROM fr
     WHERE fr.frontier IS NOT NULL
       AND (fr.queried = 1 OR fr.kind = 2 OR COALESCE(fr.joined, 0) = 0 OR fr.frontier >= fr.joined)),
x AS MATERIALIZED (
    SELECT fr.table_id,
           COALESCE((SELECT c.version FROM ls_commit c
                      WHERE c.table_id = fr.table_id AND c.barrier <= b.e AND c.version >= COALESCE(fr.restore_v, 0)
                      ORDER BY c.barrier DESC, c.version DESC LIMIT 1),
                    CASE WHEN fr.restore_v IS NULL THEN 0 END) AS m
      FROM fr CROSS JOIN b WHERE fr.queried = 1 AND fr.kind IS NOT NULL)
SELECT fr.table_id, fr.namespace, fr.name, fr.head, fr.restore_v, fr.tag, o.open_epoch, o.generation, b.e,
       x.m, d.data_version,
       CASE WHEN s.version IS NULL THEN NULL
            WHEN s.data_version > d.data_version THEN s.version
            ELSE (SELECT n.version FROM ls_commit n
                   WHERE n.table_id = x.table_id AND n.version > x.m + 1 AND n.data_version > d.data_version
                   ORDER BY n.version LIMIT 1) END AS nxt,
       s.version AS succ
  FROM fr CROSS JOIN o CROSS JOIN b
  LEFT JOIN x ON x.table_id = fr.table_id
  LEFT JOIN ls_commit d ON d.table_id = x.table_id AND d.version = x.m
  LEFT JOIN ls_commit s ON s.table_id = x.table_id AND s.version = x.m + 1
""", {"ids": "bigint[]", "q": "bigint[]"})

_RESTORES = sa.text(
    "SELECT version, barrier FROM ls_commit WHERE table_id = :t AND operation = 'RESTORE' ORDER BY version DESC"
)
_SEEK_ERA = sa.text("""
SELECT version FROM ls_commit
 WHERE table_id = :t AND barrier <= :e AND version > :lo AND version < :hi
 ORDER BY barrier DESC, version DESC LIMIT 1
""")
_DV_AT = sa.text("SELECT data_version FROM ls_commit WHERE table_id = :t AND version = :v")
_NEXT_DATA = sa.text("""
SELECT version FROM ls_commit WHERE table_id = :t AND version > :v AND data_version > :dv
 ORDER BY version LIMIT 1
""")
_NEWEST_TAG = sa.text("""
SELECT barrier FROM ls_commit WHERE table_id = :t AND barrier IS NOT NULL ORDER BY version DESC LIMIT 1
""")
_FIRST_CHANGE = sa.text("""
SELECT barrier FROM ls_commit
 WHERE table_id = :t AND version > :v AND barrier IS NOT NULL AND data_version > :dv
 ORDER BY version LIMIT 1
""")
_COMMON_SNAPSHOT = sa.text("""
SELECT s.barrier FROM ls_snapshot s
 WHERE s.table_id = :first AND s.barrier IS NOT NULL AND (s.expires_at IS NULL OR s.expires_at > :now)
   AND (SELECT count(DISTINCT s2.table_id) FROM ls_snapshot s2
         WHERE s2.barrier = s.barrier AND s2.table_id IN :ids
           AND (s2.expires_at IS NULL OR s2.expires_at > :now)) = :n
 ORDER BY s.barrier DESC LIMIT 1
""").bindparams(sa.bindparam("ids", expanding=True))
_SNAPSHOT_ROWS = sa.text("""
SELECT table_id, version, name FROM ls_snapshot
 WHERE barrier = :b AND table_id IN :ids AND (expires_at IS NULL OR expires_at > :now)
 ORDER BY table_id, name
""").bindparams(sa.bindparam("ids", expanding=True))
_NEWEST_SNAPSHOT = sa.text("""
SELECT table_id, barrier FROM ls_snapshot
 WHERE table_id IN :ids AND barrier IS NOT NULL AND (expires_at IS NULL OR expires_at > :now)
 ORDER BY barrier DESC LIMIT 1
""").bindparams(sa.bindparam("ids", expanding=True))
_OLDEST_RETAINED = sa.text(f"""
SELECT min(barrier) FROM ls_snapshot
 WHERE name LIKE '{SNAPSHOT_PREFIX}%' AND barrier IS NOT NULL AND (expires_at IS NULL OR expires_at > :now)
""")

_CHUNK = 500


@dataclass(frozen=True)
class Facts:
    """What one statement tells about a table: its name, head and newest barrier tag."""

    table_id: int
    ident: str
    head: int
    restore_version: int | None
    tag: int | None  # barrier of the newest barriered commit (of the newest era)


@dataclass(frozen=True)
class At:
    """The version of a table at a barrier, and that version's data version."""

    version: int
    data_version: int


def _chunks(ids: Sequence[int]) -> Iterable[list[int]]:
    ids = sorted(set(ids))
    for i in range(0, len(ids), _CHUNK):
        yield ids[i:i + _CHUNK]


def facts(conn: Connection, ids: Iterable[int]) -> dict[int, Facts]:
    """Head, newest RESTORE and newest barrier tag of each table (one statement)."""
    return facts_ex(conn, ids)[2]


def facts_ex(conn: Connection, ids: Iterable[int]) -> tuple[int | None, int | None, dict[int, Facts]]:
    """(topology generation, open epoch, :func:`facts`), in one statement; the first
    two are None when ``ids`` is empty."""
    out: dict[int, Facts] = {}
    gen = open_ = None
    for chunk in _chunks(list(ids)):
        for r in _FACTS(conn, ids=chunk):
            gen, open_ = int(r[6]), int(r[7])
            f = _row_facts(conn, r[0:6])
            out[f.table_id] = f
    return gen, open_, out


def _row_facts(conn: Connection, r: Sequence) -> Facts:
    """Facts from (table id, namespace, name, head, restore version, tag), as _FACTS and
    _CHANGED return them; a tag is looked for before a barrier-less RESTORE if none follows it."""
    tid = int(r[0])
    restore_v = None if r[4] is None else int(r[4])
    tag = None if r[5] is None else int(r[5])
    if tag is None and restore_v is not None:  # no barriered commit since a barrier-less RESTORE
        row = conn.execute(_NEWEST_TAG, {"t": tid}).first()
        tag = None if row is None else int(row[0])
    return Facts(tid, f"{r[1]}.{r[2]}", int(r[3]), restore_v, tag)


@dataclass(frozen=True)
class ChoiceRow:
    """One table of :func:`choice_rows`: its facts and, if queried and managed, its
    version at e* in parts (m, data version of m, next data change, m+1 recorded)."""

    facts: Facts
    m: int | None
    dv: int | None
    nxt: int | None
    succ: bool


def choice_rows(conn: Connection, ids: Iterable[int], queried: Iterable[int]
                ) -> tuple[int, int, int, dict[int, ChoiceRow]] | None:
    """(generation, open epoch, e*, rows) in one statement; None if no table exists."""
    ids = sorted(set(ids))
    if not ids or len(ids) > _CHUNK:
        return None
    out: dict[int, ChoiceRow] = {}
    head: tuple[int, int, int] | None = None
    for r in _CHOICE(conn, ids=ids, q=sorted(set(queried))):
        tid = int(r[0])
        f = Facts(tid, f"{r[1]}.{r[2]}", int(r[3]), None if r[4] is None else int(r[4]),
                  None if r[5] is None else int(r[5]))
        head = (int(r[7]), int(r[6]), int(r[8]))
        out[tid] = ChoiceRow(f, None if r[9] is None else int(r[9]), None if r[10] is None else int(r[10]),
                             None if r[11] is None else int(r[11]), r[12] is not None)
    return None if head is None else (*head, out)


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
                f = _row_facts(conn, r[3:9])
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
        got, spans = _versions_spans(conn, ask, barrier)
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
                self._put(t, known.facts.get(t))

    def _buckets(self, t: int) -> list[dict[int, set[int]]]:
        return [self.groups[None], self.groups.setdefault(self.graph.component_of(t), {})]

    def _put(self, t: int, f: Facts | None) -> None:
        old = self.value.pop(t, None)
        if old is not None:
            for b in self._buckets(t):
                members = b[old]
                members.discard(t)
                if not members:
                    del b[old]
        if f is None:
            return
        v = 0 if f.tag is None else f.tag
        if v < self.graph.joined_barriers.get(t, 0):
            return  # catching up
        self.value[t] = v
        for b in self._buckets(t):
            b.setdefault(v, set()).add(t)

    def update(self, known: Known, ids: frozenset[int]) -> None:
        for t in ids:
            if self.graph.kinds.get(t) == "derived":
                self._put(t, known.facts.get(t))
        self.seq = known.seq

    def e_star(self, known: Known, queried: set[int], scope: str) -> tuple[int, set[int], tuple[int, ...], bool]:
        """(e*, the managed queried tables, the ids holding e* back, whether the scope
        holds a managed table): what choose.e_star finds with a pass over the scope."""
        sealed = known.open_epoch - 1
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
                fq[t] = f = tag_frontier(known.facts[t], known.open_epoch)
                barrier = min(barrier, f)
        held: set[int] = set()
        if barrier < sealed:
            for b in low:
                held |= b.get(barrier, set())
            held |= {t for t, f in fq.items() if f == barrier}
        return barrier, managed_q, tuple(held), any_managed or bool(managed_q)


def frontier(graph: Graph, f: Facts, open_: int) -> int | None:
    """frontier(t): root O-1, derived its newest tag (0 if none), unmanaged None."""
    kind = graph.kind(f.table_id)
    if kind == "root":
        return open_ - 1
    if kind == "derived":
        return tag_frontier(f, open_)
    return None


def tag_frontier(f: Facts, open_: int) -> int:
    """The frontier a table's own commits give it, whatever the topology says now: its newest
    barrier tag (0 if none), at most ``O - 1``. The rule of a derived table, and of a sink a
    batch judges (which may have left the topology meanwhile)."""
    return 0 if f.tag is None else min(f.tag, open_ - 1)


def job_frontier(graph: Graph, fx: dict[int, Facts], job: Job, open_: int) -> int:
    """The barrier a job's batches have reached: the lowest frontier of its sinks (0 if none);
    ``fx`` covers the sinks."""
    return min(((frontier(graph, fx[t], open_) or 0) for t in job.sink_ids), default=0)


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
            sa.or_(c.expires_at.is_(None), c.expires_at > now)).limit(1)).first() is not None:
        out.add(BarrierState.SNAPSHOT)
    return frozenset(out)


def catching_up(graph: Graph, f: Facts, open_: int) -> bool:
    """A derived table that has not yet reached the barrier it must reach to join the COMMIT set."""
    joined = graph.joined_barrier(f.table_id)
    fr = frontier(graph, f, open_)
    return joined > 0 and fr is not None and fr < joined


def commit_set(graph: Graph, fx: dict[int, Facts], open_: int) -> list[int]:
    """The topology's tables minus the derived ones catching up (``fx`` covers the derived ones)."""
    return [t for t in graph.managed if graph.kind(t) == "root" or not catching_up(graph, fx[t], open_)]


def committed_barrier(conn: Connection, graph: Graph, open_: int) -> int:
    """The newest COMMIT barrier: every table of the COMMIT set has precommitted it."""
    return committed_from(graph, facts(conn, graph.derived), open_)


def committed_from(graph: Graph, fx: dict[int, Facts], open_: int) -> int:
    """:func:`committed_barrier` from the facts of the derived tables."""
    out = open_ - 1
    for t in commit_set(graph, fx, open_):
        if t in fx:  # roots are at open_ - 1
            out = min(out, frontier(graph, fx[t], open_) or 0)
    return out


def heads(conn: Connection, ids: Sequence[int]) -> dict[int, At]:
    """The newest version of each table, with its data version."""
    if not ids:
        return {}
    t = S.tables.c
    rows = conn.execute(sa.select(t.table_id, t.version, t.data_version).where(t.table_id.in_(list(ids))))
    return {int(r[0]): At(int(r[1]), int(r[2])) for r in rows}


def _answers(conn: Connection, query: Query, ids: Iterable[int], barrier: int
             ) -> Iterator[tuple[int, At, Sequence[Any] | None]]:
    """Per table: its version at ``barrier``, and the row of ``query`` (_VERSIONS or
    _VERSIONS_SPAN) it was read from (None: an answer of the era loop)."""
    for chunk in _chunks(list(ids)):
        for r in query(conn, ids=chunk, e=barrier):
            tid, head, m, dv, nxt = int(r[0]), int(r[1]), r[3], r[4], r[5]
            if m is None or dv is None:  # older era, or pruned records
                yield tid, _version_at_slow(conn, tid, barrier), None
                continue
            if int(m) < head and r[6] is None:
                raise BarrierNotRetainedError(str(tid), barrier, None)
            yield tid, At(int(head) if nxt is None else int(nxt) - 1, int(dv)), r


def versions_at(conn: Connection, ids: Iterable[int], barrier: int) -> dict[int, At]:
    """``version_at`` of several tables at one barrier, in one statement (plus rare fallbacks)."""
    return {tid: at for tid, at, _ in _answers(conn, _VERSIONS, ids, barrier)}


def _versions_spans(conn: Connection, ids: list[int], barrier: int
                    ) -> tuple[dict[int, At], dict[int, tuple[int, int | None, At]]]:
    """:func:`versions_at`, and for the answers of the newest era the span of barriers
    ``[lo, hi)`` over which each holds: no commit of the era has a barrier in it but
    at ``lo`` (``hi`` None: none above ``barrier``), so any barrier in it picks the same
    ``m``. Answers of the era loop are not given a span."""
    out: dict[int, At] = {}
    spans: dict[int, tuple[int, int | None, At]] = {}
    for tid, at, r in _answers(conn, _VERSIONS_SPAN, ids, barrier):
        out[tid] = at
        if r is not None:
            lo = 0 if r[7] is None or int(r[7]) > barrier else int(r[7])  # (m = 0: no commit at or below)
            spans[tid] = (lo, None if r[8] is None else int(r[8]), at)
    return out, spans


def version_at(conn: Connection, table_id: int, barrier: int) -> At:
    """The version of one table at ``barrier`` (the rule in the module docstring)."""
    return versions_at(conn, [table_id], barrier)[table_id]


def _version_at_slow(conn: Connection, table_id: int, barrier: int) -> At:
    """The era loop: newest era first, then the restore itself, then the era before."""
    hi = 1 << 62
    m: int | None = None
    for v_r, b_r in [(int(r[0]), r[1]) for r in conn.execute(_RESTORES, {"t": table_id})] + [(-1, None)]:
        row = conn.execute(_SEEK_ERA, {"t": table_id, "e": barrier, "lo": v_r, "hi": hi}).first()
        if row is not None:
            m = int(row[0])
            break
        if b_r is not None and int(b_r) <= barrier:
            m = v_r
            break
        hi = v_r
    if m is None:
        m = 0
    dv = conn.execute(_DV_AT, {"t": table_id, "v": m}).scalar()
    succ = conn.execute(_DV_AT, {"t": table_id, "v": m + 1}).scalar()
    head = conn.execute(sa.select(S.tables.c.version).where(S.tables.c.table_id == table_id)).scalar_one()
    if dv is None or (m < head and succ is None):
        raise BarrierNotRetainedError(str(table_id), barrier, None)
    nxt = conn.execute(_NEXT_DATA, {"t": table_id, "v": m, "dv": int(dv)}).scalar()
    if nxt is None:
        return At(int(head), int(dv))
    return At(int(nxt) - 1, int(dv))


def first_change(conn: Connection, table_id: int, at: At) -> int | None:
    """The first barrier after the one ``at`` was taken at whose data differs (None: none yet).

    May answer too early after a rollback (never too late): callers only use
    it to bound a batch, where too early is merely one more batch.
    """
    row = conn.execute(_FIRST_CHANGE, {"t": table_id, "v": at.version, "dv": at.data_version}).first()
    return None if row is None else int(row[0])


def common_snapshot(conn: Connection, ids: Sequence[int], now: float | None = None
                    ) -> tuple[int, dict[int, int]] | None:
    """The newest barrier that is a SNAPSHOT of every table, with each table's version."""
    ids = sorted(set(ids))
    if not ids:
        return None
    now = time.time() if now is None else now
    b = conn.execute(_COMMON_SNAPSHOT, {"first": ids[0], "ids": ids, "n": len(ids), "now": now}).scalar()
    if b is None:
        return None
    versions: dict[int, int] = {}
    for r in conn.execute(_SNAPSHOT_ROWS, {"b": int(b), "ids": ids, "now": now}):
        versions.setdefault(int(r[0]), int(r[1]))
    return int(b), versions


def newest_snapshot(conn: Connection, ids: Sequence[int], now: float | None = None) -> tuple[int, int] | None:
    """(table id, barrier) of the newest live snapshot carrying a barrier among ``ids``."""
    if not ids:
        return None
    now = time.time() if now is None else now
    row = conn.execute(_NEWEST_SNAPSHOT, {"ids": sorted(set(ids)), "now": now}).first()
    return None if row is None else (int(row[0]), int(row[1]))


def oldest_retained(conn: Connection, now: float | None = None) -> int | None:
    """The since-frontier: the oldest barrier the coordinator's snapshots still retain."""
    now = time.time() if now is None else now
    v = conn.execute(_OLDEST_RETAINED, {"now": now}).scalar()
    return None if v is None else int(v)
