"""Spark with Iceberg's runtime, reading lakestep's published tables: run by tests/interop in the
JVM peers' virtualenv (scripts/jars.py: pyspark of jars/pom.xml), never imported by the suite.

    python tests/interop/spark_reader.py SPEC.json OUT.json

SPEC: ``{"jars": [paths], "workdir": path, "sessions": [{"catalogs": {name: {property: value}}
(property "": the catalog's class),
"queries": {name: sql}}]}``. One Spark application; each entry of ``sessions`` is a session of
its own (``SparkSession.newSession``: catalogs are per session, so two catalogs can both carry
the name ``lakestep`` that Iceberg's JDBC catalog filters its rows by). OUT: ``{query name:
rows}``, each row a list, decimals and dates as strings; or ``{query name: {"error": text}}``.
"""

from __future__ import annotations

import datetime as dt
import decimal
import json
import sys
from pathlib import Path
from typing import Any


def plain(v: Any) -> Any:
    if isinstance(v, (decimal.Decimal, dt.date, dt.datetime)):
        return str(v)
    return v


def main(spec_path: str, out_path: str) -> int:
    from lakestep.testing.spark import local_session

    spec = json.loads(Path(spec_path).read_text())
    spark = local_session("lakestep-interop", spec["workdir"], conf={
        "spark.jars": ",".join(spec["jars"]),
        "spark.sql.extensions": "org.apache.iceberg.spark.extensions.IcebergSparkSessionExtensions",
    })
    out: dict[str, Any] = {}
    for s in spec["sessions"]:
        session = spark.newSession()
        for name, props in s["catalogs"].items():  # "" is the catalog's class, the rest its properties
            for k, v in props.items():
                session.conf.set(f"spark.sql.catalog.{name}" + (f".{k}" if k else ""), v)
        for name, sql in s["queries"].items():
            try:
                out[name] = [[plain(v) for v in row] for row in session.sql(sql).collect()]
            except Exception as e:  # the test reports which query failed and why
                out[name] = {"error": f"{type(e).__name__}: {e}"[:4000]}
    spark.stop()
    Path(out_path).write_text(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
