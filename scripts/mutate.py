"""A small mutation run over the modules that decide correctness (issue 16 §4).

    python scripts/mutate.py                       # every target, its fast tests
    python scripts/mutate.py --list                # the mutants, not run
    python scripts/mutate.py --target lakestep/barrier/rules.py --only 3,7

Hand-picked operators, one change per mutant, on the code's tokens (never in
comments or docstrings):

* comparisons: ``<`` ``<=`` ``>`` ``>=`` ``==`` ``!=`` each to its neighbour;
  ``is`` <-> ``is not``; ``in`` <-> ``not in``;
* boolean operators: ``and`` <-> ``or``;
* ``Verdict.NONE`` / ``SOME`` / ``ALL`` to another verdict;
* the order comparisons inside SQL string literals (``<=`` -> ``<`` ...),
  since the barrier states are decided in SQL (equalities there are joins
  and keys: mutating them breaks everything, so they are left out).

A change that does not compile (``for x not in y``) is no mutant and is left
out. Besides these, each target may name mutants of its own (:data:`NAMED`:
the exact text and its replacement, e.g. the ones an issue names), and list
the mutants known to be equivalent (:data:`EQUIVALENT`: they cannot change
behaviour, each with the reason), which are reported and not run.

Each mutant is written into a copy of the repository and the target's fast
tests run against it on SQLite (``--postgres``: PostgreSQL as well; the
tests that exist only on PostgreSQL, such as the fault-proxy ones, run
either way), stopping at the first failure (killed). A
mutant no test fails survives; the report lists the survivors and the counts
per target. Not part of ``make test`` (``make mutate``): it takes minutes per
target. Not guaranteed: a survivor is only as meaningful as the operator list
above; a killed mutant says some test failed, not which guarantee it broke.
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

# target -> the fast tests that guard it (run on SQLite, -x), the quickest killers first: with -x a
# killed mutant costs only the tests up to the first failure, a survivor costs them all.
_RESOLVE_TESTS = [
    "tests/catalog/test_commit_branches.py", "tests/catalog/test_writes.py", "tests/catalog/test_pk.py",
    "tests/catalog/test_transactions.py", "tests/catalog/test_schema_evolution.py",
    "tests/barrier/test_rollback.py", "tests/catalog/test_conflicts.py", "tests/catalog/test_druid.py",
]
TARGETS: dict[str, list[str]] = {
    "lakestep/catalog/commit.py": [
        "tests/catalog/test_commit_branches.py", "tests/catalog/test_writes.py", "tests/catalog/test_transactions.py",
        "tests/catalog/test_pk.py", "tests/catalog/test_schema_evolution.py", "tests/catalog/test_cleanup.py",
        "tests/barrier/test_rollback.py", "tests/catalog/test_error_hierarchy.py", "tests/catalog/test_faults.py",
        "tests/catalog/test_conflicts.py",
    ],
    # the conflict matrix (moved out of commit.py): its planners, undoing compactions, RESTORE
    "lakestep/catalog/resolver.py": _RESOLVE_TESTS,
    "lakestep/catalog/predicates.py": [
        "tests/catalog/test_predicates.py", "tests/catalog/test_partition_reads.py", "tests/catalog/test_bad_input.py",
        "tests/catalog/test_error_hierarchy.py", "tests/catalog/test_writes.py", "tests/catalog/test_pk.py",
        "tests/catalog/test_conflicts.py", "tests/catalog/test_druid.py",
    ],
    # the barrier rules, defined once (issue 33): the property test compares every accelerator with them
    "lakestep/barrier/rules.py": [
        "tests/barrier/test_rules.py", "tests/barrier/test_states.py",
    ],
    # the rules' SQL accelerators (the barrier facts, versions at barriers, the one-statement choice)
    "lakestep/barrier/facts.py": [
        "tests/barrier/test_rules.py", "tests/barrier/test_states.py", "tests/barrier/test_rollback.py",
        "tests/barrier/test_status.py", "tests/barrier/test_coordinator.py", "tests/barrier/test_topology.py",
    ],
    "lakestep/barrier/snapshots.py": [
        "tests/barrier/test_states.py", "tests/barrier/test_coordinator.py", "tests/barrier/test_simulation.py",
    ],
}

# Mutants the operators below do not make, named where they came from: (the exact source text,
# its replacement). The text must occur once in its target, or the run stops: a named mutant
# never rots silently.
NAMED: dict[str, list[tuple[str, str]]] = {
    # issue 33: the kernel's min/caps, which the operators above do not touch
    "lakestep/barrier/rules.py": [
        ("return 0 if tag_ is None else min(tag_, sealed(open_))", "return 0 if tag_ is None else tag_"),
        ("barrier = min(managed.values(), default=top)", "barrier = max(managed.values(), default=top)"),
        ("return min(((f or 0) for f in sink_frontiers), default=0)",
         "return max(((f or 0) for f in sink_frontiers), default=0)"),
        ("return min([sealed(open_), *((f or 0) for f in source_frontiers)])",
         "return min([open_, *((f or 0) for f in source_frontiers)])"),
        ("return max(older, key=lambda c: c.version).barrier", "return max(older, key=lambda c: c.barrier).barrier"),
    ],
    "lakestep/catalog/resolver.py": [
        # issue 16 §4: a serializable check that conflicts only with files whose every row matches
        ("if self.c.scope.verdict(f) is not Verdict.NONE:", "if self.c.scope.verdict(f) is Verdict.ALL:"),
    ],
}

# Mutants that cannot change behaviour: (source text that covers the operator, the operator as
# the listing shows it, its replacement, why). They are listed, not run (--equivalent runs them
# too). An entry that matches no mutant stops the run: the code moved, look at it again.
EQUIVALENT: dict[str, list[tuple[str, str, str, str]]] = {
    "lakestep/barrier/snapshots.py": [
        ("OR s.expires_at > :now)", "SQL >", ">=",
         "the count below requires a live (> :now) snapshot of :first at that barrier too (:first is in :ids)"),
    ],
    "lakestep/barrier/rules.py": [
        ("era = [c.barrier for c in history if c.version >= start and", ">=", ">",
         "the RESTORE left out of its era: if it was the era's only barriered commit, the fallback takes the "
         "newest barriered commit, which is that RESTORE"),
        ("if c.barrier is not None and c.barrier <= e and lo < c.version < hi", "<", "<=",
         "lo < c.version: the RESTORE at lo joins its era's search only when the test after the search would "
         "pick it anyway (barriers increase within an era); c.version < hi: the commit at hi is a newer RESTORE "
         "tagged > e or untagged, which the search leaves out by its barrier"),
        ("if c.version > m and c.data_version > dv", ">", ">=",
         "version m itself has data version dv, not a greater one"),
    ],
    "lakestep/catalog/resolver.py": [
        ("S.commits.c.version > self.c.base_version", ">", ">=",
         "ops is looked up only at versions that removed files live at base_version: all above it"),
        ("if op != Operation.COMPACT.value or f.file_id not in", "or", "and",
         "both tests are always false: a source of an undone output was removed by that very compaction"),
        ("raise self.conflict(rv, f\"file {f.file_id} to restore was removed by a {op}\")\n"
         "            if at + self.c.retention_seconds <= self.now:", "<=", "<",
         "never decides: the same compaction's age was checked, with <=, when its output was undone above"),
    ],
    "lakestep/barrier/facts.py": [
        # the span of a kept answer (FactsCache.versions_at): speed only, or never decides
        ("h.barrier > :e AND h.version >= COALESCE(x.restore_v, 0)) AS hi", "SQL >", ">=",
         "hi = e only where m carries e itself: an empty span, the answer is asked again (speed only)"),
        ("h.barrier > :e AND h.version >= COALESCE(x.restore_v, 0)) AS hi", "SQL >=", ">",
         "a span exists only when m is in the newest era, tagged >= the RESTORE's barrier and <= e: the RESTORE "
         "is never above e"),
        # the tag and m of the newest era with its RESTORE left out: NULL where the RESTORE was the
        # answer, and NULL is what sends each statement to its exact fallback
        ("c.barrier IS NOT NULL AND c.version >= COALESCE(w.restore_v, 0)", "SQL >=", ">",
         "the RESTORE left out of its era's tag: NULL only if it was the era's one barriered commit; "
         "facts_ex then reads _NEWEST_TAG (that RESTORE's barrier), the choice takes the general path"),
        ("c.barrier <= :e AND c.version >= COALESCE(w.restore_v, 0)", "SQL >=", ">",
         "m NULL where the RESTORE was the answer: the era loop answers it (b_r <= e)"),
        ("c.barrier <= b.e AND c.version >= COALESCE(fr.restore_v, 0)", "SQL >=", ">",
         "m NULL where the RESTORE was the answer: choose._committed_fast takes the general path"),
        ("n.version > x.m AND n.data_version", "SQL >", ">=",
         "version m itself has data version d.data_version, not a greater one"),
        ("n.version > x.m + 1", "SQL >", ">=", "m + 1 is s, judged by the WHEN before: its data version is not greater"),
        ("COALESCE(f.tag, 0) < o.open_epoch - 1", "SQL <", "<=", "at tag = O - 1 both branches answer O - 1"),
        ("fr.frontier >= fr.joined", "SQL >=", ">",
         "e* in SQL only: choose._committed_fast recomputes e* in Python and takes the general path on any "
         "disagreement"),
        ("version > :lo", "SQL >", ">=",
         "the RESTORE at lo is tagged <= e only when the next test answers it anyway, and never beats a "
         "commit of its era tagged <= e (barrier, then version, descending)"),
        ("version < :hi", "SQL <", "<=", "the commit at hi is a newer RESTORE tagged > e or untagged: the loop went on"),
        ("AND version > :v AND data_version", "SQL >", ">=", "version v itself has data version dv, not a greater one"),
        ("version > :v AND barrier IS NOT NULL AND data_version > :dv", "SQL >", ">=",  # both of _FIRST_CHANGE
         "at.version (a version_at answer) is the last version of its data version, which never decreases"),
        ("if tag is None and restore_v is not None:", "and", "or",
         "with a tag the fallback reads the same barrier (the newest barriered commit carries its era's highest "
         "tag); with neither a tag nor a RESTORE it finds none either"),
        # choice_rows answers None (the general path, same answer) for more scopes: only speed is lost
        ("if not ids or len(ids) > _CHUNK:", "or", "and", "the general path answers the same: speed only"),
        ("if not ids or len(ids) > _CHUNK:", ">", ">=", "the general path answers the same: speed only"),
        ("if not ids or len(ids) > _CHUNK:", ">", "<", "the general path answers the same: speed only"),
        ("if m is None or", "is", "is not",
         "always the era loop: its first seek plus its RESTORE test is the one statement's seek of the newest "
         "era split in two (barriers increase with versions within an era), same dv, next change and checks"),
        ("(m < head and succ is None)", "<", "<=",
         "the era loop's m is below the newest RESTORE (<= head) whenever dv is not None: the one statement, "
         "in the same read snapshot, found nothing at or after it tagged <= e"),
    ],
    "lakestep/catalog/predicates.py": [
        ("if all_none and not any_some:", "and", "or",
         "all_none == (not any_some) always: a SOME clause sets both, nothing else does"),
        ("if lo is None or hi is None:", "or", "and",
         "statistics hold both bounds or neither (files.compute_stats: one type per column; NaN only if all are)"),
        ("\n    return Verdict.SOME\n", "Verdict.SOME", "NONE", "unreachable: every operator parse accepts returns above"),
        ("\n    return Verdict.SOME\n", "Verdict.SOME", "ALL", "unreachable: every operator parse accepts returns above"),
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


def mutants(src: str, named: list[tuple[str, str]] = ()) -> list[Mutant]:  # type: ignore[assignment]
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
                found.append((line, s + m.start() - offs[line - 1], f"SQL {m.group(1)}", _SQL_SWAP[m.group(1)],
                              s + m.start(), s + m.end()))
    for old, new in named:
        s = src.find(old)
        if s < 0 or src.find(old, s + 1) >= 0:
            raise SystemExit(f"named mutant {old!r}: the text must occur exactly once in the target")
        line = src.count("\n", 0, s) + 1
        found.append((line, s - offs[line - 1], old, new, s, s + len(old)))
    found.sort(key=lambda f: (f[4], f[5]))
    out: list[Mutant] = []
    for line, col, old, new, s, e in found:
        text = new.split(".", 1)[1] if old.startswith("Verdict.") else new  # the token is the name only
        m = Mutant(len(out) + 1, line, col, old, text, s, e)
        try:
            compile(m.apply(src), "<mutant>", "exec")
        except SyntaxError:  # e.g. "for x in y" -> "for x not in y": no mutant
            continue
        out.append(m)
    return out


def equivalent(src: str, m: Mutant, known: list[tuple[str, str, str, str]]) -> tuple[int, str] | None:
    """(index in ``known``, reason) if ``m`` is listed as equivalent: an occurrence of the entry's
    text (it may span lines) covers the mutated characters, and the operator and its replacement match."""
    for i, (text, old, new, why) in enumerate(known):
        if m.old != old or m.new != new:
            continue
        at = src.find(text)
        while at >= 0:
            if at <= m.start and m.end <= at + len(text):
                return i, why
            at = src.find(text, at + 1)
    return None


def run_tests(copy: Path, tests: list[str], timeout: float, postgres: bool = False) -> tuple[str, float]:
    # LAKESTEP_MUTANT: property tests skip shrinking (a killed mutant needs no minimal example)
    env = dict(os.environ, PYTHONPATH=str(copy), PYTHONDONTWRITEBYTECODE="1", LAKESTEP_MUTANT="1")
    t0 = time.monotonic()
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider",
             *([] if postgres else ["-k", "not postgres"]), "-m", "not slow", *tests],
            cwd=copy, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return "killed (timeout)", time.monotonic() - t0
    dt = time.monotonic() - t0
    if proc.returncode == 0:
        return "SURVIVED", dt
    if proc.returncode == 1:  # name the test that failed first (-x: the only one)
        failed = re.findall(r"^(?:FAILED|ERROR) (\S+)", proc.stdout, flags=re.M)
        return ("killed by " + failed[0]) if failed else "killed", dt
    return f"killed (pytest exit {proc.returncode})", dt


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", action="append", help="a target file (default: all)")
    ap.add_argument("--only", default=None, help="comma-separated mutant numbers")
    ap.add_argument("--list", action="store_true", help="list the mutants and exit")
    ap.add_argument("--equivalent", action="store_true", help="run the mutants listed as equivalent too")
    ap.add_argument("--postgres", action="store_true",
                    help="run the tests' PostgreSQL cases too (slower; some branches are taken on PostgreSQL only)")
    ap.add_argument("--timeout", type=float, default=None,
                    help="seconds per mutant before it counts as killed (default: 3x the unmutated run + 60)")
    args = ap.parse_args(argv)
    targets = args.target or list(TARGETS)
    only = None if args.only is None else {int(x) for x in args.only.split(",")}
    survivors: dict[str, list[str]] = {}
    counts: dict[str, tuple[int, int, int, int]] = {}  # mutants, killed, survivors, equivalent
    with tempfile.TemporaryDirectory(prefix="lakestep-mutate-") as tmp:
        copy = Path(tmp) / "repo"
        shutil.copytree(ROOT, copy, ignore=shutil.ignore_patterns(".git", ".venv", "__pycache__", "*.egg-info",
                                                                   ".pytest_cache", ".hypothesis"))
        for target in targets:
            path = copy / target
            src = path.read_text()
            known = EQUIVALENT.get(target, [])
            every = mutants(src, NAMED.get(target, []))
            hits = {m.n: equivalent(src, m, known) for m in every}
            stale = set(range(len(known))) - {h[0] for h in hits.values() if h is not None}
            if stale:
                for i in sorted(stale):
                    print(f"{target}: the equivalent mutant {known[i][:3]} matches no mutant: look at it again")
                return 2
            ms = [m for m in every if only is None or m.n in only]
            print(f"{target}: {len(ms)} mutant(s); tests: {' '.join(TARGETS[target])}", flush=True)
            if args.list:
                for m in ms:
                    eq = hits[m.n]
                    print("  " + m.describe(target) + ("" if eq is None else f"  [equivalent: {eq[1]}]"))
                continue
            base, dt = run_tests(copy, TARGETS[target], args.timeout or 3600.0, args.postgres)
            if base != "SURVIVED":
                print(f"  the unmutated code fails its tests ({base}): fix that first", flush=True)
                return 2
            timeout = args.timeout or 3 * dt + 60
            print(f"  unmutated: tests pass in {dt:.0f}s (timeout per mutant {timeout:.0f}s)", flush=True)
            survivors[target] = []
            killed = equiv = 0
            try:
                for m in ms:
                    eq = hits[m.n]
                    if eq is not None and not args.equivalent:
                        equiv += 1
                        print(f"  {m.describe(target)}: equivalent ({eq[1]})", flush=True)
                        continue
                    path.write_text(m.apply(src))
                    outcome, dt = run_tests(copy, TARGETS[target], timeout, args.postgres)
                    note = "" if eq is None else "  [listed as equivalent]"
                    print(f"  {m.describe(target)}: {outcome} ({dt:.0f}s){note}", flush=True)
                    if outcome == "SURVIVED":
                        survivors[target].append(m.describe(target))
                    else:
                        killed += 1
            finally:
                path.write_text(src)
            counts[target] = (len(ms), killed, len(survivors[target]), equiv)
    if not args.list:
        print("\nsurvivors:")
        for target, names in survivors.items():
            n, killed, alive, equiv = counts[target]
            print(f"  {target}: {alive} ({n} mutants: {killed} killed, {alive} survived, {equiv} equivalent)")
            for name in names:
                print(f"    {name}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
