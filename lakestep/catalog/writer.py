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
from .columns import ColumnIds, as_schema, renamed, schema_with_ids, stored_names, stored_schema
from .files import NewFile, footer_leaves, leaf_count, partition_key, written_stats
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
#: Files of up to this many rows are dictionary-encoded whole, as pyarrow does by default, without
#: counting: below it the count costs more than the dictionary it might save (4 columns of 100
#: rows: ~30 us to count, ~13 us more to write with every dictionary; the file ~10% bigger).
DICTIONARY_ALL_ROWS = 256


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


def _counted(t: pa.DataType) -> bool:
    """Whether the distinct values of a column of type ``t`` decide its encoding; not for nested,
    dictionary and null columns, booleans (which Parquet never dictionary-encodes) and the types
    ``count_distinct`` refuses: those are dictionary-encoded whatever their values."""
    T = pa.types
    if T.is_nested(t) or T.is_dictionary(t) or T.is_null(t) or T.is_boolean(t):
        return False
    try:
        pc.count_distinct(pa.array([], t), mode="all")
    except (pa.ArrowNotImplementedError, pa.ArrowInvalid):
        return False
    return True


class _Layout:
    """What writing rows of one schema takes that depends on that schema alone, worked out once
    (a FileWriter keeps the last one): the schema written (column ids, rule 4 of columns.py;
    stored names, rule 6), which columns' distinct values are counted (:func:`_counted`), its
    Parquet leaf columns, which footer bounds are exact (files.footer_leaves)."""

    def __init__(self, schema: pa.Schema, column_ids: ColumnIds | None, names: pa.Schema | None) -> None:
        self.schema = schema  # as given, metadata included
        self.ids = schema_with_ids(schema, column_ids) if column_ids is not None else None
        plain = self.ids if self.ids is not None else schema
        self.stored = stored_schema(plain, names) if names is not None else None
        self.written = self.stored if self.stored is not None else plain
        self.counted = tuple(i for i, f in enumerate(self.written) if _counted(f.type))
        self.footer = footer_leaves(self.written)
        self._paths: list[list[str]] | None = None

    def apply(self, data: pa.Table) -> pa.Table:
        """``data`` (of :attr:`schema`) as written: with_ids, then to_stored (columns.py), zero copy."""
        if self.ids is not None:
            data = pa.Table.from_arrays(data.columns, schema=self.ids)
        if self.stored is not None:
            data = as_schema(data, self.stored)
        return data

    def paths(self) -> list[list[str]]:
        """Per column, the dotted paths of its Parquet leaf columns."""
        if self._paths is None:
            self._paths = _leaf_paths(self.written.serialize().to_pybytes())
        return self._paths


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
        self._layout: _Layout | None = None  # of the last schema written

    def layout(self, schema: pa.Schema) -> _Layout:
        """The :class:`_Layout` of rows of ``schema`` (the last one again while the schema is the same)."""
        last = self._layout
        if last is None or not last.schema.equals(schema, check_metadata=True):
            self._layout = last = _Layout(schema, self.column_ids, self.names)
        return last

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
        layout = self.layout(data.schema)
        data = layout.apply(data)
        try:
            size, md = self._write_file(data, full, layout)
        except OSError as e:  # disk full, read-only, no permission: the partial file must not stay
            self._delete_quietly(full)
            raise storage_error(e, full, "writing a data file") from e
        return NewFile(
            path=rel,
            record_count=data.num_rows,
            file_size=size,
            partition_json=partition_key(part),
            stats_json=json.dumps(written_stats(md, data, layout.footer), separators=(",", ":")),
            source_ids=list(source_ids),
            seq=seq,
        )

    def _write_file(self, data: pa.Table, full: str, layout: _Layout) -> tuple[int, Any]:
        """One file, written under its final name: nothing is renamed (object stores have no
        atomic rename; an S3 object becomes visible whole when its upload completes). Returns its
        size and its footer (``pyarrow.parquet.FileMetaData``)."""
        if self.remote:  # object stores have no directories to make
            with self.fs.open_output_stream(full) as sink:
                md = self._write_parquet(data, sink, layout)
                return int(sink.tell()), md
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
            md = self._write_parquet(data, sink, layout)
            return int(sink.tell()), md

    def _write_parquet(self, data: pa.Table, sink: Any, layout: _Layout) -> Any:
        """``pq.write_table(data, sink, ...)``, returning the footer it wrote. (Not its
        ``metadata_collector``: when a write fails, the collector's own error, that the writer
        has no footer, hides the OSError.)"""
        with pq.ParquetWriter(sink, data.schema, compression=self.compression, write_statistics=True,
                              use_dictionary=self._dictionary_columns(data, layout)) as w:
            w.write_table(data, row_group_size=self.row_group_size)
        return w.writer.metadata

    def _dictionary_columns(self, data: pa.Table, layout: _Layout) -> "list[str] | bool":
        """The Parquet leaf columns to dictionary-encode: all but those of top-level primitive
        columns whose first :data:`DICTIONARY_SAMPLE_ROWS` values are mostly distinct (a null
        counts as a value; fixed-width values compare bit by bit); all of them in a file of at
        most :data:`DICTIONARY_ALL_ROWS` rows.

        Like parquet-mr (Spark's writer), which drops the dictionary of a column when
        its first page does not get smaller with it: Arrow's writer keeps building
        a dictionary until it reaches 1 MB before it falls back to plain encoding,
        which made a unique int64/double/timestamp column about 3x slower to write
        (and the file no smaller).
        """
        if data.num_rows <= DICTIONARY_ALL_ROWS:
            return True
        sample = data.slice(0, DICTIONARY_SAMPLE_ROWS) if data.num_rows > DICTIONARY_SAMPLE_ROWS else data
        plain = {i for i in layout.counted
                 if pc.count_distinct(sample.column(i), mode="all").as_py() * 2 > sample.num_rows}
        if not plain:
            return True
        return [p for i, paths in enumerate(layout.paths()) if i not in plain for p in paths]

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
