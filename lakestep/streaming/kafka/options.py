"""Option parsing: Spark's ``kafka.*`` options to kafka-python settings, and the
source's own options (pure functions, no network)."""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Union

from .errors import KafkaOptionError
from .kafka_python import import_kafka_python as _import_kafka_python

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

_SECRET_KEYS = frozenset({"sasl_plain_password", "ssl_password"})

#: Java-client / librdkafka option names whose kafka-python name is not simply
#: the dotted name with dots replaced by underscores.
_RENAMED: dict[str, str] = {
    "ssl.key.password": "ssl_password",
    "ssl.cipher.suites": "ssl_ciphers",
    "ssl.ca.location": "ssl_cafile",
    "ssl.certificate.location": "ssl_certfile",
    "ssl.key.location": "ssl_keyfile",
    "ssl.crl.location": "ssl_crlfile",
    "sasl.username": "sasl_plain_username",
    "sasl.password": "sasl_plain_password",
    "socket.receive.buffer.bytes": "receive_buffer_bytes",
    "socket.send.buffer.bytes": "send_buffer_bytes",
    "receive.buffer.bytes": "receive_buffer_bytes",
    "send.buffer.bytes": "send_buffer_bytes",
    "max.poll.records": "max_poll_records",
}

#: Spark passes ``kafka.group.id`` to its consumers (it names them in broker ACLs and logs);
#: this source fetches by partition and joins no group, so it is accepted and not used.
_ACCEPTED_UNUSED = {"group.id"}

_GROUP_KEYS = {
    "group.instance.id",
    "enable.auto.commit",
    "auto.commit.interval.ms",
    "session.timeout.ms",
    "heartbeat.interval.ms",
    "max.poll.interval.ms",
    "partition.assignment.strategy",
}

#: Options refused with an explanation, by Java/dotted name.
_REFUSED: dict[str, str] = {
    **{
        key: "the source never joins a consumer group nor commits offsets to Kafka "
        "(offsets live in the Spark checkpoint)"
        for key in _GROUP_KEYS
    },
    "auto.offset.reset": "use the startingOffsets option instead",
    "key.deserializer": "key and value are always returned as binary",
    "value.deserializer": "key and value are always returned as binary",
    "allow.auto.create.topics": "the source never creates topics",
    "consumer.timeout.ms": "use kafkaConsumer.pollTimeoutMs instead",
    "ssl.truststore.location": "kafka-python cannot read JKS/PKCS12 stores; convert it to PEM and "
    "pass kafka.ssl.cafile",
    "ssl.truststore.password": "kafka-python cannot read JKS/PKCS12 stores; use kafka.ssl.cafile",
    "ssl.truststore.type": "kafka-python cannot read JKS/PKCS12 stores; use kafka.ssl.cafile",
    "ssl.keystore.location": "kafka-python cannot read JKS/PKCS12 stores; convert it to PEM and "
    "pass kafka.ssl.certfile and kafka.ssl.keyfile",
    "ssl.keystore.password": "kafka-python cannot read JKS/PKCS12 stores; use kafka.ssl.keyfile "
    "and kafka.ssl.password",
    "ssl.keystore.type": "kafka-python cannot read JKS/PKCS12 stores; use kafka.ssl.certfile",
}

#: kafka-python parameters that are not plain values and cannot come from a string option.
_NOT_STRING_SETTABLE = frozenset(
    {
        "kafka_client",
        "selector",
        "socket_options",
        "metric_reporters",
        "default_offset_commit_callback",
        "sasl_oauth_token_provider",
        "ssl_context",
        "partition_assignment_strategy",
    }
)

_INT_WITHOUT_DEFAULT = frozenset({"receive_buffer_bytes", "send_buffer_bytes"})

_JAAS_MODULES = {
    "org.apache.kafka.common.security.plain.PlainLoginModule",
    "org.apache.kafka.common.security.scram.ScramLoginModule",
}
_JAAS_RE = re.compile(r"^\s*([\w.$]+)\s+(required|requisite|sufficient|optional)\s+(.*?);?\s*$", re.S)
_JAAS_ARG_RE = re.compile(r'(\w+)\s*=\s*"((?:[^"\\]|\\.)*)"')


