"""Data files: what the catalog records of them.

Files are immutable Parquet (``writer.py`` writes them). For each file the catalog
records the row count, the byte size, the partition values and per-column statistics
(min, max, null count), so that commits can decide conflicts and readers can prune
files without opening them: :class:`DataFile` is a committed file's record,
:class:`NewFile` a file written but not yet committed; the statistics and partition
values are JSON, in the codec below, and their typed copies (``ls_file_stats``) are
pure functions of that JSON. The statistics of a file lakestep writes are taken from the
footer the Parquet writer wrote where that holds them exactly (:func:`written_stats`),
those of a file Spark wrote from its footer alone (:func:`footer_stats`).

Nothing here touches the filesystem or talks to the catalog database.
"""

from __future__ import annotations

import base64
import datetime as dt
import decimal
import json
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Mapping

import pyarrow as pa
import pyarrow.compute as pc

from .columns import stored_name


# ---------------------------------------------------------------- stats codec
def encode_value(v: Any) -> Any:
    """A statistics bound or partition value as JSON: dates, times, decimals, bytes and
    durations tagged (``{"$d": "2026-01-02"}``); None for NaN and for types it has no form for."""
    if v is None or isinstance(v, (bool, int, float, str)):
        if isinstance(v, float) and v != v:  # NaN: no usable bound
            return None
        return v
    if isinstance(v, dt.datetime):
        return {"$dt": v.isoformat()}
    if isinstance(v, dt.date):
        return {"$d": v.isoformat()}
    if isinstance(v, dt.time):
        return {"$t": v.isoformat()}
    if isinstance(v, decimal.Decimal):
        return {"$dec": str(v)}
    if isinstance(v, bytes):
        return {"$b": base64.b64encode(v).decode()}
    if isinstance(v, dt.timedelta):
        return {"$td": v.total_seconds()}
    return None  # unknown type: no statistics


def partition_key(part: Mapping[str, Any]) -> str:
    """The stored form of a file's partition values (``ls_file.partition``): canonical
    JSON, keys sorted. The only writer of that column; reads with a filter that pins
    every partition column match it as text (Predicate.partition_keys), so any other
    form would hide files from those reads."""
    return json.dumps({k: encode_value(v) for k, v in part.items()}, sort_keys=True)


def decode_value(v: Any) -> Any:
    """The value :func:`encode_value` encoded (None for a tag it does not know)."""
    if isinstance(v, dict):
        if "$dt" in v:
            return dt.datetime.fromisoformat(v["$dt"])
        if "$d" in v:
            return dt.date.fromisoformat(v["$d"])
        if "$t" in v:
            return dt.time.fromisoformat(v["$t"])
        if "$dec" in v:
            return decimal.Decimal(v["$dec"])
        if "$b" in v:
            return base64.b64decode(v["$b"])
        if "$td" in v:
            return dt.timedelta(seconds=v["$td"])
        return None
    return v


@dataclass(frozen=True)
class ColumnStats:
    min: Any
    max: Any
    null_count: int


def compute_stats(table: pa.Table) -> dict[str, list[Any]]:
    """Per-column [min, max, null_count] in JSON-ready form (no bounds for nested types)."""
    return {name: column_stats(col) for name, col in zip(table.column_names, table.columns)}


def column_stats(col: "pa.ChunkedArray | pa.Array") -> list[Any]:
    """One column's ``[min, max, null_count]`` (:func:`compute_stats`): bounds None when every
    value is null, for nested, dictionary and null columns, and for types min_max refuses."""
    nulls = col.null_count
    lo = hi = None
    t = col.type
    if len(col) > nulls and not (pa.types.is_nested(t) or pa.types.is_dictionary(t) or pa.types.is_null(t)):
        try:
            mm = pc.min_max(col)
            lo, hi = encode_value(mm["min"].as_py()), encode_value(mm["max"].as_py())
        except (pa.ArrowNotImplementedError, pa.ArrowInvalid, TypeError, ValueError):
            lo = hi = None
    return [lo, hi, nulls]


# ---------------------------------------------------- statistics from a Parquet footer
# A Parquet writer computes each column chunk's min, max and null count as it writes; the
# footer holds them. Two writers' files are described from their footers:
#
# 1. lakestep's own (writer.py, pyarrow): :func:`written_stats` gives exactly what
#    :func:`compute_stats` gives for the rows written, without a second pass over them:
#    bounds from the footer for the types where pyarrow's footer value is the value
#    ``pc.min_max`` gives (:func:`footer_exact`; for a float column unless a bound is zero,
#    which the footer stores as -0.0 for a min and 0.0 for a max whatever the rows held),
#    null counts from the rows (Arrow keeps them), everything else computed from the rows
#    as before, column by column. tests/catalog/test_file_writing.py proves the equality
#    over every type the catalog stores;
# 2. Spark's (streaming/native.py, parquet-mr): :func:`footer_stats`, from the footer alone
#    (the rows stay in the JVM); bounds unknown where the footer cannot say them exactly.
def leaf_count(t: pa.DataType) -> int:
    """How many Parquet leaf columns a column of Arrow type ``t`` is written as."""
    if pa.types.is_struct(t):
        return sum(leaf_count(t.field(i).type) for i in range(t.num_fields))
    if pa.types.is_map(t):
        return leaf_count(t.key_type) + leaf_count(t.item_type)
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t) \
            or pa.types.is_list_view(t) or pa.types.is_large_list_view(t):
        return leaf_count(t.value_type)
    return 1


