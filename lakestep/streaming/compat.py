"""Which Spark lakestep runs on, and what its Spark integration can do there: every version rule in one place.

lakestep supports Spark 3.5 (the long-term line) to 4.3 (``SUPPORTED``, the range the
``spark`` extra installs). What each line can run (:data:`FEATURES`):

=====================  =====  ===============================================================
feature                needs  why, and what to use on an older Spark
=====================  =====  ===============================================================
``DerivedJob``         3.5    Spark's own Parquet scan and writer, ``mapInArrow``: any line
``foreach_batch``      3.5    both writers (``arrow``: ``mapInArrow``; ``spark``: Spark's own)
``spark_sql``          3.5    ``spark_sql`` / ``spark_table``: Spark's own Parquet scan, and
                              where it cannot read a table as lakestep does, lakestep's reader
                              in Python workers (``mapInArrow`` on 3.5, ``format("lakestep")``
                              from 4.0)
``format``             4.0    ``format("lakestep")`` batch reads and writes: Python data
                              sources (SPARK-44076) came with 4.0. On 3.5 ``register`` raises
                              :class:`~lakestep.errors.SparkVersionError`; ``spark_table`` reads
                              a table, ``foreach_batch`` writes one
``sink``               4.1    the ``lakestep`` streaming sink: Arrow batches to a Python
                              stream writer (``DataSourceStreamArrowWriter``) came with 4.1;
                              on 4.0 use ``foreach_batch`` (the same commits, exactly once)
``source``             4.2    the ``lakestep`` streaming source aligns its inputs in
                              ``latestOffset(start, limit)``: Python data source admission
                              control came with 4.2 (before, Spark does not hand a source the
                              offset it starts from); on 4.0 and 4.1 use ``DerivedJob``
``kafka``              4.2    ``format("lakestep-kafka")`` and ``ingest``: admission control
                              (``maxOffsetsPerTrigger``, ``Trigger.AvailableNow``) came with
                              4.2; before, use Spark's own ``kafka`` source (the
                              ``spark-sql-kafka`` jar) with ``foreach_batch``
=====================  =====  ===============================================================

1. The version is the driver's pyspark (``pyspark.__version__``); :func:`register` checks
   Spark's own (``spark.version``, the JVM) against it too, so a pyspark that does not match
   its cluster is named instead of failing in a Py4J call.
2. A feature the version lacks fails at its first call with
   :class:`~lakestep.errors.SparkVersionError` (``feature``, ``needs``, ``found``), whose
   message names the version needed and what to use instead; never with an ImportError.
3. The modules of lakestep.streaming import on every supported version: the base classes
   of Python data sources a version lacks are stand-ins here (never instantiated, since the
   feature is refused first).

Not guaranteed: Spark versions outside ``SUPPORTED`` are not refused here (pip's range is the
check); their features are judged by the same table.
"""

from __future__ import annotations

import weakref
from functools import lru_cache
from typing import TYPE_CHECKING, Any

from ..errors import SparkVersionError

SUPPORTED = ">=3.5,<4.4"
"""The pyspark versions lakestep supports (pyproject.toml's ``spark`` extra says the same)."""

TESTED = ("3.5.9", "4.0.5", "4.1.1", "4.2.1", "4.3.0")
"""The pyspark releases `make compat` runs the compatibility suite on (tests/streaming/test_spark_versions.py), one per
line; the newest is the one `make test` runs everything on. 4.1's is the Spark of the JVM peers (jars/pom.xml: the
newest 4.1 release whose Kafka source Maven Central serves whole), so that they share its virtualenv."""

FEATURES: dict[str, tuple[tuple[int, int], str, str]] = {
    # feature -> (the Spark it needs, what it is, what to use instead on an older Spark)
    "derived_job": ((3, 5), "DerivedJob", ""),
    "foreach_batch": ((3, 5), "foreach_batch", ""),
    "spark_sql": ((3, 5), "spark_sql and spark_table", ""),
    "format": ((4, 0), 'format("lakestep") (Python data sources)',
               "read tables with lakestep.query.spark_table or spark_sql, write them with "
               "lakestep.streaming.foreach_batch, run derived jobs with DerivedJob"),
    "sink": ((4, 1), 'the "lakestep" streaming sink (Python Arrow stream writers)',
             "write the stream with .foreachBatch(lakestep.streaming.foreach_batch(...)): the same "
             "commits, exactly once"),
    "source": ((4, 2), 'the "lakestep" streaming source (Python data source admission control)',
               "run the derived job with lakestep.streaming.DerivedJob"),
    "kafka": ((4, 2), 'the "lakestep-kafka" source and lakestep.streaming.kafka.ingest '
                      "(Python data source admission control)",
              "read Kafka with Spark's own kafka source (the spark-sql-kafka jar) and write with "
              ".foreachBatch(lakestep.streaming.foreach_batch(...))"),
}


def parse(version: str) -> tuple[int, int]:
    """``"4.0.5"`` -> ``(4, 0)``; ``"3.5.9.dev0"`` -> ``(3, 5)``."""
    parts = version.split(".")
    try:
        return int(parts[0]), int("".join(c for c in parts[1] if c.isdigit()) or 0)
    except (IndexError, ValueError):
        raise SparkVersionError(f"cannot read the Spark version {version!r}", feature="spark", needs="3.5",
                                found=version) from None


@lru_cache(maxsize=1)
def pyspark_version() -> str:
    import pyspark

    return str(pyspark.__version__)


