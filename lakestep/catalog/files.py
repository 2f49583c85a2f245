"""Data files: where they live, how they are written, what is recorded of them.

Files are immutable Parquet written with pyarrow, under a unique name, before
any commit makes them visible. For each file the catalog records the row
count, the byte size, the partition values and per-column statistics
(min, max, null count), so that commits can decide conflicts and readers can
prune files without opening them.

Only this module and the readers touch the filesystem; nothing here talks to
the catalog database, so executors can write files with it too.
"""

from __future__ import annotations

import base64
import datetime as dt
import decimal
import errno as errnos
import functools
import json
import os
import posixpath
import re
import threading
import uuid
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Iterable, Mapping

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from ..errors import InternalError, InvalidArgumentError, InvalidIdentifierError, InvalidLocationError, StorageError
from .columns import ColumnIds, renamed, stored_names, to_stored, with_ids

_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
MAX_IDENT = 128


def check_identifier(name: object, what: str = "identifier") -> str:
    """Return ``name`` if it is a valid namespace, table, column or job name."""
    if not isinstance(name, str) or not name:
        raise InvalidIdentifierError(f"{what} must be a non-empty string, got {name!r}", identifier=str(name))
    if len(name) > MAX_IDENT:
        raise InvalidIdentifierError(
            f"{what} {name[:20]!r}... is {len(name)} characters long; the limit is {MAX_IDENT}",
            identifier=name,
        )
    if not _IDENT.match(name):
        raise InvalidIdentifierError(
            f"{what} {name!r} may only hold letters, digits and underscores, and must not start "
            "with a digit (no quotes, dots, spaces or semicolons)",
            identifier=name,
        )
    return name


# ------------------------------------------------------------------ locations
def normalize_location(location: str) -> str:
    """A canonical form of a table or warehouse location: absolute path or URI."""
    if not isinstance(location, str) or not location.strip():
        raise InvalidLocationError(f"location must be a non-empty string, got {location!r}", location=str(location))
    if "\x00" in location:
        raise InvalidLocationError("location contains a NUL byte", location=location)
    if "://" in location:
        scheme, rest = location.split("://", 1)
        if not re.match(r"^[A-Za-z][A-Za-z0-9+.-]*$", scheme):
            raise InvalidLocationError(f"malformed URI scheme in {location!r}", location=location)
        if scheme == "file":
            return os.path.normpath(rest)
        parts = rest.split("/")
        if any(p == ".." for p in parts):
            raise InvalidLocationError(f"location {location!r} must not contain '..'", location=location)
        return f"{scheme}://" + "/".join(p for i, p in enumerate(parts) if p or i == 0).rstrip("/")
    return os.path.normpath(os.path.abspath(location))


def file_uri(location: str, rel: str) -> str:
    """The absolute URI (or local path) of the file ``rel`` of the table at ``location``."""
    check_relative_path(rel)
    if "://" in location:
        return location.rstrip("/") + "/" + rel
    return os.path.join(location, *rel.split("/"))


# ------------------------------------------------------------------- storage
# The options of pyarrow's S3FileSystem a catalog may be given (``storage_options``,
# or Spark options ``storage.<name>``), and how each is parsed from a string.
S3_OPTIONS: dict[str, type] = {
    "access_key": str, "secret_key": str, "session_token": str, "region": str, "endpoint_override": str,
    "scheme": str, "force_virtual_addressing": bool, "connect_timeout": float, "request_timeout": float,
}
SECRET_OPTIONS = frozenset({"access_key", "secret_key", "session_token"})
# The AWS environment variables lakestep or the AWS SDK inside pyarrow read: filesystems
# are cached per their values too.
_AWS_ENV = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_REGION", "AWS_DEFAULT_REGION",
            "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_PROFILE", "AWS_CONFIG_FILE",
            "AWS_SHARED_CREDENTIALS_FILE", "AWS_EC2_METADATA_DISABLED")


