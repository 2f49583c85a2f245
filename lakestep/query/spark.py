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
   version's files. **Native** (the default where it can): Spark's own
   Parquet scan reads the planned files (vectorized, with column pruning and
   predicate pushdown), with the table's schema (columns added later read
   as null) and without partition discovery (the files hold their partition
   columns, as lakestep wrote them). Before the scan the driver checks each
   file's size against the catalog on the local disk
   (:class:`~lakestep.errors.DataFileCorruptError` naming the file); a file
   deleted later fails the query with Spark's error naming it. **Python**
   otherwise: through the ``lakestep`` batch source, whose executors read the
   files with lakestep's checked reader (size and footer row count) and merge
   primary-key tables on read. It runs for primary-key tables (merged on
   read), for tables on an object store unless ``native=True`` says Spark
   reaches the store itself (``fs.s3a`` configured), and for column types
   Spark's Parquet reader does not read as lakestep does (nanosecond
   timestamps). :attr:`SparkQueryResult.paths` says which ran, per table;
4. the SQL runs with its table names replaced by those views (aliases kept).

The result is a lazy DataFrame and :class:`ReadInfo`. A ``repeatable_read``
query holds its pins until :meth:`SparkQueryResult.release` (or ``with``);
its leases lapse by themselves otherwise. This module does not import
pyspark: it drives the session it is given. It builds on lakestep.streaming's
Spark I/O (the ``lakestep`` format, :mod:`lakestep.streaming.scan`), never the
reverse.

Not guaranteed: the native scan does not compare each file's footer row
count with the catalog's (the Python path does); a file replaced outside
lakestep by one of the same size is read as it now is.
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
    paths: dict[str, str] = field(default_factory=dict)  # per table label: "native", or "python (why)"
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
              scope: str = "query", barrier: int | None = None, snapshot: str | None = None,
              native: bool | None = None) -> SparkQueryResult:
    """Run ``sql`` in Spark over the lakestep tables it names, read at one consistent point.

    ``native``: None (default) scans with Spark's own Parquet reader wherever it can (step 3),
    True also on object stores (Spark must reach the store itself), False never."""
    from ..streaming import compat
    from ..streaming.catalog_cache import open_catalog
    from ..streaming.datasource import prepare
    from ..streaming.scan import native_frame, plan_frame, python_reason

    cat = open_catalog(catalog) if isinstance(catalog, str) else catalog
    url = catalog if isinstance(catalog, str) else cat.connection_url()
    storage = cat.storage.spark_options()  # credentials travel as options Spark redacts (storage.secret_key)
    template = sql_template(sql, "spark")
    read = consistent_read(cat, template.refs, level=level, scope=scope, barrier=barrier, snapshot=snapshot)
    paths: dict[str, str] = {}
    try:
        prepare(spark)
        views: dict[TableRef, str] = {}
        for label, plan in read.plans.items():
            ref = read.refs[label]
            name = _view(ref, plan.version)
            why = python_reason(plan.location, plan.schema, native, merged=plan.merge_on_read)
            if why is None:
                df = native_frame(spark, plan)
                paths[label] = "native"
            elif not compat.supports("format"):  # Spark 3.5: no Python data sources
                df = plan_frame(spark, plan)
                paths[label] = f"python ({why})"
            else:
                df = (spark.read.format("lakestep").option("catalog", url).option("table", plan.table)
                      .options(**storage).option("versionAsOf", str(plan.version)).load())
                paths[label] = f"python ({why})"
            df.createOrReplaceTempView(name)
            views[ref] = name
        run = template.fill(lambda ref: f"`{views[ref]}`")
        df = spark.sql(run)
    except BaseException:
        read.close()
        raise
    return SparkQueryResult(df, read.info, run, paths, read)


def spark_table(spark: Any, catalog: "Catalog | str", table: str, *, level: str = "read_committed",
                scope: str = "query", barrier: int | None = None, snapshot: str | None = None,
                version: int | None = None, native: bool | None = None) -> SparkQueryResult:
    """A consistent DataFrame of one table (``SELECT *`` through :func:`spark_sql`): at the
    barrier ``level`` and ``scope`` choose, or at ``barrier``, ``snapshot`` or ``version``.

    Example::

        res = spark_table(spark, url, "shop.daily", scope="global")
        res.df.groupBy("day").count().show()
        res.read.barrier, res.paths      # {"shop.daily": "native"}
    """
    from ..catalog import parse_ident

    ns, name = parse_ident(table)
    travel = f" VERSION AS OF {int(version)}" if version is not None else ""
    return spark_sql(spark, catalog, f"SELECT * FROM {ns}.{name}{travel}", level=level, scope=scope,
                     barrier=barrier, snapshot=snapshot, native=native)

