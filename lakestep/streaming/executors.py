"""Checking that Spark's executors can run lakestep's side of a query (a cluster, not local mode).

On a cluster, executors unpickle lakestep's readers and writers in Python
workers of their own machines: lakestep must be importable there (shipped with
the application, ``spark-submit --py-files lakestep.zip``, or installed on
every node), with its dependencies (pyarrow; kafka-python for the Kafka
source). Without it a query fails deep in a task with a pickling traceback.
:func:`check_executors` (called by :func:`lakestep.streaming.register`) asks
first:

0. on the driver: when lakestep was imported from a zip (``--py-files``) that is not
   on the driver JVM's ``PYTHONPATH``, it raises: Spark hands ``--py-files`` to its
   Python driver and to executors, but the Python processes the driver JVM starts
   for data sources (planning a stream's batches, committing a sink's) see only the
   JVM's ``PYTHONPATH`` and the installed packages, and would fail to unpickle the
   source ("No module named 'lakestep'") when the query starts;
1. the check runs once per application, and not on Spark Connect (no
   ``SparkContext``). In local mode (``local[...]``) the executor is the
   driver's JVM, but its Python workers run the interpreter ``PYSPARK_PYTHON``
   (or ``spark.pyspark.python``) names, which may not be the driver's: a venv
   not activated, another Python on the PATH. The probe runs there too, in one
   task, and its error names that interpreter and the fix;
2. one small Spark job runs a probe in as many tasks as the application has
   cores (one in local mode). The probe is pickled by value (it must run where lakestep is
   missing): it imports the modules executors run (``lakestep.streaming.sink``,
   ``lakestep.streaming.source``, ``lakestep.streaming.kafka.reader``, ``.ingestion``) and
   returns its Python, lakestep's version and where lakestep was imported
   from, or the import error. It runs as a SQL Python UDF, not an RDD function: Spark keeps
   one Python daemon per kind of runner (SQL's differ from RDDs' in their environment), and
   the SQL one is the one lakestep's sources and sinks run in, so their first tasks find the
   daemon started and, where Spark reuses workers (its default), a worker with those modules
   imported (in local mode ~3 s less before a new application's first micro-batch);
3. any failed import, or a lakestep version other than the driver's, raises
   :class:`~lakestep.errors.SparkSetupError` saying how to ship lakestep.

The probe opens no connection: executors never talk to the catalog database
(only drivers do; the sink and source hand executors table shapes and file
lists, sink.py and source.py).

Not guaranteed: executors that join later (dynamic allocation, a replaced
worker) are not checked, and with more executors than cores asked for, some
executor may get no probe task.
"""

from __future__ import annotations

import builtins
import logging
import sys
import threading
from dataclasses import dataclass
from typing import Any, Callable

from ..errors import SparkSetupError

log = logging.getLogger(__name__)

#: How to ship lakestep, in every message that says it is missing.
HOW_TO_SHIP = ("ship lakestep with the application (in a clone: `python -m zipfile -c lakestep.zip lakestep/`, "
               "then `PYTHONPATH=lakestep.zip spark-submit --py-files lakestep.zip ...`), or install "
               "'lakestep[spark]' (a wheel) into the executors' Python on every node; see README, 'On a cluster'")

#: how many modules were loaded at the last freeze (0: none yet)
_frozen_at = 0


def freeze_worker_heap() -> None:
    """Keep what a Spark Python worker has imported out of the garbage collector's passes.

    Spark reuses its Python workers between tasks and runs ``gc.collect()`` in
    each after every task (``pyspark/daemon.py``). A full collection walks every
    tracked object, so its cost grows with what the worker has imported: about
    20 ms for pyspark alone, 65-120 ms once lakestep's executor modules are
    loaded (pyarrow, kafka-python and the catalog's SQLAlchemy models: some
    110,000 objects), paid after every task of every micro-batch, on the
    executors' cores. Called where lakestep's executor code starts (inside a
    Spark task: ``TaskContext`` is set), it collects once and ``gc.freeze()``s
    the objects alive at that moment whenever modules were imported since the
    last freeze (modules, classes and functions live as long as the worker
    anyway): later collections skip them. Outside a Spark task (a driver, a
    test calling a reader directly) it does nothing.

    Not guaranteed: objects of a task that were alive at a freeze and become
    garbage later are never collected (a few kilobytes, each time the worker
    imports something new: a handful of times per worker process).
    """
    global _frozen_at
    import sys

    loaded = len(sys.modules)
    if loaded == _frozen_at:
        return
    from pyspark import TaskContext

    if TaskContext.get() is None:
        return
    import gc

    gc.collect()
    gc.freeze()
    _frozen_at = loaded


# Compiled without a module name, so that cloudpickle pickles it by value (lakestep may be missing there).
_PROBE_SOURCE = '''
def probe(_):
    import importlib
    import os
    import sys
    try:
        import lakestep
        for name in ("lakestep.streaming.sink", "lakestep.streaming.source", "lakestep.streaming.kafka.reader",
                     "lakestep.streaming.kafka.ingestion"):
            importlib.import_module(name)
    except ImportError as e:
        return [["missing", sys.executable, getattr(e, "name", None) or "", str(e)]]
    return [["ok", sys.executable, lakestep.__version__,
             os.path.dirname(os.path.dirname(os.path.abspath(lakestep.__file__)))]]
'''


def _probe() -> Callable[[Any], list[list[str]]]:
    namespace: dict[str, Any] = {"__builtins__": builtins}
    exec(compile(_PROBE_SOURCE, "<lakestep executor probe>", "exec"), namespace)
    return namespace["probe"]


