"""Micro-batches written by Spark's own Parquet writer: ``foreach_batch(..., writer="spark")``.

The ``lakestep`` sink and ``foreach_batch``'s default writer (``"arrow"``)
receive each micro-batch in Python workers: Spark converts its rows to Arrow
in the JVM and streams them to Python, which costs as much as a Python sink
that writes nothing (benchmarks.streaming (a)). This writer keeps the rows in
the JVM: Spark's Parquet writer writes the files, and only their footers are
read, on the driver, to describe them to the catalog.

Protocol of one micro-batch (numbered as it runs):

1. driver: the batch's columns are checked against the table by the rules of
   the arrow writer (:func:`lakestep.catalog.writes.conform`: any column order,
   lossless widening, a missing nullable column filled with nulls; anything
   else raises :class:`~lakestep.errors.SchemaMismatchError` before a file is
   written), and one ``select`` casts them to the table's types. A partitioned
   table gets one copy of each partition column (``__ls_part_<i>``): Spark
   splits the files by the copies, so every file holds one partition value and
   keeps the partition column itself, as the arrow writer's files do;
2. executors: Spark's Parquet writer (no Python worker) writes into a directory
   of this attempt's own, ``data/spark-b<batch>-<uuid>/``: timestamps as
   INT64 microseconds, at most 4,000,000 rows per file. Spark's commit
   protocol moves a task's file there only when the task committed. On a
   cluster the rows are counted on the way (an ``Observation``, in the same
   Spark job; it costs about 7% of the write, measured). Not in local mode
   (``local``, ``local[N]``): its executors are threads of the driver's own
   JVM, which cannot write where the driver does not look;
3. driver: the directory is listed and each file's footer read: its row
   count; per column ``[min, max, null_count]`` from the footer's statistics,
   the values the arrow writer computes from the rows (where the footer cannot
   say them exactly, a double column holding NaN or a value too long for
   parquet-mr to keep, the bounds are left unknown, as the arrow writer does
   for types without bounds; nested columns get no statistics); the partition
   values. The commit protocol's side files (``_SUCCESS``, ``.crc``) and files
   without rows are deleted. A non-nullable column holding a null fails the
   batch with :class:`~lakestep.errors.SchemaMismatchError`, and its files
   are deleted: nothing was committed. Files holding fewer rows than Spark
   counted (on a cluster: executors that wrote to a disk the driver does not
   see) fail the batch with :class:`~lakestep.errors.StreamingJobError`: nothing is
   committed, rather than a batch missing rows;
4. driver: the files are published exactly as by the arrow writer
   (:meth:`lakestep.streaming.sink.SinkTarget.commit`): one catalog
   transaction, idempotent per ``(job, batchId)``, a derived job's barrier.

Limits (refused with :class:`~lakestep.errors.StreamingJobError` when the
helper is made): tables without a primary key (an upsert needs the arrow
writer's merge of keys), no dead-letter table, a location on a file system
(a local or shared disk; Spark and the driver must see it at the same path).
Not guaranteed: the files of a batch whose Spark job fails midway are orphans
that cleanup removes after the table's retention window.
"""

from __future__ import annotations

import re
import uuid
from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from .. import _failpoints
from ..catalog.columns import renamed, stored_name, stored_names, stored_schema
from ..catalog.files import NewFile, footer_stats, partition_key
from ..catalog.storage import is_object_store
from ..catalog.writes import conform
from ..errors import SchemaMismatchError, StreamingJobError
from .sink import ERROR_COL, FilesWritten, SinkTarget

MAX_ROWS_PER_FILE = 4_000_000
_TS_CONF = "spark.sql.parquet.outputTimestampType"
_PART = "__ls_part_"


def check_target(table: Any, dead_letter: str | None) -> None:
    """Refuse, before the job is registered or any batch runs, a table Spark's writer cannot serve
    (module docstring, Limits)."""
    why = []
    if table.primary_key:
        why.append(f"{table.ident} has a primary key (upserts merge keys in the arrow writer)")
    if dead_letter:
        why.append("a dead-letter table is set (the arrow writer splits the rows)")
    if is_object_store(table.location):
        why.append(f"the table's location {table.location!r} is on an object store (this writer "
                   "needs a file system path that Spark and the driver share)")
    if why:
        raise StreamingJobError(f"writer='spark' cannot write {table.ident}: " + "; ".join(why)
                                + ". Use writer='arrow'.")


