"""The consistent version choice of a read over several tables (docs/design.md §4).

Levels:

* ``read_committed`` (default): barrier ``e* = min(frontier(t))`` over the
  scope; every queried table is read at its version at ``e*``. Scope
  ``query`` takes the queried tables, ``related`` adds every table connected
  to them through jobs, ``global`` takes the COMMIT set (``e*`` is then the
  last COMMIT barrier). Derived tables still catching up (topology.py) are
  left out of ``related`` and ``global`` unless queried by name. All facts
  are read in one database snapshot. Scope ``query``: usually ONE statement
  (one round trip) whatever the length of the history, else a transaction of
  a few. Scopes ``related`` and ``global``: the facts of every table are kept
  between calls (facts_cache.FactsCache, by change stamp), so a call reads what
  changed since the last one and the versions of the queried tables.
* ``read_uncommitted`` (weak): every table at its newest version, no alignment;
  ``barrier`` is None.
* ``repeatable_read``: the newest barrier that is a SNAPSHOT of every queried
  table, read at the snapshots' versions. The protocol: 1. find the barrier
  and versions; 2. pin each version with a version lock (leased); 3. check
  the snapshots still exist (retention may have dropped one between 1 and
  2; then release and start over). The caller releases the locks
  (:meth:`Choice.release`, or ``with``); until then rereads return the same
  rows and cleanup keeps the files.

Unmanaged tables (no active job writes them) are read at their newest version
at every level. Every answer carries the barrier, the versions and an
:class:`Explanation`: which table held the barrier back, and how far behind
the newest sealed barrier it is.

Not guaranteed: ``read_committed`` may return an older barrier on a later
call after a rollback (FLIP-276: read committed is not repeatable read).
"""

from __future__ import annotations

import functools
import uuid
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Literal, Sequence

import pyarrow as pa
import sqlalchemy as sa
from sqlalchemy.engine import Connection

from ..catalog import schema as S
from ..catalog.epoch import open_epoch, sealed
from ..catalog.lifecycle import VersionLock
from ..errors import InternalError, InvalidArgumentError, TableNotFoundError
from . import rules
from .errors import BarrierNotRetainedError, NoSnapshotError
from .facts import Facts, choice_rows, facts, facts_ex, versions_at
from .graph import Graph, TableKind
from .progress import catching_up, frontier
from .snapshots import common_snapshot, newest_snapshot
from .topology import Topology

if TYPE_CHECKING:
    from ..catalog import Catalog, Table

Level = Literal["read_committed", "read_uncommitted", "repeatable_read"]
Scope = rules.Scope
LEVELS = ("read_committed", "read_uncommitted", "repeatable_read")
SCOPES = ("query", "related", "global")


@dataclass(frozen=True)
class TableChoice:
    """One table of a choice: what it is, where it stands, what was chosen."""

    table: str
    table_id: int
    kind: TableKind
    job: str | None
    frontier: int | None
    head: int
    version: int | None  # None for tables of the scope that were not queried
    queried: bool
    catching_up: bool = False


@dataclass(frozen=True)
class Explanation:
    """Why a choice is what it is. ``tables`` (built on first access) has every table
    that took part: the queried ones and the rest of the scope."""

    level: Level
    scope: Scope
    barrier: int | None
    open_epoch: int
    held_by: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()
    _build: Callable[[], dict[str, TableChoice]] = field(default=dict, repr=False, compare=False)

    @functools.cached_property
    def tables(self) -> dict[str, TableChoice]:
        return self._build()

    @property
    def sealed(self) -> int:
        """The newest sealed barrier."""
        return sealed(self.open_epoch)

    def behind(self, table: str) -> int | None:
        """How many barriers ``table`` is behind the newest sealed one (None: unmanaged)."""
        f = self.tables[table].frontier
        return None if f is None else self.sealed - f

    def text(self) -> str:
        head = f"{self.level} (scope {self.scope})"
        if self.barrier is None:
            out = [f"{head}: no common barrier; every table at its newest version"]
        else:
            out = [f"{head}: barrier {self.barrier} (newest sealed {self.sealed}, open epoch {self.open_epoch})"]
        for name in self.held_by:
            t = self.tables[name]
            by = f"job {t.job!r}" if t.job else "its writer"
            out.append(f"held back by {name} ({t.kind}, {by}): precommitted up to {t.frontier}, "
                       f"{self.behind(name)} barrier(s) behind")
        for t in self.tables.values():
            if t.queried and t.version is not None:
                state = "" if t.frontier is None else f", frontier {t.frontier}"
                lag = "" if t.version == t.head else f" (head {t.head})"
                out.append(f"  {t.table}: version {t.version}{lag}; {t.kind}{state}"
                           + (", catching up" if t.catching_up else ""))
        out.extend(self.notes)
        return "\n".join(out)

    def __str__(self) -> str:
        return self.text()


