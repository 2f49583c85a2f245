"""Preparing writes: everything a commit needs, done before any lock is taken.

Each ``prepare_*`` function checks its input, writes the new data files and
returns a :class:`TableChange` that records what it read (its base version and
the files whose rows it replaces). Nothing is visible until the change commits.
Copy-on-write: DELETE and UPDATE rewrite the files holding matching rows;
files whose statistics prove every row matches are dropped without reading.
"""

from __future__ import annotations

import contextlib
import json
import logging
from typing import TYPE_CHECKING, Any, Iterator, Literal, Mapping, Sequence, Union

import pyarrow as pa
import pyarrow.compute as pc

from ..errors import ArgumentTypeError, DataOutOfRangeError, InvalidArgumentError, InvalidDataError, SchemaMismatchError
from . import pk
from . import properties as P
from .changes import Isolation, Operation, TableChange
from .files import DataFile
from .predicates import Filter, Predicate, Verdict

if TYPE_CHECKING:
    from .handle import TableHandle

log = logging.getLogger(__name__)

PartitionSpec = Union[None, Literal["dynamic"], Sequence[Mapping[str, Any]]]

# Widening casts accepted on write: they never lose information.
_SAFE_WIDENING = {
    (pa.int8(), pa.int16()), (pa.int8(), pa.int32()), (pa.int8(), pa.int64()),
    (pa.int16(), pa.int32()), (pa.int16(), pa.int64()), (pa.int32(), pa.int64()),
    (pa.uint8(), pa.int16()), (pa.uint8(), pa.int32()), (pa.uint8(), pa.int64()),
    (pa.uint16(), pa.int32()), (pa.uint16(), pa.int64()), (pa.uint32(), pa.int64()),
    (pa.float16(), pa.float32()), (pa.float16(), pa.float64()), (pa.float32(), pa.float64()),
    (pa.string(), pa.large_string()), (pa.large_string(), pa.string()),
    (pa.binary(), pa.large_binary()), (pa.large_binary(), pa.binary()),
}


def to_arrow_table(data: Any, ident: str = "?") -> pa.Table:
    """``data`` as an Arrow table; input pyarrow cannot make one of raises :class:`InvalidDataError`."""
    if isinstance(data, pa.Table):
        return data
    try:
        if isinstance(data, pa.RecordBatch):
            return pa.Table.from_batches([data])
        if isinstance(data, pa.RecordBatchReader):
            return data.read_all()
        if isinstance(data, dict):
            return _table_of_columns(data, ident)
        if isinstance(data, list) and data and all(isinstance(b, pa.RecordBatch) for b in data):
            return pa.Table.from_batches(data)
        if type(data).__name__ == "DataFrame" and hasattr(data, "to_dict"):  # pandas, without importing it
            return pa.Table.from_pandas(data, preserve_index=False)
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError, OverflowError) as e:
        raise InvalidDataError(f"cannot make rows of the data for {ident!r}: {e}. Pass columns of one length "
                               "whose values fit the table's types", table=ident) from e
    raise ArgumentTypeError(f"cannot write {type(data).__name__}: pass a pyarrow Table/RecordBatch, a dict of columns "
                            "or a pandas DataFrame", argument="data", value=data)


def _table_of_columns(data: dict[Any, Any], ident: str) -> pa.Table:
    lengths = {}
    for k, v in data.items():
        try:
            lengths[k] = len(v)
        except TypeError:
            raise InvalidDataError(f"column {k!r} of the data for {ident!r} is {type(v).__name__}, not a list "
                                   "or an array of values", table=ident) from None
    if len(set(lengths.values())) > 1:
        raise InvalidDataError(f"the columns of the data for {ident!r} have different lengths {lengths}: every "
                               "column needs one value per row (use None for a missing value)", table=ident)
    return pa.table(data)


