"""What a lakestep table looks like to Iceberg: schema, field ids, name mapping,
partition spec, and each data file's entry (partition values and column bounds).

1. **Types.** Arrow types map to Iceberg types (:func:`iceberg_type`). A type
   Iceberg readers would read differently from lakestep (unsigned 64-bit
   integers, nanosecond times, intervals, unions, dictionaries of non-strings)
   makes the table unpublishable: :class:`~lakestep.errors.IcebergSchemaError`
   names the column, and the table is left out of publishing (``lakestep doctor``
   shows why) while the others go on.
2. **Field ids.** Every column and nested field gets an id the first time the
   table is published; a later schema keeps each field's id by its path of
   names (lakestep's schema changes only add columns), and new fields take ids
   above every id the table ever had (``last-column-id``), so no id is reused.
   A primary-key table's hidden tombstone column ``_ls_deleted`` takes an id
   too, so that it is named in the name mapping and never reused.
3. **Name mapping.** lakestep's Parquet files carry no field ids: every table
   sets ``schema.name-mapping.default``, which readers use to find each field
   by name in files without ids.
4. **Partitions.** Identity partition columns become an identity partition
   spec; a file's partition tuple is the values lakestep recorded for it, the
   same values the file holds in the column.
5. **Bounds.** Column statistics come from the catalog (``ls_file.stats``),
   never from file footers. Bounds are only written where they are exact for
   Iceberg's comparison: integers, booleans, decimals, dates, times,
   microsecond (or coarser) timestamps, and strings and binaries up to
   :data:`MAX_BOUND_BYTES` bytes. Floats (NaN handling differs between
   engines) and longer values get no bounds; a missing bound costs a reader
   pruning, never rows.

Not guaranteed: Iceberg readers see ``int8``/``int16``/``uint8``/``uint16``
columns as 32-bit integers and ``uint32`` as 64-bit ones (the values are the
same); ``large_string`` and ``large_binary`` as ``string`` and ``binary``.
"""

from __future__ import annotations

import datetime as dt
import decimal
import json
from dataclasses import dataclass
from dataclasses import field as dc_field
from typing import Any, Iterable, Mapping, Sequence

import pyarrow as pa
from pyiceberg.conversions import to_bytes
from pyiceberg.manifest import DataFile, DataFileContent, FileFormat
from pyiceberg.partitioning import PartitionField, PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.transforms import IdentityTransform
from pyiceberg.typedef import Record
from pyiceberg.types import (
    BinaryType,
    BooleanType,
    DateType,
    DecimalType,
    DoubleType,
    FixedType,
    FloatType,
    IcebergType,
    IntegerType,
    ListType,
    LongType,
    MapType,
    NestedField,
    PrimitiveType,
    StringType,
    StructType,
    TimestampType,
    TimestamptzType,
    TimeType,
)

from ..catalog.files import DataFile as LakestepFile
from ..catalog.pk import DELETED
from ..errors import IcebergSchemaError

#: Strings and binaries longer than this get no bounds in manifests (Iceberg would truncate
#: them; lakestep leaves them out: a reader then reads the file's own statistics).
MAX_BOUND_BYTES = 64
#: The first partition field id (Iceberg's convention).
PARTITION_FIELD_ID_START = 1000
EPOCH_DATE = dt.date(1970, 1, 1)
EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)


class Ids:
    """Field ids by path of names (``("address", "city")``; list elements ``element``,
    map keys ``key`` and values ``value``): known ones kept, new ones above ``last``."""

    def __init__(self, known: Mapping[tuple[str, ...], int] | None = None, last: int = 0) -> None:
        self.known = dict(known or {})
        self.last = max([last, *self.known.values()]) if self.known else last

    def id(self, path: tuple[str, ...]) -> int:
        got = self.known.get(path)
        if got is None:
            self.last += 1
            got = self.known[path] = self.last
        return got