def _quoted(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


def conformed(df: Any, target: SinkTarget, schema_json: str | None = None) -> tuple[Any, list[str], Any]:
    """Step 1: ``df`` as the table's columns and types, with the partition copies; their names;
    and the column that counts the rows (step 2). ``schema_json``: ``df.schema.json()``, when
    the caller has it (each call to the JVM costs the driver a round trip)."""
    schema, ident = target.shape.schema, target.shape.ident
    if ERROR_COL in df.columns:
        raise SchemaMismatchError(ident, [
            f"the batch has a {ERROR_COL} column: rows marked as errors go to a dead-letter table, which "
            "writer='spark' does not write (use writer='arrow' with dead_letter_table=...)"])
    from pyspark import SparkContext

    # Every batch of a query has the same schema: its selection is built once and kept (each
    # column built costs the driver round trips to the JVM: 17-24 ms a batch, measured).
    # Columns are unresolved expressions, valid for any DataFrame of the same JVM.
    key = (getattr(SparkContext, "_gateway", None), schema_json or df.schema.json(), ident, schema,
           tuple(target.shape.partition_by), target.shape.column_ids)
    got = _SELECTIONS.get(key)
    if got is None:
        got = _selection(df.schema, schema, ident, list(target.shape.partition_by), _top_ids(target))
        if len(_SELECTIONS) >= 64:
            _SELECTIONS.clear()
        _SELECTIONS[key] = got
    cols, parts, count = got
    return (df if cols is None else df.select(*cols)), parts, count


_SELECTIONS: dict[tuple[Any, ...], tuple[list[Any] | None, list[str], Any]] = {}


def _top_ids(target: SinkTarget) -> dict[tuple[str, ...], int]:
    """Field id of each column and nested field (catalog/columns.py rule 4; Spark's writer takes one
    from a column's or a struct field's ``parquet.field.id`` metadata)."""
    from ..catalog.columns import ColumnIds

    ids = target.shape.column_ids
    if ids is None:
        return {}
    known = ColumnIds.from_json(*ids)
    return {} if known is None else dict(known.ids)


def _nested_type(t: pa.DataType, stored: pa.DataType, path: tuple[str, ...], ids: dict[tuple[str, ...], int]) -> Any:
    """The Spark type a nested column is cast to before Spark writes it: its struct fields named by
    their stored names (a cast of a struct is by position) and carrying their ids as
    ``parquet.field.id`` (a list's element and a map's key and value have no field of their own in
    Spark, so no id). Every nested field nullable (a cast may not make one required)."""
    from pyspark.sql.pandas.types import from_arrow_type
    from pyspark.sql.types import ArrayType, MapType, StructField, StructType

    T = pa.types
    if T.is_struct(t):
        fields = []
        for i in range(t.num_fields):
            c, sc = t.field(i), stored.field(i)
            fid = ids.get(path + (c.name,))
            fields.append(StructField(sc.name, _nested_type(c.type, sc.type, path + (c.name,), ids), True,
                                      {"parquet.field.id": fid} if fid is not None else {}))
        return StructType(fields)
    if T.is_list(t) or T.is_large_list(t):
        return ArrayType(_nested_type(t.value_type, stored.value_type, path + ("element",), ids), True)
    if T.is_map(t):
        return MapType(_nested_type(t.key_type, stored.key_type, path + ("key",), ids),
                       _nested_type(t.item_type, stored.item_type, path + ("value",), ids), True)
    return from_arrow_type(t)


def _selection(batch: Any, schema: pa.Schema, ident: str, partition_by: list[str],
               ids: dict[tuple[str, ...], int] | None = None
               ) -> tuple[list[Any] | None, list[str], Any]:
    """The columns that make a batch of Spark schema ``batch`` the table's (checked by the arrow
    writer's rules), each with its field id (``ids``), with the partition copies (None: the
    batch has the table's columns and types already, in its order, no ids are to be set and
    no partition copies are needed); the copies' names; the column that counts the rows."""
    from pyspark.sql import functions as F
    from pyspark.sql.pandas.types import from_arrow_type

    from .compat import to_arrow_schema

    try:
        arrow = to_arrow_schema(batch)
    except Exception as e:  # a Spark type Arrow has no form for
        raise SchemaMismatchError(ident, [f"the batch's schema has no Arrow form: {e}"]) from e
    conform(arrow.empty_table(), schema, ident)  # the arrow writer's rules, on the types alone
    have = set(arrow.names)
    count = F.count(F.lit(1)).alias("rows")
    cols: list[Any] = []
    for f in schema:
        if f.name not in have:
            c = F.lit(None).cast(from_arrow_type(f.type))
        else:
            c = F.col(_quoted(f.name))
            if not arrow.field(f.name).type.equals(f.type):
                c = c.cast(from_arrow_type(f.type))
            if not f.nullable and pa.types.is_nested(f.type) and arrow.field(f.name).nullable:
                # a footer counts the nulls of a nested column's leaves, not of the column
                raise SchemaMismatchError(ident, [
                    f"column {f.name!r} is not nullable and nested: writer='spark' cannot check it for "
                    "nulls (declare it non-nullable in the DataFrame, or use writer='arrow')"])
        fid = (ids or {}).get((f.name,))
        stored = stored_name(f)  # the name the files hold (catalog/columns.py rule 6)
        if pa.types.is_nested(f.type) and (renamed(pa.schema([f])) or any(
                len(p) > 1 and p[0] == f.name for p in (ids or {}))):
            c = c.cast(_nested_type(f.type, stored_schema(pa.schema([f]))[0].type, (f.name,), ids or {}))
        cols.append(c.alias(stored) if fid is None else c.alias(stored, metadata={"parquet.field.id": fid}))
    if not partition_by and not ids and not renamed(schema) and arrow.names == schema.names and all(
            arrow.field(f.name).type.equals(f.type) for f in schema):
        return None, [], count  # a select would change nothing (and costs the driver a plan)
    parts = [f"{_PART}{i}" for i in range(len(partition_by))]
    cols += [F.col(_quoted(p)).alias(n) for p, n in zip(partition_by, parts)]
    return cols, parts, count


def write(df: Any, target: SinkTarget, batch_id: int, *, schema_json: str | None = None) -> FilesWritten:
    """Steps 1-3 of a micro-batch: Spark writes, the driver describes the files.
    ``schema_json``: ``df.schema.json()`` when the caller has it."""
    from pyspark.sql import Observation

    out, parts, count = conformed(df, target, schema_json)
    session = df.sparkSession
    local = _local_session(session)
    counted = None if local else Observation(f"lakestep-b{batch_id}")
    if counted is not None:
        out = out.observe(counted, count)
    store = target.shape.store()
    rel_dir = f"data/spark-b{batch_id}-{uuid.uuid4().hex[:12]}"
    full_dir = store.full_path(rel_dir)
    stamps = _has_timestamps(target.shape.schema)  # else the setting changes nothing (and costs 3 calls)
    before = session.conf.get(_TS_CONF, None) if stamps else None
    if stamps:
        session.conf.set(_TS_CONF, "TIMESTAMP_MICROS")  # Spark's default, INT96, is legacy
    try:
        w = out.write.mode("errorifexists").options(**{  # one call to the JVM
            "maxRecordsPerFile": str(MAX_ROWS_PER_FILE), "compression": store.compression,
            "mapreduce.fileoutputcommitter.marksuccessfuljobs": "false"})
        if parts:
            w = w.partitionBy(*parts)
        w.parquet(_spark_path(full_dir))
    finally:
        if stamps and before is None:
            session.conf.unset(_TS_CONF)
        elif stamps:
            session.conf.set(_TS_CONF, before)
    _failpoints.hit("native.after_spark_write")
    msg = FilesWritten()
    try:
        describe(store, rel_dir, target, msg)
        rows = msg.rows if counted is None else int(counted.get["rows"])
        if msg.rows != rows:
            raise StreamingJobError(
                f"Spark wrote {rows} row(s) of batch {batch_id} for {target.shape.ident}, but the files the "
                f"driver finds under {full_dir} hold {msg.rows}: the executors and the driver must see the "
                "table's location at the same path (a shared file system); nothing was committed")
    except BaseException:
        for f in msg.files:
            store.delete(f.path)
        raise
    return msg


_LOCAL_MASTER = re.compile(r"local(\[[^\]]*\])?")
_LOCAL: dict[int, bool] = {}  # per SparkContext (its master never changes)


def _has_timestamps(schema: pa.Schema) -> bool:
    def ts(t: pa.DataType) -> bool:
        return pa.types.is_timestamp(t) or any(ts(t.field(i).type) for i in range(t.num_fields))

    return any(ts(f.type) for f in schema)


def _local_session(session: Any) -> bool:
    key = id(session.sparkContext)
    if key not in _LOCAL:
        _LOCAL[key] = local_master(session.sparkContext.master or "")
    return _LOCAL[key]


def local_master(master: str) -> bool:
    """Whether a Spark master URL is local mode (``local``, ``local[N]``, ``local[N,F]``, ``local[*]``):
    its executors are threads of the driver's JVM. ``local-cluster`` has executor processes of
    their own, as a cluster has."""
    return _LOCAL_MASTER.fullmatch(master) is not None


def _spark_path(full: str) -> str:
    """A local path as a ``file:`` URI: a bare path means the cluster's default file system."""
    from pathlib import Path

    return Path(full).absolute().as_uri()


def describe(store: Any, rel_dir: str, target: SinkTarget, msg: FilesWritten) -> None:
    """Step 3: the files Spark left in ``rel_dir`` as NewFiles (side files and empty files deleted)."""
    shape = target.shape
    root = store.full_path("")
    infos = store.fs.get_file_info(pafs.FileSelector(store.full_path(rel_dir), recursive=True,
                                                     allow_not_found=True))
    data: list[Any] = []  # pyarrow FileInfos
    side: list[Any] = []
    for i in infos:
        if i.type != pafs.FileType.File:
            continue
        (data if i.base_name.endswith(".parquet") and not i.base_name.startswith(("_", ".")) else side).append(i)
    for i in side:
        store.fs.delete_file(i.path)
    problems: list[str] = []
    for i in sorted(data, key=lambda x: x.path):
        rel = i.path[len(root):].lstrip("/")
        with store.fs.open_input_file(i.path) as fh:
            md = pq.read_metadata(fh)
        if md.num_rows == 0:
            store.fs.delete_file(i.path)
            continue
        stats = footer_stats(md, shape.schema)
        msg.files.append(NewFile(path=rel, record_count=md.num_rows, file_size=int(i.size or 0),
                                 partition_json=partition_key(_partition(store, i.path, md, stats, shape)),
                                 stats_json=_json(stats)))
        msg.rows += md.num_rows
        for f in shape.schema:
            n = stats.get(stored_name(f), [None, None, 0])[2]
            if not f.nullable and n:
                problems.append(f"column {f.name!r} is not nullable but has {n} null(s)")
    if problems:
        raise SchemaMismatchError(shape.ident, sorted(set(problems)))


def _json(stats: dict[str, list[Any]]) -> str:
    import json

    return json.dumps(stats, separators=(",", ":"))


def _partition(store: Any, path: str, md: Any, stats: dict[str, list[Any]], shape: Any) -> dict[str, Any]:
    """A file's partition values: the bounds of its partition columns (one value each, step 1), or
    the first row's value where the footer has no bounds."""
    from ..catalog.files import decode_value

    part: dict[str, Any] = {}
    stored = stored_names(shape.schema)
    for logical in shape.partition_by:
        name = stored.get(logical, logical)  # files, statistics and partition values use stored names
        lo, hi, nulls = stats.get(name, [None, None, None])
        if nulls == md.num_rows:
            part[name] = None
        elif lo is not None and lo == hi:
            part[name] = decode_value(lo)
        else:
            with store.fs.open_input_file(path) as fh:
                part[name] = pq.read_table(fh, columns=[name]).column(0)[0].as_py()
    return part