def _parse_bool(option: str, value: str) -> bool:
    lowered = str(value).strip().lower()
    if lowered in ("true", "1", "yes"):
        return True
    if lowered in ("false", "0", "no"):
        return False
    raise KafkaOptionError(f"option {option!r} must be true or false, got {value!r}", option=option)


def _parse_jaas(value: str) -> dict[str, str]:
    match = _JAAS_RE.match(value)
    if not match or match.group(1) not in _JAAS_MODULES:
        raise KafkaOptionError(
            "option 'kafka.sasl.jaas.config' is only understood for PlainLoginModule and "
            "ScramLoginModule (username=\"...\" password=\"...\"); set "
            "kafka.sasl.plain.username / kafka.sasl.plain.password instead",
            option="kafka.sasl.jaas.config"
        )
    args = {k: v.replace('\\"', '"').replace("\\\\", "\\") for k, v in _JAAS_ARG_RE.findall(match.group(3))}
    if "username" not in args or "password" not in args:
        raise KafkaOptionError(
            "option 'kafka.sasl.jaas.config' must contain username=\"...\" and password=\"...\"",
            option="kafka.sasl.jaas.config"
        )
    return {"sasl_plain_username": args["username"], "sasl_plain_password": args["password"]}


def kafka_consumer_config(options: Mapping[str, Any]) -> dict[str, Any]:
    """Map the ``kafka.*`` Spark options to kafka-python ``KafkaConsumer`` keyword args.

    Pure function (no network). Keys are matched case-insensitively; other
    options (not starting with ``kafka.``) are ignored. The mapping:

    * ``kafka.a.b.c`` → ``a_b_c`` when that is a ``KafkaConsumer`` parameter,
      e.g. ``kafka.bootstrap.servers`` → ``bootstrap_servers``,
      ``kafka.security.protocol`` → ``security_protocol``,
      ``kafka.sasl.mechanism`` → ``sasl_mechanism``,
      ``kafka.sasl.plain.username`` → ``sasl_plain_username``,
      ``kafka.ssl.cafile`` → ``ssl_cafile``, ``kafka.request.timeout.ms`` →
      ``request_timeout_ms``, ``kafka.isolation.level`` → ``isolation_level``.
    * Java / librdkafka names with another kafka-python name: ``ssl.key.password``
      → ``ssl_password``, ``ssl.cipher.suites`` → ``ssl_ciphers``,
      ``ssl.ca.location`` / ``ssl.certificate.location`` / ``ssl.key.location`` /
      ``ssl.crl.location`` → ``ssl_cafile`` / ``ssl_certfile`` / ``ssl_keyfile`` /
      ``ssl_crlfile``, ``sasl.username`` / ``sasl.password`` →
      ``sasl_plain_username`` / ``sasl_plain_password``,
      ``[socket.]receive|send.buffer.bytes`` → ``receive|send_buffer_bytes``.
    * ``ssl.endpoint.identification.algorithm`` → ``ssl_check_hostname``
      (``https`` → True, empty → False; any other value is refused).
    * ``sasl.jaas.config`` with Kafka's ``PlainLoginModule`` / ``ScramLoginModule``
      → ``sasl_plain_username`` + ``sasl_plain_password``.
    * ``api.version`` ``"2.8.0"`` → ``api_version=(2, 8, 0)``.

    Values are converted to the type of kafka-python's default (int, bool).

    Raises:
        KafkaOptionError: a ValueError naming the option, for unknown names, consumer-group settings
            (``enable.auto.commit``...; ``group.id`` is accepted and unused), ``auto.offset.reset``,
            deserializers, JKS key/trust stores, unparsable values, or a missing (or empty)
            ``kafka.bootstrap.servers``. Secret values never appear in messages.
    """
    _import_kafka_python()
    from kafka import KafkaConsumer

    defaults = KafkaConsumer.DEFAULT_CONFIG
    config: dict[str, Any] = {}
    sources: dict[str, str] = {}

    def put(key: str, value: Any, option: str) -> None:
        if key in config and sources[key] != option:
            raise KafkaOptionError(f"options {sources[key]!r} and {option!r} both set kafka-python {key!r}",
                                   option=option)
        config[key] = value
        sources[key] = option

    for raw_key, raw_value in options.items():
        option = str(raw_key)
        lowered = option.lower()
        if not lowered.startswith("kafka."):
            continue
        name = lowered[len("kafka.") :]
        value = "" if raw_value is None else str(raw_value)
        if name in _REFUSED:
            raise KafkaOptionError(f"option {option!r} is not supported: {_REFUSED[name]}", option=option)
        if name in _ACCEPTED_UNUSED:
            continue
        if name == "sasl.jaas.config":
            for key, val in _parse_jaas(value).items():
                put(key, val, option)
            continue
        if name == "ssl.endpoint.identification.algorithm":
            algorithm = value.strip().lower()
            if algorithm not in ("https", ""):  # kafka-python checks the host name, or does not: nothing else
                raise KafkaOptionError(f"option {option!r} must be 'https' (check the broker's host name) or empty "
                                       f"(do not), got {value!r}", option=option)
            put("ssl_check_hostname", algorithm == "https", option)
            continue
        key = _RENAMED.get(name, name.replace(".", "_").replace("-", "_"))
        if key not in defaults:
            raise KafkaOptionError(
                f"option {option!r} is not a kafka-python KafkaConsumer setting "
                f"(it maps to {key!r}); see lakestep.streaming.kafka.kafka_consumer_config",
                option=option
            )
        if key in _NOT_STRING_SETTABLE or key in {
            "group_id",
            "group_instance_id",
            "enable_auto_commit",
            "auto_offset_reset",
            "key_deserializer",
            "value_deserializer",
            "allow_auto_create_topics",
            "consumer_timeout_ms",
        } | {k.replace(".", "_") for k in _GROUP_KEYS}:
            raise KafkaOptionError(f"option {option!r} ({key}) cannot be set on this source", option=option)
        default = defaults[key]
        shown = "***" if key in _SECRET_KEYS else repr(value)
        try:
            converted: Any
            if isinstance(default, bool):
                converted = _parse_bool(option, value)
            elif isinstance(default, int) or key in _INT_WITHOUT_DEFAULT:
                converted = int(value.strip())
            elif key == "api_version":
                converted = tuple(int(part) for part in value.strip().split("."))
            else:
                converted = value
        except ValueError as exc:
            raise KafkaOptionError(f"option {option!r} has an invalid value {shown}: {exc}", option=option) from None
        put(key, converted, option)

    servers = [s.strip() for s in str(config.get("bootstrap_servers", "")).split(",") if s.strip()]
    if not servers:  # absent, empty, or only commas
        raise KafkaOptionError("option 'kafka.bootstrap.servers' is required (comma-separated host:port)",
                               option="kafka.bootstrap.servers")
    config["bootstrap_servers"] = servers
    return config


def redact(config: Mapping[str, Any]) -> dict[str, Any]:
    """``config`` with secrets replaced by ``***`` (for logs)."""
    return {k: ("***" if k in _SECRET_KEYS and v is not None else v) for k, v in config.items()}


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
    return _parse_bool("includeHeaders", str(opts.get("includeheaders", "false")))


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
        fail_on_data_loss = _parse_bool("failOnDataLoss", str(opts.get("failondataloss", "true")))
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
            include_headers=_parse_bool("includeHeaders", str(opts.get("includeheaders", "false"))),
            poll_timeout_ms=_positive_int(opts, "kafkaConsumer.pollTimeoutMs", 120_000) or 120_000,
            fetch_offset_timeout_ms=_positive_int(opts, "fetchOffset.timeoutMs", 60_000) or 60_000,
            row_format="arrow" if row_format == "arrow" else "tuples",
        )

