"""freeze_worker_heap (lakestep/streaming/executors.py) in Spark's own Python workers.

Spark runs ``gc.collect()`` in a reused Python worker after every task; lakestep's executor
entry points freeze what the worker has loaded so that those collections stop walking it.
"""

from __future__ import annotations

import gc
from typing import Any, Iterator

import pytest

from lakestep.streaming.executors import freeze_worker_heap

pytestmark = pytest.mark.spark


def test_a_worker_freezes_what_it_loaded_once_per_import(spark: Any) -> None:
    # (defined here so that Spark pickles it by value: the test module is not importable in workers)
    def _in_a_task(_: Iterator[Any]) -> Iterator[tuple[int, int, int, int]]:
        import os
        import sys

        from lakestep.streaming.executors import freeze_worker_heap

        freeze_worker_heap()
        first = gc.get_freeze_count()
        kept = [[i] for i in range(50_000)]  # tracked objects made after the freeze
        freeze_worker_heap()  # no module loaded since: nothing to do, they stay the collector's
        again = gc.get_freeze_count()
        sys.modules["_ls_test_new_module"] = type(sys)("_ls_test_new_module")  # a module loaded since
        try:
            freeze_worker_heap()
            after_import = gc.get_freeze_count()
        finally:
            del sys.modules["_ls_test_new_module"]
        del kept
        yield os.getpid(), first, again, after_import

    rows = spark.sparkContext.parallelize(range(2), 2).mapPartitions(_in_a_task).collect()
    assert len(rows) == 2
    for _pid, first, again, after_import in rows:
        assert first > 10_000  # pyspark, pyarrow and lakestep's modules at least
        assert again == first  # the 50,000 lists made since were left to the collector
        assert after_import >= first + 50_000  # a module loaded since: frozen again, the lists with it


def test_outside_a_task_nothing_is_frozen() -> None:
    before = gc.get_freeze_count()
    freeze_worker_heap()
    assert gc.get_freeze_count() == before
