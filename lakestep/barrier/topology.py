"""The topology: jobs, the tables they read and write, and the lineage between them.

The catalog holds it in three tables (FLIP-276's ``__META_JOB_SOURCE`` and
``__META_JOB_SINK``):

* ``ls_job(job_id, external_input, joined_barrier, created_at, updated_at, retired_at, description)``
* ``ls_job_source(job_id, table_id)`` and ``ls_job_sink(job_id, table_id)``

and the view ``ls_lineage(job_id, external_input, source_table, sink_table,
source_id, sink_id)`` over the active jobs, with tables by name. "Which
tables are fed, directly or not, by table X" is plain SQL on SQLite and
PostgreSQL alike (:data:`DOWNSTREAM_SQL`)::

    WITH RECURSIVE fed(table_name) AS (
        SELECT sink_table FROM ls_lineage WHERE source_table = 'shop.orders'
        UNION
        SELECT l.sink_table FROM ls_lineage l JOIN fed f ON l.source_table = f.table_name
    )
    SELECT table_name FROM fed ORDER BY table_name;

Kinds of tables (docs/design.md §1): a **root** is written by a job with external
input (Kafka, files); a **derived** table by a job reading lakestep tables.
A table is one or the other; a derived table has exactly one writing job
(root tables may have several). A table no active job writes is
**unmanaged**: barriers do not apply to it, reads take its newest version.

Changes (register, change, retire) may happen while the pipeline runs. Each
bumps ``ls_topology.generation`` under that row's lock, so two concurrent
registrations cannot together close a cycle, and readers cache the graph by
generation. A retired job's tables leave the topology: they no longer hold
the COMMIT barrier back.

A derived job registered (or changed) while the pipeline runs must catch up
from barrier 1; until its sinks reach the committed barrier of the moment it
registered (``joined_barrier``) they are *catching up*: excluded from the
COMMIT set (so global reads do not fall back), but included when queried by
name, with the lag explained. (A rollback below ``joined_barrier`` makes it
catch up again.)
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal, Sequence

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from ..catalog import schema as S
from ..catalog.checks import check_identifier
from ..errors import ArgumentTypeError, TableNotFoundError
from .errors import CycleError, JobNotFoundError, TopologyError
from .facts_cache import FactsCache
from .graph import Graph, Job, TableKind
from .progress import committed_barrier
from .sealing import open_epoch

if TYPE_CHECKING:
    from ..catalog import Catalog

#: Tables fed, directly or not, by the table named ``:table`` ("namespace.name").
DOWNSTREAM_SQL = """
WITH RECURSIVE fed(table_name) AS (
    SELECT sink_table FROM ls_lineage WHERE source_table = :table
    UNION
    SELECT l.sink_table FROM ls_lineage l JOIN fed f ON l.source_table = f.table_name
)
SELECT table_name FROM fed ORDER BY table_name
"""

#: Tables that feed, directly or not, the table named ``:table``.
UPSTREAM_SQL = """
WITH RECURSIVE feeds(table_name) AS (
    SELECT source_table FROM ls_lineage WHERE sink_table = :table
    UNION
    SELECT l.source_table FROM ls_lineage l JOIN feeds f ON l.sink_table = f.table_name
)
SELECT table_name FROM feeds ORDER BY table_name
"""


def _find_cycle(edges: dict[int, set[int]], sources: Sequence[int], sinks: Sequence[int]) -> list[int] | None:
    """A path sink -> ... -> source (which the new job closes into a cycle), or None."""
    targets = set(sources)
    for start in sinks:
        if start in targets:
            return [start]
        parent: dict[int, int] = {}
        todo = [start]
        seen = {start}
        while todo:
            n = todo.pop()
            for m in sorted(edges.get(n, ())):
                if m in seen:
                    continue
                parent[m] = n
                if m in targets:
                    path = [m]
                    while path[-1] != start:
                        path.append(parent[path[-1]])
                    return list(reversed(path))
                seen.add(m)
                todo.append(m)
    return None


def _check_job_id(job_id: str) -> str:
    check_identifier(job_id.replace("-", "_").replace(".", "_").replace(":", "_"), "job id")
    return job_id


_LOCK_TOPOLOGY = sa.select(S.topology.c.generation).where(S.topology.c.id == 1).with_for_update()
_SHARE_TOPOLOGY = sa.select(S.topology.c.generation).where(S.topology.c.id == 1).with_for_update(read=True)
_GENERATION = sa.select(S.topology.c.generation).where(S.topology.c.id == 1)


def read_generation(conn: Connection, *, lock: Literal["none", "share", "update"] = "none") -> int:
    stmt = {"none": _GENERATION, "share": _SHARE_TOPOLOGY, "update": _LOCK_TOPOLOGY}[lock]
    return int(conn.execute(stmt).scalar_one())


def load_jobs(conn: Connection, *, include_retired: bool = False) -> tuple[list[Job], dict[int, str]]:
    j, t = S.jobs.c, S.tables.c
    q = sa.select(S.jobs)
    if not include_retired:
        q = q.where(j.retired_at.is_(None))
    rows = conn.execute(q.order_by(j.job_id)).mappings().all()
    edges: dict[tuple[str, str], list[int]] = {}
    for kind, tab in (("source", S.job_sources), ("sink", S.job_sinks)):
        for er in conn.execute(sa.select(tab.c.job_id, tab.c.table_id).order_by(tab.c.job_id, tab.c.table_id)):
            edges.setdefault((kind, er[0]), []).append(int(er[1]))
    ids = sorted({i for v in edges.values() for i in v})
    names: dict[int, str] = {}
    for i in range(0, len(ids), 5000):  # one statement up to 5,000 tables (as facts._CHUNK)
        for tr in conn.execute(sa.select(t.table_id, t.namespace, t.name).where(t.table_id.in_(ids[i:i + 5000]))):
            names[int(tr[0])] = f"{tr[1]}.{tr[2]}"
    jobs = []
    for r in rows:
        # a dropped table leaves the topology with it
        sources = tuple(i for i in edges.get(("source", r["job_id"]), []) if i in names)
        sinks = tuple(i for i in edges.get(("sink", r["job_id"]), []) if i in names)
        jobs.append(Job(
            job_id=r["job_id"], external_input=bool(r["external_input"]),
            sources=tuple(names[i] for i in sources), sinks=tuple(names[i] for i in sinks),
            source_ids=sources, sink_ids=sinks, joined_barrier=int(r["joined_barrier"]),
            created_at=r["created_at"], updated_at=r["updated_at"], retired_at=r["retired_at"],
            description=r["description"] or "",
        ))
    return jobs, names


class Topology:
    """Register, change and retire jobs; query the lineage.

    Example::

        topo = Topology(catalog)
        topo.register_job("ingest", sinks=["shop.orders"], external_input=True)
        topo.register_job("daily", sources=["shop.orders"], sinks=["shop.daily"])
        topo.downstream("shop.orders")      # ['shop.daily']
    """

    def __init__(self, catalog: "Catalog") -> None:
        self.catalog = catalog
        self._graph: Graph | None = None
        #: every table's barrier facts, kept by change stamp for wide reads (choose.py)
        self.facts_cache = FactsCache()

    # ---------------------------------------------------------------- reading
    @property
    def cached(self) -> Graph | None:
        """The graph last read (check its generation before trusting it)."""
        return self._graph

    def graph(self, conn: Connection | None = None) -> Graph:
        """The active topology, read in ``conn``'s transaction (cached by generation)."""
        if conn is None:
            with self.catalog.backend.read() as c:
                return self.graph(c)
        return self.graph_at(conn, read_generation(conn))

    def graph_at(self, conn: Connection, generation: int) -> Graph:
        """The topology of ``generation``, which ``conn``'s transaction read: the cached graph
        if it is of that generation, else read in that transaction."""
        g = self._graph
        if g is not None and g.generation == generation:
            return g
        jobs, names = load_jobs(conn)
        g = Graph.build(generation, jobs, names)
        self._graph = g
        return g

    def jobs(self, *, include_retired: bool = False) -> list[Job]:
        with self.catalog.backend.read() as conn:
            return load_jobs(conn, include_retired=include_retired)[0]

    def job(self, job_id: str, *, include_retired: bool = False) -> Job:
        for j in self.jobs(include_retired=include_retired):
            if j.job_id == job_id:
                return j
        raise JobNotFoundError(job_id)

    def kind(self, table: str) -> TableKind:
        tid = self._table_id(table)
        return self.graph().kind(tid)

    def roots(self) -> list[str]:
        g = self.graph()
        return sorted(g.names[t] for t in g.roots)

    def tables(self) -> list[str]:
        """Every table of the active topology (written or read by an active job)."""
        g = self.graph()
        return sorted(g.names.values())

    def downstream(self, table: str) -> list[str]:
        """Tables fed, directly or not, by ``table``: runs :data:`DOWNSTREAM_SQL`."""
        with self.catalog.backend.read() as conn:
            return [r[0] for r in conn.execute(sa.text(DOWNSTREAM_SQL), {"table": self._ident(table)})]

    def upstream(self, table: str) -> list[str]:
        """Tables that feed, directly or not, ``table``: runs :data:`UPSTREAM_SQL`."""
        with self.catalog.backend.read() as conn:
            return [r[0] for r in conn.execute(sa.text(UPSTREAM_SQL), {"table": self._ident(table)})]

    def related(self, tables: Sequence[str]) -> list[str]:
        """The tables connected to ``tables`` through jobs, ``tables`` included."""
        g = self.graph()
        ids = [self._table_id(t) for t in tables]
        return sorted(g.names.get(i) or self._name(i) for i in g.component(ids))

    def _ident(self, table: str) -> str:
        from ..catalog import parse_ident

        ns, name = parse_ident(table)
        return f"{ns}.{name}"

    def _table_id(self, table: str) -> int:
        return self.catalog.load_table(table).table_id

    def _name(self, table_id: int) -> str:
        with self.catalog.backend.read() as conn:
            r = conn.execute(sa.select(S.tables.c.namespace, S.tables.c.name)
                             .where(S.tables.c.table_id == table_id)).first()
        if r is None:
            raise TableNotFoundError(str(table_id))
        return f"{r[0]}.{r[1]}"

    # ---------------------------------------------------------------- changes
    def register_job(
        self,
        job_id: str,
        *,
        sources: Sequence[str] = (),
        sinks: Sequence[str],
        external_input: bool = False,
        description: str = "",
    ) -> Job:
        """Register a job, or change a registered one (a retired one comes back).

        1. resolve the tables (they must exist);
        2. lock ``ls_topology`` (FOR UPDATE; SQLite: the one writer);
        3. check: at least one sink, no table both read and written, a derived
           table has one writer, a table is root or derived, no cycle;
        4. write the job and its edges, bump the generation; commit.

        Raises :class:`TopologyError` / :class:`CycleError` with nothing changed.
        """
        _check_job_id(job_id)
        if isinstance(sources, str) or isinstance(sinks, str):
            raise ArgumentTypeError("sources and sinks are sequences of table names", argument="sources/sinks",
                                    value=(sources, sinks))
        if not sinks:
            raise TopologyError(job_id, "a job needs at least one sink table")
        src_tables = [self.catalog.load_table(s) for s in dict.fromkeys(sources)]
        snk_tables = [self.catalog.load_table(s) for s in dict.fromkeys(sinks)]
        src_ids = [t.table_id for t in src_tables]
        snk_ids = [t.table_id for t in snk_tables]
        names = {t.table_id: t.ident for t in src_tables + snk_tables}
        now = self.catalog.clock.now()
        with self.catalog.backend.write() as conn:
            gen = read_generation(conn, lock="update")
            jobs, known = load_jobs(conn)
            names = {**known, **names}
            others = Graph.build(gen, [j for j in jobs if j.job_id != job_id], names)
            for t in snk_ids:
                for w in others.writers.get(t, ()):
                    other = others.jobs[w]
                    if not (external_input and other.external_input):
                        raise TopologyError(
                            job_id, f"table {names[t]!r} is already written by job {w!r}: a derived table has "
                            "exactly one writer, and a table is either root or derived")
            cycle = _find_cycle(others.edges(), src_ids, snk_ids)
            if cycle is not None:
                path = [names[i] for i in cycle]
                raise CycleError(job_id, [path[-1]] + path if len(path) > 1 else [path[0], path[0]])
            joined = 0
            if not external_input:
                joined = committed_barrier(conn, others, open_epoch(conn))
            j = S.jobs.c
            existing = conn.execute(sa.select(j.created_at).where(j.job_id == job_id)).first()
            values = dict(external_input=external_input, joined_barrier=joined, updated_at=now, retired_at=None,
                          description=description)
            if existing is None:
                conn.execute(sa.insert(S.jobs).values(job_id=job_id, created_at=now, **values))
            else:
                conn.execute(sa.update(S.jobs).where(j.job_id == job_id).values(**values))
            for tab, ids in ((S.job_sources, src_ids), (S.job_sinks, snk_ids)):
                conn.execute(sa.delete(tab).where(tab.c.job_id == job_id))
                if ids:
                    conn.execute(sa.insert(tab), [{"job_id": job_id, "table_id": i} for i in ids])
            self._bump(conn, gen, now)
            created = now if existing is None else existing[0]
        return Job(job_id, external_input, tuple(names[i] for i in src_ids), tuple(names[i] for i in snk_ids),
                   tuple(src_ids), tuple(snk_ids), joined, created, now, None, description)

    def retire_job(self, job_id: str) -> Job:
        """Retire a job: its tables leave the topology (their data stays). History is kept."""
        now = self.catalog.clock.now()
        with self.catalog.backend.write() as conn:
            gen = read_generation(conn, lock="update")
            res = conn.execute(sa.update(S.jobs).where(S.jobs.c.job_id == job_id, S.jobs.c.retired_at.is_(None))
                               .values(retired_at=now, updated_at=now))
            if res.rowcount == 0:
                raise JobNotFoundError(job_id)
            self._bump(conn, gen, now)
        return self.job(job_id, include_retired=True)

    @staticmethod
    def _bump(conn: Connection, gen: int, now: float) -> None:
        conn.execute(sa.update(S.topology).where(S.topology.c.id == 1).values(generation=gen + 1, updated_at=now))
