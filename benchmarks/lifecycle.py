"""Primary-key table lifecycle benchmark: merge-on-read cost and major compaction time.

Workload, per catalog backend (SQLite and PostgreSQL): a primary-key table of
``--rows`` rows (default 1,000,000: k int64, v string, x float64) is loaded and
major-compacted into one file. Then upsert commits of ``--batch`` random keys
(default 1,000) land on top, and the full read of the table (``to_arrow()``,
merged on read: one row per key) is timed after 1, 10 and 100 upserts since the
last major compaction, with the table's default compaction on write (every 8th
upsert merges the newest files of similar size: ``lakestep.pk.compaction-trigger``;
the upsert timings include those merges, and the number of live files is printed).
The same upserts on a table with it off (``lakestep.pk.compaction-trigger=0``: 101
files after 100 upserts) give the reads of merge-on-read alone.
Finally a major compaction merges it all back, timed.
For reference the same rows are read from a plain (non-key) table of one file.

The peer (issue 47), unless ``--skip-delta``: delta-rs on the same rows, the base
written as one file, the same upsert batches as ``MERGE`` (update every column of a
matched key, insert the others: copy-on-write, the files holding matched keys
rewritten), its reads (``DeltaTable(path).to_pyarrow_table()``, the table opened
each time as ``to_arrow`` looks its files up) after 1, 10 and 100 of them. Each
upsert call is timed on both sides (median and mean). Targets, per lakestep backend:
the read after 100 upserts at most 1.2x delta-rs's, the upserts at least 20x faster
(judged on the mean, which carries lakestep's compactions on write).

    python -m benchmarks.lifecycle [--rows N] [--batch N] [--repeat N] [--skip-postgres] [--skip-delta]

Prints a table and writes benchmarks/results/lifecycle.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pyarrow as pa

import lakestep
from lakestep import Catalog
from lakestep.catalog.properties import PK_COMPACTION_TRIGGER

SCHEMA = pa.schema([("k", pa.int64()), ("v", pa.string()), ("x", pa.float64())])
PG_ADMIN = "postgresql://postgres@127.0.0.1:5432/postgres"


def rows(keys: np.ndarray, tag: int) -> pa.Table:
    return pa.table({"k": keys, "v": pa.array([f"v{tag}-{k % 1000}" for k in keys]),
                     "x": np.full(len(keys), float(tag))}, schema=SCHEMA)


def timed(fn: Callable[[], Any], repeat: int) -> tuple[float, Any]:
    times, out = [], None
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), out


def upsert_rounds(name: str, upsert: Callable[[pa.Table], Any], read: Callable[[], pa.Table], n_rows: int,
                  batch: int, repeat: int, res: dict[str, Any], files: Callable[[], int] | None = None,
                  prefix: str = "read_pk") -> None:
    """The timed part, the same on every side: the read before any upsert, then the upserts of
    ``batch`` random keys (seeded: each side gets the same batches), each call timed, and the reads
    after 1, 10 and 100 of them (one row per key, asserted), with the live ``files`` then when
    given. Fills ``res`` (reads under ``prefix``)."""
    res[f"{prefix}_0_upserts_s"], got = timed(read, repeat)
    assert got.num_rows == n_rows
    rng = np.random.default_rng(1)
    done = 0
    upserts = []
    for target in (1, 10, 100):
        while done < target:
            done += 1
            data = rows(rng.choice(n_rows, size=batch, replace=False).astype(np.int64), done)
            t0 = time.perf_counter()
            upsert(data)
            upserts.append(time.perf_counter() - t0)
        res[f"{prefix}_{target}_upserts_s"], got = timed(read, repeat)
        assert got.num_rows == n_rows, got.num_rows  # one row per key, always
        live = ""
        if files is not None:
            res[f"{prefix}_{target}_upserts_files"] = n_files = files()
            live = f" ({n_files} files)"
        print(f"  [{name}] read after {target} upserts{live}: {res[f'{prefix}_{target}_upserts_s'] * 1000:.0f} ms",
              flush=True)
    if prefix == "read_pk":
        res["upsert_p50_s"] = statistics.median(upserts)
        res["upsert_mean_s"] = statistics.fmean(upserts)
        res["upsert_max_s"] = max(upserts)


def run_backend(name: str, url: str, wh: Path, n_rows: int, batch: int, repeat: int) -> dict[str, Any]:
    cat = Catalog(url, warehouse=str(wh))
    cat.create_namespace("b")
    t = cat.create_table("b.pk", SCHEMA, primary_key=["k"])
    off = cat.create_table("b.pk_off", SCHEMA, primary_key=["k"], properties={PK_COMPACTION_TRIGGER: "0"})
    plain = cat.create_table("b.plain", SCHEMA)
    base = rows(np.arange(n_rows, dtype=np.int64), 0)
    for pk in (t, off):
        pk.upsert(base)
        pk.compact(major=True)
    plain.append(base)
    res: dict[str, Any] = {"backend": name, "rows": n_rows, "batch": batch}
    res["read_plain_s"], got = timed(plain.to_arrow, repeat)
    assert got.num_rows == n_rows
    upsert_rounds(name, t.upsert, t.to_arrow, n_rows, batch, repeat, res, files=lambda: len(t.files()))
    upsert_rounds(f"{name}, no compaction on write", off.upsert, off.to_arrow, n_rows, batch, repeat, res,
                  files=lambda: len(off.files()), prefix="read_pk_off")
    t0 = time.perf_counter()
    r = t.compact(major=True)
    res["major_compaction_s"] = time.perf_counter() - t0
    res["major_compaction_files_in"] = r.removed_files
    res["read_pk_after_major_s"], got = timed(t.to_arrow, repeat)
    assert got.num_rows == n_rows
    cat.close()
    return res


def run_delta(wh: Path, n_rows: int, batch: int, repeat: int) -> dict[str, Any]:
    """The peer: the same base rows and upsert batches (same seed) on delta-rs (module docstring)."""
    from deltalake import DeltaTable, write_deltalake

    path = str(wh / "delta")
    write_deltalake(path, rows(np.arange(n_rows, dtype=np.int64), 0))

    def read() -> pa.Table:
        return DeltaTable(path).to_pyarrow_table()

    def upsert(data: pa.Table) -> None:
        (DeltaTable(path).merge(source=data, predicate="t.k = s.k", source_alias="s", target_alias="t")
         .when_matched_update_all().when_not_matched_insert_all().execute())

    res: dict[str, Any] = {"backend": "delta-rs", "rows": n_rows, "batch": batch}
    upsert_rounds("delta-rs", upsert, read, n_rows, batch, repeat, res)
    return res


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rows", type=int, default=1_000_000)
    p.add_argument("--batch", type=int, default=1_000)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--skip-postgres", action="store_true")
    p.add_argument("--skip-delta", action="store_true", help="no delta-rs peer (and no targets)")
    p.add_argument("--out", default="benchmarks/results/lifecycle.json")
    args = p.parse_args()
    work = Path(tempfile.mkdtemp(prefix="lakestep-lifecycle-"))
    results = []
    try:
        results.append(run_backend("sqlite", f"sqlite:///{work}/s/catalog.db", work / "s", args.rows, args.batch,
                                   args.repeat))
        if not args.skip_postgres:
            import psycopg2

            db = f"bench_lifecycle_{uuid.uuid4().hex[:8]}"
            admin = psycopg2.connect(PG_ADMIN)
            admin.autocommit = True
            admin.cursor().execute(f"CREATE DATABASE {db}")
            try:
                results.append(run_backend("postgres", f"postgresql://postgres@127.0.0.1:5432/{db}", work / "p",
                                           args.rows, args.batch, args.repeat))
            finally:
                admin.cursor().execute(f"DROP DATABASE {db} WITH (FORCE)")
                admin.close()
        delta = None if args.skip_delta else run_delta(work / "d", args.rows, args.batch, args.repeat)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    checks = []
    if delta is not None:
        for r in results:
            read_ratio = r["read_pk_100_upserts_s"] / delta["read_pk_100_upserts_s"]
            upsert_ratio = delta["upsert_mean_s"] / r["upsert_mean_s"]
            checks += [{"check": f"{r['backend']}: read after 100 upserts / delta-rs", "value": round(read_ratio, 3),
                        "target": "<= 1.2", "result": "PASS" if read_ratio <= 1.2 else "MISS"},
                       {"check": f"{r['backend']}: delta-rs upsert / lakestep upsert (mean)",
                        "value": round(upsert_ratio, 1), "target": ">= 20",
                        "result": "PASS" if upsert_ratio >= 20 else "MISS"}]
    cols = ["read_plain_s", "read_pk_0_upserts_s", "read_pk_1_upserts_s", "read_pk_10_upserts_s",
            "read_pk_100_upserts_s", "read_pk_off_100_upserts_s", "major_compaction_s", "read_pk_after_major_s"]
    print(f"\n{'backend':<9}" + "".join(f"{c.replace('_s', ''):>24}" for c in cols))
    for r in results:
        print(f"{r['backend']:<9}" + "".join(f"{r[c] * 1000:>21.0f} ms" for c in cols))
    for r in results + ([delta] if delta is not None else []):
        reads = ", ".join(f"{n}: {r[f'read_pk_{n}_upserts_s'] * 1000:.0f} ms" for n in (0, 1, 10, 100))
        print(f"{r['backend']:<9} upsert p50 {r['upsert_p50_s'] * 1000:.1f} ms, mean {r['upsert_mean_s'] * 1000:.1f} ms, "
              f"max {r['upsert_max_s'] * 1000:.1f} ms; reads after upserts {reads}")
    for c in checks:
        print(f"{c['check']:<52} {c['value']:>8} {c['target']:>7}  {c['result']}")
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    doc = {"benchmark": "lifecycle", "lakestep": lakestep.__version__, "python": platform.python_version(),
           "cpus": os.cpu_count(), "date": time.strftime("%Y-%m-%dT%H:%M:%S"), "results": results,
           "delta_rs": delta, "checks": checks}
    with open(args.out, "w") as fh:
        json.dump(doc, fh, indent=2)
    print(json.dumps(doc))


if __name__ == "__main__":
    main()
