"""A small mutation run over the modules that decide correctness (issue 16 §4).

    python scripts/mutate.py                       # every target, its fast tests
    python scripts/mutate.py --list                # the mutants, not run
    python scripts/mutate.py --target lakestep/barrier/states.py --only 3,7

Hand-picked operators, one change per mutant, on the code's tokens (never in
comments or docstrings):

* comparisons: ``<`` ``<=`` ``>`` ``>=`` ``==`` ``!=`` each to its neighbour;
  ``is`` <-> ``is not``; ``in`` <-> ``not in``;
* boolean operators: ``and`` <-> ``or``;
* ``Verdict.NONE`` / ``SOME`` / ``ALL`` to another verdict;
* the order comparisons inside SQL string literals (``<=`` -> ``<`` ...),
  since the barrier states are decided in SQL (equalities there are joins
  and keys: mutating them breaks everything, so they are left out).

Each mutant is written into a copy of the repository and the target's fast
tests run against it on SQLite, stopping at the first failure (killed). A
mutant no test fails survives; the report lists the survivors. Not part of
``make test`` (``make mutate``): it takes minutes per target.
"""

from __future__ import annotations

import argparse
import io
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import tokenize
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# target -> the fast tests that guard it (run on SQLite, -x)
TARGETS: dict[str, list[str]] = {
    "lakestep/catalog/commit.py": [
        "tests/catalog/test_conflicts.py", "tests/catalog/test_transactions.py",
        "tests/catalog/test_writes.py", "tests/catalog/test_cleanup.py", "tests/catalog/test_pk.py",
        "tests/catalog/test_schema_evolution.py", "tests/barrier/test_rollback.py",
    ],
    "lakestep/catalog/predicates.py": [
        "tests/catalog/test_writes.py", "tests/catalog/test_conflicts.py", "tests/catalog/test_pk.py",
        "tests/catalog/test_druid.py",
    ],
    "lakestep/barrier/states.py": [
        "tests/barrier/test_states.py", "tests/barrier/test_rollback.py",
        "tests/barrier/test_coordinator.py", "tests/barrier/test_topology.py",
    ],
}

_OPS = {"<": ["<=", ">"], "<=": ["<", ">="], ">": [">=", "<"], ">=": [">", "<="], "==": ["!="], "!=": ["=="]}
_NAMES = {"and": ["or"], "or": ["and"]}
_VERDICTS = ["NONE", "SOME", "ALL"]
# order comparisons only: an equality in SQL is a join or a key, and breaking it breaks everything
_SQL_CMP = re.compile(r"(?<=\s)(<=|>=|<|>)(?=\s)")
_SQL_SWAP = {"<": "<=", "<=": "<", ">": ">=", ">=": ">"}


@dataclass(frozen=True)
class Mutant:
    n: int
    line: int
    col: int
    old: str
    new: str
    start: int  # character offsets in the source
    end: int

    def apply(self, src: str) -> str:
        return src[:self.start] + self.new + src[self.end:]

    def describe(self, path: str) -> str:
        return f"#{self.n} {path}:{self.line}:{self.col}  {self.old!r} -> {self.new!r}"


def _offsets(src: str) -> list[int]:
    out, pos = [0], 0
    for line in src.splitlines(keepends=True):
        pos += len(line)
        out.append(pos)
    return out