def footer_bounds(md: Any, j: int, t: pa.DataType) -> tuple[Any, Any, int | None, bool]:
    """Leaf column ``j`` of a file, a top-level column of Arrow type ``t``, as the footer ``md``
    (``pyarrow.parquet.FileMetaData``) describes it over its row groups: ``(min, max,
    null_count, exact)``, the bounds as pyarrow converts them (text decoded for a string
    column), None when no row group has a value. ``null_count`` None: some row group's
    statistics lack it; ``exact`` False: some row group with values has no bounds, or a
    NaN bound (parquet-mr counts NaN into them)."""
    lo = hi = None
    nulls, exact = 0, True
    text = pa.types.is_string(t) or pa.types.is_large_string(t)
    for r in range(md.num_row_groups):
        cc = md.row_group(r).column(j)
        st = cc.statistics
        if st is None or not st.has_null_count:
            return lo, hi, None, False
        nulls += st.null_count
        if cc.num_values - st.null_count <= 0:
            continue
        if not st.has_min_max:
            exact = False
            continue
        a, b = st.min, st.max
        if isinstance(a, float) and (a != a or b != b):
            exact = False
            continue
        if text:
            a, b = (v.decode() if isinstance(v, bytes) else v for v in (a, b))
        lo = a if lo is None or a < lo else lo
        hi = b if hi is None or b > hi else hi
    return lo, hi, nulls, exact


_BOUNDED = (pa.types.is_integer, pa.types.is_boolean, pa.types.is_floating, pa.types.is_string,
            pa.types.is_large_string, pa.types.is_binary, pa.types.is_large_binary, pa.types.is_date32,
            pa.types.is_timestamp, pa.types.is_decimal)


def footer_stats(md: Any, schema: pa.Schema) -> dict[str, list[Any]]:
    """Per top-level primitive column ``[min, max, null_count]`` of a file, from its footer alone, in
    :func:`compute_stats`'s form (keyed by stored names); bounds None where the footer does not
    know them exactly; nested columns (and columns whose null count is not in the footer) left out."""
    arrow = md.schema.to_arrow_schema()
    leaf, at = {}, 0
    for f in arrow:
        leaf[f.name] = at if not pa.types.is_nested(f.type) else None
        at += leaf_count(f.type)
    out: dict[str, list[Any]] = {}
    for f in schema:
        j = leaf.get(stored_name(f))
        if j is None or pa.types.is_nested(f.type):
            continue
        lo, hi, nulls, exact = footer_bounds(md, j, f.type)
        if nulls is None:
            continue
        exact = exact and any(is_(f.type) for is_ in _BOUNDED)
        out[stored_name(f)] = ([encode_value(lo), encode_value(hi), nulls] if exact and lo is not None
                               else [None, None, nulls])
    return out


def footer_exact(t: pa.DataType) -> bool:
    """Whether pyarrow's footer bounds of a top-level column of type ``t`` (as pyarrow writes it) are
    the values ``pc.min_max(column)`` gives, in the same Python form: integers, booleans, float and
    double (but a zero bound: :func:`written_stats`), strings, binaries, dates, times to microseconds,
    timestamps without a time zone or in UTC (the footer's are UTC), 128- and 256-bit decimals. Not:
    types min_max refuses (their bounds are None), dictionaries, nested, date64, nanosecond times,
    other time zones, views, half floats, 32- and 64-bit decimals, extension types."""
    T = pa.types
    if T.is_integer(t) or T.is_boolean(t) or T.is_float32(t) or T.is_float64(t) or T.is_date32(t):
        return True
    if T.is_string(t) or T.is_large_string(t) or T.is_binary(t) or T.is_large_binary(t) \
            or T.is_fixed_size_binary(t) or T.is_decimal128(t) or T.is_decimal256(t):
        return True
    if T.is_time32(t) or T.is_time64(t):
        return bool(t.unit != "ns")
    if T.is_timestamp(t):
        return t.tz is None or t.tz == "UTC"
    return False


def footer_leaves(schema: pa.Schema) -> tuple[tuple[int | None, ...], int]:
    """For a file pyarrow writes with ``schema``: per top-level column the index of its Parquet leaf
    column when :func:`footer_exact` (else None), and the number of leaf columns."""
    out: list[int | None] = []
    at = 0
    for f in schema:
        out.append(at if footer_exact(f.type) else None)
        at += leaf_count(f.type)
    return tuple(out), at


