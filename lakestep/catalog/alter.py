"""Schema changes as functions of a table's metadata: what ``Table.add_columns``,
``rename_column`` and ``drop_column`` commit (docs/design.md §2.1).

Each function takes the table's :class:`~lakestep.catalog.handle.TableMeta` as read under
the table row's lock and returns an :class:`Altered` (the new schema, its column ids, the
primary key and partition columns under their new names, and the summary the ``ALTER``
commit records), or None when there is nothing to change (an idempotent call). A change
that is refused raises :class:`SchemaChangeError` (or, for add, the errors ``add_columns``
always raised) and changes nothing.

1. **rename**: the column keeps its id and its stored name (columns.py rule 6); only the
   table's name changes. Top-level columns and fields of struct columns (``"s.x"``);
   primary-key and partition columns too (the key and the partitioning follow the name).
2. **drop**: the column and its id leave the schema; the id is never given again. Files
   keep its values, which no reader asks for. Refused: a primary-key or partition column,
   the last column of the table or of its struct.
3. **add**: nullable columns at the end of the table, or of a struct column (``"s.y"``),
   each with a new id and a stored name no column of the table ever had.

Not guaranteed: fields inside lists and maps cannot be renamed, dropped or added one by
one (change the whole column instead).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Sequence

import pyarrow as pa

from ..errors import InvalidSchemaError, SchemaChangeError, SchemaMismatchError
from . import pk
from .checks import check_identifier
from .columns import (
    STORED,
    ColumnIds,
    Path,
    all_stored,
    assign,
    change_at,
    field_at,
    fresh_stored,
    parse_path,
    plain_schema,
    rekey,
    stored_name,
    stored_path,
)

if TYPE_CHECKING:
    from .handle import TableMeta


@dataclass(frozen=True)
class Altered:
    """A schema change, ready to commit."""

    schema: pa.Schema
    ids: ColumnIds
    change: dict[str, Any]
    primary_key: list[str]
    partition_by: list[str]

    def values(self) -> dict[str, Any]:
        """The ``ls_table`` columns the change sets besides the schema."""
        return {"column_ids": self.ids.to_json(), "last_column_id": self.ids.last,
                "primary_key": json.dumps(self.primary_key), "partition_by": json.dumps(self.partition_by)}


def _ids(meta: "TableMeta", schema: pa.Schema, known: ColumnIds | None = None) -> ColumnIds:
    phys = pk.physical_schema(schema, meta.primary_key) if meta.primary_key else schema
    return assign(phys, known if known is not None else meta.column_ids)


def _existing(meta: "TableMeta", name: str) -> tuple[Path, pa.Field]:
    path = parse_path(name)
    f = field_at(meta.schema, path)
    if f is None:
        where = "the table" if len(path) == 1 else f"struct column {'.'.join(path[:-1])!r}"
        raise SchemaChangeError(meta_ident(meta), name, f"no such column in {where} (columns: {meta.schema.names})")
    return path, f


def meta_ident(meta: "TableMeta") -> str:
    return f"{meta.namespace}.{meta.name}"


def rename(meta: "TableMeta", name: str, new_name: str) -> Altered | None:
    """Rule 1."""
    ident = meta_ident(meta)
    path, f = _existing(meta, name)
    check_identifier(new_name, "column name")
    if new_name.startswith("_ls_"):
        raise SchemaChangeError(ident, name, f"column names starting with _ls_ are reserved, got {new_name!r}")
    if new_name == path[-1]:
        return None
    new_path = path[:-1] + (new_name,)
    if field_at(meta.schema, new_path) is not None:
        raise SchemaChangeError(ident, name, f"a column named {'.'.join(new_path)!r} exists already")
    stored = stored_name(f)
    meta_ = {k: v for k, v in (f.metadata or {}).items() if k != STORED}
    if stored != new_name:
        meta_[STORED] = stored.encode()
    renamed_f = pa.field(new_name, f.type, f.nullable, meta_ or None)

    def put(fields: list[pa.Field], i: int) -> list[pa.Field]:
        fields[i] = renamed_f
        return fields

    schema = change_at(meta.schema, path, put)
    assert meta.column_ids is not None
    ids = rekey(meta.column_ids, path, new_path)
    top = len(path) == 1
    key = [new_name if top and k == name else k for k in meta.primary_key]
    parts = [new_name if top and k == name else k for k in meta.partition_by]
    return Altered(schema, ids, {"change": "rename_column", "from": name, "to": ".".join(new_path),
                                 "id": ids.ids.get(new_path)}, key, parts)


def drop(meta: "TableMeta", name: str) -> Altered:
    """Rule 2."""
    ident = meta_ident(meta)
    path, f = _existing(meta, name)
    if len(path) == 1 and name in meta.primary_key:
        raise SchemaChangeError(ident, name, "a primary-key column cannot be dropped (rows are merged by it)")
    if len(path) == 1 and name in meta.partition_by:
        raise SchemaChangeError(ident, name, "a partition column cannot be dropped (files are placed by it)")
    siblings = meta.schema if len(path) == 1 else field_at(meta.schema, path[:-1]).type  # type: ignore[union-attr]
    if (len(siblings.names) if len(path) == 1 else siblings.num_fields) == 1:
        raise SchemaChangeError(ident, name, "the last column of " + (
            "the table cannot be dropped" if len(path) == 1 else "a struct cannot be dropped (drop the struct)"))

    def cut(fields: list[pa.Field], i: int) -> list[pa.Field]:
        return fields[:i] + fields[i + 1:]

    schema = change_at(meta.schema, path, cut)
    assert meta.column_ids is not None
    ids = _ids(meta, schema)
    return Altered(schema, ids, {"change": "drop_column", "column": name, "id": meta.column_ids.ids.get(path)},
                   list(meta.primary_key), list(meta.partition_by))


def add(meta: "TableMeta", fields: Sequence[pa.Field], history: Sequence[pa.Schema]) -> Altered | None:
    """Rule 3. ``history``: every schema the table had (its stored names are taken)."""
    ident = meta_ident(meta)
    for f in fields:
        path = parse_path(f.name)
        for part in path:
            check_identifier(part, "column name")
        if path[-1].startswith("_ls_"):
            raise InvalidSchemaError(f"column names starting with _ls_ are reserved, got {f.name!r}", table=ident,
                                     column=f.name)
        if not f.nullable:
            raise InvalidSchemaError(f"an added column must be nullable (rows written before have no value): {f}",
                                     table=ident, column=f.name)
    if len({f.name for f in fields}) != len(fields):
        raise InvalidSchemaError(f"duplicate column names in {[f.name for f in fields]}", table=ident)
    schema = meta.schema
    problems: list[str] = []
    new: list[tuple[Path, pa.Field]] = []
    for f in fields:
        path = parse_path(f.name)
        if len(path) > 1:
            parent = field_at(schema, path[:-1])
            if parent is None or not pa.types.is_struct(parent.type):
                raise SchemaChangeError(ident, f.name, f"{'.'.join(path[:-1])!r} is not a struct column of the table")
        have = field_at(schema, path)
        if have is not None:
            if not have.type.equals(f.type):
                problems.append(f"column {f.name!r} exists as {have.type}, not {f.type}")
            continue
        plain = plain_schema(pa.schema([f]))[0]  # a stored name comes from this table only
        child = pa.field(path[-1], plain.type, True, plain.metadata)

        def append(sib: list[pa.Field], i: int, child: pa.Field = child) -> list[pa.Field]:
            return sib + [child]

        schema = change_at(schema, path, append)
        new.append((path, child))
    if problems:
        raise SchemaMismatchError(ident, problems)
    if not new:
        return None
    ids = _ids(meta, schema)
    taken = all_stored([*history, meta.schema])
    for path, child in new:  # a stored name no column ever had (columns.py rule 6)
        parent = stored_path(schema, path[:-1]) if len(path) > 1 else ()
        fresh = fresh_stored(child, parent, taken, ids.ids[path])
        if fresh is not child:
            def put(sib: list[pa.Field], i: int, fresh: pa.Field = fresh) -> list[pa.Field]:
                sib[i] = fresh
                return sib

            schema = change_at(schema, path, put)
    return Altered(schema, ids, {"change": "add_columns", "columns": [
        {"name": ".".join(p), "type": str(c.type), "id": ids.ids[p]} for p, c in new]},
        list(meta.primary_key), list(meta.partition_by))
