"""Iceberg publishing benchmark (lakestep.iceberg): what publishing costs, how far behind a
running pipeline its tags are, and what reading through Iceberg costs.

Per backend (SQLite and PostgreSQL catalogs; the Iceberg catalog in the same database):

(a) **One barrier.** ``N`` root tables (N = 1, 10, 100) each get one appended file per
    barrier; the barrier is sealed and one publishing round (:meth:`Publisher.publish`)
    is timed: a snapshot and a tag per table, ``main`` moved, every commit batched.
    Median of ``--rounds`` rounds after a warm-up (the tables carry up to that many tags).
(b) **A running pipeline.** 20 root tables written continuously by one process, a
    coordinator sealing every second (``lakestep coordinator --interval 1``) and a
    publisher (``lakestep publish --interval 0.1``), each its own process, until 25
    barriers after the first 5 have their tags. For each of them, the lag from its seal
    (``ls_seal.sealed_at``) to the end of the publishing round that tagged it on every
    table (``ls_publisher.round_at`` once the complete cut reaches it): p50 and p95, and
    whether publishing kept up (the cut at most two barriers behind the newest sealed one
    when the run ends).
(c) **Reading.** One table of ``--rows`` rows in 16 files; the same aggregate query
    through DuckDB's ``iceberg_scan`` at the snapshot of a tag, and through
    ``lakestep.query.duckdb_query`` at that barrier, interleaved; medians and the ratio.

Targets (this machine): (b) keeps up at a 1 s seal interval with 20 changing tables,
lag p50 under 2 s; (c) Iceberg within 1.2x of duckdb_query. Prints a table, writes every
number as JSON (``--out``); exits 1 when a target is missed.

    python -m benchmarks.publish [--backends sqlite,postgres] [--only abc] [--quick]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any, Iterator

import pyarrow as pa
import sqlalchemy as sa

ROOT = Path(__file__).resolve().parents[1]
PG_ADMIN = os.environ.get("LAKESTEP_BENCH_PG", "postgresql://postgres@127.0.0.1:5432/postgres")
CLI = [sys.executable, "-c", "import sys; from lakestep.cli import main; sys.exit(main())"]
SCHEMA = pa.schema([("id", pa.int64()), ("g", pa.string()), ("x", pa.int64())])
TARGETS = {"lag_p50_s": 2.0, "read_ratio": 1.2}


@contextlib.contextmanager
def catalog_url(backend: str, tmp: Path) -> Iterator[str]:
    if backend == "sqlite":
        yield f"sqlite:///{tmp / 'wh' / 'catalog.db'}"
        return
    import psycopg2

    name = f"bench_publish_{uuid.uuid4().hex[:8]}"

    def run(sql: str) -> None:
        conn = psycopg2.connect(PG_ADMIN)
        conn.autocommit = True
        try:
            conn.cursor().execute(sql)
        finally:
            conn.close()

    run(f'CREATE DATABASE "{name}"')
    try:
        yield PG_ADMIN.rsplit("/", 1)[0] + f"/{name}"
    finally:
        run(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def open_catalog(url: str, tmp: Path) -> Any:
    from lakestep import Catalog

    (tmp / "wh").mkdir(parents=True, exist_ok=True)
    return Catalog(url, warehouse=str(tmp / "wh"))


def batch(i: int, n: int = 10) -> pa.Table:
    return pa.table({"id": list(range(i * n, i * n + n)), "g": [f"g{j % 7}" for j in range(n)],
                     "x": list(range(n))}, schema=SCHEMA)


# ------------------------------------------------------------------ (a) one barrier
def one_barrier(backend: str, tables: int, rounds: int) -> dict[str, Any]:
    from lakestep.barrier import OPEN_EPOCH, Pipeline, sealing
    from lakestep.iceberg import Publisher

    with tempfile.TemporaryDirectory(prefix="bench-publish-") as d, catalog_url(backend, Path(d)) as url:
        cat = open_catalog(url, Path(d))
        cat.create_namespace("b")
        ts = [cat.create_table(f"b.t{i}", SCHEMA) for i in range(tables)]
        Pipeline(cat).register_job("feed", sinks=[t.ident for t in ts], external_input=True)
        lease = sealing.acquire(cat, "bench", 1e9)
        pub = Publisher(cat)
        times = []
        for r in range(rounds + 1):
            for t in ts:
                t.append(batch(r), barrier=OPEN_EPOCH)
            sealing.seal(cat, lease, 1e9)
            t0 = time.perf_counter()
            rep = pub.publish()
            times.append(time.perf_counter() - t0)
            assert not rep.errors and len(rep.barriers) == 1, (rep.errors, rep.barriers)
        pub.close()
        cat.close()
    med = statistics.median(times[1:])
    return {"tables": tables, "rounds": rounds, "round_s": med, "per_table_ms": med / tables * 1000,
            "rounds_s": times[1:]}


# --------------------------------------------------------------- (b) a running pipeline
WRITER = """
import sys, time
import pyarrow as pa
from lakestep import Catalog
from lakestep.barrier import OPEN_EPOCH
url, wh, n, stop = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
cat = Catalog(url, warehouse=wh)
ts = [cat.load_table(f"b.t{i}") for i in range(n)]
schema = ts[0].schema
i = 0
while True:
    for t in ts:
        t.append(pa.table({"id": [i], "g": ["g"], "x": [i]}, schema=schema), barrier=OPEN_EPOCH)
    i += 1
    try:
        open(stop).close()
        break
    except FileNotFoundError:
        time.sleep(0.2)
