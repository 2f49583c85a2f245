"""How one prepared change is decided against the commits that landed after its
base version (step 2c of the commit protocol in commit.py): the conflict matrix
of docs/design.md §2, from metadata only (file ids, operations, statistics)."""

from __future__ import annotations

import enum
import logging
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Sequence

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from ..errors import CommitConflict, InvalidArgumentError, VersionNotFoundError
from . import retention
from . import schema as S
from .changes import FILE_COLS, NeedsRebase, Operation, TableChange, chunks, row_to_file
from .files import DataFile, NewFile
from .predicates import Verdict

log = logging.getLogger(__name__)


def files_by_ids(conn: Connection, ids: Iterable[int]) -> list[DataFile]:
    ids = sorted(set(ids))
    out: list[DataFile] = []
    for chunk in chunks(ids):
        out.extend(row_to_file(r) for r in conn.execute(sa.select(*FILE_COLS).where(S.files.c.file_id.in_(chunk))))
    return out


def live_files(conn: Connection, table_id: int) -> list[DataFile]:
    q = sa.select(*FILE_COLS).where(S.files.c.table_id == table_id, S.files.c.removed_version.is_(None))
    return [row_to_file(r) for r in conn.execute(q)]


@dataclass
class Head:
    table_id: int
    version: int
    data_version: int
    last_commit_at: float
    schema_id: int = 0


@dataclass
class ResolvedChange:
    """The resolved effect of one change at the current head: the files its commit removes
    (``remove_ids``, or ``remove_all_live``), adds and re-adds, or that it is ``discarded``."""

    change: TableChange
    remove_ids: list[int] = field(default_factory=list)
    removed_rows: int = 0
    remove_all_live: bool = False
    add: list[NewFile] = field(default_factory=list)
    readd: list[DataFile] = field(default_factory=list)
    discarded: bool = False
    notes: dict[str, Any] = field(default_factory=dict)


class Kind(enum.Enum):
    """A row (the later change L) or a column (a commit E that landed after L's base) of the matrix."""

    APPEND = "APPEND / upsert"
    OVERWRITE = "OVERWRITE"
    REWRITE = "DELETE / UPDATE / MERGE"
    COMPACT = "COMPACT"
    RESTORE = "RESTORE"


def later_kind(change: TableChange) -> Kind:
    """L's row: blind appends and upserts, overwrites, rewrites, compactions, restores."""
    op = change.operation
    if change.blind:
        return Kind.APPEND
    if op is Operation.COMPACT:
        return Kind.COMPACT
    if op is Operation.OVERWRITE:
        return Kind.OVERWRITE
    if op.rewrites_rows:
        return Kind.REWRITE
    if op is Operation.RESTORE:
        return Kind.RESTORE
    raise InvalidArgumentError(f"cannot commit operation {op}", argument="operation", value=op)


#: E's column, by the operation its commit row records. A RESTORE replaces live
#: files as an OVERWRITE does; an operation not known here (``"?"``: no row) is
#: taken for a rewrite, the column whose rules are the strictest.
_EARLIER = {
    Operation.CREATE.value: Kind.APPEND, Operation.APPEND.value: Kind.APPEND, Operation.MERGE.value: Kind.APPEND,
    Operation.OVERWRITE.value: Kind.OVERWRITE, Operation.RESTORE.value: Kind.OVERWRITE,
    Operation.DELETE.value: Kind.REWRITE, Operation.UPDATE.value: Kind.REWRITE,
    Operation.COMPACT.value: Kind.COMPACT,
}


def earlier_kind(operation: str) -> Kind:
    return _EARLIER.get(operation, Kind.REWRITE)


class Rule(enum.Enum):
    """What happens to L given one E: a cell of the matrix (docs/design.md §2)."""

    BOTH_LAND = "both land"
    L_WINS = "L wins: it replaces everything live in its scope at commit time, E's rows included"
    CHECK_SERIALIZABLE = ("both land under snapshot isolation; under serializable, L fails if a file E "
                          "added may hold rows matching L's predicate")
    FAIL_IF_READ_REMOVED = "L fails if E removed a file L read (and under serializable, as above)"
    UNDO_COMPACTION = ("both land: E's compaction is undone by metadata where it took files L read; "
                       "L fails if E is not younger than the retention window")
    DISCARD_IF_INPUT_REMOVED = "L is discarded (a success, discarded=True) if E removed one of its inputs"
    RESTORE_TARGET = "L makes the live files exactly those of its target version: E is undone"


