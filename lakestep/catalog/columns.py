"""Column ids: every column of a table, each nested field included, has an id assigned
when the column is made and never reused (docs/design.md §2.1).

1. **Paths.** A column is named by its path of names, as Iceberg's name mapping names
   it: a top-level column ``("a",)``, a struct's field ``("s", "x")``, a list's element
   ``("l", "element")``, a map's key and value ``("m", "key")``, ``("m", "value")``.
   A primary-key table's tombstone column (``_ls_deleted``, pk.py) is a column too.
2. **Assignment** (:func:`assign`): depth first in schema order, a parent before its
   children (the order Iceberg uses for a new table's ids); a path already known keeps
   its id, a new one takes ``last + 1``. ``last`` only grows, so an id is never given
   twice, even to a column dropped and added again.
3. **In the catalog**: ``ls_table.column_ids`` (JSON ``[[path, id], ...]``) and
   ``ls_table.last_column_id``, written with the schema in the same statement
   (create_table, add_columns), so a reader of the table row never sees a schema
   without its ids.
4. **In the files**: every Parquet file lakestep's writers write carries the ids as
   Parquet field ids (:func:`with_ids`: the Arrow field metadata key
   ``PARQUET:field_id``, which Arrow's Parquet writer turns into ``field_id``). Reading a
   file back by name is unchanged; an engine that resolves columns by field id (Iceberg
   readers, Spark with ``spark.sql.parquet.fieldId.read.enabled``) finds them by id.
5. **Upgrade** (catalog schema version 11): a table made before ids gets them by position
   (rule 2 over its schema at the upgrade), and ``ls_table.name_mapping`` records the
   path -> id mapping of that moment: files written before it have no field ids, and
   their columns are found through it, by the names they were written with.

Not guaranteed: the Spark native writer (streaming/native.py) puts ids on top-level
columns only (Spark's writer takes a field id from a column's metadata, and nested
fields have none to set from a DataFrame); their nested fields are found by name.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import pyarrow as pa

FIELD_ID = b"PARQUET:field_id"

Path = tuple[str, ...]


@dataclass(frozen=True)
class ColumnIds:
    """The ids of a table's columns by path, and the highest id ever given (rule 2)."""

    ids: Mapping[Path, int]
    last: int

    def to_json(self) -> str:
        return json.dumps([[list(p), i] for p, i in sorted(self.ids.items(), key=lambda kv: kv[1])],
                          separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str | None, last: int) -> "ColumnIds | None":
        if not text:
            return None
        return cls({tuple(p): int(i) for p, i in json.loads(text)}, int(last))

    def top(self, name: str) -> int | None:
        return self.ids.get((name,))


def paths(t: pa.DataType, path: Path) -> list[Path]:
    """The paths under a column of type ``t`` at ``path`` (rule 1), parents first."""
    T = pa.types
    out: list[Path] = []
    if T.is_struct(t):
        for i in range(t.num_fields):
            f = t.field(i)
            out.append(path + (f.name,))
            out += paths(f.type, path + (f.name,))
    elif T.is_map(t):
        out += [path + ("key",), *paths(t.key_type, path + ("key",)),
                path + ("value",), *paths(t.item_type, path + ("value",))]
    elif T.is_list(t) or T.is_large_list(t) or T.is_fixed_size_list(t):
        out += [path + ("element",), *paths(t.value_type, path + ("element",))]
    return out


def assign(schema: pa.Schema, known: ColumnIds | None = None) -> ColumnIds:
    """Rule 2: the ids of every path of ``schema``, keeping those ``known``."""
    ids = dict(known.ids) if known is not None else {}
    last = known.last if known is not None else 0
    for f in schema:
        for p in [(f.name,), *paths(f.type, (f.name,))]:
            if p not in ids:
                last += 1
                ids[p] = last
    live = {(f.name,) for f in schema}
    live |= {p for f in schema for p in paths(f.type, (f.name,))}
    return ColumnIds({p: i for p, i in ids.items() if p in live}, last)


