"""Arrow's memory pool in lakestep's long-running processes: one that gives freed memory back.

pyarrow's default pool on Linux is mimalloc, which keeps what Arrow frees in its own segments
rather than returning it to the system. A process that reads and writes Parquet for hours (a
service, a job's driver, a reader) then grows with the churn, not with what it holds: in the
endurance run (benchmarks/soak.py) the checking reader grew by ~300 MiB an hour and the
maintenance and serve processes by 135-200 MiB an hour within each life, while Arrow held a
few MiB. Reproduced alone: 800 appends with compactions and a read of the whole table after
each, RSS 151 -> 322 MiB with mimalloc, flat at ~160 MiB with jemalloc or the system allocator.

pyarrow reads its default pool from ``ARROW_DEFAULT_MEMORY_POOL`` once, when it is imported
(``pyarrow.set_memory_pool`` later changes only what pyarrow's Python functions allocate, not
what its Parquet reader, datasets and kernels do), so the choice belongs at a process's start:

1. lakestep's entry points (the ``lakestep`` command and ``python -m lakestep``: the
   coordinator, maintenance, serve) call :func:`prefer_returning_pool` before anything
   imports pyarrow: it sets ``ARROW_DEFAULT_MEMORY_POOL=jemalloc`` (Arrow's own build, which
   returns dirty pages after a short decay). Child processes inherit it.
2. A value already set is the user's choice, kept (``mimalloc`` keeps mimalloc). A process that
   imported pyarrow before (lakestep used as a library) is left alone: set the variable in the
   environment of long-running drivers and readers (docs/operations.md).

Not guaranteed: jemalloc where pyarrow was built without it (pyarrow then warns and keeps its
default); anything about memory other libraries allocate themselves (DuckDB, the JVM, Python
objects).
"""

from __future__ import annotations

import os
import sys

#: the environment variable pyarrow reads its default pool from (a user's choice when set)
ENV = "ARROW_DEFAULT_MEMORY_POOL"
#: what step 1 sets
PREFERRED = "jemalloc"


def prefer_returning_pool() -> str | None:
    """Steps 1-2: the value set, or None where the variable was set already or pyarrow is
    imported."""
    if os.environ.get(ENV) or "pyarrow" in sys.modules:
        return None
    os.environ[ENV] = PREFERRED
    return PREFERRED
