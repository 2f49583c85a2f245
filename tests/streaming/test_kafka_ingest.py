"""lakestep.streaming.kafka.ingest: Kafka into a lakestep table, each task writing its own files
(lakestep/streaming/kafka/ingestion.py), against the real broker and Spark."""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

import pyarrow as pa
import pytest

from lakestep.errors import SchemaMismatchError
from lakestep.streaming.kafka import ingest
from lakestep.streaming.sink import STAGED_COLUMN, StagedFiles, gather
from tests.s3server import summary
from tests.streaming.kafka_helpers import await_end, produce_per_partition

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from lakestep.testing import TansuBroker

pytestmark = [pytest.mark.spark, pytest.mark.kafka]

SCHEMA = pa.schema([("key", pa.binary()), ("value", pa.binary()), ("topic", pa.string()),
                    ("partition", pa.int64()),  # int in Kafka: widened
                    ("offset", pa.int64()), ("timestamp", pa.timestamp("us", tz="UTC")),
                    ("note", pa.string())])  # no Kafka column, nullable: null


def _start(spark: SparkSession, broker: TansuBroker, spec: Any, topic: str, checkpoint: Path) -> Any:
    options = {"kafka.bootstrap.servers": broker.bootstrap_servers, "subscribe": topic,
               "startingOffsets": "earliest", "maxOffsetsPerTrigger": 50}
    return (ingest(spark, spec.url, "k.events", options, job="raw", storage_options=spec.storage_options)
            .option("checkpointLocation", str(checkpoint)).trigger(availableNow=True).start())


def _landed(table: Any) -> dict[tuple[int, int], bytes]:
    rows = table.refresh().to_arrow().to_pylist()
    keyed = {(r["partition"], r["offset"]): r["value"] for r in rows}
    assert len(keyed) == len(rows), "an offset landed twice"
    return keyed


# PostgreSQL with an S3 warehouse: the tasks write the bucket with the storage options the Spark
# options carry (this process has no AWS variables); the commit path is the sink's, tested on both.
@pytest.mark.parametrize("catalog_spec", ["sqlite", "postgres-s3"], indirect=True)
def test_every_offset_lands_once_in_root_commits_and_a_replay_adds_nothing(
    kafka_spark: SparkSession, kafka_broker: TansuBroker, kafka_topic_name: Callable[[], str],
    catalog_spec: Any, tmp_path: Path, request: pytest.FixtureRequest,
) -> None:
    s3 = request.getfixturevalue("s3_server") if catalog_spec.on_s3 else None
    topic = kafka_topic_name()
    kafka_broker.create_topic(topic, partitions=3)
    expected = produce_per_partition(kafka_broker, topic, [120, 0, 75])
    cat = catalog_spec.open()
    cat.create_namespace("k")
    table = cat.create_table("k.events", SCHEMA)

    start = s3.mark() if s3 is not None else 0
    q = _start(kafka_spark, kafka_broker, catalog_spec, topic, tmp_path / "ck")
    await_end(q, 180)
    assert q.exception() is None
    if s3 is not None:  # the tasks wrote the bucket under the files' final names, never listed or copied
        reqs = s3.requests(start)
        assert not [r for r in reqs if r.is_list or r.is_copy], summary([r for r in reqs if r.is_list or r.is_copy])
        put = {r.path.rsplit("/", 1)[1] for r in reqs if r.method == "PUT" and r.path.endswith(".parquet")}
        assert {f.path.rsplit("/", 1)[1] for f in table.refresh().files()} <= put
    assert _landed(table) == expected
    rows = table.to_arrow().to_pylist()
    assert {r["topic"] for r in rows} == {topic} and {r["note"] for r in rows} == {None}
    assert all(r["key"] is not None and r["timestamp"] is not None for r in rows)
    commits = [c for c in table.history() if c.job_id == "raw"]
    batches = sorted(c.batch_id for c in commits)
    assert batches == list(range(len(batches))) and len(batches) >= 4  # 195 records, 50 a trigger at most
    assert sum(c.added_rows for c in commits) == 195
    files = {f.path for f in table.files()}

    # The last batch committed in lakestep but not in Spark's commit log: Spark replays it, the
    # tasks read the same offsets and write them again, and the commit is recognised as a replay.
    last = max(batches)
    (tmp_path / "ck" / "commits" / str(last)).unlink()
    (tmp_path / "ck" / "commits" / f".{last}.crc").unlink(missing_ok=True)  # (Hadoop's checksum beside it)
    q = _start(kafka_spark, kafka_broker, catalog_spec, topic, tmp_path / "ck")
    await_end(q, 180)
    assert q.exception() is None
    assert [p["batchId"] for p in q.recentProgress if p["numInputRows"]] == [last]  # the replay ran
    assert _landed(table) == expected
    assert sorted(c.batch_id for c in table.history() if c.job_id == "raw") == batches
    assert {f.path for f in table.refresh().files()} == files
    stored = {Path(rel).name for rel in catalog_spec.files_under(catalog_spec.warehouse) if rel.endswith(".parquet")}
    assert stored == {Path(f).name for f in files}  # the replay's second copy was deleted

    # Schema changes between runs (issue 35): the restarted ingest writes the table's columns of now
    # (a dropped Kafka column is no longer written, a renamed one keeps its values); old rows read right.
    if catalog_spec.on_s3:  # (one backend: the storage is not the point, and the run costs a query)
        return
    table.drop_column("topic")
    table.rename_column("note", "remark")
    table.rename_column("timestamp", "ts")  # no Kafka column by that name any more: null from now on
    more = produce_per_partition(kafka_broker, topic, [0, 7, 0], tag="after")
    q = _start(kafka_spark, kafka_broker, catalog_spec, topic, tmp_path / "ck")
    await_end(q, 180)
    assert q.exception() is None
    assert _landed(table) == {**expected, **more}
    rows = table.to_arrow()
    assert rows.column_names == ["key", "value", "partition", "offset", "ts", "remark"]
    late = [r for r in rows.to_pylist() if r["value"].startswith(b"after")]
    assert len(late) == 7 and {r["ts"] for r in late} == {None}
    assert all(r["ts"] is not None for r in rows.to_pylist() if not r["value"].startswith(b"after"))