def _field(f: pa.Field, path: Path, ids: Mapping[Path, int]) -> pa.Field:
    t = f.type
    T = pa.types
    if T.is_struct(t):
        t = pa.struct([_field(t.field(i), path + (t.field(i).name,), ids) for i in range(t.num_fields)])
    elif T.is_map(t):
        key = _field(t.key_field, path + ("key",), ids)
        item = _field(t.item_field, path + ("value",), ids)
        t = pa.map_(key, item, keys_sorted=t.keys_sorted)
    elif T.is_list(t):
        t = pa.list_(_field(t.value_field, path + ("element",), ids))
    elif T.is_large_list(t):
        t = pa.large_list(_field(t.value_field, path + ("element",), ids))
    elif T.is_fixed_size_list(t):
        t = pa.list_(_field(t.value_field, path + ("element",), ids), t.list_size)
    fid = ids.get(path)
    meta = dict(f.metadata or {})
    if fid is not None:
        meta[FIELD_ID] = str(fid).encode()
    return pa.field(f.name, t, f.nullable, meta or None)


def schema_with_ids(schema: pa.Schema, ids: ColumnIds) -> pa.Schema:
    """``schema`` with each field's id in its metadata (rule 4); unknown paths get none."""
    return pa.schema([_field(f, (f.name,), ids.ids) for f in schema], metadata=schema.metadata)


def with_ids(data: pa.Table, ids: ColumnIds | None) -> pa.Table:
    """``data`` with its schema carrying the ids (zero copy): what a writer writes (rule 4)."""
    if ids is None:
        return data
    return pa.Table.from_arrays(data.columns, schema=schema_with_ids(data.schema, ids))


def file_ids(schema: pa.Schema) -> dict[Path, int]:
    """The field ids a Parquet file's Arrow schema carries, by path (empty: none)."""
    out: dict[Path, int] = {}

    def walk(f: pa.Field, path: Path) -> None:
        raw = (f.metadata or {}).get(FIELD_ID)
        if raw is not None:
            out[path] = int(raw)
        t = f.type
        if pa.types.is_struct(t):
            for i in range(t.num_fields):
                walk(t.field(i), path + (t.field(i).name,))
        elif pa.types.is_map(t):
            walk(t.key_field, path + ("key",))
            walk(t.item_field, path + ("value",))
        elif pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
            walk(t.value_field, path + ("element",))

    for f in schema:
        walk(f, (f.name,))
    return out


def spark_metadata(ids: ColumnIds | None, names: Sequence[str]) -> dict[str, dict[str, int]]:
    """Per top-level column, the metadata Spark's Parquet writer takes a field id from."""
    if ids is None:
        return {}
    return {n: {"parquet.field.id": i} for n in names if (i := ids.top(n)) is not None}


def widening(old: pa.DataType, new: pa.DataType) -> str | None:
    """Why changing a column from ``old`` to ``new`` is refused (None: it is a safe widening,
    the promotions Iceberg allows: a wider signed integer, float to double, a decimal with
    more digits and the same scale). Every file written under ``old`` reads as ``new``."""
    T = pa.types
    if old.equals(new):
        return "the column has that type already"
    if T.is_integer(old) and T.is_signed_integer(new) and new.bit_width > old.bit_width:
        return None  # (an unsigned column fits a signed one of more bits)
    if T.is_floating(old) and T.is_floating(new) and new.bit_width > old.bit_width:
        return None
    if T.is_decimal(old) and T.is_decimal(new):
        if new.scale != old.scale:
            return "a decimal's scale cannot change (its stored values would change meaning)"
        if new.precision <= old.precision:
            return "a decimal can only gain digits"
        if T.is_decimal128(old) and T.is_decimal128(new) or T.is_decimal256(new):
            return None
        return f"{new} is narrower storage than {old}"
    return (f"{old} -> {new} is not a safe widening (allowed: a wider signed integer, float to double, a "
            "decimal with more digits and the same scale)")