def _run_probe(spark: Any, tasks: int) -> list[tuple[str, str, str, str]]:
    """Step 2: the probe's answers from ``tasks`` tasks, through a SQL Python UDF (a plain one: no
    pyarrow needed where it runs, so a missing pyarrow is reported by the probe like a missing lakestep)."""
    from pyspark.sql.functions import col, udf
    from pyspark.sql.types import ArrayType, StringType

    ask = udf(_probe(), ArrayType(ArrayType(StringType())), useArrow=False)
    rows = spark.range(0, tasks, 1, tasks).select(ask(col("id")).alias("r")).collect()
    return [(str(a[0]), str(a[1]), str(a[2]), str(a[3])) for row in rows for a in row["r"]]


@dataclass(frozen=True)
class ExecutorLakestep:
    """What the executors' Python workers import: their interpreter, lakestep's version, and
    where lakestep came from (a directory, or the zip shipped with ``--py-files``)."""

    python: str
    version: str
    location: str


_checked: set[str] = set()
_lock = threading.Lock()


def driver_problem(location: str, jvm_pythonpath: str) -> str | None:
    """Step 0's rule: lakestep imported from ``location`` (the directory or zip holding the
    ``lakestep`` package) by the Python driver whose JVM has ``jvm_pythonpath``; the problem, or None."""
    import os

    if not location.endswith(".zip"):
        return None  # installed, or a directory on PYTHONPATH: the JVM's Python processes import it the same way
    if os.path.realpath(location) in {os.path.realpath(p) for p in jvm_pythonpath.split(os.pathsep) if p}:
        return None
    return f"the driver imports lakestep from {location} (--py-files), which is not on spark-submit's PYTHONPATH"


def worker_python(sc: Any) -> str:
    """The interpreter Spark starts its Python workers with: ``PYSPARK_PYTHON`` as the driver's
    SparkContext read it (``spark-submit --conf spark.pyspark.python`` sets it), else Spark's
    default ``python3`` from the PATH."""
    return str(getattr(sc, "pythonExec", None) or "python3")


def _first_cause(e: BaseException) -> str:
    """The most telling line of a failed Spark job: a Python error of the worker if there is one."""
    text = str(e)
    for ln in text.splitlines():
        s = ln.strip()
        if s.startswith(("ModuleNotFoundError", "ImportError", "java.io.IOException", "Cannot run program")) \
                or "No module named" in s:
            return s
    return next((ln.strip() for ln in text.splitlines() if ln.strip()), type(e).__name__)


def _check_driver(sc: Any) -> None:
    """Step 0."""
    import os

    try:
        jvm_path = str(sc._jvm.java.lang.System.getenv("PYTHONPATH") or "")
    except Exception:  # no JVM gateway to ask
        return
    # the folder lakestep's package is in (this module is lakestep/streaming/executors.py)
    problem = driver_problem(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), jvm_path)
    if problem is None:
        return
    raise SparkSetupError(
        f"{problem}: Spark does not hand --py-files to the Python processes its driver JVM starts for data "
        f"sources, so lakestep's sources would fail there. Start spark-submit with the zip on PYTHONPATH too "
        f"(`PYTHONPATH=lakestep.zip spark-submit --py-files lakestep.zip ...`), or install lakestep on the "
        f"driver's machine; see README, 'On a cluster'", problems=[problem])


def check_executors(spark: Any, *, force: bool = False) -> list[ExecutorLakestep] | None:
    """Steps 0-3: the distinct lakestep set-ups the executors run, or None when they were not asked.

    ``force``: check even in local mode, and again in an application checked before.

    Raises:
        SparkSetupError: lakestep (or what it needs) does not import on some
            executor, or imports in another version than the driver's (steps 1-3);
            or the driver's lakestep is a --py-files zip its JVM does not see (step 0).
    """
    from .._version import __version__

    try:
        sc = spark.sparkContext
        master, app = str(sc.master), str(sc.applicationId)
    except Exception:  # Spark Connect: no SparkContext, no RDDs to probe with
        return None
    _check_driver(sc)
    if not force and app in _checked:
        return None
    local = master.startswith("local")
    tasks = 1 if local else max(int(sc.defaultParallelism), 1)
    python = worker_python(sc)
    fix = (f"set PYSPARK_PYTHON (or spark.pyspark.python) to a Python that has lakestep and its dependencies, "
           f"such as this driver's {sys.executable}, before the SparkSession starts" if local else HOW_TO_SHIP)
    where = f"Spark's Python workers ({master}, which run {python})" if local else f"Spark's executors ({master})"
    try:
        rows = _run_probe(spark, tasks)
    except Exception as e:  # the probe itself could not run (no Python on the executors, ...)
        first = _first_cause(e)
        raise SparkSetupError(f"could not run lakestep's check in {where}: {first[:500]}. To fix: {fix}",
                              problems=[first[:500]]) from e
    missing = sorted({f"python {py}: {msg}" for kind, py, _, msg in rows if kind == "missing"})
    if missing:
        raise SparkSetupError(
            f"lakestep cannot run on {where}: {'; '.join(missing)}. To fix: {fix}", problems=missing)
    found = sorted({ExecutorLakestep(py, ver, loc) for _, py, ver, loc in rows}, key=repr)
    other = [f"python {f.python}: lakestep {f.version} from {f.location}" for f in found if f.version != __version__]
    if other:
        raise SparkSetupError(
            f"Spark's executors import another lakestep than the driver's {__version__}: {'; '.join(other)}. "
            f"Ship the driver's copy: {HOW_TO_SHIP}", problems=other)
    with _lock:
        _checked.add(app)
    log.info("Spark's executors run lakestep: %s", found)
    return found
