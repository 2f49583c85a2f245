"""Option parsing: the source's own options (pure functions, no network). Spark's
``kafka.*`` options map to kafka-python settings in consumer_config.py."""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Union

from .consumer_config import kafka_consumer_config, parse_bool
from .errors import KafkaOptionError

logger = logging.getLogger(__name__)

FORMAT_NAME = "lakestep-kafka"
EARLIEST = -2
LATEST = -1

#: A Kafka partition as ``(topic, partition)``.
TP = tuple[str, int]
#: Offsets per partition.
Offsets = dict[TP, int]
#: ``startingOffsets``: ``"earliest"``, ``"latest"`` or explicit offsets (-2/-1 allowed).
StartingOffsets = Union[Literal["earliest", "latest"], Offsets]


def parse_starting_offsets(
    value: str | None,
    topics: Sequence[str] | None,
    *,
    name: str = "startingOffsets",
    default: Literal["earliest", "latest"] = "latest",
) -> StartingOffsets:
    """Parse ``startingOffsets`` (or ``endingOffsets``, ``name``): ``earliest``, ``latest``
    or Spark's JSON form (``default`` when not given).

    JSON partitions are not checked against the cluster here (that happens when
    the query starts: every partition of the subscribed topics must be listed).

    Raises:
        KafkaOptionError: a ValueError naming the option.
    """
    if value is None or not str(value).strip():
        return default
    text = str(value).strip()
    if text.lower() in ("earliest", "latest"):
        return "earliest" if text.lower() == "earliest" else "latest"
    try:
        parsed = json.loads(text)
    except json.JSONDecodeError:
        raise KafkaOptionError(
            f"option {name!r} must be 'earliest', 'latest' or JSON like "
            f'{{"topic": {{"0": 23, "1": -2}}}}, got {text!r}',
            option=name
        ) from None
    if not isinstance(parsed, dict) or not parsed:
        raise KafkaOptionError(f"option {name!r} JSON must be a non-empty object of topics", option=name)
    result: Offsets = {}
    for topic, parts in parsed.items():
        if topics is not None and topic not in topics:
            raise KafkaOptionError(
                f"option {name!r} names topic {topic!r}, which is not subscribed "
                f"(subscribe={','.join(topics)!r})",
                option=name
            )
        if not isinstance(parts, dict) or not parts:
            raise KafkaOptionError(
                f"option {name!r}: topic {topic!r} needs an object of partition: offset",
                option=name
            )
        for part, offset in parts.items():
            try:
                partition = int(part)
            except (TypeError, ValueError):
                raise KafkaOptionError(
                    f"option {name!r}: partition {part!r} of topic {topic!r} is not "
                    "an integer",
                    option=name
                ) from None
            if isinstance(offset, bool) or not isinstance(offset, int) or offset < EARLIEST:
                raise KafkaOptionError(
                    f"option {name!r}: offset {offset!r} of {topic}-{partition} must "
                    "be an integer >= 0, or -2 (earliest) / -1 (latest)",
                    option=name
                )
            if partition < 0:
                raise KafkaOptionError(f"option {name!r}: negative partition {partition}", option=name)
            result[(topic, partition)] = offset
    return result


_SUBSCRIPTIONS = ("subscribe", "subscribepattern", "assign")