@pytest.mark.parametrize("catalog_spec", ["sqlite"], indirect=True)
@pytest.mark.parametrize(("fields", "named"), [
    ([("value", pa.binary()), ("amount", pa.int64(), False)], "amount"),  # no Kafka column, not nullable
    ([("value", pa.binary()), ("offset", pa.int32())], "offset"),  # a narrowing: long to int
    ([("amount", pa.int64())], "none of the Kafka columns"),
])
def test_a_table_the_kafka_columns_cannot_fill_is_refused_before_the_query_starts(
    kafka_spark: SparkSession, kafka_broker: TansuBroker, catalog_spec: Any, fields: list[Any], named: str,
) -> None:
    cat = catalog_spec.open()
    cat.create_namespace("k")
    cat.create_table("k.events", pa.schema([pa.field(*f) for f in fields]))
    with pytest.raises(SchemaMismatchError, match=named):
        ingest(kafka_spark, catalog_spec.url, "k.events",
               {"kafka.bootstrap.servers": kafka_broker.bootstrap_servers, "subscribe": "t"})


def test_row_format_tuples_is_refused_when_ingest_is_called(kafka_spark: SparkSession,
                                                             kafka_broker: TansuBroker) -> None:
    with pytest.raises(ValueError, match="rowFormat must be 'arrow', got 'tuples'"):
        ingest(kafka_spark, "sqlite:////nonexistent/catalog.db", "k.events",
               {"kafka.bootstrap.servers": kafka_broker.bootstrap_servers, "subscribe": "t", "rowFormat": "tuples"})


def test_a_sink_refuses_file_lists_written_for_another_table() -> None:
    def batch(staged: Any) -> pa.RecordBatch:
        return pa.RecordBatch.from_pydict({STAGED_COLUMN: [pickle.dumps(staged)]},
                                          pa.schema([(STAGED_COLUMN, pa.binary())]))

    ok = gather(iter([batch(StagedFiles(rows=3, table="k.events")), batch(StagedFiles(rows=2, table="k.events"))]),
                "k.events")
    assert ok.rows == 5
    with pytest.raises(SchemaMismatchError, match="k.other"):
        gather(iter([batch(StagedFiles(rows=1, table="k.other"))]), "k.events")
