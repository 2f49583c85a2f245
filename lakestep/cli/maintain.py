"""``lakestep compact``, ``lakestep cleanup`` and ``lakestep rollback``."""

from __future__ import annotations

from typing import Any

import click
from rich.table import Table as RichTable

from ..barrier import Pipeline
from .common import common, open_catalog, table_names
from .output import Output, size

TABLES = click.argument("tables", nargs=-1, metavar="[TABLE]...")
ALL = click.option("--all", "all_tables", is_flag=True, help="every table of the catalog")


@click.command("compact")
@TABLES
@ALL
@click.option("--major", is_flag=True, help="rewrite every file of a partition (primary-key tables: resolved rows)")
@click.option("--min-files", type=click.IntRange(min=2), default=2, show_default=True,
              help="merge only partitions with at least this many small files")
@click.option("--target-file-size", type=click.IntRange(min=1), default=128 << 20, show_default=True,
              help="bytes per output file")
@common
def compact_cmd(out: Output, catalog_url: str, tables: tuple[str, ...], all_tables: bool, major: bool,
                min_files: int, target_file_size: int) -> None:
    """Merge small files of TABLEs (or --all): a new version, same data version.

    \b
    Example:
      lakestep compact shop.orders shop.daily --catalog ./wh
      lakestep compact --all --major
    """
    with open_catalog(catalog_url) as cat:
        rows: list[dict[str, Any]] = []
        for name in out.each("compacting", table_names(cat, tables, all_tables, "compact")):
            r = cat.load_table(name).compact(target_file_size=target_file_size, min_files=min_files, major=major)
            outcome = "noop" if r.summary.get("noop") else "discarded" if r.discarded else "compacted"
            rows.append({"table": name, "outcome": outcome, "version": r.version,
                         "removed_files": 0 if outcome != "compacted" else r.removed_files,
                         "added_files": 0 if outcome != "compacted" else r.added_files})
    out.emit({"tables": rows})
    grid = RichTable(title="compaction" + (" (major)" if major else ""), title_justify="left")
    for col in ("table", "outcome", "version", "files merged", "files written"):
        grid.add_column(col)
    for row in rows:
        grid.add_row(row["table"], row["outcome"], str(row["version"]), str(row["removed_files"]),
                     str(row["added_files"]))
    out.print(grid)


@click.command("cleanup")
@TABLES
@click.option("--dry-run", is_flag=True, help="only report what would be deleted")
@click.option("--yes", is_flag=True, help="really delete (cleanup deletes files: without --dry-run it needs --yes)")
@click.option("--retention", "retention_seconds", type=click.FloatRange(min=0), default=None,
              help="seconds to keep removed files (default: each table's lakestep.retention-seconds)")