def conform(data: Any, schema: pa.Schema, ident: str) -> pa.Table:
    """Return ``data`` as an Arrow table of exactly ``schema``, or raise SchemaMismatchError.

    Accepted differences: column order, lossless widening (int32 -> int64, ...)
    and a missing nullable column (filled with nulls). Anything else is refused.
    """
    t = to_arrow_table(data, ident)
    names = set(t.column_names)
    if len(names) != len(t.column_names):
        dup = sorted({n for n in t.column_names if t.column_names.count(n) > 1})
        raise SchemaMismatchError(ident, [f"duplicate column names in the data: {dup}"])
    if t.schema.equals(schema, check_metadata=False):
        return t
    problems: list[str] = []
    extra = [n for n in t.column_names if schema.get_field_index(n) < 0]
    if extra:
        problems.append(f"columns not in the table: {extra}")
    cols = []
    for f in schema:
        if f.name not in names:
            if f.nullable:
                cols.append(pa.nulls(t.num_rows, f.type))
            else:
                problems.append(f"missing non-nullable column {f.name!r}")
            continue
        col = t.column(f.name)
        if not col.type.equals(f.type):
            if (col.type, f.type) in _SAFE_WIDENING or pa.types.is_null(col.type):
                col = col.cast(f.type)
            else:
                problems.append(f"column {f.name!r} is {col.type}, the table has {f.type}")
                continue
        if not f.nullable and col.null_count:
            problems.append(f"column {f.name!r} is not nullable but has {col.null_count} null(s)")
        cols.append(col)
    if problems:
        raise SchemaMismatchError(ident, problems)
    return pa.Table.from_arrays(cols, schema=schema)


def _read(table: "TableHandle", files: Sequence[DataFile]) -> pa.Table:
    """Rows as stored in the files (copy-on-write rewrites keep tombstones as they are)."""
    return table.read_physical(list(files))


def _keep_unmatched(table: "TableHandle", f: DataFile, pred: Predicate) -> tuple[pa.Table, int]:
    rows = _read(table, [f])
    mask = pred.mask(rows)
    matched = pc.sum(mask).as_py() or 0
    return rows.filter(pc.invert(mask)), matched


def _rewrite_outside(table: "TableHandle", change: TableChange, files: list[DataFile]) -> None:
    """OVERWRITE rebase: keep the rows of ``files`` outside the replaced range."""
    assert change.scope is not None
    for f in files:
        keep, _ = _keep_unmatched(table, f, change.scope)
        change.removed.append(f)
        if keep.num_rows:
            change.added.append(table.writer.write(keep, f.partition, prefix="rw-", source_ids=[f.file_id], seq=f.seq))
    change.summary["rewritten_files"] = change.summary.get("rewritten_files", 0) + len(files)


def prepare_append(table: "TableHandle", data: Any, *, barrier: int | None, prefix: str = "") -> TableChange:
    """A blind append; on a primary-key table a blind upsert (a MERGE of the given rows)."""
    t = table.physical(conform(data, table.schema, table.ident))
    added = table.writer.write_partitioned(t, table.partition_by, prefix=prefix) if t.num_rows else []
    return change_of(table, operation=Operation.MERGE if table.primary_key else Operation.APPEND, base_version=-1,
                     added=added, barrier=barrier)


def _prepare_pk_change(table: "TableHandle", rows: pa.Table, *, barrier: int | None,
                       summary: dict[str, Any]) -> TableChange:
    added = table.writer.write_partitioned(rows, table.partition_by) if rows.num_rows else []
    return change_of(
        table, operation=Operation.MERGE,
        base_version=-1, added=added, barrier=barrier, summary=summary,
    )


def prepare_pk_delete(table: "TableHandle", where: Filter | Predicate, *, barrier: int | None = None) -> TableChange:
    """Primary-key delete: tombstones for the keys matching ``where`` now (merge on read)."""
    pred = Predicate.parse(where, table.schema)
    keys = table.read_head(where=pred, columns=table.primary_key)
    rows = pk.tombstones(table, keys)
    return _prepare_pk_change(table, rows, barrier=barrier,
                              summary={"predicate": _describe(pred), "deleted_rows": keys.num_rows})


def prepare_pk_update(table: "TableHandle", set: Mapping[str, Any], where: Filter | Predicate, *,
                      barrier: int | None = None) -> TableChange:
    """Primary-key update: the matching rows, changed, upserted."""
    _check_set(table, set)
    pred = Predicate.parse(where, table.schema)
    rows = table.read_head(where=pred)
    if rows.num_rows:
        new_values = _evaluate_set(rows, set, table.schema, table.ident)
        cols = []
        for n in rows.column_names:
            v = new_values.get(n, rows.column(n))
            cols.append(pa.array([v.as_py()] * rows.num_rows, v.type) if isinstance(v, pa.Scalar) else v)
        rows = conform(pa.Table.from_arrays(cols, names=rows.column_names), table.schema, table.ident)
    return _prepare_pk_change(table, table.physical(rows), barrier=barrier,
                              summary={"predicate": _describe(pred), "updated_rows": rows.num_rows})


