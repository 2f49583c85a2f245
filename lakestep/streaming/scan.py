"""Spark's own Parquet scan of a lakestep table's files, and when it cannot read them as lakestep does.

What :class:`~lakestep.streaming.DerivedJob` (its batches' ``changes()`` and
``table()``) and :func:`lakestep.query.spark_sql` (its native path) read with:
a ``spark.read.format("parquet")`` of exactly the files a plan names, with the
table's schema (columns added later read as null) and without partition
discovery (the files hold their partition columns, as lakestep wrote them).
Renamed columns are read under the names they are stored with and returned
under the table's (catalog/columns.py rule 6).
On the local disk each file's size is checked against the catalog first
(:class:`~lakestep.errors.DataFileCorruptError` naming the file).

:func:`python_reason` says when that scan would not read the rows as lakestep
does (a primary-key table merged on read, an object store Spark may not reach,
column types Spark's Parquet reader reads differently): the caller then reads
through lakestep's reader in Python workers instead (:func:`python_frame`).
"""

from __future__ import annotations

import pickle
import threading
from typing import TYPE_CHECKING, Any, Callable, Iterator, Sequence

import pyarrow as pa

from ..catalog.columns import renamed, stored_schema
from ..catalog.storage import is_object_store

if TYPE_CHECKING:
    from ..catalog import Table


def python_reason(location: str, schema: "pa.Schema", native: bool | None, *, merged: bool = False) -> str | None:
    """Why files at ``location`` with the Arrow ``schema`` are read through lakestep's reader
    (None: Spark's own scan reads them as lakestep does). ``native``: False never scans
    natively, True also on object stores (Spark reaches the store itself), None where it can;
    ``merged``: the rows are a primary-key table's, merged on read."""
    if native is False:
        return "native=False"
    if merged:
        return "a primary-key table, merged on read"
    if is_object_store(location) and native is not True:
        return "an object store: pass native=True when Spark reaches it itself"
    for f in schema:
        bad = unreadable(f.type)
        if bad:
            return f"column {f.name!r} is {f.type}: {bad}"
    if renamed(pa.schema([pa.field(f.name, f.type) for f in schema])):
        return "a field of a struct column was renamed (Spark's scan maps top-level columns only)"
    return None


def unreadable(t: Any) -> str | None:
    """Why Spark's Parquet reader does not read a column of Arrow type ``t`` back as it was
    written (None: it does)."""
    import pyarrow as pa

    T = pa.types
    if T.is_timestamp(t) and t.unit == "ns":
        return "Spark's Parquet reader takes no nanosecond timestamps"
    if T.is_unsigned_integer(t) or T.is_dictionary(t) or T.is_large_list(t) or T.is_null(t):
        return "no Spark type reads it back the same"
    if T.is_struct(t):
        return next((r for r in (unreadable(c.type) for c in t) if r), None)
    if T.is_list(t) or T.is_map(t):
        return unreadable(t.value_type if T.is_list(t) else t.item_type) or (
            unreadable(t.key_type) if T.is_map(t) else None)
    return None


def native_frame(spark: Any, plan: Any) -> Any:
    """Spark's Parquet scan of exactly a :class:`~lakestep.catalog.plan.ReadPlan`'s files, with the
    table's schema."""
    return parquet_frame(spark, plan.location, plan.store(), plan.files, plan.schema)


def plan_frame(spark: Any, plan: Any, *, max_partitions: int = 64) -> Any:
    """A :class:`~lakestep.catalog.plan.ReadPlan` read by lakestep's reader in Python workers, as
    ``format("lakestep")`` reads it (merge-on-read included), without a Python data source: the
    plan's pieces (``plan.split``) pickled into rows, each read by ``mapInArrow``. What the
    Python paths read with on Spark 3.5 (lakestep/streaming/compat.py); the executors reach the
    files with the plan's storage, and never the catalog database."""
    import pickle

    from pyspark.sql.pandas.types import from_arrow_schema

    schema = from_arrow_schema(plan.schema)
    pieces = [pickle.dumps(p) for p in plan.split(max_partitions)] if plan.files else []
    if not pieces:
        return spark.createDataFrame([], schema)
    rows = spark.createDataFrame([(p,) for p in pieces], "p binary").repartition(len(pieces))
    return rows.mapInArrow(_read_pieces, schema)


