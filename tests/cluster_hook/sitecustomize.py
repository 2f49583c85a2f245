"""Loaded by the Python processes of the test's Spark cluster (tests/sparkcluster.py puts this
directory, and nothing else, on their PYTHONPATH). Test plumbing only; lakestep never imports it.

1. ``LS_TEST_NO_EDITABLE``: lakestep comes only from what the application ships
   (``--py-files``): the shared virtualenv's editable install of lakestep is
   taken out of the import system, as on a machine where lakestep was never installed;
2. ``LS_TEST_NO_CATALOG_DB=<file>`` (the workers' processes, i.e. executors): there is no
   catalog database here. ``psycopg2.connect`` and ``sqlite3.connect`` append a line
   to ``<file>`` (pid and what was asked) and raise: only drivers talk to the catalog;
3. ``LS_TEST_HOLD_DIR=<dir>`` (one worker's processes): while ``<dir>`` exists (armed),
   the first sink task of that worker's executor that wrote rows writes a marker file
   ``task-*`` into ``<dir>`` after writing its files, and waits (blocked on the FIFO
   ``<dir>/gate`` until a byte arrives, or ``<dir>/release`` existed already; at most
   ten minutes), so that the test kills the worker in the middle of that micro-batch.

Not guaranteed: a connection made by a library that bypasses psycopg2 and sqlite3.
"""

import os
import sys

if os.environ.get("LS_TEST_NO_EDITABLE"):
    sys.meta_path[:] = [f for f in sys.meta_path if not str(getattr(f, "__module__", "")).startswith("__editable__")]
    sys.path_hooks[:] = [h for h in sys.path_hooks if not str(getattr(h, "__module__", "")).startswith("__editable__")]
    sys.path_importer_cache.clear()

_db_log = os.environ.get("LS_TEST_NO_CATALOG_DB")
if _db_log:
    def _refuse(kind):  # type: ignore[no-untyped-def]
        def connect(*args, **kwargs):  # type: ignore[no-untyped-def]
            with open(_db_log, "a") as f:
                f.write(f"pid {os.getpid()}: {kind}.connect{args!r} {sorted(kwargs)}\n")
            raise RuntimeError(f"test cluster: executors have no catalog database ({kind}.connect refused)")
        return connect

    import sqlite3
    import sqlite3.dbapi2

    sqlite3.connect = sqlite3.dbapi2.connect = _refuse("sqlite3")
    try:
        import psycopg2

        psycopg2.connect = _refuse("psycopg2")
    except ImportError:
        pass

_hold = os.environ.get("LS_TEST_HOLD_DIR")
if _hold:
    import importlib.abc
    import importlib.util

    def _patch(module):  # type: ignore[no-untyped-def]
        import select

        orig = module.BatchFiles.write

        def write(self, iterator, prefix):  # type: ignore[no-untyped-def]
            msg = orig(self, iterator, prefix)
            armed = os.path.isdir(_hold) and not any(n.startswith("task-") for n in os.listdir(_hold))
            if msg.rows and armed:
                tmp = os.path.join(_hold, f".tmp-{os.getpid()}")
                with open(tmp, "w") as f:
                    f.write(f"{self.shape.ident} {prefix}: {msg.rows} rows in {len(msg.files)} file(s), "
                            f"pid {os.getpid()}")
                os.rename(tmp, os.path.join(_hold, f"task-{os.getpid()}"))
                # A blocking wait, no polling: the task holds the gate FIFO open for reading
                # and writing (Linux: opening O_RDWR never blocks, and keeps a reader open
                # for release()), then checks the release marker, then waits for a byte.
                # release() writes the marker before it opens the gate, so either the marker
                # is seen here or the gate was open when release() wrote to it.
                try:
                    fd = os.open(os.path.join(_hold, "gate"), os.O_RDWR)
                except FileNotFoundError:  # disarmed meanwhile
                    return msg
                try:
                    if not os.path.exists(os.path.join(_hold, "release")):
                        select.select([fd], [], [], 600)
                finally:
                    os.close(fd)
            return msg

        module.BatchFiles.write = write

    class _Loader(importlib.abc.Loader):
        def __init__(self, inner):  # type: ignore[no-untyped-def]
            self.inner = inner

        def create_module(self, spec):  # type: ignore[no-untyped-def]
            return self.inner.create_module(spec)

        def exec_module(self, module):  # type: ignore[no-untyped-def]
            self.inner.exec_module(module)
            _patch(module)

    class _Finder(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path, target=None):  # type: ignore[no-untyped-def]
            if name != "lakestep.streaming.sink":
                return None
            sys.meta_path.remove(self)
            try:
                spec = importlib.util.find_spec(name)
            finally:
                sys.meta_path.insert(0, self)
            if spec is not None and spec.loader is not None:
                spec.loader = _Loader(spec.loader)
            return spec

    sys.meta_path.insert(0, _Finder())
