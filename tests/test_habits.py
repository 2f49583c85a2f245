"""Habits checked on every landing: ``ruff check`` (pyflakes and import order, the settings
in pyproject.toml's ``[tool.ruff]``: lakestep/, the tests, benchmarks, scripts and examples) and
``mypy`` (``[tool.mypy]``: lakestep/) pass."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _run(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", *argv], cwd=ROOT, capture_output=True, text=True, timeout=600)


def test_ruff_check_passes() -> None:
    out = _run("ruff", "check", "--no-cache")  # what it checks: pyproject.toml's [tool.ruff] include
    assert out.returncode == 0, out.stdout + out.stderr


def test_mypy_passes() -> None:
    out = _run("mypy")  # what it checks, and how strictly: pyproject.toml's [tool.mypy]
    assert out.returncode == 0, out.stdout + out.stderr


def test_lazy_exports_are_listed() -> None:
    """The lazily loaded packages spell ``__all__`` out (so linters and readers see it) and
    it names exactly what ``__getattr__`` loads."""
    import lakestep
    import lakestep.streaming.kafka as kafka

    assert kafka.__all__ == sorted(kafka._PUBLIC)
    assert lakestep.__all__ == sorted([*lakestep._PUBLIC, "__version__"])


def test_the_front_door_names_what_a_pipeline_is_written_with() -> None:
    """``from lakestep import ...`` reaches each public name, from the module that defines it,
    and the catalog's names come without pyspark (a fresh interpreter: this one has Spark)."""
    import importlib

    import lakestep
    import lakestep.errors as errors

    for name, module in lakestep._PUBLIC.items():
        assert getattr(lakestep, name) is getattr(importlib.import_module(f"lakestep.{module}"), name)
    every_error = {n for n, v in vars(errors).items()
                   if isinstance(v, type) and issubclass(v, errors.LakestepError) and not n.startswith("_")}
    assert every_error <= set(lakestep._PUBLIC)  # every error is catchable from the front door
    code = ("import sys; from lakestep import Catalog, Pipeline, duckdb_query, LakestepError, MaintenanceLoop; "
            "print(sorted(m for m in ('pyspark', 'kafka', 'duckdb') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    assert out.stdout.strip() == "[]"