def _option_value(name: str, value: object) -> object:
    kind = S3_OPTIONS[name]
    if kind is bool:
        if isinstance(value, bool):
            return value
        v = str(value).strip().lower()
        if v not in ("true", "false"):
            raise InvalidArgumentError(f"storage option {name} must be true or false, got {value!r}",
                                       argument=name, value=value)
        return v == "true"
    if kind is float:
        try:
            return float(value)  # type: ignore[arg-type]
        except (TypeError, ValueError):
            raise InvalidArgumentError(f"storage option {name} must be a number of seconds, got {value!r}",
                                       argument=name, value=value) from None
    if not isinstance(value, str) or not value:
        raise InvalidArgumentError(f"storage option {name} must be a non-empty string",
                                   argument=name, value="***" if name in SECRET_OPTIONS else value)
    return value


@dataclass(frozen=True)
class Storage:
    """How to reach an object-store warehouse: options of pyarrow's ``S3FileSystem``.

    Empty (the default) means the standard AWS environment variables
    (``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``, ``AWS_SESSION_TOKEN``,
    ``AWS_REGION``, ``AWS_ENDPOINT_URL``), the AWS config files and instance
    roles. Given options win over the environment for what they name. A
    Storage is small and picklable: the driver hands it to Spark executors
    with each table's shape and read plan, so executors reach the store
    exactly as the driver does without ever talking to the catalog database.
    Its repr never shows a credential.
    """

    options: tuple[tuple[str, object], ...] = ()

    @classmethod
    def of(cls, options: "Mapping[str, object] | Storage | None") -> "Storage":
        if isinstance(options, Storage):
            return options
        unknown = sorted(set(options or {}) - set(S3_OPTIONS))
        if unknown:
            raise InvalidArgumentError(f"unknown storage option(s) {unknown}; known: {sorted(S3_OPTIONS)}",
                                       argument="storage_options", value=unknown)
        return cls(tuple(sorted((k, _option_value(k, v)) for k, v in (options or {}).items())))

    def as_dict(self) -> dict[str, object]:
        return dict(self.options)

    def spark_options(self) -> dict[str, str]:
        """The options as a Spark data source takes them (``storage.<name>``); they hold credentials."""
        return {f"storage.{k}": str(v).lower() if isinstance(v, bool) else str(v) for k, v in self.options}

    def __repr__(self) -> str:
        shown = ", ".join(f"{k}={'***' if k in SECRET_OPTIONS else repr(v)}" for k, v in self.options)
        return f"Storage({shown})"

    __str__ = __repr__

    def filesystem(self, location: str) -> tuple[pafs.FileSystem, str]:
        """The pyarrow filesystem and the path inside it for a normalized ``location``.

        One filesystem per process and configuration (an S3 client is costly to
        make, and may ask the store for the bucket's region)."""
        if "://" not in location:
            return pafs.LocalFileSystem(), location
        scheme, rest = location.split("://", 1)
        if scheme != "s3":
            if self.options:
                raise InvalidLocationError(f"storage options apply to s3:// locations, not {location!r}",
                                           location=location)
            return _from_uri(location)
        env = tuple(os.environ.get(k) for k in _AWS_ENV)
        bucket = rest.split("/", 1)[0]
        key = (self.options, env, bucket)
        with _fs_lock:
            fs = _filesystems.get(key)
        if fs is None:
            fs = _s3(self.as_dict(), bucket, location)
            with _fs_lock:
                fs = _filesystems.setdefault(key, fs)
        return fs, rest.rstrip("/")


_filesystems: dict[tuple[Any, ...], pafs.FileSystem] = {}
_fs_lock = threading.Lock()


def _from_uri(location: str) -> tuple[pafs.FileSystem, str]:
    try:
        return pafs.FileSystem.from_uri(location)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as e:
        raise InvalidLocationError(f"pyarrow cannot open {location!r}: {e}", location=location) from e


