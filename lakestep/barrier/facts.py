"""The barrier facts read from the catalog, and the versions of tables at barriers.

The accelerators of the rules in rules.py, in SQL: every answer here is what
a rule of rules.py gives for the catalog's rows, found with index seeks
(``ls_commit_barrier (table_id, barrier, version)``, the partial
``ls_commit_restore`` index and the primary key), so the cost does not grow
with the number of barriers; tests/barrier/test_rules.py checks each against
the rule.

* :func:`facts` (and :func:`facts_ex`, :func:`row_facts`): a table's head and
  its tag (rule 2), in one statement for many tables.
* :func:`choice_rows`: a whole read_committed choice (rule 8 and rule 9 for
  each queried table) in ONE statement; choose.py checks its e* against the
  rule and falls back to the general path on any disagreement.
* :func:`versions_at` (rule 9) in one statement for many tables; the query
  seeks in the newest era and only falls back to older eras (the era loop,
  a short loop) when ``e`` is older than the last restore's barrier.
  :func:`versions_spans` also gives the barriers over which each answer
  holds (the kept answers of facts_cache.py); :func:`versions_and_changes`
  the first data change after each (a derived batch's plan).

Rollback (rollback.py) writes RESTORE commits tagged with the target barrier
``r``, so that "newest version with barrier <= e" is right across a rollback:
for ``e >= r`` it is the restore or later, for ``e < r`` it is untouched
history. Barriers increase with versions between two RESTOREs (an *era*).

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

from dataclasses import dataclass
from typing import Any, Iterable, Iterator, Sequence

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from ..catalog import schema as S
from ._sql import Query
from .errors import BarrierNotRetainedError

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

_GENERATION_AND_EPOCH = sa.text("SELECT g.generation, o.open_epoch FROM ls_topology g CROSS JOIN ls_epoch o "
                                "WHERE g.id = 1 AND o.id = 1")

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
    SELECT w.table_id, w.head, w.restore_v{e_col},
           COALESCE((SELECT c.version FROM ls_commit c
                      WHERE c.table_id = w.table_id AND c.barrier <= {e} AND c.version >= COALESCE(w.restore_v, 0)
                      ORDER BY c.barrier DESC, c.version DESC LIMIT 1),
                    CASE WHEN w.restore_v IS NULL THEN 0 END) AS m
      FROM w{across})
SELECT x.table_id, x.head, x.restore_v, x.m, d.data_version AS dv,
       (SELECT n.version FROM ls_commit n
         WHERE n.table_id = x.table_id AND n.version > x.m AND n.data_version > d.data_version
         ORDER BY n.version LIMIT 1) AS nxt,
       s.version AS succ{span}
  FROM x
  LEFT JOIN ls_commit d ON d.table_id = x.table_id AND d.version = x.m
  LEFT JOIN ls_commit s ON s.table_id = x.table_id AND s.version = x.m + 1
"""


def _versions_sql(span: str = "", *, two: bool = False) -> str:
    """_VERSIONS_SQL at barrier :e, with ``span``'s columns after the others; ``two``: at :e
    and at :f, a row each, the barrier of each row last (after ``span``)."""
    if two:
        return _VERSIONS_SQL.format(span=span + ", x.e", e="es.e", e_col=", es.e",
                                    across=" CROSS JOIN (SELECT :e AS e UNION ALL SELECT :f AS e) es")
    return _VERSIONS_SQL.format(span=span, e=":e", e_col="", across="")


_VERSIONS = Query("versions", _versions_sql(), {"ids": "bigint[]", "e": "bigint"})
# The same, with the barriers over which each answer holds (FactsCache.versions_at):
# from the barrier of m (0 if none) up to the lowest barrier above :e of the newest era (NULL: none).
_VERSIONS_SPAN = Query("versions_span", _versions_sql(""",
       d.barrier AS lo,
       (SELECT min(h.barrier) FROM ls_commit h
         WHERE h.table_id = x.table_id AND h.barrier > :e AND h.version >= COALESCE(x.restore_v, 0)) AS hi"""),
                        {"ids": "bigint[]", "e": "bigint"})
