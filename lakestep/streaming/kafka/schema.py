"""The source's schema, as Spark types and as the Arrow schema ``read()`` yields."""

from __future__ import annotations

import pyarrow as pa
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)


def kafka_schema(include_headers: bool = False) -> StructType:
    """The Spark schema of the source (Spark's Kafka source schema)."""
    fields = [
        StructField("key", BinaryType()),
        StructField("value", BinaryType()),
        StructField("topic", StringType()),
        StructField("partition", IntegerType()),
        StructField("offset", LongType()),
        StructField("timestamp", TimestampType()),
        StructField("timestampType", IntegerType()),
    ]
    if include_headers:
        header = StructType([StructField("key", StringType()), StructField("value", BinaryType())])
        fields.append(StructField("headers", ArrayType(header)))
    return StructType(fields)


HEADERS_ARROW_TYPE = pa.list_(
    pa.field("element", pa.struct([pa.field("key", pa.string()), pa.field("value", pa.binary())]))
)
TIMESTAMP_ARROW_TYPE = pa.timestamp("us", tz="UTC")


def arrow_schema(include_headers: bool = False) -> pa.Schema:
    """The Arrow schema of the record batches ``read()`` yields.

    It must equal what pyspark derives from :func:`kafka_schema` (PySpark checks
    ``Schema.equals`` before accepting a batch).
    """
    fields = [
        pa.field("key", pa.binary()),
        pa.field("value", pa.binary()),
        pa.field("topic", pa.string()),
        pa.field("partition", pa.int32()),
        pa.field("offset", pa.int64()),
        pa.field("timestamp", TIMESTAMP_ARROW_TYPE),
        pa.field("timestampType", pa.int32()),
    ]
    if include_headers:
        fields.append(pa.field("headers", HEADERS_ARROW_TYPE))
    return pa.schema(fields)

