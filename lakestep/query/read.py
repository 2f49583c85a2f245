"""Consistent reads of several tables: what every reader (Arrow, DuckDB, Spark) builds on.

The protocol of one read (:func:`consistent_read`):

1. the tables asked for are split in two: those with explicit time travel
   (``VERSION AS OF``, ``TIMESTAMP AS OF``, a snapshot name, a barrier) and
   the plain ones;
2. the plain ones are chosen together by :meth:`Pipeline.choose` at the
   requested level and scope (the one place that decides), or all at one
   barrier / one snapshot when the caller names it;
3. each table's :class:`~lakestep.catalog.plan.ReadPlan` is made at exactly
   the chosen version: readers read those files and nothing else;
4. the answer carries what was read (:class:`ReadInfo`): the barrier, each
   table's version, the explanation, and how many barriers each table is
   behind the newest sealed one.

``repeatable_read`` pins the chosen versions with leased version locks; the
:class:`ConsistentRead` releases them on ``close()`` or on leaving its
``with`` block (a crashed reader's lease lapses by itself).

Not guaranteed: tables read with explicit time travel are read where asked,
not aligned with the others (the explanation says so). A ``read_committed``
read does not pin its versions: a reader slower than a table's retention
window must use ``repeatable_read``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Iterable, Sequence

import pyarrow as pa

from ..clock import parse_timestamp
from ..errors import QueryError

if TYPE_CHECKING:
    from ..barrier import Choice, Pipeline
    from ..catalog import Catalog
    from ..catalog.plan import ReadPlan

LEVELS = ("read_committed", "read_uncommitted", "repeatable_read")
SCOPES = ("query", "related", "global")


@dataclass(frozen=True)
class TableRef:
    """A table as a query names it, with its time travel if any."""

    ident: str
    version: int | None = None
    timestamp: str | None = None
    snapshot: str | None = None
    barrier: int | None = None

    @property
    def travels(self) -> bool:
        return any(x is not None for x in (self.version, self.timestamp, self.snapshot, self.barrier))

    @property
    def label(self) -> str:
        """How :class:`ReadInfo` names it: the table, plus its time travel."""
        if self.version is not None:
            return f"{self.ident}@v{self.version}"
        if self.timestamp is not None:
            return f"{self.ident}@{self.timestamp}"
        if self.snapshot is not None:
            return f"{self.ident}@{self.snapshot}"
        if self.barrier is not None:
            return f"{self.ident}@barrier={self.barrier}"
        return self.ident


@dataclass(frozen=True)
class ReadInfo:
    """What a consistent read read."""

    level: str
    scope: str
    barrier: int | None
    versions: dict[str, int]
    explanation: str
    behind: dict[str, int | None]
    open_epoch: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"level": self.level, "scope": self.scope, "barrier": self.barrier, "versions": dict(self.versions),
                "behind": dict(self.behind), "open_epoch": self.open_epoch, "explanation": self.explanation}


@dataclass
class ConsistentRead:
    """Read plans of several tables at one consistent point, and what was read.

    ``plans`` is keyed by :attr:`TableRef.label`. Close it (or use ``with``) to
    release a ``repeatable_read``'s pins.
    """

    catalog: "Catalog"
    info: ReadInfo
    plans: dict[str, "ReadPlan"]
    refs: dict[str, TableRef]
    _choice: "Choice | None" = field(default=None, repr=False)

    def arrow(self, label: str, **kwargs: Any) -> pa.Table:
        """The rows of one table (``columns=``, ``where=`` as for ``Table.to_arrow``)."""
        return self.plans[label].to_arrow(**kwargs)

    def tables(self) -> dict[str, pa.Table]:
        return {label: plan.to_arrow() for label, plan in self.plans.items()}

    def close(self) -> None:
        if self._choice is not None:
            self._choice.release()

    def __enter__(self) -> "ConsistentRead":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def pipeline(catalog: "Catalog") -> "Pipeline":
    """One :class:`Pipeline` per catalog: its topology, name and table caches serve every read
    (:func:`lakestep.barrier.pipeline.shared_pipeline`)."""
    from ..barrier.pipeline import shared_pipeline

    return shared_pipeline(catalog)


def _check(level: str, scope: str) -> None:
    if level not in LEVELS:
        raise QueryError(f"level must be one of {', '.join(LEVELS)}, not {level!r}")
    if scope not in SCOPES:
        raise QueryError(f"scope must be one of {', '.join(SCOPES)}, not {scope!r}")


def refs_of(tables: Iterable["str | TableRef"]) -> list[TableRef]:
    from ..catalog import parse_ident

    out: list[TableRef] = []
    for t in tables:
        ref = t if isinstance(t, TableRef) else TableRef(str(t))
        ns, name = parse_ident(ref.ident)
        ref = TableRef(f"{ns}.{name}", ref.version, ref.timestamp, ref.snapshot, ref.barrier)
        if ref not in out:
            out.append(ref)
    if not out:
        raise QueryError("a read needs at least one table")
    return out


def consistent_read(
    catalog: "Catalog",
    tables: Sequence["str | TableRef"],
    *,
    level: str = "read_committed",
    scope: str = "query",
    barrier: int | None = None,
    snapshot: str | None = None,
    locker: str | None = None,
    lease_seconds: float | None = 300.0,
) -> ConsistentRead:
    """Read plans of ``tables`` at one consistent point (see the module docstring)."""
    _check(level, scope)
    if barrier is not None and snapshot is not None:
        raise QueryError("name a barrier or a snapshot, not both")
    refs = refs_of(tables)
    p = pipeline(catalog)
    plain = [r.ident for r in refs if not r.travels]
    versions: dict[str, int] = {}
    choice = None
    behind: dict[str, int | None] = {}
    notes: list[str] = []
    open_epoch: int | None = None  # read below unless the choice brings the one it used
    chosen_barrier: int | None = None
    if plain and barrier is not None:
        chosen_barrier = barrier
        versions.update({t: p.version_at(t, barrier) for t in plain})
        notes.append(f"barrier {barrier}, as asked: every table at its version at that barrier")
    elif plain and snapshot is not None:
        for t in plain:
            versions[t] = p.table(t).read_plan(snapshot=snapshot).version
        notes.append(f"snapshot {snapshot!r}, as asked")
        if snapshot.startswith("lakestep-barrier-") and snapshot[len("lakestep-barrier-"):].isdigit():
            chosen_barrier = int(snapshot[len("lakestep-barrier-"):])
    elif plain:
        choice = p.choose(plain, level=level, scope=scope, locker=locker,  # type: ignore[arg-type]
                          lease_seconds=lease_seconds)
        chosen_barrier = choice.barrier
        open_epoch = choice.explanation.open_epoch  # the one its barrier and lags were computed against
        versions.update(choice.versions)
        behind.update({t: choice.explanation.behind(t) for t in plain})
        notes.append(choice.explanation.text())
    plans: dict[str, "ReadPlan"] = {}
    try:
        at_barrier = {r: p.version_at(r.ident, r.barrier) for r in refs if r.travels and r.barrier is not None}
        handles = {r: p.table(r.ident) for r in refs}
        with catalog.backend.read() as conn:  # every plan in one read transaction
            for r in refs:
                handle = handles[r]
                if not r.travels:
                    plans[r.label] = handle.plan_within(conn, version=versions[r.ident])
                elif r.version is not None:
                    plans[r.label] = handle.plan_within(conn, version=r.version)
                elif r.snapshot is not None:
                    plans[r.label] = handle.plan_within(conn, snapshot=r.snapshot)
                elif r.timestamp is not None:
                    plans[r.label] = handle.plan_within(conn, as_of=parse_timestamp(r.timestamp))
                else:
                    plans[r.label] = handle.plan_within(conn, version=at_barrier[r])
                if r.travels:
                    notes.append(f"{r.label}: read as written in the query (version {plans[r.label].version}), "
                                 "not aligned with the other tables")
    except BaseException:
        if choice is not None:
            choice.release()
        raise
    if open_epoch is None:
        open_epoch = p.open_epoch()
    for r in refs:
        if r.ident not in behind and not r.travels:
            behind[r.ident] = None
    info = ReadInfo(level=level, scope=scope, barrier=chosen_barrier,
                    versions={label: plan.version for label, plan in plans.items()},
                    explanation="\n".join(notes), behind=behind, open_epoch=open_epoch)
    return ConsistentRead(catalog, info, plans, {r.label: r for r in refs}, choice)


def consistent_arrow(catalog: "Catalog", tables: Sequence["str | TableRef"], **kwargs: Any) -> tuple[dict[str, pa.Table], ReadInfo]:
    """The rows of ``tables`` at one consistent point, as Arrow tables, and what was read.

    Example::

        rows, info = consistent_arrow(cat, ["shop.revenue", "shop.counts"])
        info.barrier, info.versions
    """
    with consistent_read(catalog, tables, **kwargs) as cr:
        return cr.tables(), cr.info
