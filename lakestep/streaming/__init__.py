"""Spark Structured Streaming integration: the only part of lakestep that imports pyspark.

* ``format("lakestep")``: the sink (sink.py) and the source (source.py);
* ``format("lakestep-kafka")``: a Kafka source on kafka-python (the kafka package), and
  :func:`lakestep.streaming.kafka.ingest`, a root job whose tasks write the table's files
  themselves (kafka/ingestion.py);
* :func:`register`, :func:`register_job`, :func:`foreach_batch` (datasource.py);
* :class:`DerivedJob`: a derived job run from the driver, Spark's own scan and writer, no
  streaming query (derived.py).

Names are imported lazily, so ``import lakestep`` works without a JVM.
"""

from __future__ import annotations

from typing import Any

__all__ = ["register", "register_job", "foreach_batch", "LakestepDataSource", "DerivedJob", "Batch", "RunningJob"]


def __getattr__(name: str) -> Any:
    if name in ("DerivedJob", "Batch", "RunningJob"):
        from . import derived

        return getattr(derived, name)
    if name in __all__:
        from . import datasource

        return getattr(datasource, name)
    raise AttributeError(name)
