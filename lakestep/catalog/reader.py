"""Reading committed data files, checked against what the catalog recorded.

Every read of committed files goes through :func:`read`: scans
(``Table.to_arrow``), merge on read (``pk.py``), compaction and rewrites
(``writes.py``) and the streaming source's executors. For each file:

1. **size**: checked against the catalog's ``file_size``. On local storage
   from one stat of every file (the call pyarrow's dataset factory made
   anyway, which this module no longer uses); on object stores the file is
   opened *with* the recorded size (which also saves the HEAD request the
   open made), so a Parquet footer read at the recorded size fails when the
   object has another size;
2. **rows**: the scan opens each file once and reads its footer; the footer's
   row count, kept by the fragment, is compared with ``record_count`` after
   the scan (no second open);
3. **errors**: a missing file, a mismatch, or a file pyarrow cannot read
   (``ArrowInvalid``, ``OSError: Corrupt snappy``) raises
   :class:`DataFileCorruptError` naming the file, what the catalog recorded
   and what storage holds. When the scan fails without saying which file,
   the files are checked one at a time, on that failure path only, to name
   it; a failure no file explains is raised as it came.

Nothing here talks to the catalog database: executors call it too.

Not guaranteed: a file replaced by one of exactly the same size and row
count, or scribbled inside a data page in a way the decompressor and decoder
accept, is read as it now is (pages carry no checksum).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol, Sequence

import pyarrow as pa
import pyarrow.fs as pafs

from ..errors import DataFileCorruptError
from .columns import renamed, stored_schema, to_table_names

if TYPE_CHECKING:
    import pyarrow.compute as pc
    import pyarrow.dataset as ds

    from .writer import FileWriter

FRAGMENT_INDEX = "__fragment_index"


class Recorded(Protocol):
    """What the catalog recorded of a file (a :class:`DataFile` is one). Read-only, so that
    frozen dataclasses (a plan's files) are ones too."""

    @property
    def path(self) -> str: ...
    @property
    def file_size(self) -> int: ...
    @property
    def record_count(self) -> int: ...


def read(
    table: str,
    store: "FileWriter",
    files: Sequence[Recorded],
    schema: pa.Schema,
    *,
    columns: Sequence[str] | None = None,
    filter: "pc.Expression | None" = None,
    batch_rows: int | None = None,
) -> pa.Table:
    """The rows of ``files`` (under ``store``'s location) read with ``schema``, checked (steps 1-3).

    ``columns`` may name :data:`FRAGMENT_INDEX`: the position in ``files`` of
    each row's file. ``filter`` names columns by their stored names (the table's,
    unless renamed: ``Predicate.file_expression``). ``batch_rows``: the most rows per
    chunk of the result (Arrow's default, 131,072, unless given).
    """
    if not files:
        empty = to_table_names(schema.empty_table(), schema)
        return empty.select([c for c in columns if c != FRAGMENT_INDEX]) if columns else empty
    if renamed(schema):  # columns stored under other names (columns.py rule 6)
        return _read_stored(table, store, files, schema, columns, filter, batch_rows)
    paths = [store.full_path(f.path) for f in files]
    if "://" not in store.location:
        _check_sizes(table, store.fs, files, paths, store.fs.get_file_info(paths))  # 1. local
    fragments = _fragments(store.fs, files, paths)
    dataset = _dataset(fragments, schema, store.fs)
    try:
        out = dataset.to_table(columns=list(columns) if columns else None, filter=filter,
                               **({"batch_size": batch_rows} if batch_rows else {}))
    except (OSError, pa.ArrowException) as e:
        _diagnose(table, store.fs, files, paths, schema, e)  # 3. raises if a file explains it
        raise
    for f, frag in zip(files, fragments):  # 2. the footers the scan read
        rows = frag.metadata.num_rows
        if rows != f.record_count:
            raise DataFileCorruptError(table=table, path=f.path, problem="row count",
                                       expected=f"{f.record_count} rows", found=f"{rows} rows in its footer")
    return out


def _read_stored(table: str, store: "FileWriter", files: Sequence[Recorded], schema: pa.Schema,
                 columns: Sequence[str] | None, filter: "pc.Expression | None",
                 batch_rows: int | None = None) -> pa.Table:
    """:func:`read` of a schema with stored names: the files are scanned by the stored names
    (``filter`` is over them: ``Predicate.file_expression``), the rows come back with the
    table's names."""
    names = [c for c in (columns or schema.names) if c != FRAGMENT_INDEX]
    stored = stored_schema(schema)
    read_cols = [stored.field(schema.get_field_index(c)).name for c in names]
    if columns and FRAGMENT_INDEX in columns:
        read_cols.append(FRAGMENT_INDEX)
    raw = read(table, store, files, stored, columns=read_cols, filter=filter, batch_rows=batch_rows)
    out = to_table_names(raw.select(read_cols[:len(names)]), pa.schema([schema.field(c) for c in names]))
    if FRAGMENT_INDEX in raw.column_names:
        out = out.append_column(FRAGMENT_INDEX, raw.column(FRAGMENT_INDEX))
    return out.select(list(columns)) if columns else out


def dataset(store: "FileWriter", files: Sequence[Recorded], schema: pa.Schema) -> "ds.Dataset":
    """A lazy dataset of ``files``, each opened with its recorded size (step 1 on object
    stores; locally, sizes are checked here with one stat per file). Row counts (step 2)
    are left to the caller: a lazy scan has no place to check them after it ran."""
    paths = [store.full_path(f.path) for f in files]
    if "://" not in store.location and files:
        _check_sizes("?", store.fs, files, paths, store.fs.get_file_info(paths))
    return _dataset(_fragments(store.fs, files, paths), schema, store.fs)


def _fragments(fs: pafs.FileSystem, files: Sequence[Recorded], paths: Sequence[str]) -> list[Any]:
    """A Parquet fragment of each path, opened with its file's recorded size. pyarrow.dataset is
    imported here, not with the module: it imports pandas (0.4 s), which a process that only commits
    or reads metadata never needs."""
    import pyarrow.dataset as ds

    fmt = ds.ParquetFileFormat()
    return [fmt.make_fragment(p, fs, file_size=int(f.file_size)) for p, f in zip(paths, files)]


def _dataset(fragments: list[Any], schema: pa.Schema, fs: pafs.FileSystem) -> "ds.Dataset":
    import pyarrow.dataset as ds

    return ds.FileSystemDataset(fragments, schema, ds.ParquetFileFormat(), fs)


def local_paths(store: "FileWriter", files: Sequence[Recorded]) -> list[str]:
    """The full local paths of ``files``, each checked to exist with its recorded size."""
    paths = [store.full_path(f.path) for f in files]
    _check_sizes("?", store.fs, files, paths, store.fs.get_file_info(paths))
    return paths


def _check_sizes(table: str, fs: pafs.FileSystem, files: Sequence[Recorded], paths: Sequence[str],
                 infos: Sequence[pafs.FileInfo]) -> None:
    for f, p, info in zip(files, paths, infos):
        if info.type == pafs.FileType.NotFound:
            raise DataFileCorruptError(table=table, path=f.path, problem="missing",
                                       expected=f"a file of {f.file_size} bytes", found=f"nothing at {p!r}")
        if info.type != pafs.FileType.File:
            raise DataFileCorruptError(table=table, path=f.path, problem="missing",
                                       expected=f"a file of {f.file_size} bytes", found=f"a {info.type.name.lower()}")
        if info.size != f.file_size:
            raise DataFileCorruptError(table=table, path=f.path, problem="size",
                                       expected=f"{f.file_size} bytes", found=f"{info.size} bytes")


def _diagnose(table: str, fs: pafs.FileSystem, files: Sequence[Recorded], paths: Sequence[str],
              schema: pa.Schema, error: BaseException) -> None:
    """Step 3 on a failed scan: find the file at fault, one at a time (all columns, no filter)."""
    try:
        infos = fs.get_file_info(list(paths))
    except OSError:
        return  # storage itself is failing: not a file's fault
    _check_sizes(table, fs, files, paths, infos)
    for f, p, frag in zip(files, paths, _fragments(fs, files, paths)):
        try:
            frag.to_table(schema=schema)
            rows = frag.metadata.num_rows
        except (OSError, pa.ArrowException) as e:
            raise DataFileCorruptError(table=table, path=f.path, problem="unreadable",
                                       expected=f"a Parquet file of {f.record_count} rows",
                                       found=f"{type(e).__name__}: {e}") from error
        if rows != f.record_count:
            raise DataFileCorruptError(table=table, path=f.path, problem="row count",
                                       expected=f"{f.record_count} rows", found=f"{rows} rows in its footer")
