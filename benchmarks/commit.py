"""Commit benchmark: lakestep against its peers, on the same work, in one run.

Workload: ``N`` sequential appends to ONE table, each commit appending ONE
Parquet file of 100 rows (``benchmarks.peers.make_batch``).  Every system is
timed (``time.perf_counter``) on its full user-facing append -- data file write
plus metadata commit -- after one untimed warm-up append.

Measured, with targets:

1. commits/s, p50 and p99 latency of lakestep on SQLite and on PostgreSQL and
   of every peer of ``benchmarks.peers``: pyiceberg (SQLite / PostgreSQL
   ``SqlCatalog``), delta-rs, DuckLake (SQLite / PostgreSQL metadata).
2. throughput ratios (commits/s), from this run only:
   lakestep / delta-rs >= 20 (both lakestep backends), lakestep / pyiceberg on
   the same metadata database >= 100, lakestep / DuckLake on the same metadata
   database >= 3.
3. concurrency, per lakestep backend: 4 spawned processes, each with its own
   ``Catalog`` on the same URL, append N/4 commits each to the same table,
   released together by a barrier.  Total commits/s from the first start to
   the last finish >= 0.8x the sequential figure; 0 exceptions surfaced to the
   callers; every successful append's file is live afterwards.
4. history, per lakestep backend: append p50 on a table with ``--history``
   commits (built with 1-row appends) over the p50 on a fresh table <= 1.5, and
   ``Table.files()`` on that table (10000+ live files), median of 20 runs < 20 ms.

Each lakestep PostgreSQL measurement gets a fresh database, dropped at the end.
Output: a plain-text table on stdout, every number in the JSON file ``--out``.

``--statements`` measures no time at all: per lakestep backend, the SQL statements
one append sends (counted with SQLAlchemy's ``before_cursor_execute``: a table's
first append, then ``--n`` more, default 20) and the Python function calls per
append (cProfile, the data file write included). Both are deterministic, so they
tell a regression of the commit path on a machine too busy for timings. Targets:
at most :data:`STATEMENT_TARGETS` statements per append. JSON: ``--out``, by
default benchmarks/results/commit-statements.json.

Run: ``python -m benchmarks.commit [--n 500] [--history 10000] [--skip-peers] [--quick] [--statements]``
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import cProfile
import datetime as dt
import json
import multiprocessing as mp
import operator
import os
import platform
import pstats
import queue
import re
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from importlib import metadata
from pathlib import Path
from typing import Any, Callable, Iterator

from sqlalchemy import event

import lakestep
from lakestep import Catalog, Table

from .peers import DEFAULT_PG_DSN, PEERS, RUNS, SCHEMA, Backend, _timed, fresh_pg_url, make_batch, summarize

BACKENDS: tuple[Backend, ...] = ("sqlite", "postgres")
WORKERS = 4
RATIO_TARGETS = {"deltalake": 20.0, "pyiceberg": 100.0, "ducklake": 3.0}
CONCURRENCY_TARGET = 0.8
HISTORY_TARGET = 1.5
LIST_TARGET_MS = 20.0
LIST_RUNS = 20
#: --statements: the most statements one append (after a table's first) may send.
STATEMENT_TARGETS: dict[str, int] = {"sqlite": 7, "postgres": 1}
STATEMENT_APPENDS = 20
_OPS: dict[str, Callable[[float, float], bool]] = {">=": operator.ge, "<=": operator.le, "<": operator.lt,
                                                   "==": operator.eq}


@dataclass
class Check:
    """One target: ``value op target``; a value of None (the measurement failed) is ERROR."""

    name: str
    value: float | None
    op: str
    target: float

    @property
    def result(self) -> str:
        if self.value is None:
            return "ERROR"
        return "PASS" if _OPS[self.op](self.value, self.target) else "MISS"

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "result": self.result}


# ------------------------------------------------------------------ lakestep runs
@contextlib.contextmanager
def new_catalog(workdir: Path, backend: Backend, pg_dsn: str) -> Iterator[Catalog]:
    """A new catalog with namespace ``bench``; on PostgreSQL in a fresh database, dropped after."""
    with contextlib.ExitStack() as stack:
        if backend == "sqlite":
            url = f"sqlite:///{workdir}/catalog.db"
        else:
            url = stack.enter_context(fresh_pg_url(pg_dsn, "bench_lakestep"))
        cat = Catalog(url, warehouse=str(workdir / "wh"))
        stack.callback(cat.close)  # runs before the database is dropped
        cat.create_namespace("bench")
        yield cat


def run_lakestep(n: int, workdir: Path, backend: Backend, pg_dsn: str) -> list[float]:
    """Step 1: per-commit latencies of ``n`` appends, like the peers."""
    with new_catalog(workdir, backend, pg_dsn) as cat:
        return _timed(n, cat.create_table("bench.t", SCHEMA).append)


def _worker(url: str, first: int, k: int, barrier: Any, results: Any) -> None:
    """One concurrent writer: a warm-up append, the barrier, then ``k`` timed appends."""
    batches = [make_batch(first + i) for i in range(k + 1)]
    errors: list[str] = []
    committed = timed_ok = 0
    cat: Catalog | None = None
    table: Table | None = None
    try:
        cat = Catalog(url)
        table = cat.load_table("bench.t")
        table.append(batches[0])
        committed += 1
    except Exception as e:  # counted, never raised: the parent reports it
        errors.append(f"setup: {type(e).__name__}: {e}")
        table = None
    try:
        barrier.wait(timeout=600)
    except Exception as e:
        errors.append(f"barrier: {type(e).__name__}: {e}")
    start = time.perf_counter()
    for batch in batches[1:] if table is not None else []:
        try:
            table.append(batch)
            timed_ok += 1
        except Exception as e:
            errors.append(f"{type(e).__name__}: {e}")
    end = time.perf_counter()
    if cat is not None:
        cat.close()
    results.put({"committed": committed + timed_ok, "timed_ok": timed_ok, "errors": errors,
                 "start": start, "end": end})


def run_concurrent(n: int, workdir: Path, backend: Backend, pg_dsn: str) -> dict[str, Any]:
    """Step 3: WORKERS spawned processes append n/WORKERS commits each to one table."""
    k = max(1, n // WORKERS)
    ctx = mp.get_context("spawn")
    with new_catalog(workdir, backend, pg_dsn) as cat:
        table = cat.create_table("bench.t", SCHEMA)
        barrier, results = ctx.Barrier(WORKERS), ctx.Queue()
        procs = [ctx.Process(target=_worker, args=(cat.url, w * (k + 1), k, barrier, results))
                 for w in range(WORKERS)]
        for p in procs:
            p.start()
        reports: list[dict[str, Any]] = []
        with contextlib.suppress(queue.Empty):
            for _ in procs:
                reports.append(results.get(timeout=1800))
        for p in procs:
            p.join(timeout=60)
            if p.is_alive():
                p.terminate()
        errors = [e for r in reports for e in r["errors"]]
        codes = [p.exitcode for p in procs]
        errors += [f"a worker sent no report (exit codes {codes})"] * (WORKERS - len(reports))
        ok = sum(r["timed_ok"] for r in reports)
        span = max((r["end"] for r in reports), default=0.0) - min((r["start"] for r in reports), default=0.0)
        return {
            "workers": WORKERS, "commits_per_worker": k, "commits": ok, "seconds": round(span, 3),
            "commits_per_s": round(ok / span, 2) if span > 0 else 0.0, "exceptions": len(errors),
            "error_samples": sorted(set(errors))[:5], "live_files": len(table.files()),
            "successful_appends": sum(r["committed"] for r in reports),
        }


def run_history(history: int, samples: int, workdir: Path, backend: Backend, pg_dsn: str) -> dict[str, Any]:
    """Step 4: append p50 on a fresh table vs on one with ``history`` commits; files() time."""
    with new_catalog(workdir, backend, pg_dsn) as cat:
        fresh = _timed(samples, cat.create_table("bench.fresh", SCHEMA).append)
        big = cat.create_table("bench.big", SCHEMA)
        tiny = make_batch(0, rows=1)
        t0 = time.perf_counter()
        for i in range(1, history + 1):
            big.append(tiny)
            if i % 1000 == 0 or i == history:
                el = time.perf_counter() - t0
                print(f"  [{backend}] history {i}/{history} ({i / el:.0f} commits/s)", file=sys.stderr, flush=True)
        build_s = time.perf_counter() - t0
        aged = _timed(samples, big.append)
        list_ms: list[float] = []
        for _ in range(LIST_RUNS):
            s = time.perf_counter()
            live = len(big.files())
            list_ms.append((time.perf_counter() - s) * 1000)
        p50_0, p50_h = statistics.median(fresh), statistics.median(aged)
        return {
            "history": history, "samples": samples, "build_s": round(build_s, 2),
            "build_commits_per_s": round(history / build_s, 1) if build_s else None,
            "fresh": summarize(fresh), "aged": summarize(aged), "p50_ratio": round(p50_h / p50_0, 3),
            "live_files": live, "files_ms_median": round(statistics.median(list_ms), 3),
            "files_ms_min": round(min(list_ms), 3), "files_ms_max": round(max(list_ms), 3),
        }


_LABEL = re.compile(r"^(?:(BEGIN|COMMIT|ROLLBACK|WITH)\b.*|(INSERT INTO|UPDATE|DELETE FROM) (\w+).*"
                    r"|(SELECT)\b.*?\bFROM (\w+).*)$", re.DOTALL)


def statement_label(sql: str) -> str:
    """A statement's verb and first table (``INSERT INTO ls_file``, ``SELECT FROM ls_table``),
    or its first two words."""
    m = _LABEL.match(" ".join(sql.split()))
    if m is None:
        return " ".join(sql.split()[:2])
    if m.group(1):
        return " ".join(sql.split()[:2]) if m.group(1) == "BEGIN" else m.group(1)
    if m.group(2):
        return f"{m.group(2)} {m.group(3)}"
    return f"SELECT FROM {m.group(5)}"


def count_statements(n: int, workdir: Path, backend: Backend, pg_dsn: str) -> dict[str, Any]:
    """--statements: what lakestep's append sends, no timing (see the module docstring)."""
    with new_catalog(workdir, backend, pg_dsn) as cat:
        # Calls first, on a table of their own: a listener leaves the engine's event dispatch
        # slower even once removed.
        profiled = cat.create_table("bench.profiled", SCHEMA)
        batches = [make_batch(i) for i in range(n + 1)]
        profiled.append(batches[0])
        prof = cProfile.Profile()
        prof.enable()
        for b in batches[1:]:
            profiled.append(b)
        prof.disable()
        calls = pstats.Stats(prof).total_calls  # type: ignore[attr-defined]

        table = cat.create_table("bench.t", SCHEMA)
        seen: list[str] = []

        def record(conn: Any, cursor: Any, statement: str, parameters: Any, context: Any, many: bool) -> None:
            seen.append(statement)

        event.listen(cat.backend.engine, "before_cursor_execute", record)
        try:
            table.append(batches[0])
            first = [statement_label(s) for s in seen]
            counts = []
            for b in batches[1:]:
                seen.clear()
                table.append(b)
                counts.append(len(seen))
            last = [statement_label(s) for s in seen]
        finally:
            event.remove(cat.backend.engine, "before_cursor_execute", record)
    return {"appends": n, "first_append": len(first), "per_append_min": min(counts), "per_append_max": max(counts),
            "python_calls_per_append": round(calls / n, 1), "first_append_statements": first,
            "append_statements": last, "kinds": dict(collections.Counter(last))}


