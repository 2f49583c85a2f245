"""``lakestep tables``, ``lakestep describe TABLE`` and ``lakestep alter TABLE``."""

from __future__ import annotations

import re
from typing import Any

import click
import pyarrow as pa
from rich.table import Table as RichTable

from ..barrier import Pipeline
from ..catalog.columns import stored_name
from ..catalog.lifecycle import live_locks
from .common import common, open_catalog
from .output import Output, duration, size, when


@click.command("tables")
@click.option("--namespace", default=None, help="only the tables of this namespace")
@common
def tables_cmd(out: Output, catalog_url: str, namespace: str | None) -> None:
    """List tables: kind (root, derived, unmanaged), writer job, version, files, frontier.

    \b
    Example:
      lakestep tables --catalog sqlite:///wh/catalog.db
      lakestep tables --namespace shop --json
    """
    with open_catalog(catalog_url) as cat:
        st = Pipeline(cat).status(last=1)
        names = cat.list_tables(namespace)
        rows: list[dict[str, Any]] = []
        for name in out.each("reading", names):
            t = st.tables[name]
            files = cat.load_table(name).files()
            rows.append({"table": name, "kind": t.kind, "job": t.job, "version": t.version,
                         "data_version": t.data_version, "files": len(files),
                         "bytes": sum(f.file_size for f in files), "stored_rows": sum(f.record_count for f in files),
                         "frontier": t.frontier, "behind": t.behind, "last_commit_at": t.last_commit_at})
        out.emit({"catalog": cat.url, "tables": rows})
        grid = RichTable(title=f"{len(rows)} table(s) in {cat.url}", title_justify="left")
        for col, just in (("table", "left"), ("kind", "left"), ("job", "left"), ("version", "right"),
                          ("data version", "right"), ("files", "right"), ("size", "right"),
                          ("stored rows", "right"), ("frontier", "right"), ("behind", "right"),
                          ("last commit", "left")):
            grid.add_column(col, justify=just)  # type: ignore[arg-type]
        for r in rows:
            lag = r["behind"] is not None and r["behind"] > 0
            grid.add_row(r["table"], r["kind"], r["job"] or "-", str(r["version"]), str(r["data_version"]),
                         str(r["files"]), size(r["bytes"]), str(r["stored_rows"]),
                         "-" if r["frontier"] is None else str(r["frontier"]),
                         "-" if r["behind"] is None else str(r["behind"]), when(r["last_commit_at"]),
                         style="red" if lag else None)
        out.print(grid)


@click.command("describe")
@click.argument("table")
@click.option("--history", "history_limit", type=click.IntRange(min=0), default=20, show_default=True,
              help="how many commits of history to show (0: all)")
