"""Consistent reads where users query: Arrow, DuckDB and Spark SQL, at one barrier.

* :func:`consistent_read` / :func:`consistent_arrow`: read plans (or Arrow
  tables) of several tables at one consistent point, and what was read
  (read.py);
* :func:`duckdb_connect` / :func:`duckdb_query`: a DuckDB connection whose
  views all show one barrier; a SQL string run that way (duck.py);
* :func:`spark_sql`: a Spark SQL string over lakestep tables at one barrier;
  :func:`spark_table`: one table's consistent DataFrame (spark.py; needs pyspark;
  Spark's own Parquet scan reads the files where it can);
* :func:`table_refs`: the lakestep tables a SQL string names, with their
  time travel (sql.py).

``Pipeline.choose()`` decides; these helpers only read what it chose. The
levels and scopes are those of docs/design.md §4.
"""

from __future__ import annotations

from .. import _lazy

_NAMES = {
    "ConsistentRead": "read", "ReadInfo": "read", "TableRef": "read", "consistent_read": "read",
    "consistent_arrow": "read", "DuckDBRead": "duck", "QueryResult": "duck", "duckdb_connect": "duck",
    "duckdb_query": "duck", "table_refs": "sql", "spark_sql": "spark", "SparkQueryResult": "spark",
    "spark_table": "spark",
}
__all__ = sorted(_NAMES)


__getattr__, __dir__ = _lazy.exports(__name__, _NAMES)
