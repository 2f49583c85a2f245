"""Spark formats for the benchmarks: a source without barriers, a sink that times its commits, a sink that writes nothing.

**lakestep-bench-plain**, a streaming source of a lakestep table WITHOUT barriers (the baseline rows).

``spark.readStream.format("lakestep-bench-plain").option("catalog", url).option("table", t)``:
offsets are the table's data version (``{"dv": n}``); each trigger reads the files
the commits since the last offset added (``Table.added_files``), as the ``lakestep``
source does, but with no barrier, no job and no trigger agreement: a trigger takes
whatever the table's newest version holds. So a pipeline built from it is the
barrier pipeline minus consistency: the same Spark queries, the same sink and the
same catalog commits (the sink of an unregistered job commits as a root job, with
the open epoch, and no coordinator ever seals it).

Not for applications: no read limit, no version pinning (cleanup could remove
files the stream has not read yet), no waiting out an unavailable database.

**lakestep-bench-timed**: the ``lakestep`` sink, unchanged, except that each
micro-batch's commit on the driver (sink.py step 2: the catalog transaction,
with its retries) is timed and appended as one JSON line ``{"job", "batch",
"start", "end"}`` (``time.time()``) to the file named by option ``timingFile``.

**lakestep-bench-null**: a Python streaming sink that does nothing but receive
the micro-batch: pyspark's ``DataSourceStreamArrowWriter``, as the ``lakestep``
sink is, whose tasks count the rows of the Arrow batches Spark hands them and
whose commit does nothing (benchmarks.streaming (a): the ceiling of any Python
sink, i.e. what Spark's JVM -> Python hand-off costs before a file is written).

These live in this module because Spark pickles a data source by reference:
its Python workers import them from here (``benchmarks`` is on their PYTHONPATH).
"""

from __future__ import annotations

import json
import time
from typing import Any, Iterator, Sequence

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSource,
    DataSourceStreamArrowWriter,
    DataSourceStreamReader,
    InputPartition,
    WriterCommitMessage,
)

from lakestep.catalog import reader
from lakestep.streaming import catalog_cache
from lakestep.streaming.datasource import LakestepDataSource
from lakestep.streaming.sink import FilesWritten, LakestepStreamWriter, TableShape
from lakestep.streaming.source import FilesPartition, FileToRead

FORMAT_NAME = "lakestep-bench-plain"
TIMED_NAME = "lakestep-bench-timed"


class PlainSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return FORMAT_NAME

    def schema(self) -> Any:
        from pyspark.sql.pandas.types import from_arrow_schema

        cat = catalog_cache.open_catalog(catalog_cache.required(self.options, "catalog"))
        return from_arrow_schema(cat.load_table(catalog_cache.required(self.options, "table")).schema)

    def streamReader(self, schema: Any) -> "PlainStreamReader":
        return PlainStreamReader(self.options)


class PlainStreamReader(DataSourceStreamReader):
    def __init__(self, options: Any) -> None:
        self.url = catalog_cache.required(options, "catalog")
        self.table = catalog_cache.required(options, "table")
        self.shape = TableShape.of(self._table())

    def _table(self) -> Any:
        return catalog_cache.open_catalog(self.url).load_table(self.table)

    def initialOffset(self) -> dict[str, int]:
        return {"dv": 0}

    def latestOffset(self, start: dict[str, int] | None = None, limit: Any = None) -> dict[str, int]:
        return {"dv": self._table().data_version}

    def partitions(self, start: dict[str, int], end: dict[str, int]) -> Sequence[InputPartition]:
        if int(end["dv"]) <= int(start["dv"]):
            return []
        return [FilesPartition([FileToRead(f.path, f.record_count, f.file_size)])
                for f in self._table().added_files(int(start["dv"]), int(end["dv"]))]

    def read(self, partition: FilesPartition) -> Iterator[pa.RecordBatch]:  # executors
        yield from reader.read(self.shape.ident, self.shape.store(), partition.files,
                               self.shape.physical_schema).to_batches()

    def commit(self, end: dict[str, int]) -> None:
        pass


class TimedSink(LakestepDataSource):
    @classmethod
    def name(cls) -> str:
        return TIMED_NAME

    def streamWriter(self, schema: Any, overwrite: bool) -> "TimedStreamWriter":
        return TimedStreamWriter(self.options, overwrite, schema)


class TimedStreamWriter(LakestepStreamWriter):
    def __init__(self, options: Any, overwrite: bool, schema: Any = None) -> None:
        super().__init__(options, overwrite, schema)
        self.timing_file = catalog_cache.required(options, "timingFile")

    def commit(self, messages: "list[FilesWritten | None]", batchId: int) -> None:  # driver
        start = time.time()
        super().commit(messages, batchId)
        end = time.time()
        with open(self.timing_file, "a") as f:
            f.write(json.dumps({"job": self.target.job, "batch": int(batchId), "start": start, "end": end}) + "\n")


NULL_NAME = "lakestep-bench-null"


class NullCount(WriterCommitMessage):
    def __init__(self, rows: int) -> None:
        self.rows = rows


class NullSink(DataSource):
    """lakestep-bench-null (module docstring)."""

    @classmethod
    def name(cls) -> str:
        return NULL_NAME

    def streamWriter(self, schema: Any, overwrite: bool) -> "NullStreamWriter":
        return NullStreamWriter()


class NullStreamWriter(DataSourceStreamArrowWriter):
    def write(self, iterator: Iterator[pa.RecordBatch]) -> NullCount:  # executors
        return NullCount(sum(b.num_rows for b in iterator))

    def commit(self, messages: "list[NullCount | None]", batchId: int) -> None:  # driver
        pass

    def abort(self, messages: "list[NullCount | None]", batchId: int) -> None:  # driver
        pass
