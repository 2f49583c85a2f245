"""Errors the ``lakestep-kafka`` source raises on purpose."""

from __future__ import annotations

from typing import Any

from lakestep.errors import LakestepError


class KafkaSourceError(LakestepError):
    """Root of the errors the ``lakestep-kafka`` source raises on purpose.

    Option misuse raises :class:`KafkaOptionError`, which is also a :class:`ValueError`.
    """


class KafkaOptionError(KafkaSourceError, ValueError):
    """An option the source does not accept: unknown, unsupported, of the wrong form, in
    conflict with another, or missing (the message names it and says what is expected;
    secret values never appear). Also a user-specified schema, or a batch read of a
    streaming-only format. ``option`` is the option's name as the message gives it
    (``"schema"`` for the schema; None when no one option is at fault). Nothing was read.
    """

    def __init__(self, message: str, *, option: str | None) -> None:
        super().__init__(message)
        self.option = option

    def __reduce__(self) -> tuple[Any, ...]:  # picklable across processes (keyword-only facts)
        return (_rebuild_option_error, (type(self), str(self), self.option))


def _rebuild_option_error(cls: type[KafkaOptionError], message: str, option: str | None) -> KafkaOptionError:
    return cls(message, option=option)


class KafkaTopicNotFoundError(KafkaSourceError, ValueError):
    """A topic named in ``subscribe`` does not exist on the cluster."""


class KafkaDataLossError(KafkaSourceError):
    """Offsets the query needs are no longer (or not yet) in the log."""


class KafkaSourceTimeoutError(KafkaSourceError, TimeoutError):
    """The broker did not answer, or a partition made no progress, in time."""


class KafkaDecodeError(KafkaSourceError):
    """A record batch could not be decoded: corrupt bytes (a CRC or framing error), a
    codec that is unknown or whose library is not installed, a compressed payload that
    does not decompress. Names where it is: ``topic``, ``partition`` and ``offset`` (the
    base offset of the batch when it is known, else the offset the read had reached).

    Not data loss: ``failOnDataLoss=false`` does not skip such a batch.
    """

    def __init__(self, topic: str, partition: int, offset: int, reason: str) -> None:
        self.topic = topic
        self.partition = partition
        self.offset = offset
        self.reason = reason
        super().__init__(
            f"cannot decode the Kafka record batch at offset {offset} of topic {topic!r} partition "
            f"{partition}: {reason}"
        )

    def __reduce__(self) -> tuple[type, tuple[str, int, int, str]]:
        return (type(self), (self.topic, self.partition, self.offset, self.reason))


def describe(exc: BaseException) -> str:
    """``Type: message`` of ``exc``; a type from a library is named with its package
    (``snappy.UncompressError``: some codec errors have an empty message)."""
    package = type(exc).__module__.split(".")[0]
    name = type(exc).__name__ if package in ("builtins", "kafka", "lakestep") else f"{package}.{type(exc).__name__}"
    text = str(exc)
    return f"{name}: {text}" if text else name


class KafkaTimestampNotFoundError(KafkaSourceError, ValueError):
    """No record at or after ``timestamp`` (ms since the epoch) in ``topic`` ``partition``,
    for ``option`` (``startingTimestamp`` / ``startingOffsetsByTimestamp``) with
    ``startingOffsetsByTimestampStrategy=error`` (the default, as in Spark)."""

    def __init__(self, option: str, topic: str, partition: int, timestamp: int) -> None:
        self.option = option
        self.topic = topic
        self.partition = partition
        self.timestamp = timestamp
        super().__init__(
            f"option {option!r}: no record of topic {topic!r} partition {partition} has a timestamp at or after "
            f"{timestamp}; set startingOffsetsByTimestampStrategy=latest to start at the end of such partitions"
        )

    def __reduce__(self) -> tuple[type, tuple[str, str, int, int]]:
        return (type(self), (self.option, self.topic, self.partition, self.timestamp))