def written_stats(md: Any, data: pa.Table, leaves: tuple[tuple[int | None, ...], int]) -> dict[str, list[Any]]:
    """:func:`compute_stats` of ``data``, which pyarrow has just written into the file whose footer is
    ``md``; ``leaves``: :func:`footer_leaves` of ``data.schema``. Bounds from the footer where they are
    exact (comment above: 1.), the others computed from the rows, column by column."""
    at, total = leaves
    if md.num_columns != total:  # not the file of these columns: no footer bound can be trusted
        return compute_stats(data)
    out: dict[str, list[Any]] = {}
    for name, col, j in zip(data.column_names, data.columns, at):
        nulls = col.null_count
        if j is None or len(col) == nulls:
            out[name] = column_stats(col)
            continue
        try:
            lo, hi, _, exact = footer_bounds(md, j, col.type)
        except (pa.ArrowException, TypeError, ValueError, OverflowError):  # a bound pyarrow cannot convert
            exact = False
        if not exact or lo is None or hi is None or isinstance(lo, float) and (lo == 0 or hi == 0):
            out[name] = column_stats(col)
            continue
        out[name] = [encode_value(lo), encode_value(hi), nulls]
    return out


# ------------------------------------------------- typed copies of the statistics
# What of a file's statistics the catalog also records as typed SQL rows
# (``ls_file_stats``, see stats_sql.py): pure functions of the statistics JSON
# above, shared by the commit paths and the schema migration that backfilled them.
INT64_MIN, INT64_MAX = -(2 ** 63), 2 ** 63 - 1
_DAY_ZERO = dt.date(1970, 1, 1)


def sql_int(v: Any) -> int | None:
    """``v`` as the BIGINT stored for it, or None when it is not copied: integers and
    booleans within 64 bits, dates (days since 1970-01-01); nothing else."""
    if isinstance(v, bool):
        return int(v)
    if isinstance(v, int):
        return v if INT64_MIN <= v <= INT64_MAX else None
    if isinstance(v, dt.date) and not isinstance(v, dt.datetime):
        return (v - _DAY_ZERO).days
    return None


def _json_bound(v: Any) -> int | None:
    """:func:`sql_int` of a bound as the statistics JSON decodes (an int, a bool, ``{"$d": ...}``
    for a date; anything else is not copied). Exact types: this runs per column of every
    file a commit adds."""
    t = type(v)
    if t is int:
        return v if INT64_MIN <= v <= INT64_MAX else None
    if t is bool:
        return int(v)
    if t is dict and len(v) == 1 and "$d" in v:
        try:
            return (dt.date.fromisoformat(v["$d"]) - _DAY_ZERO).days
        except (TypeError, ValueError):
            return None
    return None


def file_stats_rows(count: int, stats_json: str) -> list[tuple[str, int, int | None, int | None, int | None]]:
    """(column, null_count, min, max, width) of the columns whose bounds a file's statistics
    copy into typed rows: both bounds integers, booleans or dates within 64 bits (then
    ``width`` is the bit length of ``max - min``), or every value null (no bounds, no
    width). Floats, decimals, strings, bytes, times and timestamps are never copied;
    unreadable statistics copy nothing."""
    try:
        stats = json.loads(stats_json) if stats_json else {}
    except ValueError:
        return []
    out: list[tuple[str, int, int | None, int | None, int | None]] = []
    if type(stats) is not dict:
        return out
    for col, v in stats.items():
        if type(v) is not list or len(v) != 3:
            continue
        lo, hi, nulls = v
        if type(nulls) is not int or not INT64_MIN <= nulls <= INT64_MAX:
            continue
        if lo is None and hi is None:
            if nulls == count:  # every value null: comparisons never match
                out.append((col, nulls, None, None, None))
            continue
        a, b = _json_bound(lo), _json_bound(hi)
        if a is None or b is None or a > b:
            continue
        out.append((col, nulls, a, b, (b - a).bit_length()))
    return out


# ------------------------------------------------------------------ DataFile
@dataclass
class DataFile:
    """A data file as recorded in the catalog. ``path`` is relative to the table."""

    file_id: int
    path: str
    record_count: int
    file_size: int
    added_version: int
    removed_version: int | None = None
    partition_json: str = "{}"
    stats_json: str = "{}"
    source_ids_json: str | None = None
    seq_raw: int | None = None

    @property
    def seq(self) -> int:
        """Where this file's rows stand in commit order (merge on read)."""
        return self.added_version if self.seq_raw is None else self.seq_raw

    @cached_property
    def partition(self) -> dict[str, Any]:
        return {k: decode_value(v) for k, v in json.loads(self.partition_json).items()}

    @cached_property
    def stats(self) -> dict[str, ColumnStats]:
        return {
            k: ColumnStats(decode_value(v[0]), decode_value(v[1]), int(v[2]))
            for k, v in json.loads(self.stats_json).items()
        }

    @cached_property
    def source_ids(self) -> list[int]:
        return json.loads(self.source_ids_json) if self.source_ids_json else []


@dataclass
class NewFile:
    """A file written but not yet committed."""

    path: str
    record_count: int
    file_size: int
    partition_json: str
    stats_json: str
    # For rewrites and compaction outputs: the file ids the rows came from.
    source_ids: list[int] = field(default_factory=list)
    # Commit-order position of the rows (see DataFile.seq); None: this commit's.
    seq: int | None = None
