"""Errors the ``lakestep-kafka`` source raises on purpose."""

from __future__ import annotations

from lakestep.errors import LakestepError


class KafkaSourceError(LakestepError):
    """Root of the errors the ``lakestep-kafka`` source raises on purpose.

    Plain option misuse raises :class:`ValueError` instead (naming the option).
    """


class KafkaTopicNotFoundError(KafkaSourceError, ValueError):
    """A topic named in ``subscribe`` does not exist on the cluster."""


class KafkaDataLossError(KafkaSourceError):
    """Offsets the query needs are no longer (or not yet) in the log."""


class KafkaSourceTimeoutError(KafkaSourceError, TimeoutError):
    """The broker did not answer, or a partition made no progress, in time."""