@dataclass
class Choice:
    """The answer: a barrier, the version of each queried table, and why."""

    level: Level
    scope: Scope
    barrier: int | None
    versions: dict[str, int]
    explanation: Explanation
    locks: list[VersionLock] = field(default_factory=list)
    catalog: "Catalog | None" = field(default=None, repr=False)

    def read(self, table: str, **kwargs: Any) -> pa.Table:
        """The rows of ``table`` at the chosen version."""
        assert self.catalog is not None
        t = self.catalog.load_table(table)
        return t.to_arrow(version=self.versions[t.ident], **kwargs)

    def release(self) -> None:
        """Release the version locks of a ``repeatable_read`` choice."""
        while self.locks:
            self.locks.pop().release()

    def __enter__(self) -> "Choice":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.release()


class TableIds:
    """Table names -> ids, cached; a renamed table is noticed and looked up again. Shared by the
    threads of one pipeline (streaming.catalog_cache.pipeline_of): each call reads its own answers."""

    def __init__(self) -> None:
        self.ids: dict[str, int] = {}

    def resolve(self, conn: Connection, idents: Sequence[str]) -> dict[str, int]:
        from ..catalog import parse_ident

        missing = [i for i in idents if i not in self.ids]
        t = S.tables.c
        found: dict[str, int] = {}  # kept here too: a thread of the same pipeline may forget them meanwhile
        for k in range(0, len(missing), 100):  # SQLite caps the depth of an expression (1000)
            pairs = [parse_ident(i) for i in missing[k:k + 100]]
            cond = sa.or_(*[sa.and_(t.namespace == ns, t.name == n) for ns, n in pairs])
            for r in conn.execute(sa.select(t.table_id, t.namespace, t.name).where(cond)):
                found[f"{r[1]}.{r[2]}"] = int(r[0])
        self.ids.update(found)
        out = {}
        for i in idents:
            tid = found.get(i, self.ids.get(i))
            if tid is None:
                raise TableNotFoundError(i)
            out[i] = tid
        return out

    def forget(self, idents: Sequence[str]) -> None:
        for i in idents:
            self.ids.pop(i, None)


@functools.lru_cache(maxsize=4096)
def _norm_one(ident: str) -> str:
    from ..catalog import parse_ident

    ns, name = parse_ident(ident)
    return f"{ns}.{name}"


def norm_idents(tables: Sequence["str | Table"]) -> list[str]:
    """Table names, normalised ("ns.name") and deduplicated in order."""
    return list(dict.fromkeys(_norm_one(t if isinstance(t, str) else t.ident) for t in tables))


def choose(
    catalog: "Catalog",
    topology: Topology,
    resolver: TableIds,
    tables: Sequence["str | Table"],
    *,
    level: Level = "read_committed",
    scope: Scope = "query",
    locker: str | None = None,
    lease_seconds: float | None = 300.0,
    load: "Callable[[str, int], Table] | None" = None,
) -> Choice:
    """Choose the versions to read ``tables`` at (module docstring)."""
    if level not in LEVELS:
        raise InvalidArgumentError(f"level must be one of {LEVELS}, not {level!r}", argument="level", value=level)
    if scope not in SCOPES:
        raise InvalidArgumentError(f"scope must be one of {SCOPES}, not {scope!r}", argument="scope", value=scope)
    idents = norm_idents(tables)
    if not idents:
        raise InvalidArgumentError("choose needs at least one table", argument="tables", value=tables)
    if level == "repeatable_read":
        return _repeatable(catalog, topology, resolver, idents, scope, locker, lease_seconds,
                           load or (lambda ident, _tid: catalog.load_table(ident)))
    if level == "read_committed":
        if scope == "query":
            fast = _committed_fast(catalog, topology, resolver, idents, scope)
        else:
            fast = _committed_wide(catalog, topology, resolver, idents, scope)
        if fast is not None:
            return fast
    for attempt in range(2):
        with catalog.backend.read() as conn:
            # One statement reads the generation, the open epoch and the facts;
            # the cached graph is checked against that generation.
            graph = topology.cached or topology.graph(conn)
            qids = resolver.resolve(conn, idents)
            q = set(qids.values())
            scope_ids = _scope(graph, q, "query" if level == "read_uncommitted" else scope)
            gen, open_, fx = facts_ex(conn, scope_ids)
            if gen != graph.generation:
                graph = topology.graph(conn)
                scope_ids = _scope(graph, q, "query" if level == "read_uncommitted" else scope)
                fx.update(facts(conn, scope_ids - set(fx)))
            renamed = [i for i, tid in qids.items() if tid not in fx or fx[tid].ident != i]
            if renamed:  # renamed or dropped since cached: look the names up again
                resolver.forget(renamed)
                if attempt == 0:
                    continue
                raise TableNotFoundError(renamed[0])
            assert open_ is not None  # fx is not empty
            if level == "read_uncommitted":
                versions = {t: fx[t].head for t in q}
                return _answer(catalog, level, scope, None, idents, qids, versions, graph, fx, scope_ids, open_, (),
                               ("read_uncommitted: no alignment; the tables are consistent with each other only "
                                "where their frontiers are equal",))
            e = e_star(graph, fx, scope_ids, open_, q)
            at = versions_at(conn, [t for t in q if t in e.managed], e.barrier)
            versions = {t: (at[t].version if t in at else fx[t].head) for t in q}
            return _answer(catalog, level, scope, e.barrier, idents, qids, versions, graph, fx, scope_ids, open_,
                           e.held, e.notes)
    raise InternalError("unreachable")


