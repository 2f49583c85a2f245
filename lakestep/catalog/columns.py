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

6. **Stored names** (renames, docs/design.md §2.1): a column keeps, in files and in the
   catalog's file rows (statistics, partition values), the name it was first written
   with: its *stored* name. A rename changes the table's name of the column only; the
   field records its stored name in its metadata (:data:`STORED`) when the two differ.
   Writers write stored names (:func:`to_stored`), readers read stored names and return
   the table's (:func:`stored_schema`, :func:`to_table_names`), filters judge files by
   stored names (``Predicate`` takes them from the schema). So no file is rewritten, and
   a writer holding the schema from before a rename writes the same stored names. A new
   column never takes a stored name a column of the table had (:func:`fresh_stored`):
   files written before a drop still hold the dropped column, which no reader asks for.
7. **History** (``ls_schema``): every schema the table had, with its ids and the version
   it took effect at; a time-travel read reads with that version's schema.

Not guaranteed: the Spark native writer (streaming/native.py) puts ids on columns and
struct fields only (Spark's writer takes a field id from a column's or a struct field's
metadata; a list's element and a map's key and value have no field of their own in Spark):
those are found through the name mapping, by their fixed names.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import pyarrow as pa

FIELD_ID = b"PARQUET:field_id"
#: Field metadata: the column's stored name, when the table's name differs (rule 6).
STORED = b"lakestep.stored"

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


def children(t: pa.DataType) -> list[tuple[str, pa.Field]]:
    """The one walker of nested types: the child fields of a column of type ``t``, each with
    its path segment (rule 1): a struct's fields by name, a map's ``key`` and ``value``, a
    list's ``element``; none for other types. :func:`with_children` builds the type back."""
    T = pa.types
    if T.is_struct(t):
        return [(t.field(i).name, t.field(i)) for i in range(t.num_fields)]
    if T.is_map(t):
        return [("key", t.key_field), ("value", t.item_field)]
    if T.is_list(t) or T.is_large_list(t) or T.is_fixed_size_list(t):
        return [("element", t.value_field)]
    return []


def with_children(t: pa.DataType, kids: list[pa.Field]) -> pa.DataType:
    """``t`` with :func:`children` ``kids`` (same kind, list size and key order)."""
    T = pa.types
    if T.is_struct(t):
        return pa.struct(kids)
    if T.is_map(t):
        return pa.map_(kids[0], kids[1], keys_sorted=t.keys_sorted)
    if T.is_list(t):
        return pa.list_(kids[0])
    if T.is_large_list(t):
        return pa.large_list(kids[0])
    if T.is_fixed_size_list(t):
        return pa.list_(kids[0], t.list_size)
    return t


def paths(t: pa.DataType, path: Path) -> list[Path]:
    """The paths under a column of type ``t`` at ``path`` (rule 1), parents first."""
    out: list[Path] = []
    for seg, c in children(t):
        out.append(path + (seg,))
        out += paths(c.type, path + (seg,))
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
    live: set[Path] = {(f.name,) for f in schema}
    live |= {p for f in schema for p in paths(f.type, (f.name,))}
    return ColumnIds({p: i for p, i in ids.items() if p in live}, last)


def _field(f: pa.Field, path: Path, ids: Mapping[Path, int]) -> pa.Field:
    t = f.type
    kids = children(t)
    if kids:
        t = with_children(t, [_field(c, path + (seg,), ids) for seg, c in kids])
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
        for seg, c in children(f.type):
            walk(c, path + (seg,))

    for f in schema:
        walk(f, (f.name,))
    return out


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


# ------------------------------------------------------------------ stored names (rule 6)
def stored_name(f: pa.Field) -> str:
    """The name ``f``'s values are stored under (rule 6)."""
    raw = (f.metadata or {}).get(STORED)
    return raw.decode() if raw is not None else f.name


def _children(t: pa.DataType) -> list[pa.Field]:
    return [c for _, c in children(t)]


def renamed(schema: pa.Schema) -> bool:
    """Whether any field of ``schema`` (nested ones included) is stored under another name."""
    def walk(f: pa.Field) -> bool:
        return STORED in (f.metadata or {}) or any(walk(c) for c in _children(f.type))
    return any(walk(f) for f in schema)


def _stored_field(f: pa.Field, table: pa.Field | None) -> pa.Field:
    """``f`` (a field of data) named and typed with the stored names of ``table``'s field."""
    t = f.type
    kids = _children(t)
    if kids:
        tkids = _children(table.type) if table is not None else []
        if pa.types.is_struct(t):
            by_name = {k.name: k for k in tkids}
            t = with_children(t, [_stored_field(k, by_name.get(k.name)) for k in kids])
        elif len(tkids) == len(kids):
            t = with_children(t, [_stored_field(k, tk) for k, tk in zip(kids, tkids)])
    meta = {k: v for k, v in (f.metadata or {}).items() if k != STORED}
    name = stored_name(table) if table is not None else f.name
    return pa.field(name, t, f.nullable, meta or None)


def stored_schema(schema: pa.Schema, table: pa.Schema | None = None) -> pa.Schema:
    """``schema`` with every field named as stored (rule 6): what files hold. ``table``
    gives the stored names (default: ``schema`` itself); fields it lacks keep their names."""
    table = schema if table is None else table
    idx = {f.name: f for f in table}
    return pa.schema([_stored_field(f, idx.get(f.name)) for f in schema], metadata=schema.metadata)


def to_stored(data: pa.Table, table: pa.Schema) -> pa.Table:
    """``data`` (named as the table names its columns) renamed to the stored names: what a
    writer writes (zero copy: a rename never changes an array's layout)."""
    if not renamed(table):
        return data
    return as_schema(data, stored_schema(data.schema, table))


