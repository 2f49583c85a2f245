"""Data files: what the catalog records of them.

Files are immutable Parquet (``writer.py`` writes them). For each file the catalog
records the row count, the byte size, the partition values and per-column statistics
(min, max, null count), so that commits can decide conflicts and readers can prune
files without opening them: :class:`DataFile` is a committed file's record,
:class:`NewFile` a file written but not yet committed; the statistics and partition
values are JSON, in the codec below, and their typed copies (``ls_file_stats``) are
pure functions of that JSON.

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
    out: dict[str, list[Any]] = {}
    for name, col in zip(table.column_names, table.columns):
        nulls = col.null_count
        lo = hi = None
        t = col.type
        if len(col) > nulls and not (pa.types.is_nested(t) or pa.types.is_dictionary(t) or pa.types.is_null(t)):
            try:
                mm = pc.min_max(col)
                lo, hi = encode_value(mm["min"].as_py()), encode_value(mm["max"].as_py())
            except (pa.ArrowNotImplementedError, pa.ArrowInvalid, TypeError, ValueError):
                lo = hi = None
        out[name] = [lo, hi, nulls]
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
