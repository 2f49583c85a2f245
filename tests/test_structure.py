"""The shape of lakestep/'s imports (issue 33): no import cycles, no private names taken
from other modules, and the command line kept apart from the library.

The test reads the source with :mod:`ast` and imports nothing. It builds the graph of
imports between the modules of lakestep/ this way:

* every import statement counts, at module level or inside a function, method or class:
  a deferred import still ties the two modules together (a cycle through it only moves
  the failure from import time to call time);
* relative imports are resolved against the importing module (``from . import x`` in a
  package's ``__init__`` is a sibling of that ``__init__``'s modules);
* ``from pkg import name`` counts as importing ``pkg.name`` when that is a module of
  lakestep/, as importing the module that holds ``name`` when ``pkg`` re-exports it
  lazily (a package whose ``__getattr__`` loads its public names on first use, and whose
  ``if TYPE_CHECKING:`` block names the module of each: lakestep.streaming.kafka), and
  as importing ``pkg`` otherwise; ``import a.b.c`` counts as importing ``a.b.c`` (not
  the parent packages Python also runs on the way);
* imports under ``if TYPE_CHECKING:`` and ``if __name__ == "__main__":`` count too: a
  cycle through an annotation still ties two modules together (the reader of one must know
  the other), and a ``python -m`` block that imports a layer above makes a library module
  depend on it (``python -m lakestep <command>`` is the command line's own entry point,
  lakestep/__main__.py).

The checks, each failing with the file:line of every import involved:

1. no cycle between modules;
2. no cycle between lakestep's top-level packages (``lakestep.catalog``,
   ``lakestep.barrier``, ``lakestep.streaming``, ...; a top-level module such as
   ``lakestep.errors`` is its own node, the root ``lakestep/__init__.py`` too);
3. the layers hold: each package imports only the packages below it in :data:`LAYERS`
   (the catalog knows nothing of barriers, the barrier layer nothing of Spark, and
   ``lakestep.query`` builds on ``lakestep.streaming``'s Spark I/O, never the reverse).
   There is no list of exceptions: a module that needs a layer above it belongs above it
   (the long-running services, which use every library layer, are ``lakestep.services``);
4. no import of a private name (one leading underscore, not a dunder) from another
   module, such as ``from .files import _encode``: give it a public name where it
   lives. A private *module* (``lakestep/barrier/_sql.py``) may be imported from its
   own package and below;
5. library code does not import the command line (``lakestep.cli``, or the former
   ``lakestep._cli``; ``lakestep.__main__`` is the command line's ``python -m`` entry):
   click and rich are an extra that Spark workers do without.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "lakestep"

#: Which top-level packages each one may import (besides the top-level modules such as
#: lakestep.errors, lakestep.retry, lakestep.clock, which import no package). A package
#: missing from a set is above it, or beside it.
LAYERS: dict[str, frozenset[str]] = {
    "catalog": frozenset(),
    "barrier": frozenset({"catalog"}),
    "iceberg": frozenset({"catalog", "barrier"}),
    "streaming": frozenset({"catalog", "barrier"}),
    "query": frozenset({"catalog", "barrier", "streaming"}),
    "report": frozenset({"catalog", "barrier", "iceberg", "query"}),
    "testing": frozenset({"catalog", "barrier", "streaming", "services"}),
    # the long-running loops (coordinator, maintenance, publisher) on one base; the doctor
    "services": frozenset({"catalog", "barrier", "iceberg"}),
    "serve": frozenset({"catalog", "barrier", "iceberg", "query", "report", "services"}),  # the live page is the report
    "cli": frozenset({"catalog", "barrier", "iceberg", "streaming", "query", "report", "serve", "services"}),
}
#: The command line's packages: nothing else in lakestep/ may import them.
CLI = ("lakestep.cli", "lakestep._cli", "lakestep.__main__")


@dataclass(frozen=True)
class Import:
    source: str  # the importing module
    target: str  # the imported module (of lakestep/, or outside)
    file: str  # relative to the repository
    line: int
    names: tuple[str, ...] = ()  # for ``from target import names``: the names that are not modules

    @property
    def where(self) -> str:
        return f"{self.file}:{self.line}"


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _sources() -> dict[str, Path]:
    return {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


MODULES = _sources()


def _type_checking(test: ast.expr) -> bool:
    """``if TYPE_CHECKING:`` (bare or ``typing.TYPE_CHECKING``)."""
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _import_nodes(tree: ast.AST) -> list[ast.Import | ast.ImportFrom]:
    """Every import statement, at any depth (guarded blocks' too: the module docstring)."""
    return [n for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))]


