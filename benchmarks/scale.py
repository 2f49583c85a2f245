"""Scale benchmark: how the cost of lakestep's hot operations grows with the size of a deployment.

Each curve measures one cost at three sizes and prints the growth factor
between the smallest and the largest size (``p50 at the largest / p50 at the
smallest``), per backend (SQLite and PostgreSQL):

1. **topology**: 10 / 100 / 1,000 tables in a layered topology (a tenth of
   them roots, the rest in 3 levels of derived jobs, fan-in up to 8), each
   with ``--topology-barriers`` barriers of bulk-loaded history. Measured:
   ``choose()`` at each scope (query: 3 tables; related: 3 tables and every
   table connected to them; global: every table queried, and 3 tables queried
   with every table in the scope), the
   coordinator's seal, ``next_batch`` planning for a job with 8 sources, the
   topology load of a restarted process (a new ``Pipeline``'s first
   ``choose()``), and ``choose()`` over every table when, before each call, a
   root committed and the coordinator sealed.
2. **history**: 10^4 / 10^5 / 10^6 sealed barriers over a 12-table topology:
   ``version_at`` at random barriers, ``choose()`` (query and global scope),
   and the states behind the CLI's barrier grid (``Pipeline.status(last=50)``,
   every table).
3. **files**: 10^3 / 10^5 / 10^6 live files in one partitioned table: a cold
   ``Table.files()``, a planned read with a
   selective partition filter and with a statistics filter (cold: a table
   handle loaded afresh, nothing cached), and an append.
   Beside it, at the same file counts: delta-rs's log replay (``DeltaTable``
   + its file list, whole and pruned by a partition or a statistics predicate)
   without and with a checkpoint, and DuckLake's file list and a
   statistics-filtered count, its metadata in the same database as lakestep's
   (both need the ``bench`` extra; skipped without it).
4. **concurrency**: N = 2 / 8 / 32 writer processes, each committing one
   small file to its own table every 50 ms into the open epoch, while a
   coordinator seals every 200 ms and 2 reader processes call ``choose()``
   over every table in a loop. Reported: commit p50/p99, aggregate commits/s
   (against the offered N x 20/s), seal p99, ``choose()`` p99, exceptions
   surfaced, the CPUs' busy share and the mean number of runnable tasks
   (/proc/stat), and on PostgreSQL the peak number of connections and the
   samples with a lock wait.

History and file metadata are BULK-LOADED (rows generated in the database by
INSERT ... SELECT, no data files): the measured operations read metadata
only. Appends write real Parquet files.

Targets (issue "Scale"): growth factor <= 2 for choose(), seal and planning
from 10 to 1,000 tables and from 10^4 to 10^6 barriers; a planned read with a
selective filter at 10^6 files under 100 ms cold; at N = 32, commit p99 and
seal p99 under 50 ms and no surfaced exception. A MISS is printed as such.

Output: a plain-text table on stdout, every number in ``--out`` (JSON).

Run: ``python -m benchmarks.scale [--quick] [--backends sqlite,postgres] [--only topology,history,files,concurrency]``
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import multiprocessing as mp
import os
import platform
import random
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Callable

import pyarrow as pa
import sqlalchemy as sa

import lakestep
from lakestep import Catalog
from lakestep.barrier import OPEN_EPOCH, Pipeline
from lakestep.catalog import schema as S
from lakestep.services import Coordinator

from .barrier import _TimedCoordinator, analyze, load_history, new_catalog
from .peers import DEFAULT_PG_DSN, _duckdb_offline_connection, ducklake_metadata

SCHEMA = pa.schema([("k", pa.int64()), ("v", pa.int64())])
FILE_SCHEMA = pa.schema([("day", pa.int64()), ("k", pa.int64()), ("v", pa.int64())])
LAG = 5  # barriers the probe job's sink is behind its sources
FAN_IN = 8
GROWTH_TARGET = 2.0
FILTERED_READ_TARGET_MS = 100.0
CONCURRENT_P99_TARGET_MS = 50.0

FULL = {"topology": (10, 100, 1000), "history": (10_000, 100_000, 1_000_000),
        "files": (1_000, 100_000, 1_000_000), "concurrency": (2, 8, 32)}
QUICK = {"topology": (10, 40, 160), "history": (1_000, 4_000, 16_000),
         "files": (1_000, 4_000, 16_000), "concurrency": (2, 4, 8)}


# ------------------------------------------------------------------- helpers
def _ms(xs: list[float]) -> dict[str, float]:
    xs = sorted(xs)
    if not xs:
        return {"p50_ms": float("nan"), "p99_ms": float("nan"), "runs": 0}
    return {"p50_ms": statistics.median(xs) * 1e3, "p99_ms": xs[min(len(xs) - 1, int(len(xs) * 0.99))] * 1e3,
            "runs": len(xs)}


def _timed(fn: Callable[[], Any], runs: int, warmup: int = 1,
           setup: Callable[[int], Any] | None = None) -> dict[str, float]:
    """``fn`` timed ``runs`` times after ``warmup`` untimed calls; ``setup(run)``, if given, runs
    untimed before each timed call."""
    for _ in range(warmup):
        fn()
    times = []
    for i in range(runs):
        if setup is not None:
            setup(i)
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return _ms(times)


def build_topology(cat: Catalog, n_tables: int, barriers: int, seed: int = 7) -> dict[str, Any]:
    """A layered topology of ``n_tables`` tables with ``barriers`` barriers of bulk-loaded history.

    A tenth of the tables (at least 2) are roots; the others are split into 3
    levels, each derived table reading up to FAN_IN tables of the levels below
    it. The last derived table (the probe) reads exactly FAN_IN sources and
    lags LAG barriers, so that ``next_batch`` has a batch to plan.
    """
    rnd = random.Random(seed)
    p = Pipeline(cat)
    n_roots = max(2, n_tables // 10)
    n_derived = n_tables - n_roots - 1  # and the probe
    roots = [cat.create_table(f"b.r{i}", SCHEMA).ident for i in range(n_roots)]
    for i, r in enumerate(roots):
        p.register_job(f"ingest{i}", sinks=[r], external_input=True)
    below = list(roots)
    derived: list[str] = []
    per_level = [n_derived // 3 + (1 if i < n_derived % 3 else 0) for i in range(3)]
    for level, count in enumerate(per_level):
        this_level = []
        for j in range(count):
            ident = cat.create_table(f"b.d{level}_{j}", SCHEMA).ident
            sources = rnd.sample(below, min(len(below), rnd.randint(1, FAN_IN)))
            p.register_job(f"job{level}_{j}", sources=sources, sinks=[ident])
            this_level.append(ident)
        below += this_level
        derived += this_level
    probe_sources = rnd.sample(below, min(FAN_IN, len(below)))
    probe = cat.create_table("b.probe", SCHEMA).ident
    p.register_job("probe", sources=probe_sources, sinks=[probe])
    load_history(cat, roots + derived, {probe: barriers - LAG}, barriers)
    return {"pipeline": p, "roots": roots, "derived": derived + [probe], "probe": probe,
            "probe_sources": probe_sources}


# ------------------------------------------------------------------ curve 1
def curve_topology(cat: Catalog, n_tables: int, barriers: int, runs: int) -> dict[str, Any]:
    t = time.perf_counter()
    topo = build_topology(cat, n_tables, barriers)
    built = time.perf_counter() - t
    p: Pipeline = topo["pipeline"]
    every = topo["roots"] + topo["derived"]
    q3 = [topo["roots"][0], topo["derived"][0], topo["probe"]]
    out: dict[str, Any] = {"tables": len(every), "build_s": built}
    out["choose query (3 tables)"] = _timed(lambda: p.choose(q3, scope="query"), runs)
    out["choose related"] = _timed(lambda: p.choose(q3, scope="related"), runs)
    out["choose global"] = _timed(lambda: p.choose(every, scope="global"), max(5, runs // 4))
    out["choose global (3 tables queried)"] = _timed(lambda: p.choose(q3, scope="global"), runs)
    coord = Coordinator(cat, snapshot_every=None)
    out["seal"] = _timed(coord.seal, runs)
    coord.release()
    out["next_batch (8 sources)"] = _timed(lambda: p.next_batch("probe"), runs)
    out["restart: new Pipeline's first choose"] = _timed(lambda: Pipeline(cat).choose(q3), max(5, runs // 4), 0)
    # A live pipeline: between two choices a root commits and the coordinator seals (the kept
    # answers of the other tables still hold; the committed table's are asked again).
    coord = Coordinator(cat, snapshot_every=None)
    roots = topo["roots"]

    def commit_and_seal(i: int) -> None:
        cat.load_table(roots[i % len(roots)]).append(
            pa.table({"k": [i], "v": [i]}, schema=SCHEMA), barrier=OPEN_EPOCH)
        coord.seal()

    out["choose global after a commit and a seal"] = _timed(
        lambda: p.choose(every, scope="global"), max(5, runs // 4), 0, setup=commit_and_seal)
    coord.release()
    return out


# ------------------------------------------------------------------ curve 2
def curve_history(cat: Catalog, barriers: int, runs: int) -> dict[str, Any]:
    t = time.perf_counter()
    p = Pipeline(cat)
    roots = [cat.create_table(f"b.r{i}", SCHEMA).ident for i in range(3)]
    for i, r in enumerate(roots):
        p.register_job(f"ingest{i}", sinks=[r], external_input=True)
    derived = []
    for i in range(9):
        ident = cat.create_table(f"b.d{i}", SCHEMA).ident
        sources = [roots[i % 3]] + ([derived[i - 3]] if i >= 3 else [])
        p.register_job(f"job{i}", sources=sources, sinks=[ident])
        derived.append(ident)
    load_history(cat, roots + derived[:-1], {derived[-1]: barriers - LAG}, barriers)
    every = roots + derived
    out: dict[str, Any] = {"tables": len(every), "barriers": barriers, "build_s": time.perf_counter() - t}
    rnd = random.Random(3)
    out["version_at (random barrier)"] = _timed(
        lambda: p.version_at(every[rnd.randrange(len(every))], rnd.randint(1, barriers - LAG), strict=False), runs)
    out["choose query (3 tables)"] = _timed(lambda: p.choose([roots[0], derived[0], derived[-1]]), runs)
    out["choose global"] = _timed(lambda: p.choose(every, scope="global"), runs)
    out["barrier grid (status, last 50)"] = _timed(lambda: p.status(last=50), max(5, runs // 10))
    return out


# ------------------------------------------------------------------ curve 3
_FILES = {
    "sqlite": """
