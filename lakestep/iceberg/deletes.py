"""Primary-key tables through Iceberg: position deletes computed from lakestep's merge rule.

A lakestep primary-key table is merged on read (catalog/pk.py): for each key
the row of the newest file in commit order wins (``DataFile.seq``), and a
winning tombstone (``_ls_deleted``) hides the key. An Iceberg reader knows
nothing of that rule, so the publisher states its outcome in Iceberg's own
terms: **v2 position-delete files** naming every row that does not win (older
versions of a key, and every tombstone row). Iceberg readers then see exactly
one row per key, the newest, and no deleted key, at every published snapshot.
Why this way and not another is in docs/design.md §8.

1. **Which partitions.** Keys never span partitions (partition columns are
   part of the key), so a snapshot recomputes the deletes of the partitions
   whose files changed since the previous snapshot, and only those.
2. **The rule.** For the live files of such a partition: read each file's key
   columns and tombstone flags (checked reads, catalog/reader.py; kept in a
   cache by path, since a data file never changes), take per key the highest
   ``seq``, and delete every row that is not that one, and that one when it is
   a tombstone.
3. **One delete file per data file** (``metadata/<uuid>-deletes.parquet``,
   columns ``file_path`` and ``pos`` with Iceberg's reserved field ids, its
   ``file_path`` bounds set to the one data file): a data file whose deletes
   changed gets a new delete file and its old one is removed in the same
   snapshot; a data file with nothing to delete has none. Readers match delete
   files to data files by those bounds, and Polars' native reader requires it.

Not guaranteed: a partition's recomputation reads the key columns of its live
files that are not cached yet (after a publisher restart: all of them once);
its cost follows the partition's size, which compaction keeps in bounds.
"""

from __future__ import annotations

import hashlib
import uuid
from collections import OrderedDict
from dataclasses import dataclass
from typing import TYPE_CHECKING, Sequence

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from ..catalog import reader
from ..catalog.pk import DELETED
from ..errors import InternalError
from .metadata import FILE_PATH_ID, POS_ID

if TYPE_CHECKING:
    from ..catalog.files import DataFile
    from ..catalog.handle import TableHandle

DELETE_SCHEMA = pa.schema([
    pa.field("file_path", pa.string(), nullable=False, metadata={"PARQUET:field_id": str(FILE_PATH_ID)}),
    pa.field("pos", pa.int64(), nullable=False, metadata={"PARQUET:field_id": str(POS_ID)}),
])


class KeyCache:
    """Step 2's reads, kept: per data file path, its key columns and tombstone flags.
    Least recently used files leave first once more than ``max_rows`` rows are kept."""

    def __init__(self, max_rows: int = 20_000_000) -> None:
        self.max_rows = max_rows
        self.rows = 0
        self._files: "OrderedDict[str, pa.Table]" = OrderedDict()

    def keys(self, table: "TableHandle", files: Sequence["DataFile"]) -> list[pa.Table]:
        missing = [f for f in files if f.path not in self._files]
        if missing:
            cols = list(table.primary_key) + [DELETED]
            got = reader.read(table.ident, table.writer, missing, table.physical_schema,
                              columns=cols + [reader.FRAGMENT_INDEX])
            # grouped by file with a stable sort: each file's rows stay in the order the scan
            # read them, which is the file's own (Arrow's to_table keeps fragment and batch order)
            got = got.take(pc.sort_indices(got, sort_keys=[(reader.FRAGMENT_INDEX, "ascending")]))
            idx = got.column(reader.FRAGMENT_INDEX).to_numpy()
            got = got.select(cols)
            starts = _boundaries(idx, len(missing))
            for i, f in enumerate(missing):
                part = got.slice(starts[i], starts[i + 1] - starts[i])
                self._files[f.path] = part
                self.rows += part.num_rows
        out = []
        for f in files:
            self._files.move_to_end(f.path)
            out.append(self._files[f.path])
        while self.rows > self.max_rows and len(self._files) > len(files):
            _, t = self._files.popitem(last=False)
            self.rows -= t.num_rows
        return out


def _boundaries(idx: "object", n: int) -> list[int]:
    """Row offsets of each fragment in a scan result ordered by fragment (reader.read keeps
    each file's rows together, in the order of the files)."""
    import numpy as np

    arr = np.asarray(idx)
    if len(arr) and np.any(arr[1:] < arr[:-1]):
        raise InternalError("a scan returned the files' rows out of order")
    counts = np.bincount(arr, minlength=n) if len(arr) else np.zeros(n, dtype=np.int64)
    return [0, *np.cumsum(counts).tolist()]


def positions(table: "TableHandle", files: Sequence["DataFile"], cache: KeyCache) -> dict[str, pa.Array]:
    """Step 2 for the live files of one partition: per data file path, the sorted positions
    of its rows an Iceberg reader must not see (only files with some)."""
    if not files:
        return {}
    keys = list(table.primary_key)
    parts = []
    for i, (f, t) in enumerate(zip(files, cache.keys(table, files))):
        n = t.num_rows
        parts.append(t.append_column("__seq", pa.array([f.seq] * n, pa.int64()))
                     .append_column("__file", pa.array([i] * n, pa.int32()))
                     .append_column("__pos", pa.array(range(n), pa.int64())))
    rows = pa.concat_tables(parts)
    win = rows.group_by(keys).aggregate([("__seq", "max")])
    joined = rows.join(win, keys=keys)
    drop = joined.filter(pc.or_(pc.less(joined["__seq"], joined["__seq_max"]), joined[DELETED]))
    out: dict[str, pa.Array] = {}
    if drop.num_rows == 0:
        return out
    drop = drop.select(["__file", "__pos"]).sort_by([("__file", "ascending"), ("__pos", "ascending")])
    fi = drop["__file"].to_numpy()
    pos = drop["__pos"].combine_chunks()
    import numpy as np

    bounds = np.flatnonzero(np.diff(fi)) + 1
    starts = [0, *bounds.tolist()]
    ends = [*bounds.tolist(), len(fi)]
    for s, e in zip(starts, ends):
        out[files[int(fi[s])].path] = pos.slice(s, e - s)
    return out


def digest(pos: pa.Array) -> str:
    return hashlib.sha256(pos.buffers()[1].to_pybytes()[pos.offset * 8:(pos.offset + len(pos)) * 8]).hexdigest()


@dataclass(frozen=True)
class Written:
    path: str  # the delete file's URI
    size: int
    rows: int


def write(io: object, metadata_location: str, data_uri: str, pos: pa.Array) -> Written:
    """Step 3: one delete file naming ``pos`` of the data file ``data_uri``."""
    path = f"{metadata_location.rstrip('/')}/metadata/{uuid.uuid4()}-deletes.parquet"
    t = pa.Table.from_arrays([pa.array([data_uri] * len(pos), pa.string()), pos], schema=DELETE_SCHEMA)
    out = io.new_output(path)  # type: ignore[attr-defined]
    with out.create(overwrite=True) as stream:
        pq.write_table(t, stream, compression="zstd")
    size = len(io.new_input(path))  # type: ignore[attr-defined]
    return Written(path, size, len(pos))
