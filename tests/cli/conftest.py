"""The installed ``lakestep`` console script, and the pipeline it is pointed at: the
one of examples/operator.py (its docstring draws the topology and the state it
stops in: open epoch 5, committed 2, shop.daily 1 and shop.vip and shop.summary
2 barriers behind, an orphan under shop.orders), built in a fresh SQLite or
PostgreSQL catalog for every test.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import pytest

from examples.operator import ORPHAN, build  # noqa: F401 (ORPHAN: for the tests)
from lakestep import Catalog
from lakestep.barrier import Coordinator, Pipeline

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


def lakestep(*args: str, catalog: str | None = None, env: dict[str, str] | None = None, timeout: float = 120,
             script: Path | None = None) -> Run:
    """Run the installed console script as a user would (this checkout's code on PYTHONPATH)."""
    if not SCRIPT.exists():
        pytest.fail(f"the console script {SCRIPT} is not installed: pip install -e '.[test]'")
    e = {k: v for k, v in os.environ.items() if k not in ("LAKESTEP_CATALOG", "FORCE_COLOR", "NO_COLOR",
                                                        "TTY_COMPATIBLE", "COLUMNS")}
    e.update({"PYTHONPATH": str(ROOT), "COLUMNS": "200", "PYTHONIOENCODING": "utf-8"})
    e.update(env or {})
    argv = [str(script or SCRIPT), *args] + (["--catalog", catalog] if catalog else [])
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=e, cwd=str(ROOT))
    return Run(proc.returncode, proc.stdout, proc.stderr)
