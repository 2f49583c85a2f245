"""The whole small append (write the file + commit) against an older lakestep, in one run.

``benchmarks.commit`` counts an append's statements and times it against peers; this one
asks whether lakestep's own append got slower: the same workload runs on this checkout's
lakestep and on the lakestep of ``--against REV`` (a ``git worktree`` of that commit, made
for the run and removed after), each in processes of its own, interleaved round by round
so that the machine's drift falls on both alike.

1. Workload, per process: a fresh catalog (SQLite in a temporary folder, or a fresh
   PostgreSQL database with ``--backend postgres``), one table of 4 columns (id, timestamp,
   double, string), one untimed warm-up append, then ``--n`` appends of 100 rows, each timed
   with ``time.perf_counter`` around ``Table.append`` (the Parquet file written, the commit).
2. Rounds: ``--rounds`` times, both sides one after the other, the order alternating.
3. Figures: each side's p50 and p90 per round; the ratio this / against of the per-round
   p50s, its median over the rounds is the result; the target (issue 47) is <= 1.05.
   ``--profile`` also prints this checkout's top functions by cumulative time over ``--n``
   appends (cProfile): where the per-append cost sits.

Output: a table on stdout and one JSON document (``--out``, default
benchmarks/results/append.json), including which lakestep each side imported.

Not guaranteed: the older commit must accept the workload's calls (``Catalog(url,
warehouse=...)``, ``create_table``, ``Table.append``), which every lakestep since 0.1 does;
timings are this machine's: only the ratio from one run means anything.

Run: ``python -m benchmarks.append --against 94fc6fe [--n 300] [--rounds 5] [--backend sqlite] [--profile]``
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
TARGET = 1.05
DEFAULT_PG_DSN = "postgresql+psycopg2://postgres@127.0.0.1:5432/postgres"

# Runs in a process of its own, with PYTHONPATH naming the lakestep to measure.
_CHILD = r'''
import datetime as dt, json, shutil, sys, tempfile, time, uuid
import pyarrow as pa
import sqlalchemy as sa
import lakestep
from lakestep import Catalog

n, backend, dsn, profile = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4] == "1"
schema = pa.schema([("id", pa.int64()), ("ts", pa.timestamp("us")), ("value", pa.float64()), ("name", pa.string())])
epoch = dt.datetime(2026, 1, 1)

def batch(i):
    ids = [i * 100 + k for k in range(100)]
    return pa.table({"id": ids, "ts": [epoch + dt.timedelta(seconds=x) for x in ids],
                     "value": [x * 0.5 for x in ids], "name": [f"item-{x % 97}" for x in ids]}, schema=schema)

work = tempfile.mkdtemp(prefix="ls-append-")
db = None
if backend == "postgres":
    db = "ls_append_" + uuid.uuid4().hex[:10]
    admin = sa.create_engine(dsn, isolation_level="AUTOCOMMIT")
    with admin.connect() as c:
        c.execute(sa.text(f"CREATE DATABASE {db}"))
    url = dsn.rsplit("/", 1)[0] + "/" + db
else:
    url = f"sqlite:///{work}/catalog.db"
try:
    cat = Catalog(url, warehouse=work)
    cat.create_namespace("bench")
    t = cat.create_table("bench.t", schema)
    batches = [batch(i) for i in range(n + 1)]
    t.append(batches[0])
    out = []
    if profile:
        import cProfile, io, pstats
        prof = cProfile.Profile()
        prof.enable()
    for b in batches[1:]:
        s = time.perf_counter()
        t.append(b)
        out.append(time.perf_counter() - s)
    top = None
    if profile:
        prof.disable()
        buf = io.StringIO()
        pstats.Stats(prof, stream=buf).sort_stats("cumulative").print_stats(30)
        top = buf.getvalue()
    cat.close() if hasattr(cat, "close") else None
    print(json.dumps({"lakestep": lakestep.__file__, "latencies": out, "profile": top}))
finally:
    shutil.rmtree(work, ignore_errors=True)
    if db is not None:
        with admin.connect() as c:
            c.execute(sa.text(f"DROP DATABASE IF EXISTS {db} WITH (FORCE)"))
'''


def _run_side(root: Path, n: int, backend: str, dsn: str, profile: bool = False) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": str(root)}
    r = subprocess.run([sys.executable, "-c", _CHILD, str(n), backend, dsn, "1" if profile else "0"],
                       capture_output=True, text=True, env=env, cwd=tempfile.gettempdir(), timeout=1800)
    if r.returncode != 0:
        raise RuntimeError(f"the append workload failed on {root}:\n{r.stderr[-3000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def _pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--against", required=True, help="the commit to compare with (e.g. 94fc6fe)")
    ap.add_argument("--n", type=int, default=300, help="timed appends per process")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--backend", choices=["sqlite", "postgres"], default="sqlite")
    ap.add_argument("--pg-dsn", default=DEFAULT_PG_DSN)
    ap.add_argument("--profile", action="store_true", help="also profile this checkout's appends")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "append.json"))
    args = ap.parse_args(argv)
    rev = subprocess.run(["git", "rev-parse", "--verify", f"{args.against}^{{commit}}"], cwd=ROOT,
                         capture_output=True, text=True)
    if rev.returncode != 0:
        ap.error(f"--against {args.against!r} is not a commit of this repository")
    sha = rev.stdout.strip()
    with tempfile.TemporaryDirectory(prefix="ls-against-") as tmp:
        base = Path(tmp) / "base"
        subprocess.run(["git", "worktree", "add", "--detach", "--quiet", str(base), sha], cwd=ROOT, check=True)
        try:
            rounds: list[dict[str, Any]] = []
            files: dict[str, str] = {}
            for i in range(args.rounds):
                order = [("this", ROOT), ("against", base)]
                if i % 2:
                    order.reverse()
                got: dict[str, Any] = {}
                for side, root in order:
                    r = _run_side(root, args.n, args.backend, args.pg_dsn)
                    files[side] = r["lakestep"]
                    got[side] = {"p50_ms": 1000 * _pct(r["latencies"], 0.5),
                                 "p90_ms": 1000 * _pct(r["latencies"], 0.9)}
                got["ratio_p50"] = got["this"]["p50_ms"] / got["against"]["p50_ms"]
                rounds.append(got)
                print(f"round {i + 1}: this p50 {got['this']['p50_ms']:.3f} ms, against p50 "
                      f"{got['against']['p50_ms']:.3f} ms, ratio {got['ratio_p50']:.3f}", flush=True)
            profile = _run_side(ROOT, args.n, args.backend, args.pg_dsn, profile=True)["profile"] \
                if args.profile else None
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(base)], cwd=ROOT, check=False)
    if not files["against"].startswith(str(base)) or files["this"].startswith(str(base)):
        raise SystemExit(f"the sides imported the wrong lakestep: {files}")
    ratio = statistics.median(r["ratio_p50"] for r in rounds)
    result = {
        "benchmark": "append", "backend": args.backend, "n": args.n, "rounds": rounds, "against": sha,
        "this_p50_ms": statistics.median(r["this"]["p50_ms"] for r in rounds),
        "against_p50_ms": statistics.median(r["against"]["p50_ms"] for r in rounds),
        "ratio_p50": ratio, "target": TARGET, "result": "PASS" if ratio <= TARGET else "MISS",
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2))
    print(f"append ({args.backend}, {args.n} x 100 rows, {args.rounds} interleaved rounds): this "
          f"{result['this_p50_ms']:.3f} ms p50, {sha[:10]} {result['against_p50_ms']:.3f} ms p50, ratio "
          f"{ratio:.3f} (target <= {TARGET}): {result['result']}")
    if profile:
        print(profile)
    print(json.dumps({k: v for k, v in result.items() if k != "rounds"}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