def _s3(options: dict[str, object], bucket: str, location: str) -> pafs.FileSystem:
    """pyarrow's S3 filesystem: the options, then the AWS environment for what they leave out.

    The endpoint comes from ``AWS_ENDPOINT_URL_S3`` / ``AWS_ENDPOINT_URL`` (pyarrow's
    constructor reads neither), the region from ``AWS_REGION`` / ``AWS_DEFAULT_REGION``,
    else AWS is asked where the bucket lives; credentials are left to the AWS SDK's
    chain (variables, config files, instance roles). Writes open lazily
    (``allow_delayed_open``): a small file is one PUT, not a three-request multipart upload.
    """
    opts = dict(options)
    endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
    if "endpoint_override" not in opts and endpoint:
        opts["endpoint_override"] = endpoint
    if "region" not in opts:
        region = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")
        if region:
            opts["region"] = region
        elif "endpoint_override" not in opts:
            try:
                opts["region"] = pafs.resolve_s3_region(bucket)
            except OSError as e:
                raise StorageError(f"cannot ask AWS for the region of bucket {bucket!r} (set AWS_REGION or the "
                                   f"storage option region): {e}", path=location, errno=None) from e
    try:
        return pafs.S3FileSystem(allow_delayed_open=True, **opts)
    except (pa.ArrowInvalid, TypeError) as e:
        raise InvalidLocationError(f"pyarrow cannot open {location!r} with these storage options: {e}",
                                   location=location) from e


def resolve_filesystem(location: str, storage: "Storage | None" = None) -> tuple[pafs.FileSystem, str]:
    """The pyarrow filesystem and the path inside it for a normalized location."""
    return (storage or Storage()).filesystem(location)


def is_object_store(location: str) -> bool:
    """Everything but the local disk: no atomic rename, no directories, slow listings."""
    return "://" in location


def check_relative_path(path: str) -> str:
    """Data file paths are stored relative to the table location; refuse escapes."""
    if not path or path.startswith("/") or "\\" in path or "\x00" in path:
        raise InvalidLocationError(f"bad data file path {path!r}", location=path)
    if any(p in ("", ".", "..") for p in path.split("/")):
        raise InvalidLocationError(f"data file path {path!r} must not contain '.', '..' or '//'", location=path)
    return path


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


# ------------------------------------------------------------------- writing
def partition_path(partition: Mapping[str, Any]) -> str:
    from urllib.parse import quote

    parts = []
    for k, v in partition.items():
        s = "__NULL__" if v is None else quote(str(v), safe="")
        parts.append(f"{k}={s or '__EMPTY__'}")
    return "/".join(parts)


def split_by_partition(data: pa.Table, partition_by: list[str]) -> list[tuple[dict[str, Any], pa.Table]]:
    """Split rows by the values of the partition columns (one group if unpartitioned)."""
    if not partition_by or data.num_rows == 0:
        return [({}, data)]
    keys = data.select(partition_by).group_by(partition_by, use_threads=False).aggregate([])
    if keys.num_rows == 1:
        return [({c: keys.column(c)[0].as_py() for c in partition_by}, data)]
    groups = []
    for row in keys.to_pylist():
        mask = None
        for c in partition_by:
            v = row[c]
            m = pc.is_null(data.column(c)) if v is None else pc.equal(data.column(c), pa.scalar(v, data.schema.field(c).type))
            m = pc.fill_null(m, False)
            mask = m if mask is None else pc.and_(mask, m)
        groups.append((row, data.filter(mask)))
    return groups


#: Rows whose distinct count decides whether a column is dictionary-encoded (FileWriter).
DICTIONARY_SAMPLE_ROWS = 8192


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


@functools.lru_cache(maxsize=64)
def _leaf_paths(schema_ipc: bytes) -> list[list[str]]:
    """Per top-level column of a schema (IPC bytes), the dotted paths of its Parquet leaf columns."""
    schema = pa.ipc.read_schema(pa.py_buffer(schema_ipc))
    buf = pa.BufferOutputStream()
    pq.write_table(schema.empty_table(), buf)
    pf = pq.ParquetFile(pa.BufferReader(buf.getvalue()))
    leaves = [pf.schema.column(i).path for i in range(len(pf.schema))]
    out, i = [], 0
    for f in schema:
        k = leaf_count(f.type)
        out.append(leaves[i:i + k])
        i += k
    if i != len(leaves):  # a type whose leaves are counted differently: the paths cannot be split
        raise InternalError(f"{len(leaves)} Parquet leaf columns for {schema}, counted {i}")
    return out