@common
def describe_cmd(out: Output, catalog_url: str, table: str, history_limit: int) -> None:
    """Describe TABLE: schema, primary key, partitions, properties, snapshots, locks, history.

    \b
    Example:
      lakestep describe shop.orders --catalog ./wh
      lakestep describe shop.orders --history 5 --json
    """
    with open_catalog(catalog_url) as cat:
        t = cat.load_table(table)
        p = Pipeline(cat)
        st = p.status(last=1).tables[t.ident]
        files = t.files()
        hist = t.history(limit=history_limit or None)
        snaps = t.snapshots()
        locks = live_locks(cat, t.table_id)
        from ..barrier.publishing import status as publishing

        iceberg = publishing(cat).tables.get(t.ident)
        doc: dict[str, Any] = {
            "table": t.ident, "location": t.location, "kind": st.kind, "job": st.job, "readers": list(st.readers),
            "version": st.version, "data_version": st.data_version, "frontier": st.frontier, "behind": st.behind,
            "primary_key": list(t.primary_key), "partition_by": list(t.partition_by),
            "properties": dict(t.properties), "retention_seconds": t.retention_seconds,
            "iceberg": None if iceberg is None else {
                "metadata_location": iceberg["metadata_location"], "version": iceberg["version"],
                "barrier": iceberg["barrier"], "main_version": iceberg["main_version"], "error": iceberg["error"]},
            "files": len(files), "bytes": sum(f.file_size for f in files),
            "stored_rows": sum(f.record_count for f in files),
            "schema": [{"name": f.name, "type": str(f.type), "nullable": f.nullable,
                        "id": t.meta.column_ids.top(f.name) if t.meta.column_ids else None,
                        "stored_as": stored_name(f)} for f in t.schema],
            "snapshots": [{"name": s.name, "version": s.version, "barrier": s.barrier, "created_at": s.created_at,
                           "expires_at": s.expires_at} for s in snaps],
            "locks": [{"lock_id": lk[0], "locker": lk[1], "version": lk[3], "kind": lk[4], "expires_at": lk[5]}
                      for lk in locks],
            "history": [{"version": h.version, "data_version": h.data_version, "operation": h.operation,
                         "barrier": h.barrier, "added_files": h.added_files, "removed_files": h.removed_files,
                         "added_rows": h.added_rows, "removed_rows": h.removed_rows, "job_id": h.job_id,
                         "batch_id": h.batch_id, "committed_at": h.committed_at} for h in hist],
        }
        out.emit(doc)
        if out.json:
            return
        head = RichTable.grid(padding=(0, 2))
        head.add_column(style="bold")
        head.add_column()
        writer = "-" if st.job is None else f"job {st.job}"
        for k, v in (("table", t.ident), ("location", t.location), ("kind", f"{st.kind} ({writer})"),
                     ("read by", ", ".join(st.readers) or "-"),
                     ("version", f"{st.version} (data version {st.data_version})"),
                     ("frontier", "-" if st.frontier is None else f"{st.frontier} ({st.behind} behind)"),
                     ("primary key", ", ".join(t.primary_key) or "-"),
                     ("partitioned by", ", ".join(t.partition_by) or "-"),
                     ("files", f"{doc['files']} ({size(doc['bytes'])}, {doc['stored_rows']} stored rows)"),
                     ("retention", duration(t.retention_seconds))):
            head.add_row(k, str(v))
        if iceberg is not None:
            head.add_row("iceberg", iceberg["error"] and f"not published: {iceberg['error']}" or (
                f"{iceberg['metadata_location']} (main: version {iceberg['main_version']}, newest tag "
                f"barrier-{iceberg['barrier']})"))
        out.print(head)
        schema = RichTable(title="schema", title_justify="left")
        for col in ("id", "column", "type", "nullable", "key", "stored as"):
            schema.add_column(col)
        for f, c in zip(t.schema, doc["schema"]):
            key = ", ".join(k for k, on in (("primary key", f.name in t.primary_key),
                                            ("partition", f.name in t.partition_by)) if on)
            schema.add_row("-" if c["id"] is None else str(c["id"]), f.name, str(f.type), "yes" if f.nullable else "no",
                           key, "" if c["stored_as"] == f.name else c["stored_as"])
        out.print(schema)
        if t.properties:
            props = RichTable(title="properties", title_justify="left")
            props.add_column("key")
            props.add_column("value")
            for k, v in sorted(t.properties.items()):
                props.add_row(k, v)
            out.print(props)
        if snaps or locks:
            pins = RichTable(title="snapshots and locks", title_justify="left")
            for col in ("kind", "name", "version", "barrier", "expires"):
                pins.add_column(col)
            for s in snaps:
                pins.add_row("snapshot", s.name, str(s.version), "-" if s.barrier is None else str(s.barrier),
                             when(s.expires_at) if s.expires_at else "never")
            for lk in locks:
                pins.add_row("lock", str(lk[1]), str(lk[3]), "-", when(lk[5]) if lk[5] else "never")
            out.print(pins)
        h = RichTable(title=f"history (newest first{'' if not history_limit else f', {len(hist)} shown'})",
                      title_justify="left")
        for col, just in (("version", "right"), ("operation", "left"), ("barrier", "right"), ("+files", "right"),
                          ("-files", "right"), ("+rows", "right"), ("-rows", "right"), ("job", "left"),
                          ("batch", "right"), ("committed", "left")):
            h.add_column(col, justify=just)  # type: ignore[arg-type]
        for c in hist:
            h.add_row(str(c.version), c.operation, "-" if c.barrier is None else str(c.barrier), str(c.added_files),
                      str(c.removed_files), str(c.added_rows), str(c.removed_rows), c.job_id or "-",
                      "-" if c.batch_id is None else str(c.batch_id), when(c.committed_at))
        out.print(h)


_DECIMAL = re.compile(r"^decimal\(\s*(\d+)\s*,\s*(\d+)\s*\)$")