def iceberg_type(t: pa.DataType, path: tuple[str, ...], ids: Ids, column: str) -> IcebergType:
    """The Iceberg type of an Arrow type (module docstring, step 1); nested fields take ids."""
    T = pa.types
    if T.is_boolean(t):
        return BooleanType()
    if T.is_int8(t) or T.is_int16(t) or T.is_int32(t) or T.is_uint8(t) or T.is_uint16(t):
        return IntegerType()
    if T.is_int64(t) or T.is_uint32(t):
        return LongType()
    if T.is_float32(t):
        return FloatType()
    if T.is_float64(t):
        return DoubleType()
    if T.is_decimal(t):
        if t.precision > 38:
            raise _unsupported(column, t, "Iceberg decimals have at most 38 digits")
        return DecimalType(t.precision, t.scale)
    if T.is_string(t) or T.is_large_string(t) or T.is_string_view(t):
        return StringType()
    if T.is_binary(t) or T.is_large_binary(t) or T.is_binary_view(t):
        return BinaryType()
    if T.is_fixed_size_binary(t):
        return FixedType(t.byte_width)
    if T.is_date32(t) or T.is_date64(t):
        return DateType()
    if T.is_time64(t) and t.unit == "us":
        return TimeType()
    if T.is_timestamp(t):
        if t.unit == "ns":
            raise _unsupported(column, t, "Iceberg format 2 has no nanosecond timestamps; store microseconds")
        return TimestamptzType() if t.tz is not None else TimestampType()
    if T.is_struct(t):
        return StructType(*[
            NestedField(ids.id(path + (f.name,)), f.name, iceberg_type(f.type, path + (f.name,), ids, column),
                        required=not f.nullable)
            for f in t])
    if T.is_list(t) or T.is_large_list(t):
        p = path + ("element",)
        return ListType(ids.id(p), iceberg_type(t.value_type, p, ids, column),
                        element_required=not t.value_field.nullable)
    if T.is_map(t):
        kp, vp = path + ("key",), path + ("value",)
        return MapType(ids.id(kp), iceberg_type(t.key_type, kp, ids, column), ids.id(vp),
                       iceberg_type(t.item_type, vp, ids, column), value_required=not t.item_field.nullable)
    if T.is_dictionary(t) and (T.is_string(t.value_type) or T.is_large_string(t.value_type)):
        return StringType()
    raise _unsupported(column, t, "no Iceberg type reads it back the same")


def _unsupported(column: str, t: pa.DataType, why: str) -> IcebergSchemaError:
    return IcebergSchemaError(f"column {column!r} of type {t} cannot be published to Iceberg: {why}", column=column)


@dataclass(frozen=True)
class TableShape:
    """The Iceberg face of one lakestep table's schema."""

    schema: Schema
    ids: dict[tuple[str, ...], int]  # every path -> id, the tombstone column's included
    last_column_id: int
    name_mapping: str  # JSON of schema.name-mapping.default
    spec: PartitionSpec


def shape(schema: pa.Schema, partition_by: Sequence[str], primary_key: Sequence[str], *,
          known: Mapping[tuple[str, ...], int] | None = None, last: int = 0, schema_id: int = 0,
          stored: Mapping[tuple[str, ...], tuple[str, ...]] | None = None) -> TableShape:
    """Steps 1-4 of the module docstring for a lakestep schema; ``known``/``last``: the ids of
    the table's published schema (a new table: none). ``stored``: path -> the path of the names
    its values are stored under (catalog/columns.py rule 6), which the name mapping gives files
    without field ids (default: the same)."""
    ids = Ids(known, last)
    fields = [NestedField(ids.id((f.name,)), f.name, iceberg_type(f.type, (f.name,), ids, f.name),
                          required=not f.nullable) for f in schema]
    if primary_key:
        ids.id((DELETED,))  # named by the name mapping, never reused
    ident = [ids.known[(k,)] for k in primary_key]
    ice = Schema(*fields, schema_id=schema_id, identifier_field_ids=ident)
    spec = PartitionSpec(*[
        PartitionField(source_id=ids.known[(c,)], field_id=PARTITION_FIELD_ID_START + i, transform=IdentityTransform(),
                       name=c) for i, c in enumerate(partition_by)], spec_id=0)
    named = ids.known if not stored else {
        stored[p] if p in stored else p: i for p, i in ids.known.items() if p in stored or p == (DELETED,)}
    return TableShape(ice, dict(ids.known), ids.last, json.dumps(_mapping(named), separators=(",", ":")), spec)


def _mapping(known: Mapping[tuple[str, ...], int]) -> list[dict[str, Any]]:
    """Iceberg's name mapping (a nested list of {field-id, names, fields}) of every known path."""
    root: dict[str, Any] = {}
    for path, fid in sorted(known.items(), key=lambda kv: (len(kv[0]), kv[1])):
        node = root
        for name in path[:-1]:
            node = node[name]["fields"]
        node[path[-1]] = {"field-id": fid, "fields": {}}

    def emit(level: dict[str, Any]) -> list[dict[str, Any]]:
        out = []
        for name, node in sorted(level.items(), key=lambda kv: kv[1]["field-id"]):
            item: dict[str, Any] = {"field-id": node["field-id"], "names": [name]}
            if node["fields"]:
                item["fields"] = emit(node["fields"])
            out.append(item)
        return out

    return emit(root)


def ids_of(schema: Schema, extra: Mapping[str, int] | None = None) -> dict[tuple[str, ...], int]:
    """The path -> id map of a published Iceberg schema (the inverse of :func:`shape`)."""
    out: dict[tuple[str, ...], int] = {}

    def walk(t: IcebergType, path: tuple[str, ...]) -> None:
        if isinstance(t, StructType):
            for f in t.fields:
                out[path + (f.name,)] = f.field_id
                walk(f.field_type, path + (f.name,))
        elif isinstance(t, ListType):
            out[path + ("element",)] = t.element_id
            walk(t.element_type, path + ("element",))
        elif isinstance(t, MapType):
            out[path + ("key",)] = t.key_id
            out[path + ("value",)] = t.value_id
            walk(t.key_type, path + ("key",))
            walk(t.value_type, path + ("value",))

    walk(schema.as_struct(), ())
    for name, fid in (extra or {}).items():
        out[(name,)] = fid
    return out


