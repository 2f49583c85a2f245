"""No ``raise`` of a bare built-in exception anywhere in lakestep/ (issue 33).

Everything lakestep raises on purpose derives from :class:`lakestep.errors.LakestepError`
(tests/catalog/test_error_hierarchy.py checks the public API's error paths at run time).
This test reads the source instead, so a new ``raise ValueError(...)`` fails here, named
by file and line, even on a path no test reaches. Raise a typed error from
lakestep/errors.py (``InvalidArgumentError`` is also a ``ValueError``,
``ArgumentTypeError`` a ``TypeError``, ``InternalError`` a ``RuntimeError``) or, in the
Kafka source, from lakestep/streaming/kafka/errors.py.

Allowed: re-raising (``raise``, ``raise exc``, ``raise ... from exc`` of a caught
variable), and the built-ins that belong to a Python protocol rather than to lakestep:
``AttributeError`` in ``__getattr__``, ``ImportError`` for a missing dependency,
``SystemExit``, ``StopIteration``, ``KeyboardInterrupt``, ``GeneratorExit``, and
``NotImplementedError`` in a method that is nothing but that raise (an interface's
method: its docstring allowed), an ``@abstractmethod`` or a method of a Protocol or ABC.
"""

from __future__ import annotations

import ast
import builtins
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "lakestep"

#: Every built-in exception class, by name.
BUILTIN_EXCEPTIONS = frozenset(
    name for name, value in vars(builtins).items() if isinstance(value, type) and issubclass(value, BaseException)
)
#: Built-ins a Python protocol asks for: raising them is not an error of lakestep's.
PROTOCOL = frozenset({"SystemExit", "StopIteration", "StopAsyncIteration", "KeyboardInterrupt", "GeneratorExit",
                      "ImportError", "ModuleNotFoundError"})
_INTERFACE_BASES = frozenset({"Protocol", "ABC", "ABCMeta"})


def _name(node: ast.expr) -> str | None:
    """``X`` of ``X``, ``X(...)``, ``builtins.X`` and ``builtins.X(...)``."""
    if isinstance(node, ast.Call):
        node = node.func
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "builtins":
        return node.attr
    return None


def _base_names(cls: ast.ClassDef) -> set[str]:
    names = {_name(b) or (b.attr if isinstance(b, ast.Attribute) else "") for b in cls.bases}
    names |= {_name(k.value) or "" for k in cls.keywords if k.arg == "metaclass"}
    return names


def _only_raises(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    body = fn.body
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
            and isinstance(body[0].value.value, str):
        body = body[1:]  # the docstring
    return len(body) == 1 and isinstance(body[0], ast.Raise)


def _abstract(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    return any((_name(d) or (d.attr if isinstance(d, ast.Attribute) else "")) == "abstractmethod"
               for d in fn.decorator_list)


class _Finder(ast.NodeVisitor):
    def __init__(self, path: str, tree: ast.Module) -> None:
        self.path = path
        self.found: list[str] = []
        self.stack: list[ast.AST] = []
        self.shadowed = {node.id for node in ast.walk(tree)  # a module-level name that hides a built-in
                         if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store)
                         and node.id in BUILTIN_EXCEPTIONS}

    def generic_visit(self, node: ast.AST) -> None:
        self.stack.append(node)
        super().generic_visit(node)
        self.stack.pop()

    def _function(self) -> ast.FunctionDef | ast.AsyncFunctionDef | None:
        return next((n for n in reversed(self.stack) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))),
                    None)

    def _allowed(self, name: str) -> bool:
        if name in PROTOCOL:
            return True
        fn = self._function()
        if name == "AttributeError":
            return fn is not None and fn.name in ("__getattr__", "__getattribute__")
        if name == "NotImplementedError" and fn is not None:
            if _only_raises(fn) or _abstract(fn):
                return True
            owner = self.stack[self.stack.index(fn) - 1] if self.stack.index(fn) > 0 else None
            return isinstance(owner, ast.ClassDef) and bool(_base_names(owner) & _INTERFACE_BASES)
        return False

    def visit_Raise(self, node: ast.Raise) -> None:
        name = _name(node.exc) if node.exc is not None else None
        if name in BUILTIN_EXCEPTIONS and name not in self.shadowed and not self._allowed(name):
            self.found.append(f"{self.path}:{node.lineno}: raise {name}")
        self.generic_visit(node)


def bare_raises(root: Path = PACKAGE) -> list[str]:
    """``file:line: raise Name`` for every raise of a bare built-in exception under ``root``."""
    found: list[str] = []
    for path in sorted(root.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        finder = _Finder(str(path.relative_to(ROOT)), tree)
        finder.visit(tree)
        found += finder.found
    return found


def test_lakestep_raises_no_bare_builtin_exception() -> None:
    found = bare_raises()
    assert not found, (f"{len(found)} raise(s) of a bare built-in exception; raise a LakestepError subclass "
                       "(lakestep/errors.py) that is also that built-in instead:\n" + "\n".join(found))


@pytest.mark.parametrize("source, offending", [
    ("def f(x):\n    raise ValueError(x)\n", True),
    ("def f():\n    raise RuntimeError\n", True),
    ("import builtins\ndef f():\n    raise builtins.TypeError('t')\n", True),
    ("def f(d, k):\n    raise KeyError(k)\n", True),
    ("def f():\n    raise Exception('boom')\n", True),
    ("def f():\n    raise AssertionError('unreachable')\n", True),
    ("def f(x):\n    if x:\n        return 1\n    raise NotImplementedError(x)\n", True),
    ("def f(e):\n    raise ValueError('bad') from e\n", True),
    ("class C:\n    def g(self):\n        '''Doc.'''\n        raise NotImplementedError\n", False),
    ("from typing import Protocol\nclass P(Protocol):\n    def g(self):\n        x = 1\n"
     "        raise NotImplementedError(x)\n", False),
    ("from abc import abstractmethod\nclass C:\n    @abstractmethod\n    def g(self):\n        x = 1\n"
     "        raise NotImplementedError(x)\n", False),
    ("def f():\n    try:\n        pass\n    except ValueError as e:\n        raise\n", False),
    ("def f():\n    try:\n        pass\n    except ValueError as e:\n        raise e\n", False),
    ("from lakestep.errors import InvalidArgumentError\ndef f(x):\n"
     "    raise InvalidArgumentError('bad', argument='x', value=x) from None\n", False),
    ("def __getattr__(name):\n    raise AttributeError(name)\n", False),
    ("def f():\n    raise AttributeError('no')\n", True),
    ("try:\n    import numpy\nexcept ImportError as e:\n    raise ImportError('needs numpy') from e\n", False),
    ("if __name__ == '__main__':\n    raise SystemExit(0)\n", False),
])
def test_the_guard_finds_bare_raises(source: str, offending: bool) -> None:
    """The guard itself: it must fail on each kind of bare raise, and only on those."""
    finder = _Finder("m.py", tree := ast.parse(source))
    finder.visit(tree)
    assert bool(finder.found) is offending, finder.found
