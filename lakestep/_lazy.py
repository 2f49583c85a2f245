"""Lazy public names for a package's ``__init__``: each name is imported from its module on
first use (so ``import lakestep`` needs neither pyspark nor the catalog's imports), then kept
in the package's namespace.

Usage, in a package's ``__init__.py`` (with an ``if TYPE_CHECKING:`` block importing the same
names, for type checkers, readers and tests/test_structure.py)::

    _PUBLIC = {"Catalog": "catalog", "Coordinator": "services"}   # name -> module, relative
    __getattr__, __dir__ = _lazy.exports(__name__, _PUBLIC)
"""

from __future__ import annotations

import importlib
import sys
from typing import Any, Callable, Mapping


def exports(package: str, public: Mapping[str, str]) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The ``__getattr__`` and ``__dir__`` of ``package`` that load ``public`` (name -> module
    below the package) on first use."""

    def __getattr__(name: str) -> Any:
        module = public.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(f"{package}.{module}"), name)
        setattr(sys.modules[package], name, value)
        return value

    def __dir__() -> list[str]:
        return sorted(set(vars(sys.modules[package])) | set(public))

    return __getattr__, __dir__