def run_statements(args: argparse.Namespace) -> None:
    """The --statements mode (no peers, no timing)."""
    n = args.n if args.n is not None else STATEMENT_APPENDS
    result: dict[str, Any] = {"machine": machine_info(), "params": {"n": n, "rows_per_commit": 100},
                              "statements": {}}
    with tempfile.TemporaryDirectory(prefix="lakestep-bench-") as tmp:
        for b in BACKENDS:
            (Path(tmp) / b).mkdir()
            result["statements"][b] = _attempt(lambda: count_statements(n, Path(tmp) / b, b, args.pg_dsn))
    checks = [Check(f"statements per append[{b}]", r.get("per_append_max"), "<=", STATEMENT_TARGETS[b])
              for b, r in result["statements"].items()]
    result["targets"] = {"statements_per_append_max": STATEMENT_TARGETS}
    rows = [[b, r.get("first_append"), r.get("per_append_max"), r.get("python_calls_per_append"), r.get("error")]
            for b, r in result["statements"].items()]
    text = [text_table(f"lakestep {lakestep.__version__}: SQL statements per append ({n} appends of 100 rows)",
                       ["backend", "first append", "append", "python calls/append", "error"], rows)]
    text += [f"\n{b}, one append: " + ", ".join(r.get("append_statements", [])) for b, r in result["statements"].items()]
    text.append("\n" + text_table("Targets", ["check", "value", "target", "result"],
                                  [[c.name, c.value, f"{c.op} {c.target:g}", c.result] for c in checks]))
    finish(Path(args.out or "benchmarks/results/commit-statements.json"), result, checks, "\n".join(text))