class FileWriter:
    """Writes Parquet data files under a table location.

    File names are ``data/<partition path>/<prefix><uuid>.parquet``; ``prefix``
    lets a writer tag its files (a streaming sink puts batch, partition and
    attempt there) so that orphans can be traced.
    """

    def __init__(self, location: str, storage: Storage | None = None, *, compression: str = "snappy",
                 row_group_size: int = 1 << 20, column_ids: ColumnIds | None = None,
                 schema: pa.Schema | None = None) -> None:
        self.location = location
        self.column_ids = column_ids  # written into each file as Parquet field ids (columns.py rule 4)
        # The table's schema, when some column is stored under another name (columns.py rule 6):
        # files, their statistics and partition values then use the stored names.
        self.names = schema if schema is not None and renamed(schema) else None
        self.storage = storage or Storage()
        self.fs, self.root = self.storage.filesystem(location)
        self.remote = is_object_store(location)
        # How much older than its write a file's mtime may read: S3's LastModified has
        # whole seconds (and a multipart upload's is when the upload began).
        self.mtime_slack = 1.0 if self.remote else 0.0
        self.compression = compression
        self.row_group_size = row_group_size
        self._made_dirs: set[str] = set()

    def full_path(self, rel: str) -> str:
        return posixpath.join(self.root, rel) if "://" in self.location else os.path.join(self.root, rel)

    def write(
        self,
        data: pa.Table,
        partition: Mapping[str, Any] | None = None,
        *,
        prefix: str = "",
        source_ids: Iterable[int] = (),
        seq: int | None = None,
    ) -> NewFile:
        part = dict(partition or {})
        sub = partition_path(part)
        rel = "/".join(p for p in ("data", sub, f"{prefix}{uuid.uuid4().hex}.parquet") if p)
        full = self.full_path(rel)
        data = with_ids(data, self.column_ids)
        if self.names is not None:
            data = to_stored(data, self.names)
        try:
            size = self._write_file(data, full)
        except OSError as e:  # disk full, read-only, no permission: the partial file must not stay
            self._delete_quietly(full)
            raise storage_error(e, full, "writing a data file") from e
        return NewFile(
            path=rel,
            record_count=data.num_rows,
            file_size=size,
            partition_json=partition_key(part),
            stats_json=json.dumps(compute_stats(data), separators=(",", ":")),
            source_ids=list(source_ids),
            seq=seq,
        )

    def _write_file(self, data: pa.Table, full: str) -> int:
        """One file, written under its final name: nothing is renamed (object stores have no
        atomic rename; an S3 object becomes visible whole when its upload completes)."""
        if self.remote:  # object stores have no directories to make
            with self.fs.open_output_stream(full) as sink:
                pq.write_table(data, sink, **self._parquet_options(data))
                return int(sink.tell())
        parent = os.path.dirname(full)
        if parent not in self._made_dirs:
            self.fs.create_dir(parent, recursive=True)
            self._made_dirs.add(parent)
        try:
            sink = self.fs.open_output_stream(full)
        except FileNotFoundError:  # the directory went away (a purged table): make it again
            self.fs.create_dir(parent, recursive=True)
            sink = self.fs.open_output_stream(full)
        with sink:
            pq.write_table(data, sink, **self._parquet_options(data))
            return int(sink.tell())

    def _parquet_options(self, data: pa.Table) -> dict[str, Any]:
        return {"compression": self.compression, "row_group_size": self.row_group_size,
                "write_statistics": True, "use_dictionary": self._dictionary_columns(data)}

    def _dictionary_columns(self, data: pa.Table) -> "list[str] | bool":
        """The Parquet leaf columns to dictionary-encode: all but those of top-level primitive
        columns whose first :data:`DICTIONARY_SAMPLE_ROWS` values are mostly distinct.

        Like parquet-mr (Spark's writer), which drops the dictionary of a column when
        its first page does not get smaller with it: Arrow's writer keeps building
        a dictionary until it reaches 1 MB before it falls back to plain encoding,
        which made a unique int64/double/timestamp column about 3x slower to write
        (and the file no smaller).
        """
        if data.num_rows < 2:
            return True
        sample = data.slice(0, DICTIONARY_SAMPLE_ROWS)
        plain = set()
        for name, col in zip(sample.column_names, sample.columns):
            t = col.type
            if pa.types.is_nested(t) or pa.types.is_dictionary(t) or pa.types.is_null(t):
                continue
            try:
                distinct = pc.count_distinct(col, mode="all").as_py()
            except (pa.ArrowNotImplementedError, pa.ArrowInvalid):
                continue
            if distinct * 2 > len(col):
                plain.add(name)
        if not plain:
            return True
        per_column = _leaf_paths(data.schema.serialize().to_pybytes())
        return [p for name, paths in zip(data.column_names, per_column) if name not in plain for p in paths]

    def _delete_quietly(self, full: str) -> None:
        try:
            self.fs.delete_file(full)
        except OSError:
            pass

    def write_partitioned(
        self,
        data: pa.Table,
        partition_by: list[str],
        *,
        prefix: str = "",
        max_rows_per_file: int = 4_000_000,
    ) -> list[NewFile]:
        out: list[NewFile] = []
        try:
            stored = stored_names(self.names) if self.names is not None else {}
            for part, group in split_by_partition(data, partition_by):
                if group.num_rows == 0:
                    continue
                part = {stored.get(k, k): v for k, v in part.items()}
                for start in range(0, group.num_rows, max_rows_per_file):
                    out.append(self.write(group.slice(start, max_rows_per_file), part, prefix=prefix))
        except StorageError:  # none of this call's files will be committed: do not leave them behind
            for f in out:
                self.delete(f.path)
            raise
        return out

    def delete(self, rel: str) -> None:
        try:
            self.fs.delete_file(self.full_path(rel))
        except FileNotFoundError:
            pass

    def check_writable(self) -> None:
        """Make the location's directory and prove a file can be written there (StorageError if not).

        A probe file at the location's top (never under ``data/``, where
        cleanup looks for orphans) is written and deleted again.
        """
        try:
            if not self.remote:
                self.fs.create_dir(self.root, recursive=True)
        except OSError as e:
            raise storage_error(e, self.root, "creating the table directory") from e
        probe = self.full_path(f".lakestep-probe-{uuid.uuid4().hex}")
        try:
            with self.fs.open_output_stream(probe) as out:
                out.write(b"lakestep")
        except OSError as e:
            self._delete_quietly(probe)
            raise storage_error(e, self.root, "writing into the table directory") from e
        self._delete_quietly(probe)


_FULL = {errnos.ENOSPC, getattr(errnos, "EDQUOT", -1), errnos.EFBIG}
_READ_ONLY = {errnos.EROFS, errnos.EACCES, errnos.EPERM}


def storage_error(e: OSError, path: str, doing: str) -> StorageError:
    """A :class:`StorageError` for ``e``, whose message says what to do about it."""
    code = e.errno
    if code in _FULL:
        what = ("the storage is full or the file exceeds a size limit" if code == errnos.EFBIG
                else "the storage is full (no space left, or over quota)")
        todo = "free space or raise the quota, or move the warehouse to larger storage, then retry"
    elif code in _READ_ONLY:
        what = "the directory is read-only or not writable by this process"
        todo = "make it writable for this user, or choose another location or warehouse"
    elif code in (errnos.ENOTDIR, errnos.EEXIST):
        what = "a file stands where a directory is needed"
        todo = "move that file away, or choose another location"
    else:
        what = "the storage refused the write"
        todo = "check the storage and retry"
    return StorageError(f"{doing} at {path!r} failed: {what} ({e}). Nothing was committed; {todo}",
                        path=path, errno=code)
