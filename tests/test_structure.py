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
* imports under ``if TYPE_CHECKING:`` are left out (but for the lazy re-exports above):
  they are never run, they only name types for annotations;
* imports under ``if __name__ == "__main__":`` are left out: they run only when the file
  is run as a script, as ``python -m lakestep.barrier.coordinator`` hands over to the
  ``lakestep`` command there;
* deprecated shims are left out: a module whose docstring starts with ``Deprecated``
  only re-exports its replacement for old import paths (and warns).
  :func:`test_no_library_module_imports_a_deprecated_shim` makes sure nothing in
  lakestep/ imports one, so a shim cannot close a cycle.

The checks, each failing with the file:line of every import involved:

1. no cycle between modules;
2. no cycle between lakestep's top-level packages (``lakestep.catalog``,
   ``lakestep.barrier``, ``lakestep.streaming``, ...; a top-level module such as
   ``lakestep.errors`` is its own node, the root ``lakestep/__init__.py`` too);
3. the layers hold: each package imports only the packages below it in :data:`LAYERS`
   (the catalog knows nothing of barriers, the barrier layer nothing of Spark, and
   ``lakestep.query`` builds on ``lakestep.streaming``'s Spark I/O, never the reverse).
   :data:`UPWARD` lists the few imports that reach up on purpose, each with its reason;
   checks 2 and 3 leave them out, and fail once one is no longer made (so the list
   only shrinks);
4. no import of a private name (one leading underscore, not a dunder) from another
   module, such as ``from .files import _encode``: give it a public name where it
   lives. A private *module* (``lakestep/barrier/_sql.py``) may be imported from its
   own package and below;
5. library code does not import the command line (``lakestep.cli``, or the former
   ``lakestep._cli``): click and rich are an extra that Spark workers do without.
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
    "testing": frozenset({"catalog", "barrier", "streaming"}),
    "serve": frozenset({"catalog", "barrier", "iceberg", "query", "report"}),  # the live page is the report
    "cli": frozenset({"catalog", "barrier", "iceberg", "streaming", "query", "report", "serve"}),
}
#: Imports that reach a layer up, on purpose, with why: (importing module, imported module).
#: Each is a deferred import of the optional Iceberg publisher (lakestep/iceberg, the
#: ``iceberg`` extra), made only when a catalog publishes. Moving them out means moving the
#: maintenance loop above lakestep.iceberg (a new public path for MaintenanceLoop) and the
#: doctor's publishing check out of lakestep.barrier.health: a decision for its own change.
UPWARD: dict[tuple[str, str], str] = {
    ("lakestep.catalog.maintenance", "lakestep.iceberg.state"):
        "the maintenance loop publishes to Iceberg each round while the catalog publishes",
    ("lakestep.catalog.maintenance", "lakestep.iceberg.publisher"):
        "the maintenance loop makes its Publisher on first use (lakestep.iceberg loads it lazily)",
    ("lakestep.barrier.health", "lakestep.iceberg.state"):
        "the doctor reports how far Iceberg publishing lags",
}
#: The command line's packages: nothing else in lakestep/ may import them.
CLI = ("lakestep.cli", "lakestep._cli")


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


def _is_shim(tree: ast.Module) -> bool:
    doc = ast.get_docstring(tree)
    return bool(doc) and doc.lstrip().lower().startswith("deprecated")


def _guard(test: ast.expr) -> str | None:
    """``TYPE_CHECKING`` or ``__main__`` for the ``if`` tests whose body is left out."""
    if isinstance(test, ast.Name) and test.id == "TYPE_CHECKING":
        return "TYPE_CHECKING"
    if isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING":
        return "TYPE_CHECKING"
    if (isinstance(test, ast.Compare) and isinstance(test.left, ast.Name) and test.left.id == "__name__"
            and len(test.comparators) == 1 and isinstance(test.comparators[0], ast.Constant)
            and test.comparators[0].value == "__main__"):
        return "__main__"
    return None