def prepare_overwrite(
    table: "TableHandle",
    data: Any,
    *,
    partitions: PartitionSpec = None,
    where: Filter | Predicate | None = None,
    barrier: int | None = None,
    prefix: str = "",
) -> TableChange:
    t = conform(data, table.schema, table.ident)
    if partitions is not None and where is not None:
        raise InvalidArgumentError("overwrite takes partitions= or where=, not both", argument="partitions",
                                   value=partitions)
    scope: Predicate | None = None
    if partitions == "dynamic":
        if not table.partition_by:
            raise InvalidArgumentError(f"{table.ident} is not partitioned: dynamic partition overwrite needs partition "
                                       "columns", argument="partitions", value=partitions)
        keys = t.select(table.partition_by).group_by(table.partition_by, use_threads=False).aggregate([])
        scope = Predicate.partitions(keys.to_pylist()) if keys.num_rows else Predicate(())
    elif partitions is not None:
        if isinstance(partitions, Mapping):
            partitions = [partitions]
        for p in partitions:
            unknown = set(p) - set(table.partition_by)
            if unknown:
                raise InvalidArgumentError(f"{sorted(unknown)} are not partition columns of {table.ident} "
                                           f"({table.partition_by})", argument="partitions", value=partitions)
        scope = Predicate.partitions(list(partitions))
    elif where is not None:
        scope = Predicate.parse(where, table.schema)
    if scope is not None and scope.clauses:
        scope = Predicate.parse(scope, table.schema)  # partition values of the wrong type, too
    if scope is not None and scope.clauses and t.num_rows:
        inside = scope.mask(t)
        outside = t.num_rows - (pc.sum(inside).as_py() or 0)
        if outside:
            raise DataOutOfRangeError(table.ident, f"{outside} new row(s) fall outside the range this overwrite replaces")
    base, base_dv, live = table.head_and_live()
    change = change_of(
        table, operation=Operation.OVERWRITE, base_version=base,
        scope=scope, barrier=barrier, summary={"scope": _describe(scope)},
    )
    with _discard_on_error(table, change):
        change.added = (
            table.writer.write_partitioned(table.physical(t), table.partition_by, prefix=prefix) if t.num_rows else []
        )
        if scope is not None and scope.clauses:
            straddling = [f for f in live if scope.verdict(f) is Verdict.SOME]
            _rewrite_outside(table, change, straddling)
    change.rebase = lambda ch, files: _rewrite_outside(table, ch, files)
    return change


def prepare_delete(table: "TableHandle", where: Filter | Predicate, *, barrier: int | None = None,
                   isolation: Isolation | None = None) -> TableChange:
    pred = Predicate.parse(where, table.schema)
    base, base_dv, live = table.head_and_live()
    change = change_of(
        table, operation=Operation.DELETE, base_version=base,
        scope=pred, barrier=barrier, isolation=_isolation(table, isolation),
        retention_seconds=table.retention_seconds, summary={"predicate": _describe(pred)},
    )
    deleted = 0
    with _discard_on_error(table, change):
        for f in live:
            v = pred.verdict(f)
            if v is Verdict.NONE:
                continue
            if v is Verdict.ALL:
                change.removed.append(f)
                deleted += f.record_count
                continue
            keep, matched = _keep_unmatched(table, f, pred)
            if not matched:
                continue
            change.removed.append(f)
            deleted += matched
            if keep.num_rows:
                change.added.append(table.writer.write(keep, f.partition, prefix="rw-", source_ids=[f.file_id],
                                                        seq=f.seq))
    change.summary["deleted_rows"] = deleted
    return change


def prepare_update(
    table: "TableHandle",
    set: Mapping[str, Any],
    where: Filter | Predicate,
    *,
    barrier: int | None = None,
    isolation: Isolation | None = None,
) -> TableChange:
    _check_set(table, set)
    pred = Predicate.parse(where, table.schema)
    base, base_dv, live = table.head_and_live()
    change = change_of(
        table, operation=Operation.UPDATE, base_version=base,
        scope=pred, barrier=barrier, isolation=_isolation(table, isolation),
        retention_seconds=table.retention_seconds, summary={"predicate": _describe(pred), "set": sorted(set)},
    )
    updated = 0
    with _discard_on_error(table, change):
        for f in live:
            if pred.verdict(f) is Verdict.NONE:
                continue
            rows = _read(table, [f])
            mask = pred.mask(rows)
            matched = pc.sum(mask).as_py() or 0
            if not matched:
                continue
            new_values = _evaluate_set(rows, set, table.schema, table.ident)
            cols = []
            for name in rows.column_names:
                if name in new_values:
                    cols.append(pc.if_else(mask, new_values[name], rows.column(name)))
                else:
                    cols.append(rows.column(name))
            out = conform(pa.Table.from_arrays(cols, names=rows.column_names), table.schema, table.ident)
            change.removed.append(f)
            change.added.append(table.writer.write(out, f.partition, prefix="rw-", source_ids=[f.file_id], seq=f.seq))
            updated += matched
    change.summary["updated_rows"] = updated
    return change


