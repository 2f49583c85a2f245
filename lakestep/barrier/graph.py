"""The shape of the topology at one generation: jobs, tables, and the kinds of tables.

:class:`Job` is a registered job as read from the catalog; :class:`Graph` the
active jobs of one topology generation, with every table's writers, readers
and kind (``root``, ``derived`` or ``unmanaged``; docs/design.md §1). Both are
plain values: reading and changing the topology is topology.py's business,
the states computed from it are rules.py's and progress.py's.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Iterable, Literal, Sequence

TableKind = Literal["root", "derived", "unmanaged"]


@dataclass(frozen=True)
class Job:
    """A registered streaming job."""

    job_id: str
    external_input: bool
    sources: tuple[str, ...]
    sinks: tuple[str, ...]
    source_ids: tuple[int, ...]
    sink_ids: tuple[int, ...]
    joined_barrier: int
    created_at: float
    updated_at: float
    retired_at: float | None = None
    description: str = ""

    @property
    def active(self) -> bool:
        return self.retired_at is None


@dataclass(frozen=True)
class Graph:
    """The active topology at one generation (immutable; cached by generation)."""

    generation: int
    jobs: dict[str, Job]
    names: dict[int, str]  # table id -> "namespace.name", for every table of an active job
    writers: dict[int, tuple[str, ...]] = field(default_factory=dict)
    readers: dict[int, tuple[str, ...]] = field(default_factory=dict)
    kinds: dict[int, TableKind] = field(default_factory=dict)
    #: table id -> every table of its weakly connected component; built on first use (the graph is immutable)
    _components: dict[int, frozenset[int]] = field(default_factory=dict, init=False, repr=False, compare=False)

    @classmethod
    def build(cls, generation: int, jobs: Iterable[Job], names: dict[int, str]) -> "Graph":
        active = {j.job_id: j for j in jobs if j.active}
        writers: dict[int, list[str]] = {}
        readers: dict[int, list[str]] = {}
        for j in active.values():
            for t in j.sink_ids:
                writers.setdefault(t, []).append(j.job_id)
            for t in j.source_ids:
                readers.setdefault(t, []).append(j.job_id)
        kinds: dict[int, TableKind] = {
            t: "root" if active[w[0]].external_input else "derived" for t, w in writers.items()}
        return cls(generation, active, names,
                   {k: tuple(sorted(v)) for k, v in writers.items()},
                   {k: tuple(sorted(v)) for k, v in readers.items()}, kinds)

    def kind(self, table_id: int) -> TableKind:
        return self.kinds.get(table_id, "unmanaged")

    @property
    def roots(self) -> list[int]:
        return sorted(t for t in self.writers if self.kind(t) == "root")

    @property
    def derived(self) -> list[int]:
        return sorted(t for t in self.writers if self.kind(t) == "derived")

    @property
    def managed(self) -> list[int]:
        return sorted(self.writers)

    @functools.cached_property
    def managed_set(self) -> frozenset[int]:
        """:attr:`managed` as a set (built once: the graph is immutable)."""
        return frozenset(self.writers)

    @functools.cached_property
    def joined_barriers(self) -> dict[int, int]:
        """Table id -> :meth:`joined_barrier`, for the derived tables that have one (> 0)."""
        out = {}
        for t in self.writers:
            b = self.joined_barrier(t)
            if b > 0:
                out[t] = b
        return out

    def writer(self, table_id: int) -> Job | None:
        w = self.writers.get(table_id)
        return self.jobs[w[0]] if w else None

    def joined_barrier(self, table_id: int) -> int:
        """The barrier a derived table must reach to join the COMMIT set (0: joined)."""
        j = self.writer(table_id)
        return 0 if j is None or j.external_input else j.joined_barrier

    def edges(self) -> dict[int, set[int]]:
        """source table -> the tables jobs write from it."""
        out: dict[int, set[int]] = {}
        for j in self.jobs.values():
            for s in j.source_ids:
                out.setdefault(s, set()).update(j.sink_ids)
        return out

    def downstream(self, table_id: int) -> set[int]:
        return _reach(self.edges(), [table_id])

    def upstream(self, table_id: int) -> set[int]:
        rev: dict[int, set[int]] = {}
        for s, sinks in self.edges().items():
            for k in sinks:
                rev.setdefault(k, set()).add(s)
        return _reach(rev, [table_id])

    def component_of(self, table_id: int) -> frozenset[int] | None:
        """The weakly connected component of a table of an active job (None: no job reads or writes it);
        one object per component, so it can key a cache."""
        self.component(())
        return self._components.get(table_id)

    def component(self, table_ids: Iterable[int]) -> set[int]:
        """Every table connected to ``table_ids`` through jobs (the weakly connected component)."""
        if not self._components and self.jobs:
            adj: dict[int, set[int]] = {}
            for j in self.jobs.values():
                tables = set(j.source_ids) | set(j.sink_ids)
                for t in tables:
                    adj.setdefault(t, set()).update(tables - {t})
            found: dict[int, frozenset[int]] = {}
            for t in adj:
                if t not in found:
                    members = frozenset(_reach(adj, [t]) | {t})
                    found.update(dict.fromkeys(members, members))
            self._components.update(found)
        out: set[int] = set()
        for t in table_ids:
            out |= self._components.get(t, frozenset((t,)))
        return out


def _reach(adj: dict[int, set[int]], start: Sequence[int]) -> set[int]:
    seen: set[int] = set()
    todo = list(start)
    while todo:
        for n in adj.get(todo.pop(), ()):
            if n not in seen:
                seen.add(n)
                todo.append(n)
    return seen


