"""Import kafka-python quietly: one helper for the Kafka source and the test broker.

This module imports nothing but the standard library, so
:mod:`lakestep.testing.kafka` can use it without pulling in pyspark.
"""

from __future__ import annotations

import sys
import warnings


def import_kafka_python() -> None:
    """Import kafka-python once with its import-time DeprecationWarning silenced
    (kafka-python 3 loads its protocol schemas with ``importlib.resources.read_text``,
    which warns on Python 3.11+ and fails test suites that turn warnings into errors)."""
    if "kafka.consumer" in sys.modules:
        return
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        import kafka  # noqa: F401