def _docstring_lines(src: str) -> set[int]:
    """Lines of docstrings (module, class, function): their text is not code."""
    import ast

    lines: set[int] = set()
    for node in ast.walk(ast.parse(src)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
                lines.update(range(first.lineno, (first.end_lineno or first.lineno) + 1))
    return lines


def mutants(src: str) -> list[Mutant]:
    offs = _offsets(src)
    skip = _docstring_lines(src)
    toks = list(tokenize.generate_tokens(io.StringIO(src).readline))
    found: list[tuple[int, int, str, str, int, int]] = []

    def at(tok: tokenize.TokenInfo) -> tuple[int, int]:
        return offs[tok.start[0] - 1] + tok.start[1], offs[tok.end[0] - 1] + tok.end[1]

    for i, tok in enumerate(toks):
        if tok.start[0] in skip:
            continue
        s, e = at(tok)
        if tok.type == tokenize.OP and tok.string in _OPS:
            for new in _OPS[tok.string]:
                found.append((tok.start[0], tok.start[1], tok.string, new, s, e))
        elif tok.type == tokenize.NAME and tok.string in _NAMES:
            for new in _NAMES[tok.string]:
                found.append((tok.start[0], tok.start[1], tok.string, new, s, e))
        elif tok.type == tokenize.NAME and tok.string == "is":
            nxt = toks[i + 1]
            if nxt.string == "not":
                found.append((tok.start[0], tok.start[1], "is not", "is", s, at(nxt)[1]))
            else:
                found.append((tok.start[0], tok.start[1], "is", "is not", s, e))
        elif tok.type == tokenize.NAME and tok.string == "in" and toks[i - 1].string not in ("for", "not"):
            if toks[i - 1].string == "not":
                continue
            found.append((tok.start[0], tok.start[1], "in", "not in", s, e))
        elif tok.type == tokenize.NAME and tok.string == "not" and toks[i + 1].string == "in":
            found.append((tok.start[0], tok.start[1], "not in", "in", s, at(toks[i + 1])[1]))
        elif (tok.type == tokenize.NAME and tok.string in _VERDICTS and i >= 2 and toks[i - 1].string == "."
              and toks[i - 2].string == "Verdict"):
            for new in _VERDICTS:
                if new != tok.string:
                    found.append((tok.start[0], tok.start[1], f"Verdict.{tok.string}", f"Verdict.{new}", s, e))
        elif tok.type == tokenize.STRING and re.search(r"\b(SELECT|WHERE|UPDATE)\b", tok.string):
            for m in _SQL_CMP.finditer(tok.string):
                line = tok.start[0] + tok.string.count("\n", 0, m.start())
                found.append((line, m.start(), f"SQL {m.group(1)}", _SQL_SWAP[m.group(1)], s + m.start(), s + m.end()))
    out = []
    for n, (line, col, old, new, s, e) in enumerate(found, 1):
        text = new.split(".", 1)[1] if old.startswith("Verdict.") else new  # the token is the name only
        out.append(Mutant(n, line, col, old, text, s, e))
    return out


def run_tests(copy: Path, tests: list[str], timeout: float) -> tuple[str, float]:
    env = dict(os.environ, PYTHONPATH=str(copy), PYTHONDONTWRITEBYTECODE="1")
    t0 = time.monotonic()
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", "-k", "not postgres",
             "-m", "not slow", *tests],
            cwd=copy, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return "killed (timeout)", time.monotonic() - t0
    dt = time.monotonic() - t0
    if proc.returncode == 0:
        return "SURVIVED", dt
    if proc.returncode == 1:
        return "killed", dt
    return f"killed (pytest exit {proc.returncode})", dt


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", action="append", help="a target file (default: all)")
    ap.add_argument("--only", default=None, help="comma-separated mutant numbers")
    ap.add_argument("--list", action="store_true", help="list the mutants and exit")
    ap.add_argument("--timeout", type=float, default=900.0, help="seconds per mutant before it counts as killed")
    args = ap.parse_args(argv)
    targets = args.target or list(TARGETS)
    only = None if args.only is None else {int(x) for x in args.only.split(",")}
    survivors: dict[str, list[str]] = {}
    with tempfile.TemporaryDirectory(prefix="lakestep-mutate-") as tmp:
        copy = Path(tmp) / "repo"
        shutil.copytree(ROOT, copy, ignore=shutil.ignore_patterns(".git", ".venv", "__pycache__", "*.egg-info",
                                                                   ".pytest_cache", ".hypothesis"))
        for target in targets:
            path = copy / target
            src = path.read_text()
            ms = [m for m in mutants(src) if only is None or m.n in only]
            print(f"{target}: {len(ms)} mutant(s); tests: {' '.join(TARGETS[target])}", flush=True)
            if args.list:
                for m in ms:
                    print("  " + m.describe(target))
                continue
            base, dt = run_tests(copy, TARGETS[target], args.timeout)
            if base != "SURVIVED":
                print(f"  the unmutated code fails its tests ({base}): fix that first", flush=True)
                return 2
            print(f"  unmutated: tests pass in {dt:.0f}s", flush=True)
            survivors[target] = []
            try:
                for m in ms:
                    path.write_text(m.apply(src))
                    outcome, dt = run_tests(copy, TARGETS[target], args.timeout)
                    print(f"  {m.describe(target)}: {outcome} ({dt:.0f}s)", flush=True)
                    if outcome == "SURVIVED":
                        survivors[target].append(m.describe(target))
            finally:
                path.write_text(src)
    if not args.list:
        print("\nsurvivors:")
        for target, names in survivors.items():
            print(f"  {target}: {len(names)}")
            for name in names:
                print(f"    {name}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