def _committed_fast(catalog: "Catalog", topology: Topology, resolver: TableIds, idents: list[str],
                    scope: Scope) -> Choice | None:
    """read_committed in one statement (facts.choice_rows); None: take the general path.

    The statement computes e* with SQL; here it is computed again from the
    returned facts with the rules (rules.py) and must agree. Anything
    unusual (a topology change, a rename, a barrier older than a rollback's,
    pruned records) falls back to the general path, which reads in a
    transaction and handles it.
    """
    graph = topology.cached
    if graph is None:
        return None
    with catalog.backend.statement() as conn:
        qids = resolver.resolve(conn, idents)
        q = set(qids.values())
        scope_ids = _scope(graph, q, scope)
        got = choice_rows(conn, scope_ids | q, q)
    if got is None:
        return None
    gen, open_, e_sql, rows = got
    fx = {t: r.facts for t, r in rows.items()}
    if gen != graph.generation or any(t not in fx or fx[t].ident != i for i, t in qids.items()):
        return None
    if any(f.tag is None and f.restore_version is not None for f in fx.values()):
        return None
    e = e_star(graph, fx, scope_ids, open_, q)
    barrier, managed = e.barrier, e.managed
    if barrier != e_sql:
        return None
    versions: dict[int, int] = {}
    for t in q:
        r = rows[t]
        if t not in managed:
            versions[t] = r.facts.head
            continue
        if r.m is None or r.dv is None:
            return None
        if r.m < r.facts.head and not r.succ:
            raise BarrierNotRetainedError(r.facts.ident, barrier, None)
        versions[t] = r.facts.head if r.nxt is None else r.nxt - 1
    return _answer(catalog, "read_committed", scope, barrier, idents, qids, versions, graph, fx, scope_ids, open_,
                   e.held, e.notes)


def _committed_wide(catalog: "Catalog", topology: Topology, resolver: TableIds, idents: list[str],
                    scope: Scope) -> Choice | None:
    """read_committed at scope ``related`` or ``global`` from the kept facts of every table
    (facts_cache.FactsCache): the cost follows what changed since the last call and the tables
    queried, not the size of the topology. None: take the general path (a rename)."""
    with catalog.backend.read() as conn:
        known = topology.facts_cache.look(conn)  # the first statement: the snapshot's facts
        graph = topology.cached
        if graph is None or graph.generation != known.generation:
            graph = topology.graph(conn)
        if graph.generation != known.generation:  # changed between the two statements? cannot in one snapshot
            return None
        qids = resolver.resolve(conn, idents)
        fx = known.facts
        if any(t not in fx or fx[t].ident != i for i, t in qids.items()):
            return None  # renamed or dropped since cached: the general path looks again
        q = set(qids.values())
        open_ = known.open_epoch
        got = topology.facts_cache.wide_barrier(known, graph, q, scope)
        if got is None:  # the full pass
            e = e_star(graph, fx, _scope(graph, q, scope), open_, q)
            barrier, managed_q, held, notes = e.barrier, set(e.managed) & q, e.held, e.notes
        else:
            barrier, managed_q, held_ids, any_managed = got
            held = tuple(sorted(fx[t].ident for t in held_ids))
            notes = _notes(held, any_managed, open_)
        at = topology.facts_cache.versions_at(conn, known, managed_q, barrier)
    versions = {t: (at[t].version if t in at else fx[t].head) for t in q}
    return _answer(catalog, "read_committed", scope, barrier, idents, qids, versions, graph, fx,
                   lambda: _scope(graph, q, scope), open_, held, notes)


@dataclass(frozen=True)
class EStar:
    """The read_committed barrier of a scope, and what it rests on (rules.EStar, with names)."""

    barrier: int  # e* = min(frontier) over the managed tables of the scope; O - 1 if none is managed
    managed: dict[int, int]  # table id -> frontier, the managed tables of the scope
    held: tuple[str, ...]  # the tables at e* below the newest sealed barrier: they hold it back
    notes: tuple[str, ...]


