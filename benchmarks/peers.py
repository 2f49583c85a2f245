"""Append-latency benchmark of lakestep's peers.

Workload: ``n`` sequential appends to ONE table, where every commit appends
ONE Parquet file of 100 rows (see :func:`make_batch`).  For each peer we time
(``time.perf_counter``) the full user-facing ``append`` call -- writing the
data file plus committing the metadata -- and return the per-commit latencies
in seconds.  Table creation and one warm-up append happen before timing.

Peers:

* pyiceberg ``SqlCatalog`` with a SQLite or PostgreSQL catalog,
* delta-rs ``write_deltalake(mode="append")`` (log on the local filesystem),
* DuckLake (DuckDB) with a SQLite or PostgreSQL metadata catalog.

DuckDB extensions: the sandbox has no access to the extension repository, so
DuckDB is opened with ``autoinstall_known_extensions`` and
``autoload_known_extensions`` disabled and the extensions are ``LOAD``-ed by
full path from the ``duckdb-extension-*`` wheels (lakestep.query.duck.load_extensions).

For the PostgreSQL backends a fresh, uniquely named database is created per
run (through ``pg_dsn``, which must point at an existing database such as
``postgres``) and dropped afterwards.

Run: ``python -m benchmarks.peers --n 50``; prints one JSON line per peer.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import statistics
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Literal
from urllib.parse import urlsplit, urlunsplit

import pyarrow as pa

if TYPE_CHECKING:
    import duckdb

Backend = Literal["sqlite", "postgres"]
DEFAULT_PG_DSN = "postgresql://postgres@127.0.0.1:5432/postgres"
DUCKDB_EXTENSIONS = ("sqlite", "postgres", "ducklake")  # the duckdb-extension-<name> wheels (parquet is built in)
_EPOCH = dt.datetime(2024, 1, 1, tzinfo=dt.timezone.utc)

SCHEMA = pa.schema(
    [
        ("id", pa.int64()),
        ("ts", pa.timestamp("us", tz="UTC")),
        ("value", pa.float64()),
        ("name", pa.string()),
    ]
)


def make_batch(i: int, rows: int = 100) -> pa.Table:
    """Deterministic batch ``i``: ids ``i*rows .. i*rows+rows-1``."""
    ids = [i * rows + k for k in range(rows)]
    return pa.table(
        {
            "id": ids,
            "ts": [_EPOCH + dt.timedelta(seconds=x) for x in ids],
            "value": [x * 0.5 for x in ids],
            "name": [f"item-{x % 97}" for x in ids],
        },
        schema=SCHEMA,
    )


def _timed(n: int, append: Callable[[pa.Table], object]) -> list[float]:
    """Warm up with batch 0, then time ``n`` appends of batches 1..n."""
    append(make_batch(0))
    latencies: list[float] = []
    for i in range(1, n + 1):
        batch = make_batch(i)
        start = time.perf_counter()
        append(batch)
        latencies.append(time.perf_counter() - start)
    return latencies


@contextlib.contextmanager
def _fresh_pg_database(pg_dsn: str, prefix: str) -> Iterator[str]:
    """Create a uniquely named database, yield its name, drop it on exit."""
    import psycopg2

    name = f"{prefix}_{uuid.uuid4().hex[:10]}"

    def run(sql: str) -> None:
        conn = psycopg2.connect(pg_dsn)
        try:
            conn.autocommit = True
            with conn.cursor() as cur:
                cur.execute(sql)
        finally:
            conn.close()

    run(f'CREATE DATABASE "{name}"')
    try:
        yield name
    finally:
        run(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def _with_dbname(pg_dsn: str, dbname: str, scheme: str | None = None) -> str:
    parts = urlsplit(pg_dsn)
    return urlunsplit((scheme or parts.scheme, parts.netloc, f"/{dbname}", parts.query, ""))


@contextlib.contextmanager
def fresh_pg_url(pg_dsn: str, prefix: str, scheme: str | None = None) -> Iterator[str]:
    """The URL of a fresh database on ``pg_dsn``'s server, dropped on exit."""
    with _fresh_pg_database(pg_dsn, prefix) as db:
        yield _with_dbname(pg_dsn, db, scheme)


# --------------------------------------------------------------------- pyiceberg
def run_pyiceberg(
    n: int, workdir: Path, backend: Backend, pg_dsn: str | None = None
) -> list[float]:
    from pyiceberg.catalog.sql import SqlCatalog

    def bench(uri: str) -> list[float]:
        catalog = SqlCatalog(
            "bench", uri=uri, warehouse=f"file://{workdir}/iceberg-wh"
        )
        try:
            catalog.create_namespace("bench")
            table = catalog.create_table("bench.t", schema=SCHEMA)
            return _timed(n, table.append)
        finally:
            catalog.engine.dispose()

    if backend == "sqlite":
        return bench(f"sqlite:///{workdir}/pyiceberg.db")
    with _fresh_pg_database(pg_dsn or DEFAULT_PG_DSN, "bench_pyiceberg") as db:
        return bench(_with_dbname(pg_dsn or DEFAULT_PG_DSN, db, "postgresql+psycopg2"))


