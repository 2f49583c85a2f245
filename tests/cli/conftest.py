"""The ``lakestep`` command line (run in this process, or as the installed console script), and
the pipeline it is pointed at: the one of examples/operator.py (its docstring draws the
topology and the state it stops in: open epoch 5, committed 2, shop.daily 1 and shop.vip and
shop.summary 2 barriers behind, an orphan under shop.orders), built in a fresh SQLite or
PostgreSQL catalog for every test.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import pytest

from examples.operator import ORPHAN, build  # noqa: F401 (ORPHAN: for the tests)
from lakestep import Catalog
from lakestep.barrier import Pipeline
from lakestep.services import Coordinator

from ..conftest import CatalogSpec

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = Path(sys.executable).parent / "lakestep"


@dataclass
class Shop:
    spec: CatalogSpec
    catalog: Catalog
    pipeline: Pipeline
    coordinator: Coordinator
    orphan: Path  # a file under shop.orders' data/ that no commit recorded

    @property
    def url(self) -> str:
        return self.spec.url


@pytest.fixture
def shop(catalog_spec: CatalogSpec) -> Iterator[Shop]:
    cat = catalog_spec.open()
    s = Shop(catalog_spec, cat, *build(cat))
    yield s
    cat.close()


@dataclass
class Run:
    code: int
    out: str
    err: str

    def json(self) -> Any:
        assert self.code in (0, 3), self.err
        return json.loads(self.out)  # one JSON document, nothing else on stdout

    def lines(self) -> list[str]:
        return self.out.splitlines()


ENV_DROPPED = ("LAKESTEP_CATALOG", "FORCE_COLOR", "NO_COLOR", "TTY_COMPATIBLE", "COLUMNS")


def lakestep(*args: str, catalog: str | None = None, env: dict[str, str] | None = None) -> Run:
    """Run the command line in this process, as the console script does: ``lakestep.cli.main(argv)``,
    its return value is the exit code (the script's ``sys.exit(main())``), and stdout and stderr are
    what the user would see (click's CliRunner isolation swaps sys.stdin/stdout/stderr and os.environ).

    Starting the script once per call cost a Python start-up and the imports of pyarrow, SQLAlchemy,
    rich and DuckDB, a second or more each, for hundreds of calls; the installed script itself is
    started as a real process by :func:`lakestep_process` (test_actions.py's
    test_console_script_is_a_real_process and test_readme_commands_run).

    What the process gave for free is undone here: the root logger's handlers and level (the
    services set them) are put back, and the environment is the script's (no $LAKESTEP_CATALOG,
    no colour overrides, COLUMNS=200). An exception that escapes ``main`` fails the test (a
    process would print its traceback and exit with code 1: the tests refuse both).
    """
    from click.testing import CliRunner

    from lakestep.cli import main

    e: dict[str, str | None] = {k: None for k in ENV_DROPPED}
    e.update({"COLUMNS": "200", "PYTHONIOENCODING": "utf-8"})
    e.update(env or {})
    argv = [*args] + (["--catalog", catalog] if catalog else [])
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    try:
        with CliRunner().isolation(env=e) as (out, err, _mixed):
            try:
                code = main(argv)
            except SystemExit as exit_:  # what the process would have exited with
                code = exit_.code if isinstance(exit_.code, int) else (0 if exit_.code is None else 1)
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
            return Run(code, out.getvalue().decode(), err.getvalue().decode())
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)


def lakestep_process(*args: str, catalog: str | None = None, env: dict[str, str] | None = None,
                     timeout: float = 120, cwd: Path = ROOT) -> Run:
    """Run the installed console script as a real process, as a user would (this checkout's code on
    PYTHONPATH)."""
    if not SCRIPT.exists():
        pytest.fail(f"the console script {SCRIPT} is not installed: pip install -e '.[test]'")
    e = {k: v for k, v in os.environ.items() if k not in ENV_DROPPED}
    e.update({"PYTHONPATH": str(ROOT), "COLUMNS": "200", "PYTHONIOENCODING": "utf-8"})
    e.update(env or {})
    argv = [str(SCRIPT), *args] + (["--catalog", catalog] if catalog else [])
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=e, cwd=str(cwd))
    return Run(proc.returncode, proc.stdout, proc.stderr)