def _import_nodes(tree: ast.AST) -> list[ast.Import | ast.ImportFrom]:
    """Every import statement, at any depth, but for the guarded blocks' bodies (their
    ``else`` still runs)."""
    found: list[ast.Import | ast.ImportFrom] = []

    def visit(node: ast.AST) -> None:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            found.append(node)
            return
        if isinstance(node, ast.If) and _guard(node.test):
            for child in node.orelse:
                visit(child)
            return
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return found


def _resolve(module: str, path: Path, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    base = package[: len(package) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _lazy_exports() -> dict[str, dict[str, str]]:
    """Per package that loads its public names in a module-level ``__getattr__``: the module
    of each name its ``if TYPE_CHECKING:`` block imports."""
    out: dict[str, dict[str, str]] = {}
    for module, path in MODULES.items():
        if path.name != "__init__.py":
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        if not any(isinstance(n, ast.FunctionDef) and n.name == "__getattr__" for n in tree.body):
            continue
        names: dict[str, str] = {}
        for node in tree.body:
            if isinstance(node, ast.If) and _guard(node.test) == "TYPE_CHECKING":
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
    imports: list[Import]  # every import of every module (shims' own included)
    shims: frozenset[str]

    def edges(self, *, upward: bool = True) -> dict[str, dict[str, list[Import]]]:
        """module -> imported module of lakestep/ -> the imports that make the edge
        (``upward=False``: without the imports of :data:`UPWARD`)."""
        g: dict[str, dict[str, list[Import]]] = defaultdict(lambda: defaultdict(list))
        for i in self.imports:
            if i.target in MODULES and i.target != i.source and i.source not in self.shims \
                    and (upward or (i.source, i.target) not in UPWARD):
                g[i.source][i.target].append(i)
        return g


def _graph() -> Graph:
    imports: list[Import] = []
    shims = set()
    for module, path in MODULES.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        if _is_shim(tree):
            shims.add(module)
        imports.extend(_imports(module, path, tree))
    return Graph(imports, frozenset(shims))


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


def _package_edges(*, upward: bool = False) -> dict[str, dict[str, list[Import]]]:
    g: dict[str, dict[str, list[Import]]] = defaultdict(lambda: defaultdict(list))
    for a, targets in GRAPH.edges(upward=upward).items():
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


def test_every_upward_import_is_still_made() -> None:
    made = {(i.source, i.target) for i in GRAPH.imports}
    stale = sorted(set(UPWARD) - made)
    assert not stale, f"no longer imported: remove them from UPWARD in {Path(__file__).name}: {stale}"


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
            if a is None or b not in subpackages:
                continue  # the root's lazy re-exports, and the top-level modules
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


def test_no_library_module_imports_a_deprecated_shim() -> None:
    bad = [f"{i.where}: {i.source} imports the deprecated {i.target}" for i in GRAPH.imports
           if i.target in GRAPH.shims and i.source not in GRAPH.shims]
    assert not bad, "import the module that replaced the shim:\n" + "\n".join(bad)


def _shim_statement(node: ast.stmt) -> bool:
    """What a shim may hold: imports of lakestep (its replacement), ``import warnings``,
    ``__all__``, and one ``warnings.warn(...)``."""
    if isinstance(node, ast.ImportFrom):
        return bool(node.level) or (node.module or "").startswith("lakestep") or node.module == "__future__"
    if isinstance(node, ast.Import):
        return [a.name for a in node.names] == ["warnings"]
    if isinstance(node, ast.Assign):
        return all(isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets)
    return (isinstance(node, ast.Expr) and isinstance(node.value, ast.Call)
            and ast.unparse(node.value.func) == "warnings.warn")


def test_a_deprecated_shim_only_reexports() -> None:
    """A shim re-exports its replacement, says which release removes it, and holds no code of its own."""
    for shim in sorted(GRAPH.shims):
        tree = ast.parse(MODULES[shim].read_text(encoding="utf-8"))
        doc = ast.get_docstring(tree) or ""
        assert "removed in" in doc.lower(), f"{MODULES[shim]}: say in its docstring which release removes it"
        for node in tree.body[1:]:
            assert _shim_statement(node), \
                f"{MODULES[shim]}:{node.lineno}: a shim holds only imports of its replacement, __all__ and a warning"