print(i)
"""


def running(backend: str, tables: int, barriers: int, warmup: int, timeout: float = 600.0) -> dict[str, Any]:
    """Runs until ``barriers`` barriers sealed after the first ``warmup`` ones have their tags on
    every table (or ``timeout``), then stops the writer, the coordinator and the publisher."""
    import signal

    from lakestep.barrier import Pipeline
    from lakestep.catalog import schema as S

    with tempfile.TemporaryDirectory(prefix="bench-publish-") as d, catalog_url(backend, Path(d)) as url:
        cat = open_catalog(url, Path(d))
        cat.create_namespace("b")
        for i in range(tables):
            cat.create_table(f"b.t{i}", SCHEMA)
        Pipeline(cat).register_job("feed", sinks=[f"b.t{i}" for i in range(tables)], external_input=True)
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        stop = Path(d) / "stop"
        procs = [
            subprocess.Popen([sys.executable, "-c", WRITER, url, str(Path(d) / "wh"), str(tables), str(stop)],
                             env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True),
            subprocess.Popen([*CLI, "coordinator", "--catalog", url, "--interval", "1", "--log-level", "WARNING"],
                             env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True),
            subprocess.Popen([*CLI, "publish", "--catalog", url, "--interval", "0.1", "--log-level", "WARNING"],
                             env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True),
        ]
        seen: dict[int, float] = {}  # barrier -> the round_at of the round that completed it
        last = None
        deadline = time.monotonic() + timeout
        try:
            while time.monotonic() < deadline and len([b for b in seen if b > warmup]) < barriers:
                with cat.backend.read() as conn:
                    row = conn.execute(sa.select(S.publisher.c.complete_barrier, S.publisher.c.round_at)
                                       .where(S.publisher.c.id == 1)).one()
                if row[0] is not None and row[0] != last:
                    for b in range(1 if last is None else last + 1, int(row[0]) + 1):
                        seen.setdefault(b, float(row[1]))
                    last = int(row[0])
                for p in procs:
                    if p.poll() is not None:
                        raise RuntimeError(f"a pipeline process stopped: {p.stderr.read()[-2000:]}")
                time.sleep(0.05)
            with cat.backend.read() as conn:
                seals = dict(conn.execute(sa.select(S.seals.c.barrier, S.seals.c.sealed_at)).all())
                newest = max(seals) if seals else 0
        finally:
            stop.touch()
            for p in procs[1:]:
                if p.poll() is None:
                    p.send_signal(signal.SIGTERM)
            for p in procs:
                try:
                    p.wait(timeout=120)
                except subprocess.TimeoutExpired:
                    p.kill()
            cat.close()
        lags = sorted(seen[b] - seals[b] for b in seen if b in seals and b > warmup)
    kept_up = last is not None and newest - last <= 2
    q = statistics.quantiles(lags, n=20) if len(lags) >= 2 else lags * 19
    return {"tables": tables, "barriers": len(lags), "sealed": newest, "complete": last,
            "kept_up": kept_up, "lag_p50_s": statistics.median(lags) if lags else None,
            "lag_p95_s": q[18] if q else None, "lags_s": lags}


# ----------------------------------------------------------------------- (c) reading
def reading(backend: str, rows: int, rounds: int) -> dict[str, Any]:
    import duckdb

    from lakestep.barrier import OPEN_EPOCH, Pipeline, sealing
    from lakestep.iceberg import Publisher, sql_catalog
    from lakestep.query import duckdb_query
    from lakestep.query.duck import load_extensions

    sql = "SELECT g, count(*) AS n, sum(x) AS s FROM {t} GROUP BY g ORDER BY g"
    with tempfile.TemporaryDirectory(prefix="bench-publish-") as d, catalog_url(backend, Path(d)) as url:
        cat = open_catalog(url, Path(d))
        cat.create_namespace("b")
        t = cat.create_table("b.facts", SCHEMA)
        p = Pipeline(cat)
        p.register_job("feed", sinks=["b.facts"], external_input=True)
        lease = sealing.acquire(cat, "bench", 1e9)
        per = rows // 16
        for f in range(16):
            ids = pa.array(range(f * per, (f + 1) * per), pa.int64())
            t.append(pa.table({"id": ids, "g": pa.array([f"g{j % 97}" for j in range(per)]), "x": ids},
                              schema=SCHEMA), barrier=OPEN_EPOCH)
        barrier = sealing.seal(cat, lease, 1e9).barrier
        pub = Publisher(cat)
        pub.publish_once()
        pub.close()
        ice = sql_catalog(cat).load_table("b.facts")
        meta = ice.metadata_location
        snap = ice.snapshot_by_name(f"barrier-{barrier}").snapshot_id
        con = duckdb.connect()
        load_extensions(con, "avro", "iceberg")

        def through_iceberg() -> list[tuple]:
            return con.execute(sql.format(t="iceberg_scan(?, snapshot_from_id => ?)"), [meta, snap]).fetchall()

        def through_lakestep() -> list[tuple]:
            res = duckdb_query(cat, sql.format(t="b.facts"), barrier=barrier)
            return [tuple(r.values()) for r in res.table.to_pylist()]

        assert through_iceberg() == through_lakestep()  # the same answer, exactly
        times: dict[str, list[float]] = {"iceberg": [], "duckdb_query": []}
        for _ in range(rounds):
            for name, fn in (("iceberg", through_iceberg), ("duckdb_query", through_lakestep)):
                t0 = time.perf_counter()
                fn()
                times[name].append(time.perf_counter() - t0)
        cat.close()
    med = {k: statistics.median(v) for k, v in times.items()}
    return {"rows": rows, "rounds": rounds, "iceberg_s": med["iceberg"], "duckdb_query_s": med["duckdb_query"],
            "read_ratio": med["iceberg"] / med["duckdb_query"]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.publish", description=__doc__.splitlines()[0])
    ap.add_argument("--backends", default="sqlite,postgres")
    ap.add_argument("--only", default="abc", help="sections to run: a (one barrier), b (running), c (reading)")
    ap.add_argument("--quick", action="store_true", help="small sizes (the test suite's run)")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "publish.json"))
    args = ap.parse_args(argv)
    sizes = (1, 10, 100) if not args.quick else (1, 3)
    rounds = 10 if not args.quick else 2
    results: dict[str, Any] = {}
    misses = []
    for backend in args.backends.split(","):
        res: dict[str, Any] = results.setdefault(backend, {})
        if "a" in args.only:
            res["one_barrier"] = [one_barrier(backend, n, rounds) for n in sizes]
            for r in res["one_barrier"]:
                print(f"[{backend}] (a) one barrier, {r['tables']:>3} changed table(s): {r['round_s'] * 1000:7.1f} ms "
                      f"a round, {r['per_table_ms']:5.1f} ms a table", flush=True)
        if "b" in args.only:
            r = res["running"] = running(backend, 20 if not args.quick else 3, 25 if not args.quick else 2,
                                         5 if not args.quick else 0)
            print(f"[{backend}] (b) running, {r['tables']} tables, seal every 1 s: {r['barriers']} barriers, lag p50 "
                  f"{_s(r['lag_p50_s'])}, p95 {_s(r['lag_p95_s'])}; kept up: {r['kept_up']} (complete "
                  f"{r['complete']} of {r['sealed']} sealed)", flush=True)
            if not args.quick and (not r["kept_up"] or r["lag_p50_s"] is None or r["lag_p50_s"] > TARGETS["lag_p50_s"]):
                misses.append(f"{backend}: publishing lag p50 {_s(r['lag_p50_s'])} (target {TARGETS['lag_p50_s']} s), "
                              f"kept up {r['kept_up']}")
        if "c" in args.only:
            r = res["reading"] = reading(backend, 2_000_000 if not args.quick else 16_000, 9 if not args.quick else 2)
            print(f"[{backend}] (c) reading {r['rows']:,} rows: iceberg_scan at the tag {r['iceberg_s'] * 1000:.1f} ms, "
                  f"duckdb_query at the barrier {r['duckdb_query_s'] * 1000:.1f} ms: {r['read_ratio']:.2f}x "
                  f"(target {TARGETS['read_ratio']}x)", flush=True)
            if not args.quick and r["read_ratio"] > TARGETS["read_ratio"]:
                misses.append(f"{backend}: reading through Iceberg {r['read_ratio']:.2f}x duckdb_query")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"params": {"quick": args.quick, "sizes": sizes, "rounds": rounds},
                               "targets": TARGETS, "results": results, "misses": misses}, indent=2, default=str))
    for m in misses:
        print(f"MISSED: {m}")
    return 1 if misses else 0


def _s(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f} s"


if __name__ == "__main__":
    sys.exit(main())
