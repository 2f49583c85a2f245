"""Writing data files: immutable Parquet, written with pyarrow under a unique name,
before any commit makes them visible.

:class:`FileWriter` writes a table's rows under its location, one directory per
partition (:func:`split_by_partition`, :func:`partition_path`), and returns a
:class:`~lakestep.catalog.files.NewFile` for each file: its row count, byte size,
partition values and statistics, for the commit to record.

Nothing here talks to the catalog database, so executors can write files with it too.
"""

from __future__ import annotations

import functools
import json
import os
import posixpath
import uuid
from typing import Any, Iterable, Mapping

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from ..errors import InternalError, StorageError
from .columns import ColumnIds, renamed, stored_names, to_stored, with_ids
from .files import NewFile, compute_stats, partition_key
from .storage import Storage, is_object_store, storage_error


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