def to_table_names(data: pa.Table, schema: pa.Schema) -> pa.Table:
    """``data`` as read (stored names, in the order of ``schema``'s fields) with the names of
    ``schema``, whose fields it has in that order: what a reader returns."""
    plain = pa.schema([_strip(f) for f in schema], metadata=schema.metadata)
    return as_schema(data, plain)


def _strip(f: pa.Field) -> pa.Field:
    """``f`` without stored names, at every level."""
    kids = _children(f.type)
    t = with_children(f.type, [_strip(k) for k in kids]) if kids else f.type
    return pa.field(f.name, t, f.nullable, _without_stored(f.metadata))


def plain_schema(schema: pa.Schema) -> pa.Schema:
    """``schema`` without the stored names (what readers return)."""
    if not renamed(schema):
        return schema
    return to_table_names(schema.empty_table(), schema).schema


def _without_stored(meta: Mapping[bytes, bytes] | None) -> dict[bytes, bytes] | None:
    out = {k: v for k, v in (meta or {}).items() if k != STORED}
    return out or None


def as_schema(data: pa.Table, schema: pa.Schema) -> pa.Table:
    """``data`` under ``schema``, whose fields have the layouts of its columns (other names, at
    any level, other metadata): zero copy (:func:`to_stored`, :func:`to_table_names`)."""
    cols = []
    for col, f in zip(data.columns, schema):
        cols.append(col if col.type.equals(f.type) else pa.chunked_array([c.view(f.type) for c in col.chunks],
                                                                        type=f.type))
    return pa.Table.from_arrays(cols, schema=schema)


def stored_names(schema: pa.Schema) -> dict[str, str]:
    """Top-level columns stored under another name: table name -> stored name."""
    return {f.name: stored_name(f) for f in schema if stored_name(f) != f.name}


def all_stored(schemas: "Sequence[pa.Schema]") -> set[Path]:
    """Every stored path of every field of ``schemas`` (a table's history): names a new
    column may not be stored under (rule 6)."""
    out: set[Path] = set()

    def walk(f: pa.Field, path: Path) -> None:
        p = path + (stored_name(f),)
        out.add(p)
        for c in _children(f.type):
            walk(c, p)

    for s in schemas:
        for f in s:
            walk(f, ())
    return out


def fresh_stored(f: pa.Field, parent: Path, taken: set[Path], column_id: int) -> pa.Field:
    """``f`` (a new column under stored path ``parent``) with a stored name no column of the
    table ever had (rule 6): its own name when free, else ``_ls_c<id>``."""
    if parent + (f.name,) not in taken:
        return f
    meta = dict(f.metadata or {})
    meta[STORED] = f"_ls_c{column_id}".encode()
    return f.with_metadata(meta)


# ------------------------------------------------------------------ changes by path
def parse_path(name: str) -> Path:
    """A column's path from its dotted name (``"s.x"``: field ``x`` of struct column ``s``)."""
    return tuple(name.split("."))


def field_at(schema: pa.Schema, path: Path) -> pa.Field | None:
    """The field at ``path`` (through struct columns only), or None."""
    i = schema.get_field_index(path[0])
    if i < 0:
        return None
    f = schema.field(i)
    for name in path[1:]:
        if not pa.types.is_struct(f.type):
            return None
        j = f.type.get_field_index(name)
        if j < 0:
            return None
        f = f.type.field(j)
    return f


def stored_path(schema: pa.Schema, path: Path) -> Path:
    """The stored names along ``path`` (which must exist)."""
    out: list[str] = []
    f: pa.Field | None = None
    for k in range(len(path)):
        f = field_at(schema, path[:k + 1])
        assert f is not None
        out.append(stored_name(f))
    return tuple(out)


def change_at(schema: pa.Schema, path: Path, change: "Callable[[list[pa.Field], int], list[pa.Field]]") -> pa.Schema:
    """``schema`` with the fields holding ``path``'s last name (the top-level columns, or a
    struct's fields) replaced by ``change(fields, index of the name or -1)``."""
    def under(fields: list[pa.Field], rest: Path) -> list[pa.Field]:
        names = [f.name for f in fields]
        i = names.index(rest[0]) if rest[0] in names else -1
        if len(rest) == 1:
            return change(list(fields), i)
        f = fields[i]
        kids = under([f.type.field(k) for k in range(f.type.num_fields)], rest[1:])
        out = list(fields)
        out[i] = pa.field(f.name, pa.struct(kids), f.nullable, f.metadata)
        return out

    return pa.schema(under(list(schema), path), metadata=schema.metadata)


def rekey(ids: ColumnIds, old: Path, new: Path) -> ColumnIds:
    """``ids`` with the column at ``old`` (and everything under it) now at ``new``: a rename."""
    n = len(old)
    return ColumnIds({(new + p[n:] if p[:n] == old else p): i for p, i in ids.ids.items()}, ids.last)


def stored_paths(schema: pa.Schema) -> dict[Path, Path]:
    """Every path of ``schema`` (rule 1) -> the path of stored names its values are under
    (rule 6): what a file without field ids names it (Iceberg's name mapping)."""
    out: dict[Path, Path] = {}

    def walk(t: pa.DataType, lp: Path, sp: Path) -> None:
        struct = pa.types.is_struct(t)  # a struct's fields have stored names; maps and lists do not
        for seg, c in children(t):
            stored = stored_name(c) if struct else seg
            out[lp + (seg,)] = sp + (stored,)
            walk(c.type, lp + (seg,), sp + (stored,))

    for f in schema:
        out[(f.name,)] = (stored_name(f),)
        walk(f.type, (f.name,), (stored_name(f),))
    return out