def parse_type(text: str) -> pa.DataType:
    """An Arrow type from its name: ``int64``, ``double``, ``string``, ``decimal(12,2)``, ..."""
    t = text.strip().lower()
    m = _DECIMAL.match(t)
    if m:
        precision, scale = int(m.group(1)), int(m.group(2))
        if not 1 <= precision <= 76 or scale > precision:
            raise click.BadParameter(f"no decimal({precision},{scale}): 1 <= precision <= 76, scale <= precision")
        return pa.decimal128(precision, scale) if precision <= 38 else pa.decimal256(precision, scale)
    try:
        return pa.type_for_alias({"long": "int64", "integer": "int32", "int": "int32", "bigint": "int64"}.get(t, t))
    except ValueError:
        raise click.BadParameter(f"unknown type {text!r} (int32, int64, float, double, string, "
                                 "decimal(P,S), date32, ...)") from None


def _pairs(values: tuple[str, ...], what: str) -> list[tuple[str, pa.DataType]]:
    out = []
    for v in values:
        name, sep, typ = v.partition("=")
        if not sep or not name.strip():
            raise click.BadParameter(f"{what} takes COLUMN=TYPE, got {v!r}")
        out.append((name.strip(), parse_type(typ)))
    return out


@click.command("alter")
@click.argument("table")
@click.option("--add", "adds", multiple=True, metavar="COL=TYPE", help="add a nullable column (repeatable)")
@click.option("--widen", "widens", multiple=True, metavar="COL=TYPE",
              help="widen a column's type: a wider integer, float to double, a decimal with more digits")
@click.option("--optional", "optionals", multiple=True, metavar="COL", help="make a required column optional")
@click.option("--rename", "renames", multiple=True, metavar="OLD=NEW",
              help="rename a column, or a struct's field (s.x=y) (repeatable)")
@click.option("--drop", "drops", multiple=True, metavar="COL", help="drop a column, or a struct's field (s.x)")
@click.option("--order", default=None, metavar="COL,COL,...", help="put the columns in this order (every column once)")
@common
def alter_cmd(out: Output, catalog_url: str, table: str, adds: tuple[str, ...], widens: tuple[str, ...],
              optionals: tuple[str, ...], renames: tuple[str, ...], drops: tuple[str, ...],
              order: str | None) -> None:
    """Change a table's schema, metadata only: no file is rewritten.

    Each change is a commit of its own (see `lakestep describe TABLE`); a change the
    table already has changes nothing. Changes run in the order: renames, drops, adds,
    widenings, optionals, order. Refused changes (a narrowing, an unrelated type, a
    primary-key column made optional or dropped, a name in use) fail with the reason,
    and nothing of that change is made. Add a struct's field with --add s.y=TYPE.

    \b
    Example:
      lakestep alter shop.orders --rename amout=amount --widen qty=int64 --add coupon=string
      lakestep alter shop.orders --drop legacy --optional note --order id,day,qty,note,coupon
    """
    added, widened = _pairs(adds, "--add"), _pairs(widens, "--widen")
    renamed = []
    for v in renames:
        old_name, sep, new_name = v.partition("=")
        if not sep or not old_name.strip() or not new_name.strip():
            raise click.BadParameter(f"--rename takes OLD=NEW, got {v!r}")
        renamed.append((old_name.strip(), new_name.strip()))
    if not (added or widened or optionals or order or renamed or drops):
        raise click.UsageError("nothing to change: give --add, --widen, --optional, --rename, --drop or --order")
    with open_catalog(catalog_url) as cat:
        t = cat.load_table(table)
        before = t.version
        for old_name, new_name in renamed:
            t.rename_column(old_name, new_name)
        for n in drops:
            t.drop_column(n)
        if added:
            t.add_columns(*[pa.field(n, typ) for n, typ in added])
        for n, typ in widened:
            t.update_column(n, type=typ)
        for n in optionals:
            t.update_column(n, nullable=True)
        if order:
            t.reorder_columns([c.strip() for c in order.split(",")])
        out.emit({"table": t.ident, "version_before": before, "version": t.version, "schema_id": t.meta.schema_id,
                  "columns": [{"name": f.name, "type": str(f.type), "nullable": f.nullable,
                               "id": (t.meta.column_ids.top(f.name) if t.meta.column_ids else None)} for f in t.schema]})
        grid = RichTable(title=f"{t.ident}: version {before} -> {t.version}", title_justify="left")
        for col in ("id", "column", "type", "nullable"):
            grid.add_column(col)
        for f in t.schema:
            fid = t.meta.column_ids.top(f.name) if t.meta.column_ids else None
            grid.add_row("-" if fid is None else str(fid), f.name, str(f.type), "yes" if f.nullable else "no")
        out.print(grid)


COMMANDS = [tables_cmd, describe_cmd, alter_cmd]
