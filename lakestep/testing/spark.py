"""Spark set-up shared by the tests, the demo and the benchmarks.

:func:`log4j2_properties` is the text of a ``log4j2.properties`` file that sends
the JVM's log lines to standard error at one level, in a short one-line
layout. Write it to a file and pass the file to the JVM with
``-Dlog4j2.configurationFile=file:<path>`` (in
``spark.driver.extraJavaOptions`` for a local session, in ``conf/`` for a
standalone master or worker)::

    path.write_text(log4j2_properties("warn", {"org.apache.spark.deploy": "info"}))

:func:`local_session` is a quiet local session built with it (test applications run
in their own processes, benchmarks).

:func:`root_and_derived` sets up the catalog side of one derived streaming job (a root
table, a table derived from it, a coordinator that seals only when told).

:func:`make_class_archive` dumps the classes a Spark driver loads into a class-data
archive (the JVM's AppCDS); with ``LAKESTEP_SPARK_CLASS_ARCHIVE`` naming it,
:func:`local_session` (and :func:`class_archive_option` for a session built by hand)
maps it in, and a Spark JVM starts about twice as fast (measured: session 8.8 s ->
4.3 s, first query 4.7 s -> 1.8 s, quiet 2-core machine). scripts/test.py makes one per
pyspark and JVM for the test run; nothing else sets the variable.

1. An archive is used only when its file exists: a missing one costs nothing.
2. The archive is keyed by the pyspark version and the JVM (:func:`class_archive_path`):
   another JVM or pyspark gets an archive of its own, never a stale one.
3. It is written to a temporary name by a separate process and renamed into place
   when complete: a JVM never maps a half-written archive.

Not guaranteed: a JVM whose class path differs from the archive's (a Spark
standalone cluster's daemons, spark-submit with extra jars) maps what matches, or
nothing; it runs the same either way.

Importing this module does not load pyspark (:func:`local_session` and
:func:`root_and_derived` do).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping

from ..errors import InvalidArgumentError

if TYPE_CHECKING:
    from ..barrier import Pipeline
    from ..catalog import Catalog, Table
    from ..services import Coordinator

CLASS_ARCHIVE_ENV = "LAKESTEP_SPARK_CLASS_ARCHIVE"


def class_archive_option() -> str:
    """The JVM option that maps the class-data archive named by ``LAKESTEP_SPARK_CLASS_ARCHIVE``
    (``-XX:SharedArchiveFile=...``, with the JVM's messages about it silenced), or "" when the
    variable is unset or its file does not exist."""
    import os

    path = os.environ.get(CLASS_ARCHIVE_ENV)
    if not path or not os.path.isfile(path):
        return ""
    return f"-XX:SharedArchiveFile={path} -Xlog:cds=off -Xlog:cds+dynamic=off"


def class_archive_path(folder: "str | Path") -> Path:
    """Where the archive of this pyspark and this JVM lives under ``folder``: its name carries the
    pyspark version and a digest of the JVM's ``java -version`` and location."""
    import hashlib
    import os
    import shutil
    import subprocess
    from importlib.metadata import version

    java = os.path.join(os.environ["JAVA_HOME"], "bin", "java") if os.environ.get("JAVA_HOME") else shutil.which("java")
    if java is None:
        raise InvalidArgumentError("no java on PATH and no JAVA_HOME", argument="java", value=None)
    described = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=60).stderr
    digest = hashlib.sha256(f"{os.path.realpath(java)}\n{described}".encode()).hexdigest()[:12]
    return Path(folder) / f"spark-{version('pyspark')}-{digest}.jsa"


_ARCHIVE_WORKLOAD = """
import shutil, sys, tempfile
from lakestep.testing.spark import local_session
work = tempfile.mkdtemp(prefix="lakestep-cds-")
try:
    spark = local_session("lakestep-class-archive", work, jvm_options=sys.argv[1])
    df = spark.range(1000).selectExpr("id", "id % 7 AS k", "CAST(id AS STRING) AS s")
    df.write.parquet(work + "/p")
    back = spark.read.parquet(work + "/p")
    back.groupBy("k").agg({"id": "sum"}).join(back.select("k").distinct(), "k").collect()
    spark.sql("SELECT k, count(*) FROM parquet.`" + work + "/p` GROUP BY k ORDER BY k").collect()
    back.limit(5).collect()
    spark.stop()
finally:
    shutil.rmtree(work, ignore_errors=True)
"""


def make_class_archive(path: "str | Path", *, timeout: float = 600) -> bool:
    """Dump the classes of a small Spark workload (a local session, Parquet written and read,
    an aggregate, a join, SQL) into the class-data archive ``path``, in a process of its own,
    written under a temporary name and renamed when complete. Returns whether ``path`` exists
    now (False: the JVM could not dump one; everything runs as before). Imports nothing of pyspark
    here."""
    import os
    import subprocess
    import sys

    target = Path(path)
    if target.is_file():
        return True
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f"{target.name}.tmp-{os.getpid()}")
    env = {k: v for k, v in os.environ.items() if k != CLASS_ARCHIVE_ENV}
    try:
        subprocess.run([sys.executable, "-c", _ARCHIVE_WORKLOAD,
                        f"-XX:ArchiveClassesAtExit={tmp} -Xlog:cds=off -Xlog:cds+dynamic=off"],
                       env=env, capture_output=True, timeout=timeout, check=False)
        if tmp.is_file() and tmp.stat().st_size > 0:
            os.replace(tmp, target)
    except subprocess.TimeoutExpired:
        pass
    finally:
        tmp.unlink(missing_ok=True)
    return target.is_file()


