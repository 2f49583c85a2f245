"""A data file changed outside lakestep is never read silently (issue 9, item 5).

Each damage is done for real to one committed file; every read path (scans,
merge on read, compaction, copy-on-write rewrites) must raise
:class:`DataFileCorruptError` naming that file, and commit nothing.
"""

from __future__ import annotations

import os
from typing import Callable

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from lakestep import Catalog, errors
from lakestep.catalog.files import DataFile

SCHEMA = pa.schema([("id", pa.int64()), ("part", pa.string()), ("v", pa.int64())])


def write_parquet(path: str, t: pa.Table) -> None:
    pq.write_table(t, path)


def same_size_more_rows(path: str, f: DataFile) -> None:
    """The file replaced by a valid Parquet file of the same byte size holding one more row.

    Only the footer's row count can tell them apart, not the size. The size is
    matched by the length of a plain-encoded, uncompressed string column; a
    second one absorbs the byte a varint may add when a length crosses 128.
    """
    n = f.record_count + 1
    options = dict(compression="none", use_dictionary=False, write_statistics=False, store_schema=False)
    tmp = path + ".tmp"

    def size(pad: int, extra: int) -> int:
        rows = pa.table({"id": list(range(n)), "pad": ["x" * pad] + [""] * (n - 1),
                         "pad2": ["y" * extra] + [""] * (n - 1)})
        pq.write_table(rows, tmp, **options)  # type: ignore[arg-type]
        return os.path.getsize(tmp)

    start = max(0, f.file_size - size(0, 0) - 8)  # each byte of pad is a byte of file, give or take a varint
    for extra in range(4):
        for pad in range(start, start + 16):
            got = size(pad, extra)
            if got == f.file_size:
                os.replace(tmp, path)
                return
            if got > f.file_size:
                break
    os.remove(tmp)
    raise AssertionError("could not build a replacement of the same size")


def deleted(path: str, f: DataFile) -> None:
    os.remove(path)


def truncated(path: str, f: DataFile) -> None:
    os.truncate(path, f.file_size // 2)


def emptied(path: str, f: DataFile) -> None:
    os.truncate(path, 0)


def grown(path: str, f: DataFile) -> None:
    with open(path, "ab") as out:
        out.write(b"\0" * 100)


def swapped_more_rows(path: str, f: DataFile) -> None:  # the case: count() said 1, to_arrow() 4 rows
    write_parquet(path, pa.table({"id": [1, 2, 3, 4], "part": ["a"] * 4, "v": [1, 2, 3, 4]}))


def swapped_other_schema(path: str, f: DataFile) -> None:  # the case: columns came back null
    write_parquet(path, pa.table({"other": list(range(f.record_count))}))


def scribbled(path: str, f: DataFile) -> None:
    """Bytes overwritten inside the first page (its header), size unchanged."""
    with open(path, "r+b") as out:
        out.seek(4)
        out.write(b"\xff" * 24)


DAMAGE: dict[str, tuple[Callable[[str, DataFile], None], set[str]]] = {
    "deleted": (deleted, {"missing"}),
    "truncated": (truncated, {"size"}),
    "emptied": (emptied, {"size"}),
    "grown": (grown, {"size"}),
    "swapped-more-rows": (swapped_more_rows, {"size"}),
    "swapped-other-schema": (swapped_other_schema, {"size"}),
    "same-size-more-rows": (same_size_more_rows, {"row count"}),
    "scribbled": (scribbled, {"unreadable"}),
}


READS: dict[str, Callable] = {  # type: ignore[type-arg]
    "to_arrow": lambda t: t.to_arrow(),
    "to_arrow-where": lambda t: t.to_arrow(where=[("v", ">", 0)]),
    "to_arrow-columns": lambda t: t.to_arrow(columns=["id"]),
    "compact": lambda t: t.compact(min_files=2),
    "major-compact": lambda t: t.compact(major=True),
    "delete": lambda t: t.delete([("v", "=", 2)]),
    "update": lambda t: t.update({"v": 9}, [("v", "=", 2)]),
    "overwrite-where": lambda t: t.overwrite({"id": [9], "part": ["a"], "v": [2]}, where=[("v", "=", 2)]),
    "rewrite_file": lambda t: t.rewrite_file(t.files()[0], lambda rows: rows),
}


def make_table(catalog: Catalog, kind: str):  # type: ignore[no-untyped-def]
    catalog.create_namespace("s")
    t = catalog.create_table("s.t", SCHEMA, primary_key=["id"] if kind == "pk" else [])
    t.append({"id": [1, 2, 3], "part": ["a", "a", "a"], "v": [1, 2, 3]})  # the file to damage
    t.append({"id": [4], "part": ["a"], "v": [4]})
    return t


@pytest.fixture(params=["plain", "pk"])
def table(request, catalog: Catalog):  # type: ignore[no-untyped-def]
    return make_table(catalog, request.param)


def check(table, damage: str, read: Callable) -> None:  # type: ignore[no-untyped-def, type-arg]
    victim = min(table.files(), key=lambda f: f.file_id)
    full = table.writer.full_path(victim.path)
    fn, problems = DAMAGE[damage]
    fn(full, victim)
    head = table.version
    on_disk = sorted(os.listdir(os.path.dirname(full)))
    with pytest.raises(errors.DataFileCorruptError) as ei:
        read(table)
    e = ei.value
    assert (e.table, e.path) == ("s.t", victim.path)
    assert e.problem in problems, e
    assert victim.path in str(e)
    assert table.version == head  # nothing committed
    assert sorted(os.listdir(os.path.dirname(full))) == on_disk  # nothing written that stays


@pytest.mark.parametrize("damage", DAMAGE)
def test_a_damaged_file_raises_a_typed_error_naming_it(table, damage: str) -> None:  # type: ignore[no-untyped-def]
    check(table, damage, lambda t: t.to_arrow())


@pytest.mark.parametrize("kind", ["plain", "pk"])
@pytest.mark.parametrize("damage", ["deleted", "truncated", "same-size-more-rows", "scribbled"])
@pytest.mark.parametrize("read", READS)
def test_every_read_path_checks_the_files(tmp_path, kind: str, damage: str, read: str) -> None:  # type: ignore[no-untyped-def]
    """Each read path against one damage of each kind the checks tell apart (missing, size, row
    count, unreadable). Reading files is the same on both catalog backends: SQLite only here."""
    with Catalog(warehouse=str(tmp_path / "wh")) as cat:
        check(make_table(cat, kind), damage, READS[read])


def test_versions_without_the_damaged_file_still_read(table) -> None:  # type: ignore[no-untyped-def]
    """A damaged file does not hide the others: untouched versions and files read as before."""
    victim = max(table.files(), key=lambda f: f.file_id)
    deleted(table.writer.full_path(victim.path), victim)
    assert sorted(table.to_arrow(version=1).column("id").to_pylist()) == [1, 2, 3]