def _resolve(module: str, path: Path, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    base = package[: len(package) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _defines_getattr(node: ast.stmt) -> bool:
    """``def __getattr__`` or ``__getattr__, __dir__ = _lazy.exports(...)`` (lakestep/_lazy.py)."""
    if isinstance(node, ast.FunctionDef):
        return node.name == "__getattr__"
    if isinstance(node, ast.Assign):
        return any(isinstance(n, ast.Name) and n.id == "__getattr__" for t in node.targets for n in ast.walk(t))
    return False


def _lazy_exports() -> dict[str, dict[str, str]]:
    """Per package that loads its public names in a module-level ``__getattr__``: the module
    of each name its ``if TYPE_CHECKING:`` block imports."""
    out: dict[str, dict[str, str]] = {}
    for module, path in MODULES.items():
        if path.name != "__init__.py":
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        if not any(_defines_getattr(n) for n in tree.body):
            continue
        names: dict[str, str] = {}
        for node in tree.body:
            if isinstance(node, ast.If) and _type_checking(node.test):
                for imp in ast.walk(node):
                    if isinstance(imp, ast.ImportFrom):
                        source = _resolve(module, path, imp)
                        if source in MODULES:
                            names.update({a.asname or a.name: source for a in imp.names})
        if names:
            out[module] = names
    return out


LAZY = _lazy_exports()


def _imports(module: str, path: Path, tree: ast.Module) -> list[Import]:
    rel = str(path.relative_to(ROOT))
    out: list[Import] = []
    for node in _import_nodes(tree):
        if isinstance(node, ast.Import):
            out.extend(Import(module, a.name, rel, node.lineno) for a in node.names)
            continue
        target = _resolve(module, path, node)
        plain: list[str] = []
        for a in node.names:
            sub = f"{target}.{a.name}"
            if sub in MODULES:
                out.append(Import(module, sub, rel, node.lineno))
            elif a.name in LAZY.get(target, {}):
                out.append(Import(module, LAZY[target][a.name], rel, node.lineno, (a.name,)))
            else:
                plain.append(a.name)
        if plain:
            out.append(Import(module, target, rel, node.lineno, tuple(plain)))
    return out


@dataclass
class Graph:
    imports: list[Import]  # every import of every module

    def edges(self) -> dict[str, dict[str, list[Import]]]:
        """module -> imported module of lakestep/ -> the imports that make the edge."""
        g: dict[str, dict[str, list[Import]]] = defaultdict(lambda: defaultdict(list))
        for i in self.imports:
            if i.target in MODULES and i.target != i.source:
                g[i.source][i.target].append(i)
        return g


def _graph() -> Graph:
    imports: list[Import] = []
    for module, path in MODULES.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        imports.extend(_imports(module, path, tree))
    return Graph(imports)


GRAPH = _graph()


def _package(module: str) -> str:
    """``lakestep.catalog.files`` -> ``lakestep.catalog``; a top-level module is its own package."""
    return ".".join(module.split(".")[:2])


def _components(g: dict[str, dict[str, list[Import]]]) -> list[list[str]]:
    """The strongly connected components of more than one node (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []
    counter = 0

    def connect(v: str) -> None:
        nonlocal counter
        index[v] = low[v] = counter
        counter += 1
        stack.append(v)
        on.add(v)
        for w in sorted(g.get(v, {})):
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(set(g) | {w for ws in g.values() for w in ws}):
        if v not in index:
            connect(v)
    return sorted(found)


def _shortest_cycle(g: dict[str, dict[str, list[Import]]], comp: list[str]) -> list[str]:
    """A shortest loop through the component's first node: [a, b, ..., a]."""
    members = set(comp)
    start = comp[0]
    paths = {start: [start]}
    frontier = [start]
    while frontier:
        nxt = []
        for v in frontier:
            for w in sorted(g.get(v, {})):
                if w not in members:
                    continue
                if w == start:
                    return paths[v] + [start]
                if w not in paths:
                    paths[w] = paths[v] + [w]
                    nxt.append(w)
        frontier = nxt
    return comp + [comp[0]]  # unreachable: a component of two or more nodes has a loop


def _describe(g: dict[str, dict[str, list[Import]]], comp: list[str]) -> str:
    loop = _shortest_cycle(g, comp)
    lines = [" -> ".join(loop)]
    for a, b in zip(loop, loop[1:]):
        where = ", ".join(i.where for i in g[a][b][:3]) + (" ..." if len(g[a][b]) > 3 else "")
        lines.append(f"    {a} -> {b}: {where}")
    if len(comp) > len(loop) - 1:
        lines.append(f"    the loop is part of a tangle of {len(comp)} ({', '.join(comp)}); its other imports:")
        shown = set(zip(loop, loop[1:]))
        members = set(comp)
        for a in comp:
            for b in sorted(g.get(a, {})):
                if b in members and (a, b) not in shown:
                    lines.append(f"    {a} -> {b}: " + ", ".join(i.where for i in g[a][b][:3]))
    return "\n".join(lines)


def _package_edges() -> dict[str, dict[str, list[Import]]]:
    g: dict[str, dict[str, list[Import]]] = defaultdict(lambda: defaultdict(list))
    for a, targets in GRAPH.edges().items():
        for b, imports in targets.items():
            pa, pb = _package(a), _package(b)
            if pa != pb:
                g[pa][pb].extend(imports)
    return g


# ------------------------------------------------------------------ the checks
def test_the_graph_sees_the_package() -> None:
    """The parser finds what it should (a guard against a test that passes on an empty graph)."""
    edges = GRAPH.edges()
    assert "lakestep.catalog.catalog" in MODULES and "lakestep.streaming.kafka.source" in MODULES
    assert "lakestep.errors" in edges["lakestep.catalog.catalog"]  # from ..errors import ...
    assert "lakestep.catalog" in _package_edges()["lakestep.barrier"]
    assert LAZY["lakestep.streaming.kafka"]["ingest"] == "lakestep.streaming.kafka.ingestion"
    assert LAZY["lakestep.services"]["Coordinator"] == "lakestep.services.coordinator"


def test_no_import_cycle_between_modules() -> None:
    edges = GRAPH.edges()
    cycles = [_describe(edges, c) for c in _components(edges)]
    assert not cycles, "import cycles between modules of lakestep/:\n" + "\n".join(cycles)


def test_no_import_cycle_between_packages() -> None:
    edges = _package_edges()
    cycles = [_describe(edges, c) for c in _components(edges)]
    assert not cycles, "import cycles between lakestep's packages:\n" + "\n".join(cycles)


def test_each_package_imports_only_the_layers_below_it() -> None:
    subpackages = {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").is_file()}
    missing = sorted(subpackages - set(LAYERS))
    assert not missing, f"add these packages to LAYERS in {Path(__file__).name}: {missing}"
    bad = []
    for pa, targets in sorted(_package_edges().items()):
        a = pa.split(".")[1] if pa != "lakestep" else None
        for pb, imports in sorted(targets.items()):
            b = pb.split(".")[1] if pb != "lakestep" else None
            if a is None or b not in subpackages or pa == "lakestep.__main__":
                continue  # the root's lazy re-exports; ``python -m lakestep``, the command line's entry
            if b not in LAYERS.get(a, frozenset()):  # a top-level module imports no package
                bad.append(f"{pa} imports {pb}: " + ", ".join(i.where for i in imports))
    assert not bad, "imports against the layers (LAYERS):\n" + "\n".join(bad)


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def test_no_private_name_imported_from_another_module() -> None:
    bad = []
    for i in GRAPH.imports:
        if not i.target.startswith("lakestep"):
            continue
        for n in i.names:  # attributes of another module (a module's name never lands here)
            if _private(n):
                bad.append(f"{i.where}: {i.source} imports {n} from {i.target}")
        # a private module, imported from outside the package it belongs to
        parts = i.target.split(".")
        for k, part in enumerate(parts):
            owner = ".".join(parts[:k])
            if _private(part) and i.target in MODULES and not (i.source + ".").startswith(owner + "."):
                bad.append(f"{i.where}: {i.source} imports the private module {i.target} from outside {owner}")
    assert not bad, "private names imported from other modules (make them public where they live):\n" + "\n".join(bad)


def test_library_code_does_not_import_the_command_line() -> None:
    bad = [f"{i.where}: {i.source} imports {i.target}" for i in GRAPH.imports
           if any(i.target == c or i.target.startswith(c + ".") for c in CLI)
           and not any(i.source == c or i.source.startswith(c + ".") for c in CLI)]
    assert not bad, "library code importing the command line:\n" + "\n".join(bad)
    assert "lakestep._cli" not in MODULES, "lakestep/_cli.py is gone: the cli package holds what commands share"
