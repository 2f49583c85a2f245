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

Importing this module does not load pyspark (:func:`local_session` does).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Mapping

from ..errors import InvalidArgumentError

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
