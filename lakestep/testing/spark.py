"""Spark set-up shared by the tests, the demo and the benchmarks.

:func:`log4j2_properties` is the text of a ``log4j2.properties`` file that sends
the JVM's log lines to standard error at one level, in a short one-line
layout. Write it to a file and pass the file to the JVM with
``-Dlog4j2.configurationFile=file:<path>`` (in
``spark.driver.extraJavaOptions`` for a local session, in ``conf/`` for a
standalone master or worker)::

    path.write_text(log4j2_properties("warn", {"org.apache.spark.deploy": "info"}))

Importing this module does not load pyspark.
"""

from __future__ import annotations

import re
from typing import Mapping

LEVELS = ("off", "fatal", "error", "warn", "info", "debug", "trace", "all")


def log4j2_properties(level: str = "warn", loggers: Mapping[str, str] | None = None) -> str:
    """The properties: the root logger at ``level``, plus one logger per ``loggers`` entry (name -> level).

    Raises ``ValueError`` for a level log4j does not know or a logger name that
    is not a dotted Java name (either would make log4j ignore the file silently).
    """
    lines = ["status = error", f"rootLogger.level = {_level(level)}", "rootLogger.appenderRef.stderr.ref = console",
             "appender.console.type = Console", "appender.console.name = console",
             "appender.console.target = SYSTEM_ERR", "appender.console.layout.type = PatternLayout",
             "appender.console.layout.pattern = %d{HH:mm:ss} %p %c{1}: %m%n"]
    for i, (name, lvl) in enumerate(sorted((loggers or {}).items())):
        if not re.fullmatch(r"[A-Za-z_$][\w$]*(\.[A-Za-z_$][\w$]*)*", name):
            raise ValueError(f"not a Java logger name: {name!r}")
        lines += [f"logger.l{i}.name = {name}", f"logger.l{i}.level = {_level(lvl)}"]
    return "\n".join(lines) + "\n"


def _level(level: str) -> str:
    if level.lower() not in LEVELS:
        raise ValueError(f"not a log4j level: {level!r} (one of {', '.join(LEVELS)})")
    return level.lower()
