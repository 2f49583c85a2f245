"""The ``kafka.*`` options to kafka-python's ``KafkaConsumer`` settings: Java and
librdkafka names, security (SASL's JAAS config, SSL), settings refused on a source that
joins no consumer group, and secrets redacted for logs (pure functions, no network; the
source's own options are options.py's)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from .errors import KafkaOptionError
from .kafka_python import import_kafka_python as _import_kafka_python

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


def parse_bool(option: str, value: str) -> bool:
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
                converted = parse_bool(option, value)
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