LEVELS = ("off", "fatal", "error", "warn", "info", "debug", "trace", "all")


def log4j2_properties(level: str = "warn", loggers: Mapping[str, str] | None = None) -> str:
    """The properties: the root logger at ``level``, plus one logger per ``loggers`` entry (name -> level).

    Raises :class:`~lakestep.errors.InvalidArgumentError` (a ``ValueError``) for a level log4j does not
    know or a logger name that is not a dotted Java name (either would make log4j ignore the file silently).
    """
    lines = ["status = error", f"rootLogger.level = {_level(level)}", "rootLogger.appenderRef.stderr.ref = console",
             "appender.console.type = Console", "appender.console.name = console",
             "appender.console.target = SYSTEM_ERR", "appender.console.layout.type = PatternLayout",
             "appender.console.layout.pattern = %d{HH:mm:ss} %p %c{1}: %m%n"]
    for i, (name, lvl) in enumerate(sorted((loggers or {}).items())):
        if not re.fullmatch(r"[A-Za-z_$][\w$]*(\.[A-Za-z_$][\w$]*)*", name):
            raise InvalidArgumentError(f"not a Java logger name: {name!r}", argument="loggers", value=name)
        lines += [f"logger.l{i}.name = {name}", f"logger.l{i}.level = {_level(lvl)}"]
    return "\n".join(lines) + "\n"


def _level(level: str) -> str:
    if level.lower() not in LEVELS:
        raise InvalidArgumentError(f"not a log4j level: {level!r} (one of {', '.join(LEVELS)})",
                                   argument="level", value=level)
    return level.lower()


def local_session(app: str, workdir: "str | Path", *, cores: int = 2, level: str = "error",
                  master: str | None = "local", jvm_options: str = "", pythonpath: "str | Path | None" = None,
                  conf: Mapping[str, str] | None = None) -> Any:
    """A quiet local Spark session for the tests, a test application or a benchmark: ``local[cores]``
    (``master``: "local" for that, None to leave it to spark-submit, or a master URL), as many
    shuffle partitions, no UI, UTC, loopback only, no adaptive execution, the JVM's log at
    ``level`` on standard error (the properties file is written to ``workdir``), and the Python
    workers running this interpreter (``PYSPARK_PYTHON`` unless set), with ``pythonpath``
    put first on their ``PYTHONPATH``. ``jvm_options``: more options of the driver's JVM;
    ``conf``: more Spark settings. Imports pyspark."""
    import os
    import sys

    from pyspark.sql import SparkSession

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    if pythonpath is not None:
        parts = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
        if str(pythonpath) not in parts:
            os.environ["PYTHONPATH"] = os.pathsep.join([str(pythonpath), *parts])
    jvm_options = f"{class_archive_option()} {jvm_options}".strip()
    work = Path(workdir)
    work.mkdir(parents=True, exist_ok=True)
    log4j = work / "log4j2.properties"
    log4j.write_text(log4j2_properties(level))
    b = SparkSession.builder
    if master is not None:
        b = b.master(f"local[{cores}]" if master == "local" else master)
    b = (b.appName(app)
         .config("spark.sql.shuffle.partitions", str(cores)).config("spark.default.parallelism", str(cores))
         .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
         .config("spark.sql.session.timeZone", "UTC")
         .config("spark.driver.host", "127.0.0.1").config("spark.driver.bindAddress", "127.0.0.1")
         .config("spark.driver.extraJavaOptions", f"-Dlog4j2.configurationFile=file:{log4j} {jvm_options}".strip())
         .config("spark.sql.adaptive.enabled", "false"))
    for k, v in (conf or {}).items():
        b = b.config(k, v)
    spark = b.getOrCreate()
    spark.sparkContext.setLogLevel(level.upper())
    return spark


def root_and_derived(catalog: "Catalog", url: str, root: str, derived: str,
                     job: str) -> "tuple[Pipeline, Coordinator, Table, Table]":
    """The catalog side of a derived streaming job, for a test or a benchmark: the tables ``root``
    and ``derived`` ("namespace.name", in one namespace, which is made here; columns ``id`` and
    ``e``, int64); ``root`` written by the external job ``feed``; ``job`` registered to read
    ``root`` and write ``derived`` (:func:`lakestep.streaming.register_job` on ``url``, the
    catalog's URL as the streaming query names it); and a coordinator that holds the lease and
    seals only when told. Returns the pipeline, the coordinator (the caller releases it) and
    the two tables. Raises :class:`~lakestep.barrier.BarrierError` when another coordinator
    holds the lease. Imports pyspark."""
    import pyarrow as pa

    from ..barrier import Pipeline
    from ..barrier.errors import BarrierError
    from ..services import Coordinator
    from ..streaming import register_job

    catalog.create_namespace(root.split(".")[0])
    schema = pa.schema([("id", pa.int64()), ("e", pa.int64())])
    root_table = catalog.create_table(root, schema)
    derived_table = catalog.create_table(derived, schema)
    p = Pipeline(catalog)
    p.register_job("feed", sinks=[root], external_input=True)
    register_job(url, job, sources=[root], sinks=[derived])
    coord = Coordinator(p.catalog, interval=3600)
    if not coord.acquire():
        raise BarrierError(f"another coordinator holds the lease of the catalog of {root!r}")
    return p, coord, root_table, derived_table