# The same at two barriers :e and :f in one statement (a derived batch's guard: its sources
# at lo-1 and at hi); the barrier of each row last.
_VERSIONS_TWO = Query("versions_two", _versions_sql(two=True), {"ids": "bigint[]", "e": "bigint", "f": "bigint"})
# The same, with the first barrier after the answer whose data differs (first_change), for a
# derived batch's plan: its start versions and the change that bounds it in one statement.
_VERSIONS_CHANGE = Query("versions_change", _versions_sql(""",
       (SELECT c.barrier FROM ls_commit c
         WHERE c.table_id = x.table_id AND c.version > x.m AND c.barrier IS NOT NULL
           AND c.data_version > d.data_version
         ORDER BY c.version LIMIT 1) AS chg"""), {"ids": "bigint[]", "e": "bigint"})

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
# Tables per statement: one statement serves any catalog up to this size (lakestep serve's
# metrics count on it); SQLite allows 32,766 parameters and a statement names at most two lists.
_CHUNK = 5000


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


def chunks(ids: Sequence[int]) -> Iterable[list[int]]:
    ids = sorted(set(ids))
    for i in range(0, len(ids), _CHUNK):
        yield ids[i:i + _CHUNK]


def facts(conn: Connection, ids: Iterable[int]) -> dict[int, Facts]:
    """Head, newest RESTORE and newest barrier tag of each table (one statement)."""
    return facts_ex(conn, ids)[2]


def facts_ex(conn: Connection, ids: Iterable[int]) -> tuple[int, int, dict[int, Facts]]:
    """(topology generation, open epoch, :func:`facts`), in one statement (a second one reads
    the first two when no table of ``ids`` exists)."""
    out: dict[int, Facts] = {}
    gen = open_ = None
    for chunk in chunks(list(ids)):
        for r in _FACTS(conn, ids=chunk):
            gen, open_ = int(r[6]), int(r[7])
            f = row_facts(conn, r[0:6])
            out[f.table_id] = f
    if gen is None or open_ is None:
        g, o = conn.execute(_GENERATION_AND_EPOCH).one()
        gen, open_ = int(g), int(o)
    return gen, open_, out


def row_facts(conn: Connection, r: Sequence) -> Facts:
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
    for chunk in chunks(list(ids)):
        for r in query(conn, ids=chunk, e=barrier):
            at = _answer(conn, r, barrier)
            yield int(r[0]), at, (None if r[3] is None or r[4] is None else r)


def _answer(conn: Connection, r: Sequence[Any], barrier: int) -> At:
    """The version at ``barrier`` from a row of the _VERSIONS statements (the era loop when
    the row's era has no answer)."""
    tid, head, m, dv, nxt = int(r[0]), int(r[1]), r[3], r[4], r[5]
    if m is None or dv is None:  # older era, or pruned records
        return _version_at_slow(conn, tid, barrier)
    if int(m) < head and r[6] is None:
        raise BarrierNotRetainedError(str(tid), barrier, None)
    return At(int(head) if nxt is None else int(nxt) - 1, int(dv))


def versions_at(conn: Connection, ids: Iterable[int], barrier: int) -> dict[int, At]:
    """``version_at`` of several tables at one barrier, in one statement (plus rare fallbacks)."""
    return {tid: at for tid, at, _ in _answers(conn, _VERSIONS, ids, barrier)}


def versions_spans(conn: Connection, ids: list[int], barrier: int
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


def versions_at_both(conn: Connection, ids: Iterable[int], first: int, second: int
                     ) -> tuple[dict[int, At], dict[int, At]]:
    """:func:`versions_at` at two barriers, in one statement (plus the same rare fallbacks)."""
    out: dict[int, dict[int, At]] = {first: {}, second: {}}  # (first == second: the same rows twice)
    for chunk in chunks(list(ids)):
        for r in _VERSIONS_TWO(conn, ids=chunk, e=first, f=second):
            e = int(r[7])
            out[e][int(r[0])] = _answer(conn, r, e)
    return out[first], out[second]


def versions_and_changes(conn: Connection, ids: Iterable[int], barrier: int
                         ) -> tuple[dict[int, At], dict[int, int | None]]:
    """:func:`versions_at`, and :func:`first_change` of each answer, in one statement (plus
    the same rare fallbacks; an answer of the era loop asks first_change on its own)."""
    at: dict[int, At] = {}
    chg: dict[int, int | None] = {}
    for tid, a, r in _answers(conn, _VERSIONS_CHANGE, ids, barrier):
        at[tid] = a
        # versions in (m, a.version] hold m's data version, so "after m" is "after the answer"
        chg[tid] = first_change(conn, tid, a) if r is None else (None if r[7] is None else int(r[7]))
    return at, chg


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