# ------------------------------------------------------------------------ report
def machine_info() -> dict[str, Any]:
    versions = {}
    for dist in ("pyarrow", "sqlalchemy", "psycopg2-binary", "pyiceberg", "deltalake", "duckdb"):
        with contextlib.suppress(metadata.PackageNotFoundError):
            versions[dist] = metadata.version(dist)
    return {
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "cpu_count": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform(),
        "lakestep": lakestep.__version__, "versions": versions,
    }


def pct(xs: list[float], q: float) -> float | None:
    """Nearest-rank percentile ``q`` (0..1) of ``xs``; None when empty. Every benchmark's p50/p99."""
    if not xs:
        return None
    s = sorted(xs)
    return s[min(len(s) - 1, int(round(q * (len(s) - 1))))]


def finish(out: Path, result: dict[str, Any], checks: list[Check], text: str) -> None:
    """The end of every benchmark run: the JSON at ``out`` (checks included), the report, the tally."""
    result["checks"] = [c.to_json() for c in checks]
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(text)
    print(f"\n{sum(c.result == 'PASS' for c in checks)}/{len(checks)} targets met; JSON: {out}")


def text_table(title: str, headers: list[str], rows: list[list[Any]]) -> str:
    cells = [headers] + [["-" if c is None else (f"{c:.2f}" if isinstance(c, float) else str(c)) for c in r]
                         for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]

    def fmt(r: list[str]) -> str:
        return "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths)))

    return "\n".join([title, fmt(cells[0]), fmt(["-" * w for w in widths])] + [fmt(r) for r in cells[1:]])