# --------------------------------------------------------------------- deltalake
def run_deltalake(n: int, workdir: Path) -> list[float]:
    from deltalake import DeltaTable, write_deltalake

    path = str(workdir / "delta-table")
    DeltaTable.create(path, schema=SCHEMA)
    return _timed(n, lambda batch: write_deltalake(path, batch, mode="append"))


# ---------------------------------------------------------------------- ducklake
def _duckdb_offline_connection() -> duckdb.DuckDBPyConnection:
    import duckdb

    con = duckdb.connect(
        # python_enable_replacements: DuckLake 1.5 probes its metadata catalog by table name, and a
        # Python object of that name in the caller's frames (ducklake_metadata here) must not answer
        config={"autoinstall_known_extensions": "false", "autoload_known_extensions": "false",
                "python_enable_replacements": "false"}
    )
    from lakestep.query.duck import load_extensions

    load_extensions(con, *DUCKDB_EXTENSIONS)
    return con


def run_ducklake(
    n: int, workdir: Path, backend: Backend, pg_dsn: str | None = None
) -> list[float]:
    def bench(metadata: str) -> list[float]:
        con = _duckdb_offline_connection()
        try:
            # DATA_INLINING_ROW_LIMIT 0: every commit writes its Parquet file, as the other peers' do
            # (DuckLake 1.5 keeps small inserts in its metadata database instead)
            con.execute(f"ATTACH '{metadata}' AS lake (DATA_PATH '{workdir}/ducklake-data/', "
                        "DATA_INLINING_ROW_LIMIT 0)")
            con.execute(
                "CREATE TABLE lake.t (id BIGINT, ts TIMESTAMPTZ, value DOUBLE, name VARCHAR)"
            )

            def append(batch: pa.Table) -> None:
                con.register("batch", batch)
                con.execute("INSERT INTO lake.t SELECT * FROM batch")
                con.unregister("batch")

            return _timed(n, append)
        finally:
            con.close()

    with ducklake_metadata(workdir, backend, pg_dsn) as metadata:
        return bench(metadata)


@contextlib.contextmanager
def ducklake_metadata(workdir: Path, backend: Backend, pg_dsn: str | None = None) -> Iterator[str]:
    """The ``ATTACH`` string of a new DuckLake catalog: a SQLite file in ``workdir``, or a
    fresh PostgreSQL database (dropped on exit)."""
    if backend == "sqlite":
        yield f"ducklake:sqlite:{workdir}/meta.sqlite"
        return
    dsn = urlsplit(pg_dsn or DEFAULT_PG_DSN)
    with _fresh_pg_database(pg_dsn or DEFAULT_PG_DSN, "bench_ducklake") as db:
        libpq = f"dbname={db} host={dsn.hostname or '127.0.0.1'} port={dsn.port or 5432}"
        libpq += f" user={dsn.username or 'postgres'}"
        if dsn.password:
            libpq += f" password={dsn.password}"
        yield f"ducklake:postgres:{libpq}"


PEERS: dict[str, Callable[..., list[float]]] = {
    "pyiceberg": run_pyiceberg,
    "deltalake": run_deltalake,
    "ducklake": run_ducklake,
}

# (peer, backend) combinations run by the CLI; backend None = no catalog choice.
RUNS: list[tuple[str, Backend | None]] = [
    ("pyiceberg", "sqlite"),
    ("pyiceberg", "postgres"),
    ("deltalake", None),
    ("ducklake", "sqlite"),
    ("ducklake", "postgres"),
]


def summarize(latencies: list[float]) -> dict[str, float]:
    p99 = latencies[0]
    if len(latencies) > 1:
        p99 = statistics.quantiles(latencies, n=100, method="inclusive")[98]
    return {
        "commits_per_s": round(len(latencies) / sum(latencies), 2),
        "p50_ms": round(statistics.median(latencies) * 1000, 3),
        "p99_ms": round(p99 * 1000, 3),
    }


def main(argv: list[str] | None = None) -> None:
    import tempfile

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=50, help="timed commits per peer")
    parser.add_argument("--pg-dsn", default=DEFAULT_PG_DSN)
    args = parser.parse_args(argv)

    for peer, backend in RUNS:
        record: dict[str, object] = {
            "peer": peer, "backend": backend or "filesystem", "n": args.n
        }
        try:
            with tempfile.TemporaryDirectory(prefix=f"lakestep-{peer}-") as tmp:
                kwargs = {} if backend is None else {"backend": backend, "pg_dsn": args.pg_dsn}
                record.update(summarize(PEERS[peer](args.n, Path(tmp), **kwargs)))
        except Exception as exc:  # one failing peer must not stop the others
            record = {"peer": peer, "backend": backend, "error": f"{type(exc).__name__}: {exc}"}
        print(json.dumps(record), flush=True)


if __name__ == "__main__":
    main()
