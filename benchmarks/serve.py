"""``lakestep serve`` benchmark: what the Iceberg REST catalog's read endpoints cost.

Per backend (SQLite and PostgreSQL catalogs): ``--tables`` root tables, each
published at ``--barriers`` barriers (an append, a seal, a publishing round),
then the server (uvicorn, in this process, on a loopback port) answers, over
one kept-alive HTTP connection, interleaved call by call:

* ``config``: ``GET /v1/config`` (the plain warehouse);
* ``config@consistent``: the moving warehouse (pins the newest complete barrier);
* ``load``: ``loadTable`` of each table in turn, as published;
* ``load@barrier``: ``loadTable`` under the prefix of the oldest published barrier
  (``main`` moved to its tag).

p50 and p99 in milliseconds per call, as JSON (``--out``) and a table.

Then ``GET /metrics`` on catalogs of ``--metrics`` sizes (10 and 1,000 tables: half
roots, half derived, a job per ten derived tables, files to reclaim): the catalog
statements one scrape sends (counted on the engine; the target: no more at 1,000
tables than at 10), the body's size, p50/p99 ms per scrape.

    python -m benchmarks.serve [--backends sqlite,postgres] [--tables 20] [--calls 500]
                               [--metrics 10,1000] [--scrapes 20] [--quick]
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any, Iterator

from .commit import Check, finish, pct, text_table
from .publish import batch, catalog_url, open_catalog

OPS = ("config", "config@consistent", "load", "load@barrier")


@contextlib.contextmanager
def serving(cat: Any) -> Iterator[int]:
    """The server for ``cat`` on a free loopback port, in a thread; yields the port."""
    from lakestep.serve import create_app
    from lakestep.testing.serving import Served

    with Served(create_app(cat), name="bench-serve") as s:
        yield s.port


def timed_get(conn: http.client.HTTPConnection, path: str) -> tuple[float, bytes]:
    """One GET over the kept-alive ``conn``: (milliseconds to the whole body, the body); not 200 raises."""
    t0 = time.perf_counter()
    conn.request("GET", path)
    resp = conn.getresponse()
    body = resp.read()
    ms = (time.perf_counter() - t0) * 1000
    if resp.status != 200:
        raise RuntimeError(f"{path}: HTTP {resp.status}: {body[:200]!r}")
    return ms, body


def measure(backend: str, tables: int, barriers: int, calls: int) -> dict[str, Any]:
    from lakestep.barrier import OPEN_EPOCH, Pipeline, sealing
    from lakestep.iceberg import Publisher

    with tempfile.TemporaryDirectory(prefix="bench-serve-") as d, catalog_url(backend, Path(d)) as url:
        cat = open_catalog(url, Path(d))
        cat.create_namespace("b")
        ts = [cat.create_table(f"b.t{i}", batch(0).schema) for i in range(tables)]
        Pipeline(cat).register_job("feed", sinks=[t.ident for t in ts], external_input=True)
        lease = sealing.acquire(cat, "bench", 1e9)
        pub = Publisher(cat)
        for r in range(barriers):
            for t in ts:
                t.append(batch(r), barrier=OPEN_EPOCH)
            sealing.seal(cat, lease, 1e9)
            rep = pub.publish()
            if rep.errors:
                raise RuntimeError(f"publishing failed: {rep.errors}")
        pub.close()
        pinned = 1
        times: dict[str, list[float]] = {op: [] for op in OPS}
        with serving(cat) as port:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
            paths = {
                "config": lambda i: "/v1/config?warehouse=lakestep",
                "config@consistent": lambda i: "/v1/config?warehouse=lakestep@consistent",
                "load": lambda i: f"/v1/namespaces/b/tables/t{i % tables}",
                "load@barrier": lambda i: f"/v1/barrier={pinned}/namespaces/b/tables/t{i % tables}",
            }
            for i in range(calls + 5):  # the first 5 warm the caches and the connection
                for op in OPS:
                    ms, _ = timed_get(conn, paths[op](i))
                    if i >= 5:
                        times[op].append(ms)
            conn.close()
        cat.close()
    return {"tables": tables, "barriers": barriers, "calls": calls,
            "ms": {op: {"p50": statistics.median(v), "p99": pct(v, 0.99)} for op, v in times.items()}}


def build_topology(cat: Any, tables: int) -> None:
    """``tables`` tables for the metrics: half roots of one job, half derived (one job per
    ten, reading a root); every table appended then overwritten (a removed file), one in
    ten with no retention (what cleanup would delete now), one sealed barrier."""
    from lakestep.barrier import OPEN_EPOCH, Pipeline, sealing

    cat.create_namespace("m")
    p = Pipeline(cat)
    roots = [f"m.r{i}" for i in range(tables // 2)]
    derived = [f"m.d{i}" for i in range(tables - len(roots))]
    for i, name in enumerate(roots + derived):
        t = cat.create_table(name, batch(0).schema)
        t.append(batch(0))
        t.overwrite(batch(1))
        if i % 10 == 0:
            t.set_properties({"lakestep.retention-seconds": "0"})
    p.register_job("feed", sinks=roots, external_input=True)
    for j in range(0, len(derived), 10):
        p.register_job(f"agg{j // 10}", sources=[roots[(j // 10) % len(roots)]], sinks=derived[j:j + 10])
    with cat.transaction(job_id="feed", batch_id=0) as tx:
        for name in roots:
            tx.append(name, batch(2), barrier=OPEN_EPOCH)
    lease = sealing.acquire(cat, "bench", 1e9)
    sealing.seal(cat, lease, 1e9)


def measure_metrics(backend: str, sizes: list[int], scrapes: int) -> dict[str, Any]:
    """Per catalog size: statements per scrape (counted on the catalog's engine), and
    p50/p99 ms of ``GET /metrics`` over one kept-alive connection."""
    from sqlalchemy import event

    from lakestep.serve import create_app
    from lakestep.testing.serving import Served

    out: dict[str, Any] = {}
    for n in sizes:
        with tempfile.TemporaryDirectory(prefix="bench-metrics-") as d, catalog_url(backend, Path(d)) as url:
            cat = open_catalog(url, Path(d))
            build_topology(cat, n)
            sent: list[str] = []

            def count(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
                sent.append(statement)

            times: list[float] = []
            per_scrape: list[int] = []
            with Served(create_app(cat), name="bench-metrics") as srv:
                conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=300)
                event.listen(cat.backend.engine, "before_cursor_execute", count)
                try:
                    for i in range(scrapes + 2):  # the first 2 warm the caches and the connection
                        sent.clear()
                        ms, body = timed_get(conn, "/metrics")
                        if i >= 2:
                            times.append(ms)
                            per_scrape.append(len(sent))
                finally:
                    event.remove(cat.backend.engine, "before_cursor_execute", count)
                    conn.close()
            cat.close()
        out[str(n)] = {"tables": n, "statements": max(per_scrape), "bytes": len(body),
                       "ms": {"p50": statistics.median(times), "p99": pct(times, 0.99)}}
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backends", default="sqlite,postgres")
    ap.add_argument("--tables", type=int, default=None, help="published tables (20; quick: 3)")
    ap.add_argument("--barriers", type=int, default=None, help="published barriers (5; quick: 2)")
    ap.add_argument("--calls", type=int, default=None, help="calls per endpoint (500; quick: 20)")
    ap.add_argument("--metrics", default=None, help="catalog sizes (tables) to scrape /metrics at "
                    "(10,1000; quick: 4,40); 'none' skips")
    ap.add_argument("--scrapes", type=int, default=None, help="scrapes per size (20; quick: 3)")
    ap.add_argument("--quick", action="store_true", help="small numbers: a smoke run")
    ap.add_argument("--out", default="benchmarks/results/serve.json")
    args = ap.parse_args(argv)
    tables = args.tables or (3 if args.quick else 20)
    barriers = args.barriers or (2 if args.quick else 5)
    calls = args.calls or (20 if args.quick else 500)
    result: dict[str, Any] = {"params": {"tables": tables, "barriers": barriers, "calls": calls}, "backends": {}}
    sizes = [] if args.metrics == "none" else [int(x) for x in (args.metrics or ("4,40" if args.quick else "10,1000")).split(",")]
    scrapes = args.scrapes or (3 if args.quick else 20)
    result["params"].update(metrics=sizes, scrapes=scrapes)
    result["metrics"] = {}
    for b in args.backends.split(","):
        result["backends"][b] = measure(b, tables, barriers, calls)
        if sizes:
            result["metrics"][b] = measure_metrics(b, sizes, scrapes)
    rows = [[b, op, r["ms"][op]["p50"], r["ms"][op]["p99"]] for b, r in result["backends"].items() for op in OPS]
    text = text_table(f"lakestep serve: ms per call ({tables} tables, {calls} calls per endpoint, interleaved)",
                      ["backend", "endpoint", "p50 ms", "p99 ms"], rows)
    checks: list[Check] = []
    if sizes:
        rows = [[b, m["tables"], m["statements"], m["bytes"], m["ms"]["p50"], m["ms"]["p99"]]
                for b, by in result["metrics"].items() for m in by.values()]
        text += "\n" + text_table(f"GET /metrics: one scrape ({scrapes} per size)",
                                   ["backend", "tables", "statements", "bytes", "p50 ms", "p99 ms"], rows)
        # issue 34: a scrape's catalog statements do not grow with the number of tables
        for b, by in result["metrics"].items():
            counts = [m["statements"] for m in by.values()]
            checks.append(Check(f"{b}: statements per scrape at {max(sizes)} tables minus at {min(sizes)}",
                                counts[-1] - counts[0], "<=", 0))
    finish(Path(args.out), result, checks, text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
