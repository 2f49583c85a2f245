"""Dead letters: JSON Kafka records parsed into a lakestep table, failures into a dead-letter table.

Real Spark, the real tansu broker: every record lands in exactly one of the
two tables, and both tables' commits of a micro-batch are one transaction.
"""

from __future__ import annotations

import json
import uuid

import pyarrow as pa
import pytest

from lakestep.streaming import register
from lakestep.streaming.deadletter import dead_letter_schema, parse_json

pytestmark = [pytest.mark.spark, pytest.mark.kafka]

SCHEMA = "id long, name string, amount double, ts timestamp"
LINEAGE = [("topic", pa.string()), ("partition", pa.int32()), ("offset", pa.int64()),
           ("timestamp", pa.timestamp("us", tz="UTC"))]
PARSED = [("id", pa.int64()), ("name", pa.string()), ("amount", pa.float64()),
          ("ts", pa.timestamp("us", tz="UTC"))]

# (value, expected error or None)
RECORDS: list[tuple[bytes | None, str | None]] = [
    (b'{"id": 1, "name": "a", "amount": 1.5, "ts": "2024-01-01T00:00:00Z"}', None),
    (b'{"id": 2, "name": "b", "amount": 2}', None),                       # int read as double
    (b'{"id": 3, "name": null, "extra": [1, 2]}', None),                  # null and unknown fields
    (b'{"id": "four", "name": "d"}', "field id: expected long"),
    (b'{"id": 5, "amount": "lots"}', "field amount: expected double"),
    (b'{"id": 6.5, "amount": "x", "ts": "never"}',
     "field id: expected long; field amount: expected double; field ts: expected timestamp"),
    (b'{"id": 7, "name": "g"', "malformed JSON"),                         # truncated
    (b"not json at all", "malformed JSON"),
    (b'[{"id": 9}]', "malformed JSON"),                                   # not an object
    (b"\xff\xfe\x00garbage", "malformed JSON"),                           # not UTF-8
    (None, "null value"),                                                 # tombstone
    (b'{"id": 12, "name": "l", "amount": -0.25}', None),
]


def _produce(kafka_broker, topic: str) -> dict[tuple[int, int], tuple[bytes | None, str | None]]:  # type: ignore[no-untyped-def]
    expected = {}
    for i, (value, err) in enumerate(RECORDS):
        part = i % 2
        (p, off), = kafka_broker.produce(topic, [value], partition=part, keys=[f"k{i}"])
        expected[(p, off)] = (value, err)
    return expected


# The sink reads its options case-insensitively (datasource.py hands it pyspark's CaseInsensitiveDict), so
# "deadLetterTable" reaches it as written.
def _run(spark, kafka_broker, topic: str, url: str, ck: str, *, dead_letter_columns: bool = True) -> None:  # type: ignore[no-untyped-def]
    register(spark)
    raw = (spark.readStream.format("lakestep-kafka").option("kafka.bootstrap.servers", kafka_broker.bootstrap_servers)
           .option("subscribe", topic).option("startingOffsets", "earliest").load())
    parsed = parse_json(raw, SCHEMA, dead_letter_columns=dead_letter_columns)
    q = (parsed.writeStream.format("lakestep").option("catalog", url).option("table", "s.orders")
         .option("deadLetterTable", "s.orders_dlq").option("job", "ingest").option("checkpointLocation", ck)
         .queryName(f"dlq-{uuid.uuid4().hex[:8]}").trigger(availableNow=True).start())
    try:
        assert q.awaitTermination(180), "availableNow query did not finish"
    finally:
        q.stop()
    if q.exception() is not None:
        raise AssertionError(str(q.exception()))


def test_dead_letter_schema() -> None:
    s = dead_letter_schema()
    assert s.names == ["raw", "error", "topic", "partition", "offset", "timestamp"]
    assert s.field("raw").type == pa.binary() and s.field("offset").type == pa.int64()
    assert dead_letter_schema(raw_and_error=False, key=True).names[0] == "_ls_error"
    assert "key" in dead_letter_schema(key=True).names


def test_parse_json_refuses_clashing_names(spark) -> None:  # type: ignore[no-untyped-def]
    df = spark.createDataFrame([(b"{}",)], "value binary")
    with pytest.raises(ValueError, match="clash"):
        parse_json(df, "raw string, id long")
    with pytest.raises(ValueError, match="struct schema"):
        parse_json(df, "array<int>")