def _parse_subscription(
    opts: Mapping[str, Any],
) -> tuple[tuple[str, ...], re.Pattern[str] | None, tuple[TP, ...] | None]:
    """Exactly one of ``subscribe``, ``subscribePattern``, ``assign``: (topics, pattern, assign).

    Raises:
        KafkaOptionError: a ValueError naming the option.
    """
    given = [name for name in _SUBSCRIPTIONS if str(opts.get(name) or "").strip()]
    if len(given) != 1:
        raise KafkaOptionError(
            "exactly one of the options 'subscribe' (comma-separated topic names), 'subscribePattern' "
            "(a regular expression) and 'assign' (JSON like {\"topicA\": [0, 1]}) is required"
            + (f"; got {', '.join(given)}" if given else ""),
            option=None
        )
    value = str(opts[given[0]]).strip()
    if given[0] == "subscribe":
        topics = tuple(dict.fromkeys(t.strip() for t in value.split(",") if t.strip()))
        if not topics:
            raise KafkaOptionError("option 'subscribe' is required (comma-separated topic names)", option="subscribe")
        return topics, None, None
    if given[0] == "subscribepattern":
        try:
            return (), re.compile(value), None
        except re.error as exc:
            raise KafkaOptionError(f"option 'subscribePattern' is not a valid regular expression: {exc}",
                                   option="subscribePattern") from None
    try:
        parsed = json.loads(value)
    except json.JSONDecodeError:
        parsed = None
    if not isinstance(parsed, dict) or not parsed or not all(
        isinstance(parts, list) and parts and all(isinstance(p, int) and not isinstance(p, bool) and p >= 0
                                                  for p in parts)
        for parts in parsed.values()
    ):
        raise KafkaOptionError(
            f'option \'assign\' must be JSON like {{"topicA": [0, 1], "topicB": [2, 4]}}, got {value!r}',
            option="assign"
        )
    assign = tuple(sorted({(str(topic), int(p)) for topic, parts in parsed.items() for p in parts}))
    return tuple(sorted(parsed)), None, assign


def _positive_int(options: Mapping[str, Any], name: str, default: int | None) -> int | None:
    raw = options.get(name.lower())
    if raw is None or str(raw).strip() == "":
        return default
    try:
        value = int(str(raw).strip())
    except ValueError:
        raise KafkaOptionError(f"option {name!r} must be a positive integer, got {raw!r}", option=name) from None
    if value <= 0:
        raise KafkaOptionError(f"option {name!r} must be a positive integer, got {raw!r}", option=name)
    return value


def check_common_options(options: Mapping[str, Any]) -> bool:
    """Check the options streaming queries and batch reads share (``kafka.*``, the
    subscription); returns ``includeHeaders`` (what the schema depends on).

    Raises:
        KafkaOptionError: a ValueError naming the option.
    """
    opts = {str(k).lower(): v for k, v in options.items()}
    kafka_consumer_config(opts)
    _parse_subscription(opts)
    return parse_bool("includeHeaders", str(opts.get("includeheaders", "false")))


_KNOWN_OPTIONS = {
    "subscribe",
    "subscribepattern",
    "assign",
    "startingoffsets",
    "startingtimestamp",
    "startingoffsetsbytimestamp",
    "startingoffsetsbytimestampstrategy",
    "maxoffsetspertrigger",
    "minoffsetspertrigger",
    "maxtriggerdelay",
    "idlepollinterval",
    "minpartitions",
    "maxrecordsperpartition",
    "includeheaders",
    "failondataloss",
    "kafkaconsumer.polltimeoutms",
    "fetchoffset.timeoutms",
    "rowformat",
    "path",
}
#: Spark options accepted (validated) and not used, and why (docs/kafka.md).
_IGNORED_OPTIONS = {
    "fetchoffset.numretries": "offset lookups are bounded by fetchOffset.timeoutMs instead of retried",
    "fetchoffset.retryintervalms": "offset lookups are bounded by fetchOffset.timeoutMs instead of retried",
    "groupidprefix": "the source joins no consumer group (offsets live in the Spark checkpoint)",
}
#: Options of Spark's streaming source only: ignored by batch reads (as Spark does).
_STREAMING_ONLY = {"maxoffsetspertrigger", "minoffsetspertrigger", "maxtriggerdelay", "idlepollinterval"}
#: Options of Spark's batch reads only: refused by streaming queries (as Spark does).
#: (Keys lowercased, as Spark hands options over; values: the option as documented, and why.)
_BATCH_ONLY: dict[str, tuple[str, str]] = {
    "endingoffsets": ("endingOffsets", "it is not valid for streaming queries"),
    "endingoffsetsbytimestamp": ("endingOffsetsByTimestamp", "it is not valid for streaming queries"),
    "endingtimestamp": ("endingTimestamp", "it is not valid for streaming queries"),
}
_UNSUPPORTED_OPTIONS: dict[str, tuple[str, str]] = {
    "maxpartitions": ("maxPartitions", "use minPartitions (ranges are split, never merged)"),
}


