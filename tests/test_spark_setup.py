"""lakestep.testing.spark: the log4j2 properties the tests, the demo and the benchmarks give Spark's JVMs."""

from __future__ import annotations

import sys

import pytest

from lakestep.testing.spark import log4j2_properties


def props(text: str) -> dict[str, str]:
    return dict(line.split(" = ", 1) for line in text.splitlines())


def test_root_level_and_extra_loggers() -> None:
    p = props(log4j2_properties("WARN", {"org.apache.spark.deploy": "info", "a.b": "error"}))
    assert p["rootLogger.level"] == "warn"
    assert p["appender.console.target"] == "SYSTEM_ERR"
    names = {p[k]: p[k.replace(".name", ".level")] for k in p if k.startswith("logger.") and k.endswith(".name")}
    assert names == {"org.apache.spark.deploy": "info", "a.b": "error"}
    assert props(log4j2_properties())["rootLogger.level"] == "warn"
    assert not [k for k in props(log4j2_properties("error")) if k.startswith("logger.")]


@pytest.mark.parametrize("level, loggers", [("loud", None), ("warn", {"org.x": "chatty"}),
                                            ("warn", {"org x": "info"}), ("warn", {"": "info"})])
def test_unknown_levels_and_bad_names_are_refused(level: str, loggers: dict[str, str] | None) -> None:
    with pytest.raises(ValueError):
        log4j2_properties(level, loggers)


def test_importing_it_does_not_load_pyspark() -> None:
    import subprocess

    code = "import sys, lakestep.testing.spark; sys.exit('pyspark' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


def test_the_class_archive_workload_imports_what_it_runs() -> None:
    """make_class_archive runs its workload as a script (``python -c``): its imports must resolve there (a
    relative import, which only a module may make, once left every fresh clone without the archive: the
    Spark lane then starts each JVM in about twice the time). The imports run in a fresh interpreter;
    the whole workload runs at the start of every `make test` that has no archive yet."""
    import ast
    import subprocess

    from lakestep.testing import spark

    tree = ast.parse(spark._ARCHIVE_WORKLOAD)
    imports = [node for node in tree.body if isinstance(node, (ast.Import, ast.ImportFrom))]
    assert imports and all(not (isinstance(i, ast.ImportFrom) and i.level) for i in imports), \
        [ast.unparse(i) for i in imports]
    code = "\n".join(ast.unparse(i) for i in imports)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