@click.option("--force", is_flag=True, help="allow --retention shorter than a table's own retention")
@click.option("--no-orphans", is_flag=True, help="leave files that no commit recorded alone")
@common
def cleanup_cmd(out: Output, catalog_url: str, tables: tuple[str, ...], dry_run: bool, yes: bool,
                retention_seconds: float | None, force: bool, no_orphans: bool) -> None:
    """Delete files no retained version needs, and old orphans (default: every table).

    Safe beside running writers and readers: only files removed longer ago
    than the retention window, and not pinned by a snapshot or lock, go.

    \b
    Example:
      lakestep cleanup --dry-run --catalog ./wh
      lakestep cleanup shop.orders --yes
    """
    if dry_run == yes:
        raise click.UsageError("cleanup deletes files: pass --dry-run to see what would go, or --yes to delete")
    with open_catalog(catalog_url) as cat:
        names = list(tables) or cat.list_tables()
        loaded = [cat.load_table(n) for n in names]
        if retention_seconds is not None and not force:
            short = [t.ident for t in loaded if retention_seconds < t.retention_seconds]
            if short:
                raise click.UsageError(
                    f"--retention {retention_seconds:g} is shorter than the retention of {', '.join(short)}: "
                    "readers and compaction undo rely on it; pass --force to go ahead")
        reports = []
        for t in out.each("cleaning up" if yes else "looking", loaded):
            reports.append(t.cleanup(retention_seconds=retention_seconds, dry_run=dry_run,
                                     orphans=not no_orphans, force=force))
    docs: list[dict[str, Any]] = [{
        "table": r.table, "floor_version": r.floor_version, "pinned_versions": r.pinned_versions,
        "expired_files": r.deleted_files, "expired_bytes": r.deleted_bytes, "orphan_files": r.orphan_files,
        "orphan_bytes": r.orphan_bytes, "pruned_file_rows": r.pruned_file_rows,
        "pruned_commit_rows": r.pruned_commit_rows} for r in reports]
    total = sum(r.deleted_bytes + r.orphan_bytes for r in reports)
    out.emit({"dry_run": dry_run, "tables": docs, "total_bytes": total})
    verb = "would delete" if dry_run else "deleted"
    grid = RichTable(title=f"cleanup ({'dry run' if dry_run else 'done'}): {verb} {size(total)}", title_justify="left")
    for col in ("table", "expired files", "bytes", "orphans", "bytes ", "pinned versions", "pruned rows"):
        grid.add_column(col)
    for r in reports:
        grid.add_row(r.table, str(len(r.deleted_files)), size(r.deleted_bytes), str(len(r.orphan_files)),
                     size(r.orphan_bytes), ", ".join(map(str, r.pinned_versions)) or "-",
                     "-" if dry_run else f"{r.pruned_file_rows} file, {r.pruned_commit_rows} commit")
    out.print(grid)


@click.command("rollback")
@click.option("--to-barrier", "to", type=click.IntRange(min=0), required=True,
              help="make every commit with a barrier above this one invisible")
@click.option("--dry-run", is_flag=True, help="only show which tables would be restored to which version")
@click.option("--yes", is_flag=True, help="really roll back (needed without --dry-run)")
@common
def rollback_cmd(out: Output, catalog_url: str, to: int, dry_run: bool, yes: bool) -> None:
    """Roll every table of the topology back to a barrier, in one transaction.

    New RESTORE commits (history is kept); refused below a live snapshot's
    barrier. Derived jobs then process the barriers after it again; re-ingesting
    the rolled-back input is up to the root jobs.

    \b
    Example:
      lakestep rollback --to-barrier 41 --dry-run --catalog ./wh
      lakestep rollback --to-barrier 41 --yes
    """
    if dry_run == yes:
        raise click.UsageError("rollback changes every table of the topology: pass --dry-run to preview it, "
                               "or --yes to do it")
    with open_catalog(catalog_url) as cat:
        p = Pipeline(cat)
        rows: list[tuple[object, ...]]  # the table's cells (shown with str)
        if dry_run:
            st = p.status(last=1)
            plan = []
            for t in st.managed():
                at = p.version_at(t.table, to, strict=False)
                if at != t.version or (t.kind == "derived" and (t.frontier or 0) > to):
                    plan.append({"table": t.table, "from_version": t.version, "to_version": at})
            out.emit({"to_barrier": to, "dry_run": True, "open_epoch": st.open_epoch, "tables": plan})
            rows = [(r["table"], r["from_version"], r["to_version"], "-") for r in plan]
            title = f"rollback to barrier {to} (dry run): {len(plan)} table(s) would be restored"
        else:
            res = p.rollback(to)
            out.emit({"to_barrier": res.to_barrier, "dry_run": False, "open_epoch": res.open_epoch,
                      "rollback_id": res.rollback_id,
                      "tables": [{"table": r.table, "from_version": r.from_version, "to_version": r.to_version,
                                  "restore_version": r.restore_version} for r in res.tables.values()]})
            rows = [(r.table, r.from_version, r.to_version, r.restore_version) for r in res.tables.values()]
            title = f"rolled back to barrier {to}: {len(rows)} table(s) restored"
    grid = RichTable(title=title, title_justify="left")
    for col in ("table", "from version", "rows of version", "restore commit"):
        grid.add_column(col)
    for r in rows:
        grid.add_row(*map(str, r))
    out.print(grid)


COMMANDS = [compact_cmd, cleanup_cmd, rollback_cmd]