def _check_set(table: "TableHandle", set: Mapping[str, Any]) -> None:
    """An update's ``set=``, checked before any file is read: known columns, values of their types."""
    if not set:
        raise InvalidArgumentError("update needs at least one column in set=", argument="set", value=set)
    for col in set:
        if table.schema.get_field_index(col) < 0:
            raise SchemaMismatchError(table.ident, [f"update sets unknown column {col!r}"])
        if col in table.primary_key:
            raise InvalidArgumentError(f"update cannot change key column {col!r}; delete and upsert instead",
                                       argument="set", value=col)
        if col in table.partition_by:
            raise InvalidArgumentError(f"update cannot change partition column {col!r}; delete and append instead",
                                       argument="set", value=col)
    _evaluate_set(table.schema.empty_table(), set, table.schema, table.ident)


def _evaluate_set(rows: pa.Table, set: Mapping[str, Any], schema: pa.Schema, ident: str = "?") -> dict[str, Any]:
    exprs = {k: v for k, v in set.items() if isinstance(v, pc.Expression)}
    out: dict[str, Any] = {}
    bad = (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError, OverflowError, TypeError)
    if exprs:
        try:
            import pyarrow.dataset as ds  # here: it imports pandas (predicates.Predicate.mask)

            evaluated = ds.dataset(rows).to_table(columns=exprs)
            for k in exprs:
                out[k] = evaluated.column(k).cast(schema.field(k).type)
        except bad as e:
            raise SchemaMismatchError(ident, [f"update expressions {sorted(exprs)} do not give values of their "
                                              f"columns' types: {e}"]) from e
    for k, v in set.items():
        if k not in out:
            t = schema.field(k).type
            try:
                out[k] = pa.scalar(v, type=t)
            except bad as e:
                raise SchemaMismatchError(ident, [f"update sets column {k!r} ({t}) to {v!r}, which is not a "
                                                  f"{t} value"]) from e
    return out


def prepare_compact(table: "TableHandle", *, target_file_size: int, min_files: int = 2,
                    major: bool = False, runs: int = 0) -> TableChange:
    """Merge files of each partition into target-size files (see :meth:`Table.compact`);
    with ``runs`` (a primary-key table) the newest files of similar size instead, when
    there are at least ``runs`` of them (:func:`_newest_runs`)."""
    base, base_dv, live = table.head_and_live()
    change = change_of(
        table, operation=Operation.COMPACT, base_version=base,
        base_data_version=base_dv,
    )
    by_part: dict[str, list[DataFile]] = {}
    for f in live:
        by_part.setdefault(f.partition_json, []).append(f)
    merged = 0
    with _discard_on_error(table, change):
        for members in by_part.values():
            members.sort(key=lambda f: (f.seq, f.file_id))
            picked = _newest_runs(members, runs) if runs else \
                _compaction_runs(table, members, target_file_size, min_files, major)
            for run in picked:
                if table.primary_key:
                    data = pk.in_key_order(pk.merge(table, run, keep_tombstones=not major),
                                           table.primary_key)
                else:
                    data = _read(table, run)
                ids = [f.file_id for f in run]
                size = sum(f.file_size for f in run)
                rows_per_file = max(1, int(data.num_rows * target_file_size / max(size, 1)))
                for start in range(0, max(data.num_rows, 1), rows_per_file):
                    if data.num_rows == 0:
                        break
                    change.added.append(table.writer.write(
                        data.slice(start, rows_per_file), run[0].partition, prefix="c-", source_ids=ids,
                        seq=max(f.seq for f in run)))
                change.removed.extend(run)
                merged += len(run)
    change.summary.update({"input_files": merged, "output_files": len(change.added), "major": major})
    if runs:
        change.summary["runs"] = runs
    return change