def test_bad_records_go_to_the_dead_letter_table_in_the_same_transaction(
    spark, kafka_broker, kafka_topic_name, catalog_spec, tmp_path  # type: ignore[no-untyped-def]
) -> None:
    topic = kafka_topic_name()
    kafka_broker.create_topic(topic, 2)
    expected = _produce(kafka_broker, topic)
    cat = catalog_spec.open()
    cat.create_namespace("s")
    # The sink drops only _ls_error from good rows, so the good table must take raw/error too.
    orders = cat.create_table("s.orders", pa.schema(PARSED + LINEAGE + [("raw", pa.binary()), ("error", pa.string())]))
    dlq = cat.create_table("s.orders_dlq", dead_letter_schema())
    _run(spark, kafka_broker, topic, catalog_spec.url, str(tmp_path / "ck"))

    good = orders.to_arrow().to_pylist()
    bad = dlq.to_arrow().to_pylist()
    assert len(good) + len(bad) == len(RECORDS)
    seen: dict[tuple[int, int], str] = {}
    for r in good:
        key = (r["partition"], r["offset"])
        assert key not in seen, f"{key} twice"
        seen[key] = "good"
        value, err = expected[key]
        assert err is None, (key, value)
        doc = json.loads(value)  # type: ignore[arg-type]
        assert r["id"] == doc["id"] and r["name"] == doc.get("name") and r["topic"] == topic
        assert r["amount"] == (float(doc["amount"]) if "amount" in doc else None)
        assert r["raw"] is None and r["error"] is None and r["timestamp"] is not None
    assert good and next(r for r in good if r["id"] == 1)["ts"].isoformat() == "2024-01-01T00:00:00+00:00"
    for r in bad:
        key = (r["partition"], r["offset"])
        assert key not in seen, f"{key} in both tables or twice"
        seen[key] = "bad"
        value, err = expected[key]
        assert err is not None, (key, value)
        assert r["error"] == err and r["raw"] == value and r["topic"] == topic and r["timestamp"] is not None
    assert set(seen) == set(expected)  # nothing dropped

    # one transaction per micro-batch: same job, batch and barrier in both tables
    def commits(t):  # type: ignore[no-untyped-def]
        return {(h.job_id, h.batch_id): h for h in t.history() if h.operation == "APPEND"}

    good_commits, bad_commits = commits(orders), commits(dlq)
    assert bad_commits and set(bad_commits) <= set(good_commits)
    for k, h in bad_commits.items():
        assert k[0] == "ingest" and h.barrier is not None and h.barrier == good_commits[k].barrier
    assert sum(h.added_rows for h in good_commits.values()) == len(good)
    assert sum(h.added_rows for h in bad_commits.values()) == len(bad)
    cat.close()


@pytest.mark.parametrize("catalog_spec", ["sqlite"], indirect=True)  # the sink's columns: any backend
def test_good_table_without_dead_letter_columns(spark, kafka_broker, kafka_topic_name, catalog_spec,  # type: ignore[no-untyped-def]
                                                tmp_path) -> None:
    topic = kafka_topic_name()
    kafka_broker.create_topic(topic, 1)
    kafka_broker.produce(topic, [b'{"id": 1}', b"oops"], partition=0)
    cat = catalog_spec.open()
    cat.create_namespace("s")
    cat.create_table("s.orders", pa.schema(PARSED + LINEAGE))
    cat.create_table("s.orders_dlq", dead_letter_schema())
    _run(spark, kafka_broker, topic, catalog_spec.url, str(tmp_path / "ck"))
    assert cat.load_table("s.orders").count() == 1 and cat.load_table("s.orders_dlq").count() == 1


@pytest.mark.parametrize("catalog_spec", ["sqlite"], indirect=True)
def test_dead_letters_without_raw_and_error_columns(spark, kafka_broker, kafka_topic_name, catalog_spec,  # type: ignore[no-untyped-def]
                                                    tmp_path) -> None:
    """dead_letter_columns=False: the good table is just the parsed + lineage columns, and the
    dead-letter table keeps the error in _ls_error (the sink drops that column from good rows only)."""
    topic = kafka_topic_name()
    kafka_broker.create_topic(topic, 1)
    kafka_broker.produce(topic, [b'{"id": 1}', b"oops", b'{"id": "x"}'], partition=0)
    cat = catalog_spec.open()
    cat.create_namespace("s")
    orders = cat.create_table("s.orders", pa.schema(PARSED + LINEAGE))
    dlq = cat.create_table("s.orders_dlq", dead_letter_schema(raw_and_error=False))
    _run(spark, kafka_broker, topic, catalog_spec.url, str(tmp_path / "ck"), dead_letter_columns=False)
    assert orders.to_arrow().column("id").to_pylist() == [1]
    got = sorted((r["offset"], r["_ls_error"]) for r in dlq.to_arrow().to_pylist())
    assert got == [(1, "malformed JSON"), (2, "field id: expected long")]
    cat.close()