_TIME_UNITS_MS = {"us": 0.001, "ms": 1, "s": 1000, "m": 60_000, "min": 60_000, "h": 3_600_000, "d": 86_400_000}
_TIME_RE = re.compile(r"^([0-9]+)\s*([a-z]+)?$")
DEFAULT_MAX_TRIGGER_DELAY_MS = 15 * 60_000
#: ``idlePollInterval`` (lakestep-kafka only): after a trigger that found nothing new, the next
#: asks the cluster no sooner than this after the last ask (0: as often as Spark triggers)
DEFAULT_IDLE_POLL_INTERVAL_MS = 100


def parse_duration_ms(name: str, value: Any) -> int:
    """A duration as Spark writes them (``JavaUtils.timeStringAsMs``): ``500ms``, ``30s``,
    ``15m`` / ``15min``, ``2h``, ``1d``, ``100us``; a bare number is milliseconds.

    Raises:
        KafkaOptionError: a ValueError naming the option.
    """
    match = _TIME_RE.match(str(value).strip().lower())
    unit = (match.group(2) or "ms") if match else None
    if match is None or unit not in _TIME_UNITS_MS:
        raise KafkaOptionError(
            f"option {name!r} must be a duration like '30s', '15m', '500ms' (units us, ms, s, m, min, h, d), "
            f"got {value!r}",
            option=name
        )
    return int(int(match.group(1)) * _TIME_UNITS_MS[unit])


def _duration_ms(options: Mapping[str, Any], name: str, default: int) -> int:
    """Option ``name`` (case-insensitive keys) as a duration in ms, ``default`` when absent."""
    raw = options.get(name.lower())
    return default if raw is None else parse_duration_ms(name, raw)


def _non_negative_int(options: Mapping[str, Any], name: str) -> None:
    raw = options.get(name.lower())
    try:
        if raw is not None and int(str(raw).strip()) >= 0:
            return
    except ValueError:
        pass
    if raw is not None:
        raise KafkaOptionError(f"option {name!r} must be an integer >= 0, got {raw!r}", option=name)


#: A timestamp for every partition (``startingTimestamp``), or per partition (``...ByTimestamp``).
Timestamps = Union[int, Offsets, None]


def _parse_timestamps(
    opts: Mapping[str, Any], single: str, per_partition: str, topics: Sequence[str] | None
) -> Timestamps:
    """``startingTimestamp`` / ``startingOffsetsByTimestamp`` (or the ending pair): the first
    one given, as Spark ranks them (ms since the epoch, >= 0).

    Raises:
        KafkaOptionError: a ValueError naming the option.
    """
    raw = opts.get(single.lower())
    if raw is not None and str(raw).strip():
        try:
            value = int(str(raw).strip())
        except ValueError:
            value = -1
        if value < 0:
            raise KafkaOptionError(
                f"option {single!r} must be a timestamp in milliseconds since the epoch, got {raw!r}", option=single)
        return value
    raw = opts.get(per_partition.lower())
    if raw is None or not str(raw).strip():
        return None
    try:  # JSON only: 'earliest' / 'latest' are no timestamps (refused below, with this option's own message)
        json.loads(str(raw))
    except json.JSONDecodeError:
        parsed: StartingOffsets | None = None
    else:
        parsed = parse_starting_offsets(str(raw), topics, name=per_partition)
    if not isinstance(parsed, dict) or any(ts < 0 for ts in parsed.values()):
        raise KafkaOptionError(
            f"option {per_partition!r} must be JSON like {{\"topic\": {{\"0\": 1700000000000}}}} "
            f"(ms since the epoch, >= 0), got {raw!r}",
            option=per_partition
        )
    return parsed