def _compaction_runs(table: "TableHandle", members: list[DataFile], target: int, min_files: int,
                     major: bool) -> list[list[DataFile]]:
    """The groups of files to merge, in one partition (``members`` in commit order).

    Major: all of them. Minor: small files; on a primary-key table only runs of
    small files adjacent in commit order, so that merging them cannot reorder
    their rows against a file in between.
    """
    if major:
        has_tombstones = bool(table.primary_key) and any(
            (st := f.stats.get(pk.DELETED)) is not None and st.max for f in members)
        return [members] if len(members) >= 2 or has_tombstones else []
    small = [f.file_size < target * 0.75 for f in members]
    if not table.primary_key:
        run = [f for f, sm in zip(members, small) if sm]
        return [run] if len(run) >= min_files else []
    runs, cur = [], []
    for f, sm in zip(members, small):
        if sm:
            cur.append(f)
        else:
            if len(cur) >= min_files:
                runs.append(cur)
            cur = []
    if len(cur) >= min_files:
        runs.append(cur)
    return runs


def _newest_runs(members: list[DataFile], trigger: int) -> list[list[DataFile]]:
    """The compaction on write of a primary-key table's partition (``members`` in commit
    order; the table property ``lakestep.pk.compaction-trigger``): the newest files, taken
    from the newest back while a file holds at most :data:`_RUN_RATIO` times the rows of all
    the newer ones together, merged when there are at least ``trigger`` of them.

    So upsert files of about the same size are merged ``trigger`` at a time, a merged file
    joins the next merge once the files after it add up to about its size (a binary counter:
    after ``n`` upserts a partition holds its large files, O(log(n / trigger)) merged files
    and fewer than ``trigger`` new ones), and a large base is left alone until the newer
    files add up to it. Adjacent in commit order by construction: no other file's rows fall
    between them (the module docstring of ``pk.py``)."""
    picked: list[DataFile] = []
    total = 0
    for f in reversed(members):
        if picked and f.record_count > total * _RUN_RATIO:
            break
        picked.append(f)
        total += f.record_count
    return [picked[::-1]] if len(picked) >= trigger else []


#: How much larger (in rows) than all the newer files together a file may be and still join
#: their compaction on write (:func:`_newest_runs`): batches of a stream vary in size.
_RUN_RATIO = 1.5


@contextlib.contextmanager
def _discard_on_error(table: "TableHandle", change: TableChange) -> Iterator[None]:
    """Files a failing prepare already wrote are deleted: a failed write leaves none behind."""
    try:
        yield
    except BaseException:
        for f in change.added:
            table.writer.delete(f.path)
        raise


def change_of(table: "TableHandle", **fields: Any) -> TableChange:
    """A :class:`TableChange` of ``table``, stamped with the schema its writer read (``schema_id``)."""
    return TableChange(table_id=table.table_id, ident=table.ident, location=table.location,
                       schema_id=table.meta.schema_id, **fields)


def _isolation(table: "TableHandle", explicit: Isolation | None) -> Isolation:
    if explicit is None:
        return P.value(table.ident, table.properties, P.ISOLATION, warned=table.warned)
    if explicit not in P.ISOLATIONS:
        raise InvalidArgumentError(f"isolation must be 'snapshot' or 'serializable', got {explicit!r}",
                                   argument="isolation", value=explicit)
    return explicit


def _describe(pred: Predicate | None) -> Any:
    if pred is None:
        return "all"
    return json.loads(json.dumps([list(map(list, c)) for c in pred.clauses], default=str))


def prepare_rewrite_file(table: "TableHandle", file: DataFile | int, transform: Any) -> TableChange:
    """Replace one file's rows by ``transform(rows)`` (an UPDATE of exactly that file)."""
    base, _, live = table.head_and_live()
    fid = file.file_id if isinstance(file, DataFile) else int(file)
    target = next((f for f in live if f.file_id == fid), None)
    if target is None:
        raise InvalidArgumentError(f"file {fid} is not live in {table.ident}", argument="file", value=file)
    rows = _read(table, [target])
    logical = rows.drop_columns([pk.DELETED]) if table.primary_key else rows
    out = conform(transform(logical), table.schema, table.ident)
    if table.primary_key:  # keep the file's tombstones and its rows' order
        out = pk.to_physical(table, out)
        flagged = rows.filter(rows.column(pk.DELETED))
        if flagged.num_rows:
            out = pa.concat_tables([out, flagged])
    change = change_of(
        table, operation=Operation.UPDATE,
        base_version=base, removed=[target], retention_seconds=table.retention_seconds,
        summary={"rewrite_file": target.path, "rows_before": target.record_count, "rows_after": out.num_rows},
    )
    if out.num_rows:
        change.added.append(table.writer.write(out, target.partition, prefix="rw-", source_ids=[fid], seq=target.seq))
    return change