def mapping_ids(name_mapping: str | None) -> dict[tuple[str, ...], int]:
    """The path -> id map a stored name mapping holds (it names the hidden columns too)."""
    out: dict[tuple[str, ...], int] = {}

    def walk(items: Iterable[Mapping[str, Any]], path: tuple[str, ...]) -> None:
        for it in items:
            for name in it.get("names", []):
                out[path + (name,)] = int(it["field-id"])
                walk(it.get("fields") or [], path + (name,))

    if name_mapping:
        walk(json.loads(name_mapping), ())
    return out


# ------------------------------------------------------------------ data files
def _days(v: Any) -> int | None:
    if isinstance(v, dt.datetime):
        v = v.date()
    return (v - EPOCH_DATE).days if isinstance(v, dt.date) else None


def _micros(v: Any) -> int | None:
    if not isinstance(v, dt.datetime):
        return None
    if v.tzinfo is None:
        v = v.replace(tzinfo=dt.timezone.utc)
    delta = v - EPOCH
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds


def _time_micros(v: Any) -> int | None:
    if not isinstance(v, dt.time):
        return None
    return ((v.hour * 60 + v.minute) * 60 + v.second) * 1_000_000 + v.microsecond


def _bound(t: PrimitiveType, v: Any) -> Any:
    """The value Iceberg's single-value serialization takes for a bound, or None: no bound."""
    if v is None:
        return None
    if isinstance(t, BooleanType):
        return bool(v) if isinstance(v, bool) else None
    if isinstance(t, (IntegerType, LongType)):
        return v if isinstance(v, int) and not isinstance(v, bool) else None
    if isinstance(t, DecimalType):
        if not isinstance(v, decimal.Decimal) or not v.is_finite():
            return None
        return v.quantize(decimal.Decimal(1).scaleb(-t.scale)) if v.as_tuple().exponent != -t.scale else v
    if isinstance(t, DateType):
        return _days(v)
    if isinstance(t, TimeType):
        return _time_micros(v)
    if isinstance(t, (TimestampType, TimestamptzType)):
        return _micros(v)
    if isinstance(t, StringType):
        return v if isinstance(v, str) and len(v.encode()) <= MAX_BOUND_BYTES else None
    if isinstance(t, BinaryType):
        return v if isinstance(v, bytes) and len(v) <= MAX_BOUND_BYTES else None
    return None  # floats, fixed: none (module docstring, step 5)


@dataclass
class FileMapper:
    """Turns lakestep's recorded data files into Iceberg ``DataFile`` entries for one table."""

    location: str
    schema: Schema
    spec: PartitionSpec
    partition_by: Sequence[str]
    #: columns stored under another name (catalog/columns.py rule 6): a file's statistics and
    #: partition values are recorded under it
    stored: Mapping[str, str] = dc_field(default_factory=dict)

    def __post_init__(self) -> None:
        self.columns: list[tuple[str, int, PrimitiveType | None]] = [
            (f.name, f.field_id, f.field_type if isinstance(f.field_type, PrimitiveType) else None)
            for f in self.schema.fields]
        self.part_types = [self.schema.find_field(c).field_type for c in self.partition_by]

    def path(self, rel: str) -> str:
        return file_uri(self.location, rel)

    def partition(self, values: Mapping[str, Any]) -> Record:
        out = []
        for c, t in zip(self.partition_by, self.part_types):
            v = values.get(self.stored.get(c, c))
            if isinstance(t, DateType):
                v = _days(v)
            elif isinstance(t, (TimestampType, TimestamptzType)):
                v = _micros(v)
            out.append(v)
        return Record(*out)

    def data_file(self, f: LakestepFile) -> DataFile:
        stats = f.stats
        nulls: dict[int, int] = {}
        values: dict[int, int] = {}
        lo: dict[int, bytes] = {}
        hi: dict[int, bytes] = {}
        for name, fid, t in self.columns:
            s = stats.get(self.stored.get(name, name))
            if t is None or s is None:
                continue
            nulls[fid] = s.null_count
            values[fid] = f.record_count
            a, b = _bound(t, s.min), _bound(t, s.max)
            if a is not None and b is not None:
                lo[fid] = to_bytes(t, a)
                hi[fid] = to_bytes(t, b)
        df = DataFile.from_args(
            content=DataFileContent.DATA, file_path=self.path(f.path), file_format=FileFormat.PARQUET,
            partition=self.partition(f.partition), record_count=f.record_count, file_size_in_bytes=f.file_size,
            value_counts=values, null_value_counts=nulls, lower_bounds=lo, upper_bounds=hi)
        df.spec_id = self.spec.spec_id
        return df


def file_uri(location: str, rel: str) -> str:
    """A data or metadata file's URI as Iceberg records it: ``file:///...`` on a local disk,
    the object store's own URI otherwise."""
    base = location.rstrip("/")
    if "://" not in base:
        base = "file://" + base
    return f"{base}/{rel}" if rel else base