def build_checks(seq: dict[str, dict[str, Any]], conc: dict[str, dict[str, Any]],
                 hist: dict[str, dict[str, Any]], skip_peers: bool) -> list[Check]:
    def cps(key: str) -> float | None:
        return seq.get(key, {}).get("commits_per_s")

    def ratio(a: float | None, b: float | None) -> float | None:
        return round(a / b, 2) if a and b else None

    checks: list[Check] = []
    for b in BACKENDS:
        ls = cps(f"lakestep/{b}")
        if not skip_peers:
            checks.append(Check(f"lakestep[{b}] / deltalake", ratio(ls, cps("deltalake/filesystem")), ">=",
                                RATIO_TARGETS["deltalake"]))
            for peer in ("pyiceberg", "ducklake"):
                checks.append(Check(f"lakestep[{b}] / {peer}[{b}]", ratio(ls, cps(f"{peer}/{b}")), ">=",
                                    RATIO_TARGETS[peer]))
    for b, c in conc.items():
        checks.append(Check(f"concurrent[{b}] / sequential", ratio(c.get("commits_per_s"), cps(f"lakestep/{b}")),
                            ">=", CONCURRENCY_TARGET))
        checks.append(Check(f"concurrent[{b}] exceptions", c.get("exceptions"), "==", 0))
        checks.append(Check(f"concurrent[{b}] lost appends",
                            c["successful_appends"] - c["live_files"] if "live_files" in c else None, "==", 0))
    for b, h in hist.items():
        checks.append(Check(f"history[{b}] p50 ratio", h.get("p50_ratio"), "<=", HISTORY_TARGET))
        checks.append(Check(f"history[{b}] files() median ms", h.get("files_ms_median"), "<", LIST_TARGET_MS))
    return checks


def report(result: dict[str, Any], checks: list[Check]) -> str:
    p = result["params"]
    seq_rows = [[k.split("/")[0], k.split("/")[1], v.get("commits_per_s"), v.get("p50_ms"), v.get("p99_ms"),
                 v.get("error")] for k, v in result["sequential"].items()]
    conc_rows = [[b, c.get("commits"), c.get("seconds"), c.get("commits_per_s"), c.get("exceptions"),
                  c.get("live_files"), c.get("successful_appends")] for b, c in result["concurrency"].items()]
    hist_rows = [[b, h.get("fresh", {}).get("p50_ms"), h.get("aged", {}).get("p50_ms"), h.get("p50_ratio"),
                  h.get("live_files"), h.get("files_ms_median"), h.get("build_commits_per_s")]
                 for b, h in result["history"].items()]
    m = result["machine"]
    parts = [
        f"lakestep {m['lakestep']} commit benchmark  {m['date']}  cpus={m['cpu_count']}  python {m['python']}",
        text_table(f"\n1. Sequential appends (n={p['n']}, one 100-row Parquet file per commit)",
                   ["system", "backend", "commits/s", "p50 ms", "p99 ms", "error"], seq_rows),
        text_table(f"\n3. Concurrency ({WORKERS} processes x {p['n'] // WORKERS} appends, one table)",
                   ["backend", "commits", "seconds", "commits/s", "exceptions", "live files", "appends ok"],
                   conc_rows),
        text_table(f"\n4. History ({p['history']} commits; {p['samples']} timed appends each side)",
                   ["backend", "p50 ms @0", f"p50 ms @{p['history']}", "ratio", "live files",
                    "files() ms", "build commits/s"], hist_rows),
        text_table("\n2-4. Targets", ["check", "value", "target", "result"],
                   [[c.name, c.value, f"{c.op} {c.target:g}", c.result] for c in checks]),
    ]
    errors = [f"  {section}[{b}]: {e}" for section in ("concurrency", "history")
              for b, r in result[section].items() for e in ([r["error"]] if "error" in r else r.get("error_samples", []))]
    if errors:
        parts.append("\nErrors:\n" + "\n".join(errors))
    return "\n".join(parts)