#: The conflict matrix, one row per (L, E) cell. The rules are applied by the
#: planner of L's row (:data:`PLANNERS`); a rewrite consults the cell of each E.
MATRIX: dict[tuple[Kind, Kind], Rule] = {
    (Kind.APPEND, Kind.APPEND): Rule.BOTH_LAND,
    (Kind.APPEND, Kind.OVERWRITE): Rule.BOTH_LAND,
    (Kind.APPEND, Kind.REWRITE): Rule.BOTH_LAND,
    (Kind.APPEND, Kind.COMPACT): Rule.BOTH_LAND,
    (Kind.OVERWRITE, Kind.APPEND): Rule.L_WINS,
    (Kind.OVERWRITE, Kind.OVERWRITE): Rule.L_WINS,
    (Kind.OVERWRITE, Kind.REWRITE): Rule.L_WINS,
    (Kind.OVERWRITE, Kind.COMPACT): Rule.L_WINS,
    (Kind.REWRITE, Kind.APPEND): Rule.CHECK_SERIALIZABLE,
    (Kind.REWRITE, Kind.OVERWRITE): Rule.FAIL_IF_READ_REMOVED,
    (Kind.REWRITE, Kind.REWRITE): Rule.FAIL_IF_READ_REMOVED,
    (Kind.REWRITE, Kind.COMPACT): Rule.UNDO_COMPACTION,
    (Kind.COMPACT, Kind.APPEND): Rule.DISCARD_IF_INPUT_REMOVED,
    (Kind.COMPACT, Kind.OVERWRITE): Rule.DISCARD_IF_INPUT_REMOVED,
    (Kind.COMPACT, Kind.REWRITE): Rule.DISCARD_IF_INPUT_REMOVED,
    (Kind.COMPACT, Kind.COMPACT): Rule.DISCARD_IF_INPUT_REMOVED,
    (Kind.RESTORE, Kind.APPEND): Rule.RESTORE_TARGET,
    (Kind.RESTORE, Kind.OVERWRITE): Rule.RESTORE_TARGET,
    (Kind.RESTORE, Kind.REWRITE): Rule.RESTORE_TARGET,
    (Kind.RESTORE, Kind.COMPACT): Rule.RESTORE_TARGET,
}


