"""docs/kafka.md's option table against the option parser, so that the two cannot drift:
every row's example is parsed for the queries the row names, refused rows must be refused
(naming the option), the others accepted; every option the parser knows has a row, and
every option of Spark's Kafka source has one."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import pytest

from lakestep.streaming.kafka import consumer_config
from lakestep.streaming.kafka import options as kafka_options
from lakestep.streaming.kafka.options import KafkaSourceOptions

DOC = Path(__file__).resolve().parents[2] / "docs" / "kafka.md"

#: Every option of the Structured Streaming + Kafka Integration Guide (Spark 4).
SPARK_OPTIONS = [
    "assign", "subscribe", "subscribePattern", "kafka.bootstrap.servers", "startingTimestamp",
    "startingOffsetsByTimestamp", "startingOffsets", "endingTimestamp", "endingOffsetsByTimestamp",
    "endingOffsets", "failOnDataLoss", "kafkaConsumer.pollTimeoutMs", "fetchOffset.numRetries",
    "fetchOffset.retryIntervalMs", "maxOffsetsPerTrigger", "minOffsetsPerTrigger", "maxTriggerDelay",
    "minPartitions", "maxRecordsPerPartition", "groupIdPrefix", "kafka.group.id", "includeHeaders",
    "startingOffsetsByTimestampStrategy",
    # kafka.* options Spark refuses
    "kafka.auto.offset.reset", "kafka.key.deserializer", "kafka.value.deserializer",
    "kafka.enable.auto.commit", "kafka.interceptor.classes",
]
VERDICTS = {"same", "different", "refused", "extra"}
SUBSCRIPTIONS = {"assign", "subscribe", "subscribepattern"}


@dataclass(frozen=True)
class Row:
    options: tuple[str, ...]
    queries: str
    example: str
    verdict: str


def _code(cell: str) -> list[str]:
    return re.findall(r"`([^`]+)`", cell)


def doc_rows() -> list[Row]:
    lines = DOC.read_text().splitlines()
    start = lines.index("| Option | Queries | Example | Verdict | lakestep-kafka |")
    rows = []
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        cells = [c.strip() for c in line.strip().strip("|").split(" | ")]
        assert len(cells) == 5, line
        names, queries, example, verdict = _code(cells[0]), cells[1], _code(cells[2]), cells[3]
        assert names and len(example) == 1, line
        assert queries in ("streaming", "batch", "both") and verdict in VERDICTS, line
        rows.append(Row(tuple(names), queries, example[0], verdict))
    return rows


ROWS = doc_rows()


def _parse(option: str, value: str, *, batch: bool) -> KafkaSourceOptions:
    base = {"kafka.bootstrap.servers": "localhost:9092"}
    if option.lower() not in SUBSCRIPTIONS:
        base["subscribe"] = "t"
    return KafkaSourceOptions.from_options({**base, option: value}, batch=batch)


@pytest.mark.parametrize("row", ROWS, ids=[r.options[0] for r in ROWS])
def test_doc_row_matches_the_parser(row: Row) -> None:
    for option in row.options:
        for batch in (False, True):
            applies = row.queries == "both" or row.queries == ("batch" if batch else "streaming")
            if row.verdict == "refused" or (not applies and row.queries == "batch"):
                with pytest.raises(ValueError) as info:
                    _parse(option, row.example, batch=batch)
                assert option.lower() in str(info.value).lower(), (option, batch, info.value)
            else:  # accepted; a streaming-only option is ignored by batch reads
                _parse(option, row.example, batch=batch)


def test_doc_has_a_row_for_every_option() -> None:
    documented = {name.lower() for row in ROWS for name in row.options}
    assert len(documented) == sum(len(row.options) for row in ROWS), "an option has two rows"
    parser = (
        (kafka_options._KNOWN_OPTIONS - {"path"})  # (the path Spark passes for load(path))
        | set(kafka_options._IGNORED_OPTIONS)
        | set(kafka_options._UNSUPPORTED_OPTIONS)
        | set(kafka_options._BATCH_ONLY)
        | kafka_options._STREAMING_ONLY
        | {f"kafka.{name}" for name in consumer_config._REFUSED}
    )
    assert sorted(parser - documented) == []
    assert sorted({o.lower() for o in SPARK_OPTIONS} - documented) == []


def test_min_offsets_per_trigger_and_max_trigger_delay_parse_like_spark() -> None:
    base = {"kafka.bootstrap.servers": "localhost:9092", "subscribe": "t"}
    default = KafkaSourceOptions.from_options({**base, "minOffsetsPerTrigger": "10"})
    assert default.min_offsets_per_trigger == 10 and default.max_trigger_delay_ms == 15 * 60_000
    for text, ms in [("500ms", 500), ("30s", 30_000), ("15m", 900_000), ("2min", 120_000), ("1h", 3_600_000),
                     ("1d", 86_400_000), ("250", 250), (" 3 S ", 3000)]:
        assert KafkaSourceOptions.from_options({**base, "maxTriggerDelay": text}).max_trigger_delay_ms == ms
    for options, message in [
        ({"maxTriggerDelay": "soon"}, "'maxTriggerDelay' must be a duration"),
        ({"maxTriggerDelay": "5 weeks"}, "'maxTriggerDelay' must be a duration"),
        ({"minOffsetsPerTrigger": "0"}, "'minOffsetsPerTrigger' must be a positive integer"),
        ({"minOffsetsPerTrigger": "11", "maxOffsetsPerTrigger": "10"}, "higher than 'maxOffsetsPerTrigger'"),
    ]:
        with pytest.raises(ValueError, match=message):
            KafkaSourceOptions.from_options({**base, **options})
    batch = KafkaSourceOptions.from_options({**base, "minOffsetsPerTrigger": "x"}, batch=True)
    assert batch.min_offsets_per_trigger is None  # streaming-only: ignored by batch reads, as Spark


def test_idle_poll_interval_parses_as_a_duration() -> None:
    base = {"kafka.bootstrap.servers": "localhost:9092", "subscribe": "t"}
    assert KafkaSourceOptions.from_options(base).idle_poll_interval_ms == 100
    for text, ms in [("0", 0), ("250ms", 250), ("2s", 2000), ("40", 40)]:
        assert KafkaSourceOptions.from_options({**base, "idlePollInterval": text}).idle_poll_interval_ms == ms
    with pytest.raises(ValueError, match="'idlePollInterval' must be a duration"):
        KafkaSourceOptions.from_options({**base, "idlePollInterval": "-5"})
    batch = KafkaSourceOptions.from_options({**base, "idlePollInterval": "x"}, batch=True)
    assert batch.idle_poll_interval_ms == 100  # streaming-only: ignored by batch reads


def test_batch_offsets_parse_like_spark() -> None:
    base = {"kafka.bootstrap.servers": "localhost:9092", "subscribe": "t"}
    batch = KafkaSourceOptions.from_options(base, batch=True)
    assert (batch.starting_offsets, batch.ending_offsets, batch.batch) == ("earliest", "latest", True)
    json_ends = KafkaSourceOptions.from_options(
        {**base, "startingOffsets": '{"t": {"0": 3, "1": -2}}', "endingOffsets": '{"t": {"0": 7, "1": -1}}'},
        batch=True,
    )
    assert json_ends.starting_offsets == {("t", 0): 3, ("t", 1): -2}
    assert json_ends.ending_offsets == {("t", 0): 7, ("t", 1): -1}
    for options, message in [
        ({"startingOffsets": "latest"}, "'startingOffsets' cannot be latest"),
        ({"startingOffsets": '{"t": {"0": -1}}'}, "'startingOffsets' cannot be latest"),
        ({"endingOffsets": "earliest"}, "'endingOffsets' cannot be earliest"),
        ({"endingOffsets": '{"t": {"0": -2}}'}, "'endingOffsets' cannot be earliest"),
        ({"endingOffsets": '{"u": {"0": 1}}'}, "'endingOffsets' names topic 'u'"),
    ]:
        with pytest.raises(ValueError, match=message):
            KafkaSourceOptions.from_options({**base, **options}, batch=True)


def test_timestamp_options_parse_like_spark() -> None:
    base = {"kafka.bootstrap.servers": "localhost:9092", "subscribe": "t"}
    parsed = KafkaSourceOptions.from_options({**base, "startingTimestamp": "1000"})
    assert (parsed.starting_timestamps, parsed.starting_timestamp_strategy) == (1000, "error")
    both = KafkaSourceOptions.from_options(  # startingTimestamp ranks first, as in Spark
        {**base, "startingTimestamp": "1000", "startingOffsetsByTimestamp": '{"t": {"0": 5}}',
         "startingOffsetsByTimestampStrategy": "LATEST"})
    assert (both.starting_timestamps, both.starting_timestamp_strategy) == (1000, "latest")
    per = KafkaSourceOptions.from_options({**base, "startingOffsetsByTimestamp": '{"t": {"0": 5, "1": 0}}'})
    assert per.starting_timestamps == {("t", 0): 5, ("t", 1): 0}
    ending = KafkaSourceOptions.from_options({**base, "endingOffsetsByTimestamp": '{"t": {"0": 9}}'}, batch=True)
    assert ending.ending_timestamps == {("t", 0): 9}
    for options, message in [
        ({"startingTimestamp": "yesterday"}, "'startingTimestamp' must be a timestamp"),
        ({"startingTimestamp": "-5"}, "'startingTimestamp' must be a timestamp"),
        ({"startingOffsetsByTimestamp": '{"t": {"0": -1}}'}, "'startingOffsetsByTimestamp' must be JSON"),
        ({"startingOffsetsByTimestamp": '{"u": {"0": 1}}'}, "'startingOffsetsByTimestamp' names topic 'u'"),
        ({"startingOffsetsByTimestampStrategy": "skip"}, "'error' or 'latest'"),
        ({"endingTimestamp": "5"}, "'endingTimestamp' is not supported.*streaming"),
    ]:
        with pytest.raises(ValueError, match=message):
            KafkaSourceOptions.from_options({**base, **options})
