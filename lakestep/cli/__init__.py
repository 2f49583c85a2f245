"""The ``lakestep`` command: an operator's view of a catalog and its pipeline.

``lakestep --help`` lists the commands; each takes ``--catalog URL`` (or the
``LAKESTEP_CATALOG`` environment variable; a warehouse directory stands for
its SQLite catalog) and ``--json``. Built on click and rich, which come with
the ``cli`` extra (``pip install 'lakestep[cli]'``): the library itself, and
the Spark workers that import it, do without them.

Errors of lakestep (:class:`lakestep.LakestepError`) print one line on stderr
and exit with code 1; passwords in URLs are masked in everything printed.
"""

from __future__ import annotations

import sys
from typing import Sequence

INSTALL_HINT = "pip install 'lakestep[cli]'"


def main(argv: Sequence[str] | None = None) -> int:
    """The console script ``lakestep``."""
    from .._memory import prefer_returning_pool

    prefer_returning_pool()  # before anything imports pyarrow (lakestep/_memory.py)
    try:
        import click  # noqa: F401
        import rich  # noqa: F401
    except ImportError as e:
        print(f"lakestep: the command line needs the 'cli' extra ({e.name} is missing): {INSTALL_HINT}",
              file=sys.stderr)
        return 1
    from .app import run

    return run(argv)
