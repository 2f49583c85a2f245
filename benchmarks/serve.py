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

p50 and p99 in milliseconds per call, as JSON (``--out``) and a table. No targets
yet: issue 34 asks for the figures.

    python -m benchmarks.serve [--backends sqlite,postgres] [--tables 20] [--calls 500] [--quick]
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


def measure(backend: str, tables: int, barriers: int, calls: int) -> dict[str, Any]:
    from lakestep.barrier import OPEN_EPOCH, Pipeline, epochs
    from lakestep.iceberg import Publisher

    with tempfile.TemporaryDirectory(prefix="bench-serve-") as d, catalog_url(backend, Path(d)) as url:
        cat = open_catalog(url, Path(d))
        cat.create_namespace("b")
        ts = [cat.create_table(f"b.t{i}", batch(0).schema) for i in range(tables)]
        Pipeline(cat).register_job("feed", sinks=[t.ident for t in ts], external_input=True)
        lease = epochs.acquire(cat, "bench", 1e9)
        pub = Publisher(cat)
        for r in range(barriers):
            for t in ts:
                t.append(batch(r), barrier=OPEN_EPOCH)
            epochs.seal(cat, lease, 1e9)
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
                    t0 = time.perf_counter()
                    conn.request("GET", paths[op](i))
                    resp = conn.getresponse()
                    body = resp.read()
                    dt = time.perf_counter() - t0
                    if resp.status != 200:
                        raise RuntimeError(f"{op}: HTTP {resp.status}: {body[:200]!r}")
                    if i >= 5:
                        times[op].append(dt * 1000)
            conn.close()
        cat.close()
    return {"tables": tables, "barriers": barriers, "calls": calls,
            "ms": {op: {"p50": statistics.median(v), "p99": pct(v, 0.99)} for op, v in times.items()}}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backends", default="sqlite,postgres")
    ap.add_argument("--tables", type=int, default=None, help="published tables (20; quick: 3)")
    ap.add_argument("--barriers", type=int, default=None, help="published barriers (5; quick: 2)")
    ap.add_argument("--calls", type=int, default=None, help="calls per endpoint (500; quick: 20)")
    ap.add_argument("--quick", action="store_true", help="small numbers: a smoke run")
    ap.add_argument("--out", default="benchmarks/results/serve.json")
    args = ap.parse_args(argv)
    tables = args.tables or (3 if args.quick else 20)
    barriers = args.barriers or (2 if args.quick else 5)
    calls = args.calls or (20 if args.quick else 500)
    result: dict[str, Any] = {"params": {"tables": tables, "barriers": barriers, "calls": calls}, "backends": {}}
    for b in args.backends.split(","):
        result["backends"][b] = measure(b, tables, barriers, calls)
    rows = [[b, op, r["ms"][op]["p50"], r["ms"][op]["p99"]] for b, r in result["backends"].items() for op in OPS]
    text = text_table(f"lakestep serve: ms per call ({tables} tables, {calls} calls per endpoint, interleaved)",
                      ["backend", "endpoint", "p50 ms", "p99 ms"], rows)
    checks: list[Check] = []  # no targets yet (issue 34 asks for the figures)
    finish(Path(args.out), result, checks, text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