def _read_pieces(batches: Any) -> Any:  # executors
    import pickle

    from .executors import freeze_worker_heap

    freeze_worker_heap()
    for rb in batches:
        for cell in rb.column(0).to_pylist():
            yield from pickle.loads(cell).to_arrow().to_batches()


def spark_scan(spark: Any, t: "Table", files: Sequence[Any], *, physical: bool = False) -> Any:
    """Spark's Parquet scan of ``files`` (recorded files of table ``t``) with the table's schema
    (``physical``: with a primary-key table's tombstone flag too); on a local disk their sizes
    are checked first (:class:`~lakestep.errors.DataFileCorruptError` naming a file)."""
    return parquet_frame(spark, t.location, _store(t), files, t.physical_schema if physical else t.schema)


def parquet_frame(spark: Any, location: str, store: Any, files: Sequence[Any], schema: Any) -> Any:
    """Spark's Parquet scan of ``files`` (relative to ``location``, reached through ``store``) read
    with the Arrow ``schema``, no partition discovery; local files' sizes checked first."""
    from pyspark.sql.pandas.types import from_arrow_schema

    from ..catalog import reader

    if not files:
        return spark.createDataFrame([], from_arrow_schema(schema))
    if is_object_store(location):
        scheme = location.split("://", 1)[0]
        paths = [store.full_path(f.path) for f in files]
        paths = [p if "://" in p else f"{scheme}://{p}" for p in paths]
    else:
        paths = reader.local_paths(store, files)  # sizes checked: DataFileCorruptError
    if renamed(schema):  # read the stored names, return the table's (columns.py rule 6)
        return _parquet_reader(spark, stored_schema(schema)).load(
            paths[0] if len(paths) == 1 else paths).toDF(*schema.names)
    return _parquet_reader(spark, schema).load(paths[0] if len(paths) == 1 else paths)


_READERS: dict[tuple[int, bytes], Any] = {}
_READERS_LOCK = threading.Lock()


def _parquet_reader(spark: Any, schema: Any) -> Any:
    """A Parquet reader with ``schema``, no partition discovery, made once per session and schema:
    every call to the JVM costs the driver a round trip, and a busy driver's Python threads
    make each one wait for the interpreter (a new reader with a schema costs eight, a load of one
    path through this one costs one). Loading does not change a reader."""
    from pyspark.sql.pandas.types import from_arrow_schema

    key = (id(spark), schema.serialize().to_pybytes())
    with _READERS_LOCK:
        got = _READERS.get(key)
        if got is None:
            if len(_READERS) >= 256:
                _READERS.clear()
            ddl = spark._jsparkSession.parseDataType(from_arrow_schema(schema).json()).toDDL()
            got = _READERS[key] = spark.read.format("parquet").schema(ddl).option("recursiveFileLookup", "true")
        return got


def _store(t: "Table") -> Any:
    from ..catalog.writer import FileWriter

    return FileWriter(t.location, t.catalog.storage)


def python_frame(spark: Any, t: "Table", files: Sequence[Any]) -> Any:
    """``files`` read by lakestep's checked reader in Python workers (one task per file)."""
    from pyspark.sql.pandas.types import from_arrow_schema

    from .sink import TableShape
    from .source import FileToRead

    schema = from_arrow_schema(t.schema)
    if not files:
        return spark.createDataFrame([], schema)
    shape = TableShape.of(t)
    parts = [pickle.dumps([FileToRead(f.path, f.record_count, f.file_size)]) for f in files]
    rows = spark.createDataFrame([(p,) for p in parts], "f binary").repartition(min(len(parts), 64))
    return rows.mapInArrow(_files_reader(shape), schema)


def _files_reader(shape: Any) -> Callable[[Iterator[Any]], Iterator[Any]]:
    def read(batches: Iterator[Any]) -> Iterator[Any]:  # executors
        import pyarrow as pa

        from ..catalog import reader
        from .executors import freeze_worker_heap

        freeze_worker_heap()
        for rb in batches:
            for cell in rb.column(0).to_pylist():
                data = reader.read(shape.ident, shape.store(), pickle.loads(cell), shape.physical_schema)
                if shape.primary_key:
                    data = data.filter(pa.compute.invert(data.column("_ls_deleted"))).drop_columns(["_ls_deleted"])
                yield from data.to_batches()

    return read