@dataclass(frozen=True)
class KafkaSourceOptions:
    """Validated source options (see the module docstring)."""

    #: ``subscribe``: the topics; ``assign``: the topics of the assigned partitions;
    #: ``subscribePattern``: empty (the topics are those matching at each trigger)
    topics: tuple[str, ...]
    consumer_config: dict[str, Any] = field(repr=False)
    #: ``subscribePattern``, compiled (matched against whole topic names, as Java's ``matches``)
    pattern: re.Pattern[str] | None = None
    #: ``assign``: exactly these partitions
    assign: tuple[TP, ...] | None = None
    fail_on_data_loss: bool = True
    starting_offsets: StartingOffsets = "latest"
    #: batch reads: ``endingOffsets`` (``latest`` or offsets; -1 = latest)
    ending_offsets: StartingOffsets = "latest"
    #: ``startingTimestamp`` (one for every partition) or ``startingOffsetsByTimestamp``
    #: (per partition), in ms since the epoch; before ``startingOffsets`` when set
    starting_timestamps: Timestamps = None
    #: ``startingOffsetsByTimestampStrategy``: no record at or after the timestamp
    starting_timestamp_strategy: Literal["error", "latest"] = "error"
    #: batch reads: ``endingTimestamp`` / ``endingOffsetsByTimestamp``; before ``endingOffsets``
    ending_timestamps: Timestamps = None
    #: the options of a batch read (``spark.read``)
    batch: bool = False
    max_offsets_per_trigger: int | None = None
    #: ``minOffsetsPerTrigger``: a trigger waits for this many new offsets, at most ``max_trigger_delay_ms``
    min_offsets_per_trigger: int | None = None
    max_trigger_delay_ms: int = DEFAULT_MAX_TRIGGER_DELAY_MS
    #: ``idlePollInterval``: the least time between two asks of the cluster while idle
    idle_poll_interval_ms: int = DEFAULT_IDLE_POLL_INTERVAL_MS
    min_partitions: int | None = None
    #: ``maxRecordsPerPartition``: no task reads more offsets of a partition (before ``minPartitions``)
    max_records_per_partition: int | None = None
    include_headers: bool = False
    poll_timeout_ms: int = 120_000
    fetch_offset_timeout_ms: int = 60_000
    row_format: Literal["arrow", "tuples"] = "arrow"

    @classmethod
    def from_options(cls, options: Mapping[str, Any], *, batch: bool = False) -> KafkaSourceOptions:
        """Validate Spark's (case-insensitive) option map, for a streaming query or (``batch``)
        a batch read. docs/kafka.md compares every option with Spark's Kafka source.

        Raises:
            KafkaOptionError: a ValueError naming the offending option.
        """
        opts = {str(k).lower(): v for k, v in options.items()}
        consumer_config = kafka_consumer_config(opts)
        if not batch:
            for key, (name, why) in _BATCH_ONLY.items():
                if key in opts:
                    raise KafkaOptionError(f"option {name!r} is not supported by {FORMAT_NAME}: {why}", option=name)
        for key, (name, why) in _UNSUPPORTED_OPTIONS.items():
            if key in opts:
                raise KafkaOptionError(f"option {name!r} is not supported by {FORMAT_NAME}: {why}", option=name)
        _non_negative_int(opts, "fetchOffset.numRetries")
        _non_negative_int(opts, "fetchOffset.retryIntervalMs")
        if batch:
            opts = {k: v for k, v in opts.items() if k not in _STREAMING_ONLY}
        known = _KNOWN_OPTIONS | set(_IGNORED_OPTIONS) | set(_BATCH_ONLY) | _STREAMING_ONLY
        unknown = sorted(k for k in opts if not k.startswith("kafka.") and k not in known)
        if unknown:
            logger.warning("%s ignores unknown options %s", FORMAT_NAME, unknown)

        topics, pattern, assign = _parse_subscription(opts)
        fail_on_data_loss = parse_bool("failOnDataLoss", str(opts.get("failondataloss", "true")))
        row_format = str(opts.get("rowformat", "arrow")).strip().lower()
        if row_format not in ("arrow", "tuples"):
            raise KafkaOptionError(f"option 'rowFormat' must be 'arrow' or 'tuples', got {row_format!r}",
                                   option="rowFormat")

        max_offsets = _positive_int(opts, "maxOffsetsPerTrigger", None)
        min_offsets = _positive_int(opts, "minOffsetsPerTrigger", None)
        if min_offsets is not None and max_offsets is not None and min_offsets > max_offsets:
            raise KafkaOptionError(
                f"option 'minOffsetsPerTrigger' ({min_offsets}) is higher than 'maxOffsetsPerTrigger' ({max_offsets})",
                option="minOffsetsPerTrigger"
            )
        max_trigger_delay_ms = _duration_ms(opts, "maxTriggerDelay", DEFAULT_MAX_TRIGGER_DELAY_MS)
        idle_poll_interval_ms = _duration_ms(opts, "idlePollInterval", DEFAULT_IDLE_POLL_INTERVAL_MS)

        subscribed = topics if pattern is None else None
        starting = parse_starting_offsets(
            opts.get("startingoffsets"), subscribed, default="earliest" if batch else "latest"
        )
        starting_ts = _parse_timestamps(opts, "startingTimestamp", "startingOffsetsByTimestamp", subscribed)
        strategy = str(opts.get("startingoffsetsbytimestampstrategy", "error")).strip().lower()
        if strategy not in ("error", "latest"):
            raise KafkaOptionError(
                f"option 'startingOffsetsByTimestampStrategy' must be 'error' or 'latest', got {strategy!r}",
                option="startingOffsetsByTimestampStrategy"
            )
        ending_ts = _parse_timestamps(opts, "endingTimestamp", "endingOffsetsByTimestamp", subscribed)
        ending: StartingOffsets = "latest"
        if batch:
            if starting == "latest" or (isinstance(starting, dict) and LATEST in starting.values()):
                raise KafkaOptionError(
                    "option 'startingOffsets' cannot be latest (-1) in a batch read (as in Spark): "
                    "use earliest, or offsets",
                    option="startingOffsets"
                )
            ending = parse_starting_offsets(opts.get("endingoffsets"), subscribed, name="endingOffsets")
            if ending == "earliest" or (isinstance(ending, dict) and EARLIEST in ending.values()):
                raise KafkaOptionError(
                    "option 'endingOffsets' cannot be earliest (-2) in a batch read (as in Spark): "
                    "use latest, or offsets",
                    option="endingOffsets"
                )

        return cls(
            topics=topics,
            pattern=pattern,
            assign=assign,
            fail_on_data_loss=fail_on_data_loss,
            consumer_config=consumer_config,
            starting_offsets=starting,
            ending_offsets=ending,
            starting_timestamps=starting_ts,
            starting_timestamp_strategy="latest" if strategy == "latest" else "error",
            ending_timestamps=ending_ts,
            batch=batch,
            max_offsets_per_trigger=max_offsets,
            min_offsets_per_trigger=min_offsets,
            max_trigger_delay_ms=max_trigger_delay_ms,
            idle_poll_interval_ms=idle_poll_interval_ms,
            min_partitions=_positive_int(opts, "minPartitions", None),
            max_records_per_partition=_positive_int(opts, "maxRecordsPerPartition", None),
            include_headers=parse_bool("includeHeaders", str(opts.get("includeheaders", "false"))),
            poll_timeout_ms=_positive_int(opts, "kafkaConsumer.pollTimeoutMs", 120_000) or 120_000,
            fetch_offset_timeout_ms=_positive_int(opts, "fetchOffset.timeoutMs", 60_000) or 60_000,
            row_format="arrow" if row_format == "arrow" else "tuples",
        )