class Resolver:
    """Decides one change against the commits in ``(base_version, head]``."""

    def __init__(self, conn: Connection, change: TableChange, head: Head, now: float) -> None:
        self.conn = conn
        self.c = change
        self.head = head
        self.now = now
        self._ops: dict[int, tuple[str, float]] | None = None

    # concurrent commits: version -> (operation, committed_at)
    @property
    def ops(self) -> dict[int, tuple[str, float]]:
        if self._ops is None:
            q = sa.select(S.commits.c.version, S.commits.c.operation, S.commits.c.committed_at).where(
                S.commits.c.table_id == self.c.table_id, S.commits.c.version > self.c.base_version
            )
            self._ops = {r[0]: (r[1], r[2]) for r in self.conn.execute(q)}
        return self._ops

    def conflict(self, other_version: int, reason: str) -> CommitConflict:
        return CommitConflict(
            table=self.c.ident,
            operation=self.c.operation.value,
            base_version=self.c.base_version,
            other_version=other_version,
            other_operation=self.ops.get(other_version, ("?", 0.0))[0],
            reason=reason,
        )

    def rule(self, other_version: int) -> Rule:
        """The matrix cell of this change and the commit ``other_version``."""
        return MATRIX[(later_kind(self.c), earlier_kind(self.ops.get(other_version, ("?",))[0]))]

    def resolve(self) -> ResolvedChange:
        return PLANNERS[later_kind(self.c)](self)

    # ------------------------------------------------------- APPEND / upsert
    def _both_land(self) -> ResolvedChange:
        return ResolvedChange(self.c, add=list(self.c.added))

    # ---------------------------------------------------------------- COMPACT
    def _compact(self) -> ResolvedChange:
        ids = sorted(self.c.read_ids)
        if self.c.base_version != self.head.version:
            gone = self._removed_among(ids)
            if gone:
                fid, rv = next(iter(gone.items()))
                log.info(
                    "compaction of %s discarded: input file %s was removed by version %s (%s)",
                    self.c.ident, fid, rv, self.ops.get(rv, ("?",))[0],
                )
                return ResolvedChange(self.c, discarded=True, notes={"discarded_by": rv})
        return ResolvedChange(
            self.c,
            remove_ids=ids,
            removed_rows=sum(f.record_count for f in self.c.removed),
            add=list(self.c.added),
        )

    def _removed_among(self, ids: Sequence[int]) -> dict[int, int]:
        out: dict[int, int] = {}
        for chunk in chunks(list(ids)):
            q = sa.select(S.files.c.file_id, S.files.c.removed_version).where(
                S.files.c.file_id.in_(chunk), S.files.c.removed_version.is_not(None)
            )
            out.update({r[0]: r[1] for r in self.conn.execute(q)})
        return out

    # ------------------------------------------------------------- OVERWRITE
    def _overwrite(self) -> ResolvedChange:
        c = self.c
        plan = ResolvedChange(c)
        if c.scope is None:  # the whole table: everything live at commit time
            plan.remove_all_live = True
            plan.add = list(c.added)
            return plan
        live = live_files(self.conn, c.table_id)
        live_ids = {f.file_id for f in live}
        rewritten = {s for f in c.added for s in f.source_ids}
        # Rewrites of files a concurrent commit already replaced are stale: drop
        # them; whatever replaced those files is judged below like any live file.
        plan.add = [f for f in c.added if not f.source_ids or all(s in live_ids for s in f.source_ids)]
        if len(plan.add) != len(c.added):
            plan.notes["stale_rewrites"] = len(c.added) - len(plan.add)
        todo: list[DataFile] = []
        for f in live:
            v = c.scope.verdict(f)
            if v is Verdict.NONE:
                continue
            if v is Verdict.ALL or f.file_id in rewritten:
                plan.remove_ids.append(f.file_id)
                plan.removed_rows += f.record_count
            else:
                todo.append(f)
        if todo:
            raise NeedsRebase(c, todo)
        return plan

    # ------------------------------------------------- DELETE / UPDATE / MERGE
    def _rewrite(self) -> ResolvedChange:
        c = self.c
        read = c.read_ids
        plan = ResolvedChange(c, add=list(c.added))
        if c.base_version == self.head.version:
            plan.remove_ids = sorted(read)
            plan.removed_rows = sum(f.record_count for f in c.removed)
            return plan
        gone = self._removed_among(sorted(read))
        for fid, rv in sorted(gone.items()):
            if self.rule(rv) is not Rule.UNDO_COMPACTION:
                raise self.conflict(rv, f"file {fid} that this {c.operation.value} read was removed")
        if gone:
            self._undo_compactions(plan, gone)
        still_live = [f for f in c.removed if f.file_id not in gone]
        plan.remove_ids.extend(f.file_id for f in still_live)
        plan.removed_rows += sum(f.record_count for f in still_live)
        if c.isolation == "serializable" and c.scope is not None:
            self._check_serializable()
        return plan

    def _undo_compactions(self, plan: ResolvedChange, gone: dict[int, int]) -> None:
        """Undo, by metadata, the concurrent compactions that took files L read.

        The compaction outputs holding those rows are removed; their other
        inputs, whose bytes are still on storage while the compaction is
        younger than the retention window, are recorded again (at exactly
        ``R`` old cleanup may delete them: refused). Compactions of compaction
        outputs are undone too.
        """
        read = self.c.read_ids
        pending = list(gone.items())
        undone: dict[int, DataFile] = {}
        while pending:
            fid, rv = pending.pop()
            op, at = self.ops.get(rv, ("?", 0.0))
            if op != Operation.COMPACT.value:
                raise self.conflict(rv, f"file {fid} holding rows this {self.c.operation.value} read was removed")
            if at + self.c.retention_seconds <= self.now:
                raise self.conflict(rv, "the compaction that took the files read is older than the retention window")
            q = sa.select(*FILE_COLS).where(
                S.files.c.table_id == self.c.table_id,
                S.files.c.added_version == rv,
                S.files.c.source_ids.is_not(None),
            )
            for out in map(row_to_file, self.conn.execute(q)):
                if fid not in out.source_ids or out.file_id in undone:
                    continue
                undone[out.file_id] = out
                if out.removed_version is not None:  # compacted again, or worse
                    pending.append((out.file_id, out.removed_version))
        sources = {s for o in undone.values() for s in o.source_ids} - read - set(undone)
        readd = files_by_ids(self.conn, sources)
        for f in readd:
            if f.removed_version is None:
                continue  # still live: nothing to restore
            rv = f.removed_version
            op, at = self.ops.get(rv, ("?", 0.0))
            if op != Operation.COMPACT.value or f.file_id not in {s for o in undone.values() if o.added_version == rv for s in o.source_ids}:
                raise self.conflict(rv, f"file {f.file_id} to restore was removed by a {op}")
            if at + self.c.retention_seconds <= self.now:
                raise self.conflict(rv, "the files to restore are past the retention window")
            plan.readd.append(f)
        live_outputs = [o for o in undone.values() if o.removed_version is None]
        plan.remove_ids.extend(o.file_id for o in live_outputs)
        plan.removed_rows += sum(o.record_count for o in live_outputs)
        plan.notes["undone_compactions"] = sorted({o.added_version for o in undone.values()})
        plan.notes["restored_files"] = len(plan.readd)

    def _check_serializable(self) -> None:
        assert self.c.scope is not None
        q = sa.select(*FILE_COLS).where(
            S.files.c.table_id == self.c.table_id, S.files.c.added_version > self.c.base_version
        )
        for f in map(row_to_file, self.conn.execute(q)):
            if self.rule(f.added_version) is Rule.UNDO_COMPACTION:
                continue  # compaction outputs hold rows that existed before
            if self.c.scope.verdict(f) is not Verdict.NONE:
                raise self.conflict(
                    f.added_version,
                    f"serializable isolation: file {f.file_id} added concurrently may hold rows matching the predicate",
                )

    # ---------------------------------------------------------------- RESTORE
    def _restore(self) -> ResolvedChange:
        """RESTORE: make the live files exactly those live at ``base_version``, by metadata.

        1. every live file whose path was not live at the target is removed;
        2. every file live at the target whose path is no longer live is recorded
           again (a new file row, same path and statistics);
        3. re-adding a file removed the retention window ago or longer is
           refused (cleanup may have deleted its bytes: it expires files removed
           at or before ``now - R``) unless a live snapshot or version lock pins
           a version where it was live.

        Commits that landed after the target, concurrent ones included, are all
        undone: the table then holds exactly the rows of the target version.
        """
        c, v = self.c, self.c.base_version
        if not 0 <= v <= self.head.version:
            raise VersionNotFoundError(c.ident, f"version {v} (newest is {self.head.version})")
        if v < self.head.version and self.conn.execute(sa.select(S.commits.c.version).where(
                S.commits.c.table_id == c.table_id, S.commits.c.version == v)).first() is None:
            # cleanup pruned it: its file rows may be gone too, and restoring what is left
            # would silently drop rows (checked here, in the commit's transaction)
            raise VersionNotFoundError(c.ident, f"version {v} any more (expired and cleaned up): cannot restore it")
        f = S.files.c
        at_v = [row_to_file(r) for r in self.conn.execute(sa.select(*FILE_COLS).where(
            f.table_id == c.table_id, f.added_version <= v,
            sa.or_(f.removed_version.is_(None), f.removed_version > v)))]
        live = live_files(self.conn, c.table_id)
        want, have = {x.path for x in at_v}, {x.path for x in live}
        plan = ResolvedChange(c, notes={"restored_to": v})
        for x in live:
            if x.path not in want:
                plan.remove_ids.append(x.file_id)
                plan.removed_rows += x.record_count
        pinned: list[int] | None = None
        for x in at_v:
            if x.path in have:
                continue
            rv = int(x.removed_version or 0)
            if self.ops.get(rv, ("?", 0.0))[1] + c.retention_seconds <= self.now:
                if pinned is None:
                    pinned = self._pinned_versions()
                if not any(x.added_version <= w < rv for w in pinned):
                    raise self.conflict(rv, f"file {x.file_id} to restore was removed past the retention window")
            plan.readd.append(x)
        plan.notes["restored_files"] = len(plan.readd)
        return plan

    def _pinned_versions(self) -> list[int]:
        """Versions of this table that cleanup keeps readable (retention.py step 2)."""
        return retention.pinned_versions(self.conn, self.c.table_id, self.now)


#: The planner of each row of :data:`MATRIX`: the named procedure that applies its rules.
PLANNERS: dict[Kind, Callable[[Resolver], ResolvedChange]] = {
    Kind.APPEND: Resolver._both_land,
    Kind.OVERWRITE: Resolver._overwrite,
    Kind.REWRITE: Resolver._rewrite,
    Kind.COMPACT: Resolver._compact,
    Kind.RESTORE: Resolver._restore,
}
