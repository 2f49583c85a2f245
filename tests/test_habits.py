"""Habits checked on every landing: ``ruff check`` (pyflakes and import order, the settings
in pyproject.toml's ``[tool.ruff]``) and ``mypy`` (``[tool.mypy]``) pass on lakestep/."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _run(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", *argv], cwd=ROOT, capture_output=True, text=True, timeout=600)


def test_ruff_check_passes() -> None:
    out = _run("ruff", "check", "--no-cache", "lakestep")
    assert out.returncode == 0, out.stdout + out.stderr


def test_mypy_passes() -> None:
    out = _run("mypy")  # what it checks, and how strictly: pyproject.toml's [tool.mypy]
    assert out.returncode == 0, out.stdout + out.stderr


def test_lazy_exports_are_listed() -> None:
    """The lazily loaded packages spell ``__all__`` out (so linters and readers see it) and
    it names exactly what ``__getattr__`` loads."""
    import lakestep.streaming.kafka as kafka

    assert kafka.__all__ == sorted(kafka._PUBLIC)