def version() -> tuple[int, int]:
    """The driver's Spark line, ``(major, minor)``."""
    return parse(pyspark_version())


def supports(feature: str, at: tuple[int, int] | None = None) -> bool:
    """Whether ``feature`` (a key of :data:`FEATURES`) runs on Spark ``at`` (default: this one)."""
    return (at or version()) >= FEATURES[feature][0]


def require(feature: str, at: tuple[int, int] | None = None) -> None:
    """Raises:
        SparkVersionError: ``feature`` needs a newer Spark than ``at`` (default: this one)."""
    if supports(feature, at):
        return
    needs, what, instead = FEATURES[feature]
    found = pyspark_version() if at is None or at == version() else ".".join(map(str, at))
    need = f"{needs[0]}.{needs[1]}"
    raise SparkVersionError(f"{what} needs Spark {need} or newer; this is Spark {found}"
                            + (f": {instead}" if instead else ""), feature=feature, needs=need, found=found)


_CHECKED: "weakref.WeakKeyDictionary[Any, tuple[int, int]]" = weakref.WeakKeyDictionary()


def check_session(spark: Any) -> tuple[int, int]:
    """Step 1: the session's Spark line. Raises SparkVersionError when it is not the driver's
    pyspark line (a pyspark that does not match its cluster's Spark). Asks the JVM once per
    session (``spark.version`` is a Py4J call; a session's Spark does not change)."""
    try:
        return _CHECKED[spark]
    except (KeyError, TypeError):  # TypeError: an object that takes no weak reference
        pass
    jvm = getattr(spark, "version", None)
    ours = version()
    if isinstance(jvm, str) and parse(jvm) != ours:
        raise SparkVersionError(
            f"pyspark {pyspark_version()} drives Spark {jvm}: install the pyspark of the cluster's Spark "
            f"(pip install 'pyspark=={jvm}')", feature="spark", needs=jvm, found=pyspark_version())
    try:
        _CHECKED[spark] = ours
    except TypeError:
        pass
    return ours


# ---------------------------------------------------- base classes, or stand-ins where a Spark lacks them
class _Missing:
    """Stands in for a base class of Python data sources that this Spark lacks (step 3): making
    one raises what :func:`require` raises for the feature it belongs to."""

    feature = "format"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        require(self.feature)


def _stand_in(name: str, feature: str, base: type = _Missing) -> Any:
    return type(name, (base,), {"feature": feature, "__module__": __name__})


if TYPE_CHECKING:  # type checkers read the installed pyspark (make test's, the newest line)
    from pyspark.sql.datasource import (
        DataSource,
        DataSourceArrowWriter,
        DataSourceReader,
        DataSourceStreamArrowWriter,
        DataSourceStreamReader,
        InputPartition,
        WriterCommitMessage,
    )
    from pyspark.sql.streaming.datasource import (
        ReadAllAvailable,
        ReadLimit,
        ReadMaxRows,
        SupportsTriggerAvailableNow,
    )
else:  # at run time, each Spark line's classes or stand-ins for those it lacks
    try:  # Spark 4.0
        from pyspark.sql.datasource import (  # noqa: F401  (re-exported)
            DataSource,
            DataSourceArrowWriter,
            DataSourceReader,
            DataSourceStreamReader,
            InputPartition,
            WriterCommitMessage,
        )
    except ImportError:  # Spark 3.5
        DataSource, DataSourceArrowWriter, DataSourceReader = (
            _stand_in(n, "format") for n in ("DataSource", "DataSourceArrowWriter", "DataSourceReader"))
        DataSourceStreamReader = _stand_in("DataSourceStreamReader", "source")

        class InputPartition:
            """pyspark 4's ``InputPartition``, which lakestep also pickles to its own Python tasks."""

            def __init__(self, value: Any) -> None:
                self.value = value

        class WriterCommitMessage:
            """pyspark 4's ``WriterCommitMessage``: what a task's writer returns to the driver."""

    try:  # Spark 4.1
        from pyspark.sql.datasource import DataSourceStreamArrowWriter  # noqa: F401
    except ImportError:
        DataSourceStreamArrowWriter = _stand_in("DataSourceStreamArrowWriter", "sink")

    try:  # Spark 4.2
        from pyspark.sql.streaming.datasource import (  # noqa: F401
            ReadAllAvailable,
            ReadLimit,
            ReadMaxRows,
            SupportsTriggerAvailableNow,
        )
    except ImportError:
        ReadLimit = _stand_in("ReadLimit", "kafka")
        ReadAllAvailable, ReadMaxRows = (_stand_in(n, "kafka", ReadLimit) for n in ("ReadAllAvailable", "ReadMaxRows"))

        class SupportsTriggerAvailableNow:
            """A mix-in marker: without admission control Spark never asks for it."""


def to_arrow_schema(schema: Any) -> Any:
    """A Spark schema as the Arrow schema of the batches Spark hands Python (timestamps in UTC):
    pyspark 4.2 takes ``timezone``, 4.0 and 4.1 ``timestamp_utc``, 3.5 neither (UTC always)."""
    from pyspark.sql.pandas import types as T

    at = version()
    if at >= (4, 2):
        return T.to_arrow_schema(schema, timezone="UTC")
    if at >= (4, 0):
        # pyspark 4.0's and 4.1's keyword: the installed pyspark's signature (4.2+) has timezone instead
        return T.to_arrow_schema(schema, timestamp_utc=True)  # type: ignore[call-arg]
    return T.to_arrow_schema(schema)