def _attempt(fn: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """One failing measurement must not stop the others."""
    try:
        return fn()
    except Exception as exc:
        return {"error": f"{type(exc).__name__}: {exc}"}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--n", type=int, default=None,
                        help="sequential commits per system (500; quick: 40; --statements: 20 appends)")
    parser.add_argument("--history", type=int, default=None, help="commits of the aged table (10000; quick: 300)")
    parser.add_argument("--out", default=None,
                        help="JSON file (benchmarks/results/commit.json; --statements: commit-statements.json)")
    parser.add_argument("--pg-dsn", default=DEFAULT_PG_DSN)
    parser.add_argument("--skip-peers", action="store_true", help="measure lakestep only")
    parser.add_argument("--quick", action="store_true", help="small numbers: a smoke run")
    parser.add_argument("--statements", action="store_true",
                        help="count SQL statements and Python calls per lakestep append (no timing), then exit")
    args = parser.parse_args(argv)
    if args.statements:
        run_statements(args)
        return
    n = args.n if args.n is not None else (40 if args.quick else 500)
    history = args.history if args.history is not None else (300 if args.quick else 10_000)
    samples = 30 if args.quick else 200

    def step(label: str) -> None:
        print(f"[{time.strftime('%H:%M:%S')}] {label}", file=sys.stderr, flush=True)

    result: dict[str, Any] = {
        "machine": machine_info(),
        "params": {"n": n, "history": history, "samples": samples, "workers": WORKERS, "quick": args.quick,
                   "skip_peers": args.skip_peers, "rows_per_commit": 100},
        "sequential": {}, "concurrency": {}, "history": {},
    }
    with tempfile.TemporaryDirectory(prefix="lakestep-bench-") as tmp:
        root = Path(tmp)

        def workdir(name: str) -> Path:
            (root / name).mkdir()
            return root / name

        for b in BACKENDS:
            step(f"sequential lakestep/{b}")
            result["sequential"][f"lakestep/{b}"] = _attempt(
                lambda: summarize(run_lakestep(n, workdir(f"seq-{b}"), b, args.pg_dsn)))
        for peer, pb in [] if args.skip_peers else RUNS:
            key = f"{peer}/{pb or 'filesystem'}"
            step(f"sequential {key}")
            kwargs = {} if pb is None else {"backend": pb, "pg_dsn": args.pg_dsn}
            result["sequential"][key] = _attempt(
                lambda: summarize(PEERS[peer](n, workdir(key.replace("/", "-")), **kwargs)))
        for b in BACKENDS:
            step(f"concurrency lakestep/{b}")
            result["concurrency"][b] = _attempt(lambda: run_concurrent(n, workdir(f"conc-{b}"), b, args.pg_dsn))
        for b in BACKENDS:
            step(f"history lakestep/{b}")
            result["history"][b] = _attempt(
                lambda: run_history(history, samples, workdir(f"hist-{b}"), b, args.pg_dsn))

    checks = build_checks(result["sequential"], result["concurrency"], result["history"], args.skip_peers)
    result["targets"] = {"ratio_min": RATIO_TARGETS, "concurrency_min": CONCURRENCY_TARGET,
                         "history_p50_ratio_max": HISTORY_TARGET, "files_ms_max": LIST_TARGET_MS}
    finish(Path(args.out or "benchmarks/results/commit.json"), result, checks, report(result, checks))


if __name__ == "__main__":
    main()