def e_star(graph: Graph, fx: dict[int, Facts], scope_ids: set[int], open_: int,
           queried: "set[int] | frozenset[int]" = frozenset()) -> EStar:
    """e* (rules.py, rule 8) over the tables of ``scope_ids``, whose facts ``fx`` holds."""
    managed = [t for t in scope_ids if t in graph.kinds]  # rule 8 skips the others
    e = rules.e_star(rules.members(graph, {t: fx[t].tag for t in managed}, managed), open_, queried)
    held = tuple(sorted(fx[t].ident for t in e.held))
    return EStar(e.barrier, e.managed, held, _notes(held, bool(e.managed), open_))


def _notes(held: tuple[str, ...], any_managed: bool, open_: int) -> tuple[str, ...]:
    return () if held or not any_managed else (
        f"every table is precommitted up to the newest sealed barrier; epoch {open_} is still open",)


def _scope(graph: Graph, q: set[int], scope: Scope) -> set[int]:
    return rules.scope(graph, q, scope)


def _answer(catalog: "Catalog", level: Level, scope: Scope, barrier: int | None, idents: list[str],
            qids: dict[str, int], versions: dict[int, int], graph: Graph, fx: dict[int, Facts],
            scope_ids: "set[int] | Callable[[], set[int]]", open_: int, held: tuple[str, ...], notes: tuple[str, ...],
            locks: list[VersionLock] | None = None) -> Choice:
    q = set(qids.values())

    def build() -> dict[str, TableChoice]:
        info: dict[str, TableChoice] = {}
        members = scope_ids() if callable(scope_ids) else scope_ids
        for tid in sorted(members | q, key=lambda t: fx[t].ident):
            f = fx[tid]
            if tid not in q and catching_up(graph, f, open_):
                continue  # left out of the scope (e_star)
            w = graph.writer(tid)
            info[f.ident] = TableChoice(
                table=f.ident, table_id=tid, kind=graph.kind(tid), job=None if w is None else w.job_id,
                frontier=frontier(graph, f, open_), head=f.head, version=versions.get(tid), queried=tid in q,
                catching_up=catching_up(graph, f, open_),
            )
        return info

    expl = Explanation(level, scope, barrier, open_, held, notes, build)
    return Choice(level, scope, barrier, {i: versions[qids[i]] for i in idents}, expl, locks or [], catalog)


def _repeatable(catalog: "Catalog", topology: Topology, resolver: TableIds, idents: list[str], scope: Scope,
                locker: str | None, lease_seconds: float | None, load: "Callable[[str, int], Table]") -> Choice:
    locker = locker or f"repeatable-read:{uuid.uuid4().hex[:12]}"
    for _ in range(5):
        with catalog.backend.read() as conn:
            graph = topology.graph(conn)
            qids = resolver.resolve(conn, idents)
            open_ = open_epoch(conn)
            q = set(qids.values())
            fx = facts(conn, q)
            managed = [t for t in q if graph.kind(t) != "unmanaged"]
            found = common_snapshot(conn, managed, catalog.clock.now())
            if managed and found is None:
                raise NoSnapshotError(idents, _missing(conn, graph, fx, managed, catalog.clock.now()))
            barrier, snap_versions = found if found is not None else (None, {})
            versions = {t: snap_versions.get(t, fx[t].head) for t in q}
        locks: list[VersionLock] = []
        try:
            for ident in idents:
                t = load(ident, qids[ident])
                locks.append(t.lock(locker=locker, version=versions[qids[ident]], lease_seconds=lease_seconds))
            with catalog.backend.read() as conn:
                still = common_snapshot(conn, managed, catalog.clock.now()) if managed else None
        except BaseException:
            for lk in locks:
                lk.release()
            raise
        if not managed or (still is not None and still[0] == barrier):
            notes = (f"pinned by version locks of locker {locker!r}; release them when done",)
            return _answer(catalog, "repeatable_read", scope, barrier, idents, qids, versions, graph, fx, q, open_,
                           (), notes, locks)
        for lk in locks:  # retention dropped the snapshot meanwhile: choose again
            lk.release()
    raise NoSnapshotError(idents, idents[0])


def _missing(conn: Connection, graph: Graph, fx: dict[int, Facts], ids: list[int], now: float) -> str:
    worst: tuple[int, str] | None = None
    for t in ids:
        snap = newest_snapshot(conn, [t], now)
        b = -1 if snap is None else snap[1]
        if worst is None or b < worst[0]:
            worst = (b, fx[t].ident)
    return worst[1] if worst else "?"
