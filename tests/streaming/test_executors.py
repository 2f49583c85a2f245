"""register()'s set-up checks (lakestep/streaming/executors.py), without a cluster.

The probe runs where lakestep may be missing, so it must travel by value: it is
pickled here with PySpark's cloudpickle and run in a fresh Python that has no
lakestep (the shared virtualenv's editable install hidden by tests/cluster_hook),
and in one that has it. The cluster itself: tests/streaming/test_cluster.py and
README "On a cluster" as written.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

from lakestep import __version__
from lakestep.streaming.executors import _probe, driver_problem
from tests.sparkcluster import HOOK_DIR, REPO_ROOT, clean_env

_RUN = "import pickle, sys; print(repr(pickle.loads(sys.stdin.buffer.read())(0)))"


def _run_probe(pythonpath: str) -> list[tuple[str, ...]]:
    from pyspark import cloudpickle

    blob = cloudpickle.dumps(_probe())
    # the probe's own pickle names no lakestep module: unpickling needs only the standard library
    assert b"lakestep.streaming.executors" not in blob
    env = clean_env(PYTHONPATH=pythonpath, LS_TEST_NO_EDITABLE="1")
    proc = subprocess.run([sys.executable, "-c", _RUN], input=blob, capture_output=True, env=env, cwd="/",
                          timeout=120)
    assert proc.returncode == 0, proc.stderr.decode()
    return ast.literal_eval(proc.stdout.decode())


def test_probe_reports_a_missing_lakestep() -> None:
    import pyspark

    # pyspark itself (cloudpickle's home) but no lakestep
    (kind, python, missing, message), = _run_probe(os.pathsep.join([str(HOOK_DIR), str(Path(pyspark.__file__).parents[1])]))
    assert (kind, python, missing) == ("missing", sys.executable, "lakestep"), message


def test_probe_reports_where_lakestep_came_from() -> None:
    (kind, python, version, location), = _run_probe(os.pathsep.join([str(HOOK_DIR), str(REPO_ROOT)]))
    assert (kind, python, version, location) == ("ok", sys.executable, __version__, str(REPO_ROOT))


def test_driver_rule_for_a_py_files_zip(tmp_path: Path) -> None:
    """Step 0: a driver that imports lakestep from a zip its JVM's PYTHONPATH lacks is refused."""
    z = tmp_path / "lakestep.zip"
    z.write_bytes(b"")
    assert driver_problem(str(REPO_ROOT), "") is None  # a directory (or an installed package)
    assert driver_problem(str(z), f"/elsewhere{os.pathsep}{z}") is None
    os.symlink(z, tmp_path / "link.zip")
    assert driver_problem(str(z), str(tmp_path / "link.zip")) is None  # the same file by another name
    problem = driver_problem(str(z), "/elsewhere")
    assert problem is not None and str(z) in problem and "PYTHONPATH" in problem


_LOCAL_APP = """
import sys
from pyspark.sql import SparkSession
from lakestep.errors import SparkSetupError
from lakestep.streaming import register
spark = SparkSession.builder.master("local[1]").config("spark.ui.enabled", "false").getOrCreate()
spark.sparkContext.setLogLevel("OFF")
try:
    register(spark)
    print("REGISTERED")
except SparkSetupError as e:
    print("SETUP ERROR", e)
spark.stop()
"""


@pytest.mark.spark
def test_register_names_a_worker_python_without_lakestep(tmp_path: Path) -> None:
    """Local mode: Spark's Python workers run the interpreter PYSPARK_PYTHON names (else python3
    from the PATH). One without lakestep makes register() fail at once, naming it and the fix,
    instead of every query failing later with "Failed to create Python data source instance"."""
    other = os.path.join(sys.base_prefix, "bin", "python3")  # the Python this virtualenv was made from
    assert subprocess.run([other, "-c", "import pyarrow, lakestep"], cwd=tmp_path, capture_output=True).returncode
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "PYSPARK_PYTHON": other}
    proc = subprocess.run([sys.executable, "-c", _LOCAL_APP], cwd=tmp_path, capture_output=True, text=True,
                          timeout=300, env=env)
    out = proc.stdout
    assert "SETUP ERROR" in out, (out, proc.stderr[-3000:])
    assert other in out and "PYSPARK_PYTHON" in out and sys.executable in out, out
    # (a worker Python with lakestep passes the same check: every Spark test's register() runs it)
