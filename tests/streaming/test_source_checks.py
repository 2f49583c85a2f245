"""The streaming source's executor read checks each file against the catalog (issue 9, item 5).

No Spark session: the reader's methods are called as Spark's Python workers
call them (``partitions`` on the driver, ``read`` on an executor).
"""

from __future__ import annotations

import os

import pyarrow as pa
import pytest

from lakestep import errors
from lakestep.barrier import OPEN_EPOCH, Pipeline

pytest.importorskip("pyspark")

from lakestep.services import Coordinator
from lakestep.streaming.source import LakestepStreamReader  # noqa: E402

KV = pa.schema([("k", pa.int64()), ("v", pa.int64())])


@pytest.fixture
def stream(catalog_spec):  # type: ignore[no-untyped-def]
    cat = catalog_spec.open()
    cat.create_namespace("s")
    a = cat.create_table("s.a", KV)
    cat.create_table("s.d", KV)
    p = Pipeline(cat)
    p.register_job("ingest", sinks=["s.a"], external_input=True)
    p.register_job("copy", sources=["s.a"], sinks=["s.d"])
    a.append({"k": [1, 2], "v": [1, 2]}, barrier=OPEN_EPOCH)
    coord = Coordinator(cat, lease_seconds=30.0)
    coord.seal()
    coord.release()
    reader = LakestepStreamReader({"catalog": catalog_spec.url, "table": "s.a", "job": "copy"})
    yield reader, a
    cat.close()


def test_a_truncated_file_fails_the_executor_read_with_a_typed_error(stream) -> None:  # type: ignore[no-untyped-def]
    reader, table = stream
    parts = reader.partitions({"barrier": 0, "dv": 0}, {"barrier": 1, "dv": 1})
    assert [sum(b.num_rows for b in reader.read(p)) for p in parts] == [2]  # intact: read as before
    (f,) = table.files()
    full = table.writer.full_path(f.path)
    os.truncate(full, f.file_size - 1)
    with pytest.raises(errors.DataFileCorruptError) as ei:
        list(reader.read(parts[0]))
    assert (ei.value.table, ei.value.path, ei.value.problem) == ("s.a", f.path, "size")
