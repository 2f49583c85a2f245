"""Parse Kafka records as JSON, routing the records that do not parse to a dead-letter table.

A streaming job must neither stop on a bad record nor drop it silently.
:func:`parse_json` turns the ``value`` bytes of a Kafka DataFrame (the
``lakestep-kafka`` or Spark's ``kafka`` source) into typed columns and marks
every record it cannot parse with an error text in the column ``_ls_error``.
The lakestep sink sends the marked rows to the table named by its option
``deadLetterTable`` and the others to its table, **in the same catalog
transaction** (so both tables' commits carry the same job, batch and barrier,
and a crash never leaves one without the other).

Example::

    from lakestep.streaming import register
    from lakestep.streaming.deadletter import dead_letter_schema, parse_json

    cat.create_table("shop.orders", pa.schema([("id", pa.int64()), ("amount", pa.float64()),
                                               ("topic", pa.string()), ("partition", pa.int32()),
                                               ("offset", pa.int64()), ("timestamp", pa.timestamp("us", tz="UTC"))]))
    cat.create_table("shop.orders_dlq", dead_letter_schema())
    register(spark)
    raw = (spark.readStream.format("lakestep-kafka")
           .option("kafka.bootstrap.servers", "broker:9092").option("subscribe", "orders").load())
    parsed = parse_json(raw, "id long, amount double")
    (parsed.writeStream.format("lakestep").option("catalog", url).option("table", "shop.orders")
        .option("deadLetterTable", "shop.orders_dlq").option("job", "ingest")
        .option("checkpointLocation", "/ck/orders").start())

Columns of the result: the schema's fields, then the Kafka lineage columns
``topic``, ``partition``, ``offset``, ``timestamp`` (those present in the input;
``keep`` chooses them), then, unless ``dead_letter_columns=False``,
``raw`` (the original value bytes) and ``error`` (the same text as
``_ls_error``), set on bad records only, and finally ``_ls_error``. The good
rows' table must accept every column but ``_ls_error`` (the sink drops only
that one from good rows): give it the lineage columns and nullable ``raw`` /
``error`` columns, or pass ``dead_letter_columns=False`` and use a dead-letter
table without ``raw`` / ``error`` (see :func:`dead_letter_schema`).

What counts as a bad record (error texts):

* ``null value``: a record without a value (e.g. a compaction tombstone);
* ``malformed JSON``: not UTF-8 JSON text, or not a JSON object;
* ``field x: expected long`` (one clause per field, joined by ``"; "``): the
  field is present and non-null but cannot be read as the schema's type. Spark's
  ``from_json`` in PERMISSIVE mode silently nulls such a field; it is detected
  by parsing the same text with every field as a string and comparing;
* ``does not match the schema``: a mismatch inside a nested field (Spark's
  corrupt-record column is set, no top-level field is at fault).

Not errors (Spark's JSON reader is lenient there): missing fields and explicit
nulls (the column is null), fields not in the schema (ignored), and any JSON
value read into a ``string`` field (``7`` becomes ``"7"``, an object its text).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence, Union

import pyarrow as pa

from ..errors import InvalidArgumentError
from .sink import ERROR_COL

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame
    from pyspark.sql.types import StructType

__all__ = ["ERROR_COL", "LINEAGE_COLUMNS", "dead_letter_schema", "parse_json"]

LINEAGE_COLUMNS = ("topic", "partition", "offset", "timestamp")
_CORRUPT = "_ls_corrupt"


def dead_letter_schema(*, raw_and_error: bool = True, key: bool = False) -> pa.Schema:
    """The Arrow schema of a dead-letter table for :func:`parse_json`'s output.

    ``raw`` (the record's value bytes) and ``error`` (why it was refused), then
    where it came from: ``topic``, ``partition``, ``offset``, ``timestamp``.
    ``key=True`` adds the record key (pass ``keep=(..., "key")`` to parse_json).
    """
    fields = [("raw", pa.binary()), ("error", pa.string())] if raw_and_error else [(ERROR_COL, pa.string())]
    fields += [("topic", pa.string()), ("partition", pa.int32()), ("offset", pa.int64()),
               ("timestamp", pa.timestamp("us", tz="UTC"))]
    if key:
        fields.append(("key", pa.binary()))
    return pa.schema(fields)


def _struct(schema: Union[str, "StructType"]) -> "StructType":
    from pyspark.sql.types import StructType, _parse_datatype_string

    if isinstance(schema, StructType):
        return schema
    parsed = _parse_datatype_string(schema)
    if not isinstance(parsed, StructType):
        raise InvalidArgumentError(f"parse_json needs a struct schema (e.g. 'id long, name string'), got {schema!r}",
                                   argument="schema", value=schema)
    return parsed


def _type_name(t: object) -> str:
    from pyspark.sql.types import ArrayType, MapType, StructType

    if isinstance(t, (ArrayType, MapType, StructType)):
        return t.simpleString()
    return t.typeName()  # type: ignore[attr-defined]  # "long", "integer", "timestamp", "decimal"


def parse_json(
    df: "DataFrame",
    schema: Union[str, "StructType"],
    *,
    value_col: str = "value",
    keep: Sequence[str] = LINEAGE_COLUMNS,
    dead_letter_columns: bool = True,
) -> "DataFrame":
    """Parse ``df[value_col]`` (binary or string JSON) into ``schema``'s columns, marking bad records.

    Args:
        df: a DataFrame with the JSON in ``value_col`` (batch or streaming).
        schema: a Spark DDL string (``"id long, name string"``) or a StructType.
        value_col: the column holding the JSON text or UTF-8 bytes.
        keep: input columns carried through (those absent from ``df`` are skipped).
        dead_letter_columns: add ``raw`` and ``error`` (set on bad records only).

    Returns:
        One DataFrame, a row per input row (nothing is dropped): good rows have
        ``_ls_error`` null, bad ones have it set and their parsed columns null.
    """
    from pyspark.sql import functions as F
    from pyspark.sql.types import StringType, StructField, StructType

    struct = _struct(schema)
    names = [f.name for f in struct.fields]
    clash = {ERROR_COL, _CORRUPT, "raw", "error"}.intersection(names) if dead_letter_columns \
        else {ERROR_COL, _CORRUPT}.intersection(names)
    if clash:
        raise InvalidArgumentError(f"schema fields {sorted(clash)} clash with the columns parse_json adds",
                                   argument="schema", value=sorted(clash))
    kept = [c for c in keep if c in df.columns and c not in names]

    typed = StructType(list(struct.fields) + [StructField(_CORRUPT, StringType())])
    strings = StructType([StructField(f.name, StringType()) for f in struct.fields]
                         + [StructField(_CORRUPT, StringType())])
    opts = {"mode": "PERMISSIVE", "columnNameOfCorruptRecord": _CORRUPT}
    value = F.col(value_col)
    text = value.cast("string")
    t = F.from_json(text, typed, opts)
    s = F.from_json(text, strings, opts)

    field_errors: list[Column] = [
        F.when(t[f.name].isNull() & s[f.name].isNotNull(),
               F.lit(f"field {f.name}: expected {_type_name(f.dataType)}"))
        for f in struct.fields
    ]
    per_field = F.concat_ws("; ", *field_errors) if field_errors else F.lit("")
    error = (
        F.when(value.isNull(), F.lit("null value"))
        .when(s.isNull() | s[_CORRUPT].isNotNull(), F.lit("malformed JSON"))
        .when(per_field != "", per_field)
        .when(t.isNull() | t[_CORRUPT].isNotNull(), F.lit("does not match the schema"))
    )
    staged = df.select(*[F.col(c) for c in kept], value.alias("_ls_raw"), t.alias("_ls_t"),
                       error.alias(ERROR_COL))
    bad = F.col(ERROR_COL).isNotNull()
    cols = [F.when(~bad, F.col("_ls_t")[n]).alias(n) for n in names]
    cols += [F.col(c) for c in kept]
    if dead_letter_columns:
        raw = F.col("_ls_raw").cast("binary")
        cols += [F.when(bad, raw).alias("raw"), F.col(ERROR_COL).alias("error")]
    cols.append(F.col(ERROR_COL))
    return staged.select(*cols)
