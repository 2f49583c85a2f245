"""Consistent Spark SQL over lakestep tables.

Example::

    from lakestep.query import spark_sql

    result = spark_sql(spark, url, '''
        SELECT r.customer, r.revenue / c.orders AS avg_order
          FROM shop.revenue r JOIN shop.counts c ON r.customer = c.customer''')
    result.df.show()
    result.read.barrier, result.read.versions, print(result.read.explanation)

The protocol:

1. the lakestep tables are found in the SQL by parsing it (sqlglot, Spark
   dialect), with their ``VERSION AS OF`` / ``TIMESTAMP AS OF`` clauses;
2. the versions are chosen on the driver (:func:`~lakestep.query.read.consistent_read`:
   ``Pipeline.choose()`` at the level and scope asked for);
3. each table is registered as a temporary view reading exactly its chosen
   version through the ``lakestep`` batch source (executors read the files);
4. the SQL runs with its table names replaced by those views (aliases kept).

The result is a lazy DataFrame and :class:`ReadInfo`. A ``repeatable_read``
query holds its pins until :meth:`SparkQueryResult.release` (or ``with``);
its leases lapse by themselves otherwise. This module does not import
pyspark: it drives the session it is given.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .read import ConsistentRead, ReadInfo, TableRef, consistent_read
from .sql import sql_template

if TYPE_CHECKING:
    from ..catalog import Catalog


@dataclass
class SparkQueryResult:
    """A Spark SQL query's DataFrame (lazy) and what it reads."""

    df: Any
    read: ReadInfo
    sql: str  # as run, over the temporary views
    _read: ConsistentRead | None = field(default=None, repr=False)

    def release(self) -> None:
        """Release a ``repeatable_read``'s pins (after the last action on ``df``)."""
        if self._read is not None:
            self._read.close()

    def __enter__(self) -> "SparkQueryResult":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.release()


def _view(ref: TableRef, version: int) -> str:
    return "lakestep__" + re.sub(r"[^A-Za-z0-9_]", "_", ref.ident) + f"__v{version}"


def spark_sql(spark: Any, catalog: "Catalog | str", sql: str, *, level: str = "read_committed",
              scope: str = "query", barrier: int | None = None, snapshot: str | None = None) -> SparkQueryResult:
    """Run ``sql`` in Spark over the lakestep tables it names, read at one consistent point."""
    from ..streaming import register
    from ..streaming.progress import open_catalog

    cat = open_catalog(catalog) if isinstance(catalog, str) else catalog
    url = catalog if isinstance(catalog, str) else cat.connection_url()
    storage = cat.storage.spark_options()  # credentials travel as options Spark redacts (storage.secret_key)
    template = sql_template(sql, "spark")
    read = consistent_read(cat, template.refs, level=level, scope=scope, barrier=barrier, snapshot=snapshot)
    try:
        register(spark)
        views: dict[TableRef, str] = {}
        for label, plan in read.plans.items():
            ref = read.refs[label]
            name = _view(ref, plan.version)
            (spark.read.format("lakestep").option("catalog", url).option("table", plan.table).options(**storage)
             .option("versionAsOf", str(plan.version)).load().createOrReplaceTempView(name))
            views[ref] = name
        run = template.fill(lambda ref: f"`{views[ref]}`")
        df = spark.sql(run)
    except BaseException:
        read.close()
        raise
    return SparkQueryResult(df, read.info, run, read)
