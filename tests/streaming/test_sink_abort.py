"""Spark calls ``abort`` when a commit raised, and a commit that raised may have landed
(its connection died after the database committed; the query was stopped while the commit
ran). The writers' abort must never delete files that a commit recorded. The writers are
driven here as Spark drives them (write on an executor, then commit and/or abort on the
driver), without a Spark session, on SQLite and PostgreSQL."""

from __future__ import annotations

import os

import pyarrow as pa

from lakestep import Catalog
from lakestep.streaming.batch_io import LakestepBatchWriter
from lakestep.streaming.sink import BatchFiles, LakestepStreamWriter

SCHEMA = pa.schema([("k", pa.int64())])


def _rows(k: list[int]) -> pa.RecordBatch:
    return pa.RecordBatch.from_pydict({"k": k}, schema=SCHEMA)


def _paths(cat: Catalog, ident: str, messages: list) -> list[str]:  # type: ignore[type-arg]
    t = cat.load_table(ident)
    return [os.path.join(t.location, f.path) for m in messages for f in m.files]


def test_stream_abort_after_a_landed_commit_keeps_the_rows(catalog: Catalog) -> None:
    catalog.create_namespace("s")
    catalog.create_table("s.t", SCHEMA)
    writer = LakestepStreamWriter({"catalog": catalog.connection_url(), "table": "s.t", "job": "feed"}, False)
    messages = [writer.target.files().write(iter([_rows([1, 2, 3])]), "b4-p0-a0-")]
    writer.commit(messages, 4)  # landed; say Spark saw it fail and aborts the batch
    writer.abort(messages, 4)
    assert all(os.path.exists(p) for p in _paths(catalog, "s.t", messages))
    assert sorted(catalog.load_table("s.t").to_arrow().column("k").to_pylist()) == [1, 2, 3]


def test_batch_write_abort_deletes_only_unrecorded_files(catalog: Catalog) -> None:
    catalog.create_namespace("b")
    catalog.create_table("b.t", SCHEMA)
    writer = LakestepBatchWriter({"catalog": catalog.connection_url(), "table": "b.t"}, False, None)
    landed = [BatchFiles(writer.shape, None).write(iter([_rows([1, 2])]), "w1-")]
    writer.commit(landed)
    writer.abort(landed)  # the commit landed: nothing may go
    assert all(os.path.exists(p) for p in _paths(catalog, "b.t", landed))
    assert sorted(catalog.load_table("b.t").to_arrow().column("k").to_pylist()) == [1, 2]

    failed = [BatchFiles(writer.shape, None).write(iter([_rows([9])]), "w2-")]
    paths = _paths(catalog, "b.t", failed)
    assert all(os.path.exists(p) for p in paths)
    writer.abort(failed)  # a task failed before any commit: its files are garbage
    assert not any(os.path.exists(p) for p in paths)
    assert sorted(catalog.load_table("b.t").to_arrow().column("k").to_pylist()) == [1, 2]