WITH RECURSIVE s(x) AS (SELECT 0 UNION ALL SELECT x + 1 FROM s WHERE x < :n - 1)
INSERT INTO ls_file (table_id, path, added_version, removed_version, record_count, file_size, partition, stats)
SELECT :t, 'data/day=' || (x % :days) || '/f' || x || '.parquet', 1, NULL, 100, 4096,
       '{"day": ' || (x % :days) || '}',
       '{"day":[' || (x % :days) || ',' || (x % :days) || ',0],"k":[' || (x * 100) || ',' || (x * 100 + 99) || ',0]}'
  FROM s""",
    "postgresql": """
INSERT INTO ls_file (table_id, path, added_version, removed_version, record_count, file_size, partition, stats)
SELECT :t, 'data/day=' || (x % :days) || '/f' || x || '.parquet', 1, NULL, 100, 4096,
       '{"day": ' || (x % :days) || '}',
       '{"day":[' || (x % :days) || ',' || (x % :days) || ',0],"k":[' || (x * 100) || ',' || (x * 100 + 99) || ',0]}'
  FROM generate_series(0, CAST(:n AS bigint) - 1) AS x""",
}
DAYS = 1000


def _probe_values(n_files: int) -> tuple[int, int]:
    """The day (one partition) and the key (one file's range) the file curve filters on."""
    return n_files % DAYS // 2, (n_files // 2) * 100 + 5


# The typed statistics rows (ls_file_stats) of the bulk-loaded files, as a commit writes them
# (lakestep/catalog/stats_sql.py): k spans 100 values (width: bit length of 99 = 7), day one.
_FILE_STATS = {
    "sqlite": """
INSERT INTO ls_file_stats (file_id, column_name, table_id, null_count, min_value, max_value, width)
SELECT file_id, :col, table_id, 0, json_extract(stats, '$.' || :col || '[0]'),
       json_extract(stats, '$.' || :col || '[1]'), :width
  FROM ls_file WHERE table_id = :t""",
    "postgresql": """
INSERT INTO ls_file_stats (file_id, column_name, table_id, null_count, min_value, max_value, width)
SELECT file_id, :col, table_id, 0, CAST(stats::json -> :col ->> 0 AS bigint),
       CAST(stats::json -> :col ->> 1 AS bigint), :width
  FROM ls_file WHERE table_id = :t""",
}


def curve_files(cat: Catalog, n_files: int, runs: int, workdir: Path, pg_dsn: str = DEFAULT_PG_DSN) -> dict[str, Any]:
    t = time.perf_counter()
    table = cat.create_table("b.files", FILE_SCHEMA, partition_by=["day"])
    dialect = cat.backend.engine.dialect.name
    with cat.backend.write() as conn:
        conn.execute(sa.text(_FILES[dialect]), {"t": table.table_id, "n": n_files, "days": DAYS})
        for col, width in (("day", 0), ("k", 7)):
            conn.execute(sa.text(_FILE_STATS[dialect]), {"t": table.table_id, "col": col, "width": width})
        conn.execute(sa.insert(S.stats_columns).values(table_id=table.table_id, digest=S.columns_digest(["day", "k"]),
                                                       columns=S.columns_json(["day", "k"])))
        conn.execute(sa.insert(S.commits).values(
            table_id=table.table_id, version=1, data_version=1, operation="APPEND", base_version=0, txn_id=None,
            barrier=None, committed_at=time.time(), added_files=n_files, removed_files=0,
            added_rows=100 * n_files, removed_rows=0, summary="{}"))
        conn.execute(sa.update(S.tables).where(S.tables.c.table_id == table.table_id).values(
            version=1, data_version=1, last_commit_at=time.time(), stamp=S.NextStamp()))
    analyze(cat)
    out: dict[str, Any] = {"files": n_files, "build_s": time.perf_counter() - t}
    def cold(fn: Callable[[Any], Any]) -> Callable[[], Any]:
        """``fn`` on a table handle loaded afresh (no file list cached), from the open catalog."""
        return lambda: fn(cat.load_table("b.files"))

    small = max(3, runs // 10)
    counts: dict[str, int] = {}

    def count(name: str, fn: Callable[[Any], Any]) -> Callable[[Any], Any]:
        def run(t: Any) -> Any:
            got = fn(t)
            counts[name] = len(got if isinstance(got, list) else got.files)
            return got
        return run

    out["cold Table.files()"] = _timed(cold(count("all", lambda t: t.files())), small)
    day, k = _probe_values(n_files)
    out["cold read plan, partition filter (day = d)"] = _timed(
        cold(count("partition", lambda t: t.read_plan(where=[("day", "==", day)]))), small)
    out["cold read plan, stats filter (k = x)"] = _timed(
        cold(count("stats", lambda t: t.read_plan(where=[("k", "==", k)]))), small)
    out["files returned"] = dict(counts)
    batch = pa.table({"day": [1], "k": [-1], "v": [0]}, schema=FILE_SCHEMA)
    out["append (1 file)"] = _timed(lambda: table.append(batch), max(10, runs // 5))
    out["delta-rs"] = _delta_listing(workdir / f"delta-{n_files}", n_files, small)
    backend = "sqlite" if dialect == "sqlite" else "postgres"
    out["DuckLake"] = _ducklake_listing(workdir / f"ducklake-{n_files}", n_files, small, backend, pg_dsn)
    return out


def _delta_listing(path: Path, n_files: int, runs: int) -> dict[str, Any]:
    """delta-rs at the same file count: one commit of ``n_files`` add actions (written as JSON,
    as a bulk load), then the log replay with and without a checkpoint."""
    try:
        from deltalake import DeltaTable
    except ImportError as e:  # the benchmark extra brings it
        return {"skipped": f"deltalake not installed ({e})"}
    log = path / "_delta_log"
    log.mkdir(parents=True, exist_ok=True)
    schema = {"type": "struct", "fields": [{"name": n, "type": "long", "nullable": True, "metadata": {}}
                                           for n in ("day", "k", "v")]}
    now = int(time.time() * 1000)
    with open(log / "00000000000000000000.json", "w") as f:
        f.write(json.dumps({"protocol": {"minReaderVersion": 1, "minWriterVersion": 2}}) + "\n")
        f.write(json.dumps({"metaData": {"id": "bench", "format": {"provider": "parquet", "options": {}},
                                         "schemaString": json.dumps(schema), "partitionColumns": ["day"],
                                         "configuration": {}, "createdTime": now}}) + "\n")
        for x in range(n_files):
            d = x % DAYS
            stats = json.dumps({"numRecords": 100, "minValues": {"k": x * 100, "v": 0},
                                "maxValues": {"k": x * 100 + 99, "v": 0}, "nullCount": {"k": 0, "v": 0}})
            f.write(json.dumps({"add": {"path": f"day={d}/f{x}.parquet", "partitionValues": {"day": str(d)},
                                        "size": 4096, "modificationTime": now, "dataChange": True,
                                        "stats": stats}}) + "\n")
    out: dict[str, Any] = {}
    day, k = _probe_values(n_files)

    def listing() -> int:
        return len(DeltaTable(str(path)).file_uris())

    def filtered() -> int:
        return len(DeltaTable(str(path)).file_uris(file_pruning_predicate=[("day", "=", day)]))

    def by_stats() -> int:
        return len(DeltaTable(str(path)).file_uris(file_pruning_predicate=[("k", "=", k)]))

    for label in ("no checkpoint", "checkpoint"):
        if label == "checkpoint":
            DeltaTable(str(path)).create_checkpoint()
        out[f"log replay + file list, {label}"] = _timed(listing, runs, 0)
        out[f"log replay + partition filter, {label}"] = _timed(filtered, runs, 0)
        out[f"log replay + stats filter, {label}"] = _timed(by_stats, runs, 0)
    out["files returned"] = {"all": listing(), "partition": filtered(), "stats": by_stats()}
    return out


def _ducklake_listing(path: Path, n_files: int, runs: int, backend: str, pg_dsn: str) -> dict[str, Any]:
    """DuckLake at the same file count, its metadata in SQLite or PostgreSQL as lakestep's.

    One real insert writes one Parquet file and DuckLake's rows for it; the other
    ``n_files - 1`` files are bulk-loaded into DuckLake's metadata tables (through DuckDB's
    attachment of them) as copies of that file's rows with the benchmark's partition values
    and statistics; every copy names the one real file, so a query can read what it keeps.
    Measured cold (the catalog attached afresh to a DuckDB connection that has its extensions
    loaded): ``ducklake_list_files``,
    and ``count(*)`` with a statistics filter (1 file kept, read). No partition-filtered
    query: every copy names the real file, whose path says ``day=0``; such a count took
    5.7 s at 10^5 files (0.1 s with the statistics filter), reading files rather than
    planning, so it would not measure the plan."""
    try:
        con = _duckdb_offline_connection()
    except Exception as e:  # the benchmark extra brings duckdb and its extensions
        return {"skipped": f"DuckLake not available ({type(e).__name__}: {e})"}
    path.mkdir(parents=True, exist_ok=True)
    out: dict[str, Any] = {}
    with ducklake_metadata(path, backend, pg_dsn) as metadata:
        # no inlining (DuckLake 1.5 keeps small inserts in its metadata): the one real insert is a file
        attach = f"ATTACH '{metadata}' AS lake (DATA_PATH '{path}/data/', DATA_INLINING_ROW_LIMIT 0)"
        try:
            con.execute(attach)
            con.execute("CREATE TABLE lake.t (day BIGINT, k BIGINT, v BIGINT)")
            con.execute("ALTER TABLE lake.t SET PARTITIONED BY (day)")
            con.execute("INSERT INTO lake.t VALUES (0, 0, 0)")
            m = "__ducklake_metadata_lake"
            (snapshot,) = con.execute(f"SELECT max(snapshot_id) FROM {m}.ducklake_snapshot").fetchone()
            # copies by column name (``* REPLACE``): DuckLake's metadata tables gain columns between
            # versions (1.4 had partial_file_info, 1.5 has partial_max)
            con.execute(f"""
                INSERT INTO {m}.ducklake_data_file
                SELECT f.* REPLACE (f.data_file_id + x AS data_file_id, 100 AS record_count,
                                    f.row_id_start + 100 * x AS row_id_start)
                FROM {m}.ducklake_data_file f, range(1, {n_files}) r(x)""")
            con.execute(f"""
                INSERT INTO {m}.ducklake_file_partition_value
                SELECT p.* REPLACE (p.data_file_id + x AS data_file_id,
                                    CAST(x % {DAYS} AS VARCHAR) AS partition_value)
                FROM {m}.ducklake_file_partition_value p, range(1, {n_files}) r(x)""")
            con.execute(f"""
                INSERT INTO {m}.ducklake_file_column_stats
                SELECT s.* REPLACE (s.data_file_id + x AS data_file_id, 100 AS value_count, 0 AS null_count,
                       CAST(CASE s.column_id WHEN 1 THEN x % {DAYS} WHEN 2 THEN x * 100 ELSE 0 END AS VARCHAR)
                           AS min_value,
                       CAST(CASE s.column_id WHEN 1 THEN x % {DAYS} WHEN 2 THEN x * 100 + 99 ELSE 0 END AS VARCHAR)
                           AS max_value)
                FROM {m}.ducklake_file_column_stats s, range(1, {n_files}) r(x)""")
            con.execute(f"UPDATE {m}.ducklake_snapshot SET next_file_id = {n_files} WHERE snapshot_id = {snapshot}")
            con.execute(f"UPDATE {m}.ducklake_table_stats SET record_count = {100 * n_files}, "
                        f"next_row_id = {100 * n_files}")
        finally:
            con.close()
        _, k = _probe_values(n_files)
        con = _duckdb_offline_connection()  # extensions loaded once: the catalog is attached cold

        def cold(sql: str) -> Callable[[], Any]:
            def run() -> Any:
                con.execute(attach)
                try:
                    return con.execute(sql).fetchone()[0]
                finally:
                    con.execute("DETACH lake")
            return run

        try:
            listing = cold("SELECT count(*) FROM ducklake_list_files('lake', 't')")
            out["file list"] = _timed(listing, runs, 0)
            out["count(*), stats filter"] = _timed(cold(f"SELECT count(*) FROM lake.t WHERE k = {k}"), runs, 0)
            out["files returned"] = {"all": listing()}
        finally:
            con.close()
    return out


# ------------------------------------------------------------------ curve 4
def _cpu_sample() -> tuple[float, float, int] | None:
    """(busy jiffies, total jiffies, runnable tasks) from /proc/stat; None off Linux."""
    try:
        text = Path("/proc/stat").read_text()
    except OSError:
        return None
    busy = total = 0.0
    running = 0
    for line in text.splitlines():
        if line.startswith("cpu "):
            v = [float(x) for x in line.split()[1:]]
            total = sum(v[:8])  # user nice system idle iowait irq softirq steal (guest is in user)
            busy = total - v[3] - v[4]
        elif line.startswith("procs_running "):
            running = int(line.split()[1])
    return busy, total, running


class CpuSampler:
    """What the machine did during a run: the CPUs' busy share and the mean number of runnable
    tasks (Linux /proc/stat, sampled every 0.1 s). A run whose runnable tasks far exceed the
    cores measures the scheduler's queue as much as lakestep."""

    def __init__(self) -> None:
        self.first = self.last = _cpu_sample()
        self.running: list[int] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(0.1):
            got = _cpu_sample()
            if got is not None:
                self.running.append(got[2] - 1)  # (minus this sampler)
                self.last = got

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> dict[str, Any]:
        self._stop.set()
        self._thread.join()
        if self.first is None or self.last is None or not self.running:
            return {}
        busy, total = self.last[0] - self.first[0], self.last[1] - self.first[1]
        return {"cpu_busy_pct": round(100 * busy / total, 1) if total else None, "cpus": os.cpu_count(),
                "runnable_mean": round(statistics.mean(self.running), 1), "runnable_max": max(self.running)}


def _writer(url: str, ident: str, seconds: float, period: float, ready: Any, go: Any, results: Any) -> None:
    cat = Catalog(url)
    table = cat.load_table(ident)
    batch = pa.table({"k": [1, 2, 3], "v": [4, 5, 6]}, schema=SCHEMA)
    table.append(batch, barrier=OPEN_EPOCH)  # warm-up
    ready.put(1)
    go.wait()
    lat: list[float] = []
    errors: list[str] = []
    end = time.monotonic() + seconds
    nxt = time.monotonic()
    cpu0 = time.process_time()
    while time.monotonic() < end:
        t = time.perf_counter()
        try:
            table.append(batch, barrier=OPEN_EPOCH)
            lat.append(time.perf_counter() - t)
        except Exception as e:  # counted: the target is zero
            errors.append(f"{type(e).__name__}: {e}"[:300])
        nxt += period
        time.sleep(max(0.0, nxt - time.monotonic()))
    cpu = time.process_time() - cpu0
    cat.close()
    results.put(("write", lat, errors, cpu))


def _reader(url: str, tables: list[str], seconds: float, ready: Any, go: Any, results: Any) -> None:
    cat = Catalog(url)
    p = Pipeline(cat)
    p.choose(tables)
    ready.put(1)
    go.wait()
    lat: list[float] = []
    errors: list[str] = []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        t = time.perf_counter()
        try:
            p.choose(tables)
            lat.append(time.perf_counter() - t)
        except Exception as e:
            errors.append(f"{type(e).__name__}: {e}"[:300])
    cat.close()
    results.put(("read", lat, errors, 0.0))


def curve_concurrency(cat: Catalog, writers: int, seconds: float) -> dict[str, Any]:
    p = Pipeline(cat)
    tables = []
    for i in range(writers):
        ident = cat.create_table(f"b.w{i}", SCHEMA).ident
        p.register_job(f"writer{i}", sinks=[ident], external_input=True)
        tables.append(ident)
    # forkserver: fresh processes (no inherited connections or threads), each forked from one that
    # imported lakestep once, instead of every process importing it anew (seconds of CPU each)
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(["benchmarks.scale"])
    q: Any = ctx.Queue()
    ready: Any = ctx.Queue()
    go = ctx.Event()  # released once every process has imported and warmed up
    procs = [ctx.Process(target=_writer, args=(cat.url, t, seconds, 0.05, ready, go, q)) for t in tables]
    procs += [ctx.Process(target=_reader, args=(cat.url, tables, seconds, ready, go, q)) for _ in range(2)]
    for pr in procs:
        pr.start()
    for _ in procs:
        ready.get(timeout=600)
    coord = _TimedCoordinator(cat, interval=0.2, lease_seconds=10.0, snapshot_every=None)
    samples: list[tuple[int, int]] = []
    stop = threading.Event()
    sampler = None
    if cat.backend.engine.dialect.name == "postgresql":
        def sample() -> None:
            eng = sa.create_engine(cat.url, poolclass=sa.pool.NullPool)
            with eng.connect() as c:
                while not stop.wait(0.1):
                    conns = c.execute(sa.text(
                        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()")).scalar()
                    waits = c.execute(sa.text("SELECT count(*) FROM pg_locks WHERE NOT granted")).scalar()
                    c.commit()
                    samples.append((int(conns or 0), int(waits or 0)))
            eng.dispose()
        sampler = threading.Thread(target=sample, daemon=True)
    cpu = CpuSampler()
    go.set()
    cpu.start()
    coord.start()
    if sampler is not None:
        sampler.start()
    got = [q.get(timeout=300 + seconds) for _ in procs]
    coord.stop()
    machine = cpu.stop()
    stop.set()
    for pr in procs:
        pr.join(30)
    commit_lat = [x for role, lat, _, _ in got if role == "write" for x in lat]
    choose_lat = [x for role, lat, _, _ in got if role == "read" for x in lat]
    errors = [e for _, _, errs, _ in got for e in errs]
    writer_cpu = sum(cpu for role, _, _, cpu in got if role == "write")
    out: dict[str, Any] = {"writers": writers, "seconds": seconds, "commit": _ms(commit_lat),
                           "commits_per_s": len(commit_lat) / seconds, "seal": _ms(coord.latencies),
                           "choose": _ms(choose_lat), "exceptions": len(errors), "first_exceptions": errors[:3],
                           "offered_commits_per_s": writers / 0.05, **machine,
                           # CPU the writer processes spent per commit (their Python, the driver, and on
                           # SQLite the database itself): what N writers ask of the cores
                           "writer_cpu_ms_per_commit": round(1000 * writer_cpu / len(commit_lat), 2)
                           if commit_lat else None}
    if samples:
        out["pg_connections_peak"] = max(c for c, _ in samples)
        out["pg_lock_wait_samples"] = sum(1 for _, w in samples if w)
        out["pg_lock_waits_peak"] = max(w for _, w in samples)
        out["pg_samples"] = len(samples)
    return out


# ------------------------------------------------------------------ report
def growth(curve: list[dict[str, Any]], key: str) -> float:
    a, b = curve[0][key]["p50_ms"], curve[-1][key]["p50_ms"]
    return b / a if a else float("inf")


def report(results: dict[str, Any], sizes: dict[str, tuple[int, ...]]) -> tuple[str, list[dict[str, Any]]]:
    lines: list[str] = []
    checks: list[dict[str, Any]] = []

    def check(backend: str, name: str, value: float, target: float, unit: str) -> str:
        ok = value <= target
        checks.append({"backend": backend, "name": name, "value": value, "target": target, "unit": unit,
                       "result": "PASS" if ok else "MISS"})
        return "PASS" if ok else "MISS"

    for backend, r in results.items():
        for curve_name, key_targets in (
            ("topology", {"choose query (3 tables)": True, "choose related": True, "choose global": True,
                          "choose global (3 tables queried)": True, "seal": True, "next_batch (8 sources)": True,
                          "restart: new Pipeline's first choose": False,
                          "choose global after a commit and a seal": True}),
            ("history", {"version_at (random barrier)": True, "choose query (3 tables)": True,
                         "choose global": True, "barrier grid (status, last 50)": False}),
            ("files", {"cold Table.files()": False, "cold read plan, partition filter (day = d)": False,
                       "cold read plan, stats filter (k = x)": False, "append (1 file)": False}),
        ):
            curve = r.get(curve_name)
            if not curve:
                continue
            size_label = {"topology": "tables", "history": "barriers", "files": "files"}[curve_name]
            ns = sizes[curve_name]
            lines.append(f"\n[{backend}] {curve_name}: p50 (p99) in ms at {size_label} = "
                         + " / ".join(f"{n:,}" for n in ns))
            for key, targeted in key_targets.items():
                if any(key not in c for c in curve):  # (a result file of an older run)
                    continue
                cells = "  ".join(f"{c[key]['p50_ms']:8.2f} ({c[key]['p99_ms']:8.2f})" for c in curve)
                g = growth(curve, key)
                verdict = f"  <= {GROWTH_TARGET:g}: {check(backend, f'{curve_name} growth: {key}', g, GROWTH_TARGET, 'x')}" if targeted else ""
                lines.append(f"  {key:<42} {cells}   growth {g:6.2f}x{verdict}")
            if curve_name == "files":
                big = curve[-1]
                for key, what in (("cold read plan, partition filter (day = d)", "partition"),
                                  ("cold read plan, stats filter (k = x)", "stats")):
                    v = big[key]["p50_ms"]
                    lines.append(f"  selective {what}-filtered plan at {ns[-1]:,} files: {v:.1f} ms  "
                                 f"< {FILTERED_READ_TARGET_MS:g} ms: "
                                 f"{check(backend, f'files: {what}-filtered plan at largest size', v, FILTERED_READ_TARGET_MS, 'ms')}")
                for peer in ("delta-rs", "DuckLake"):
                    for c in curve:
                        d = c.get(peer, {})
                        if not d:  # (a result file of an older run)
                            continue
                        if "skipped" in d:
                            lines.append(f"  {peer} at {c['files']:,} files: skipped ({d['skipped']})")
                            continue
                        lines.append(f"  {peer} at {c['files']:,} files: " + ", ".join(
                            f"{k} {v['p50_ms']:.1f} ms" for k, v in d.items() if "p50_ms" in v))
        for c in r.get("concurrency", []):
            extra = ""
            if "pg_connections_peak" in c:
                extra = (f", PG connections peak {c['pg_connections_peak']}, lock-wait samples "
                         f"{c['pg_lock_wait_samples']}/{c['pg_samples']}")
            lines.append(f"\n[{backend}] concurrency N={c['writers']}: commit p50 {c['commit']['p50_ms']:.1f} ms "
                         f"p99 {c['commit']['p99_ms']:.1f} ms, {c['commits_per_s']:.0f} commits/s, seal p99 "
                         f"{c['seal']['p99_ms']:.1f} ms ({c['seal']['runs']} seals), choose p99 "
                         f"{c['choose']['p99_ms']:.1f} ms, exceptions {c['exceptions']}{extra}")
            if "cpu_busy_pct" in c:
                lines.append(f"    offered {c['offered_commits_per_s']:.0f} commits/s; writer CPU "
                             f"{c['writer_cpu_ms_per_commit']} ms per commit; CPUs busy {c['cpu_busy_pct']}% of "
                             f"{c['cpus']}, runnable tasks mean {c['runnable_mean']} (max {c['runnable_max']})")
        conc = r.get("concurrency", [])
        if conc:
            big = conc[-1]
            lines.append(f"  at N={big['writers']}: commit p99 < {CONCURRENT_P99_TARGET_MS:g} ms: "
                         f"{check(backend, 'concurrency: commit p99', big['commit']['p99_ms'], CONCURRENT_P99_TARGET_MS, 'ms')}"
                         f"; seal p99 < {CONCURRENT_P99_TARGET_MS:g} ms: "
                         f"{check(backend, 'concurrency: seal p99', big['seal']['p99_ms'], CONCURRENT_P99_TARGET_MS, 'ms')}"
                         f"; exceptions == 0: {check(backend, 'concurrency: exceptions', big['exceptions'], 0, '')}")
    return "\n".join(lines), checks


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.scale", description=__doc__.split("\n")[0])
    ap.add_argument("--backends", default="sqlite,postgres")
    ap.add_argument("--only", default="topology,history,files,concurrency")
    ap.add_argument("--quick", action="store_true", help="smaller sizes and fewer runs (minutes, not half an hour)")
    ap.add_argument("--runs", type=int, default=None, help="timed runs per measurement")
    ap.add_argument("--topology-barriers", type=int, default=None)
    ap.add_argument("--seconds", type=float, default=None, help="length of each concurrency run")
    ap.add_argument("--pg-dsn", default=os.environ.get("LAKESTEP_BENCH_PG_DSN", DEFAULT_PG_DSN))
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "scale.json"))
    ap.add_argument("--sizes", default=None, help="override, e.g. 'topology=10,20,40;files=100,200,400'")
    args = ap.parse_args(argv)
    sizes = dict(QUICK if args.quick else FULL)
    if args.sizes:
        for part in args.sizes.split(";"):
            name, _, values = part.partition("=")
            sizes[name.strip()] = tuple(int(v) for v in values.split(","))
    runs = args.runs or (30 if args.quick else 100)
    tb = args.topology_barriers or (100 if args.quick else 1000)
    seconds = args.seconds or (3.0 if args.quick else 10.0)
    only = {x.strip() for x in args.only.split(",") if x.strip()}
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="lakestep-bench-scale-") as tmp:
        for backend in [b.strip() for b in args.backends.split(",") if b.strip()]:
            r: dict[str, Any] = results.setdefault(backend, {})
            for curve in ("topology", "history", "files", "concurrency"):
                if curve not in only:
                    continue
                for i, n in enumerate(sizes[curve]):
                    print(f"[{backend}] {curve} at {n:,} ...", file=sys.stderr, flush=True)
                    work = Path(tmp) / backend / f"{curve}{i}_{n}"
                    with new_catalog(work, backend, args.pg_dsn, f"{curve}{i}_{n}", bench="scale") as cat:
                        if curve == "topology":
                            got = curve_topology(cat, n, tb, runs)
                        elif curve == "history":
                            got = curve_history(cat, n, runs)
                        elif curve == "files":
                            got = curve_files(cat, n, runs, work, args.pg_dsn)
                        else:
                            got = curve_concurrency(cat, n, seconds)
                    r.setdefault(curve, []).append(got)
    text, checks = report(results, sizes)
    print(text)
    doc = {"benchmark": "scale", "when": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
           "lakestep": lakestep.__version__, "python": sys.version.split()[0], "machine": platform.platform(),
           "cpus": os.cpu_count(), "quick": args.quick, "sizes": sizes, "runs": runs,
           "topology_barriers": tb, "metadata": "bulk-loaded with INSERT ... SELECT (no data files)",
           "results": results, "checks": checks}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(doc, indent=2, default=str))
    print(f"\nJSON: {args.out}")
    return 0 if all(c["result"] == "PASS" for c in checks) else 1


if __name__ == "__main__":
    raise SystemExit(main())
