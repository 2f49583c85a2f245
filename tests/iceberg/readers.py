"""Reading what lakestep publishes with real Iceberg engines, and comparing with lakestep.

Every comparison is an exact multiset of rows (``collections.Counter`` of
tuples of Python values: integers, decimals, strings, dates; no floats). An
engine reads a snapshot with the snapshot's own schema: columns lakestep added
later are compared on the columns the engine returns, and must read null in
lakestep's rows of that barrier.
"""

from __future__ import annotations

import collections
import os
from typing import Any, Iterable, Sequence

import pyarrow as pa

os.environ.setdefault("POLARS_ICEBERG_PLANNER", "pyiceberg")  # the planner plugin is not installed

from lakestep import Catalog  # noqa: E402
from lakestep.iceberg import s3_properties, sql_catalog  # noqa: E402

Rows = collections.Counter


def freeze(v: Any) -> Any:
    """A hashable form of a value, the same for every engine's way of giving nested values:
    a struct or a map is its sorted (name, value) pairs (Arrow and PyIceberg give a map as a
    list of pairs, DuckDB as a dict, Polars as a list of {key, value}); an empty map reads
    as an empty list."""
    def pair(x: Any) -> bool:
        return (isinstance(x, tuple) and len(x) == 2) or (isinstance(x, dict) and set(x) == {"key", "value"})

    if isinstance(v, dict):
        return tuple(sorted(((k, freeze(x)) for k, x in v.items()), key=repr)) if v else ("list",)
    if isinstance(v, (list, tuple)):
        if v and all(pair(x) for x in v):
            pairs = [(freeze(x["key"]), freeze(x["value"])) if isinstance(x, dict) else (freeze(x[0]), freeze(x[1]))
                     for x in v]
            return tuple(sorted(pairs, key=repr))
        return ("list", *(freeze(x) for x in v))
    return v


def counter(table: pa.Table, columns: Sequence[str] | None = None) -> Rows:
    t = table.select(list(columns)) if columns is not None else table
    names = t.column_names
    return collections.Counter(tuple(freeze(r[c]) for c in names) for r in t.to_pylist())


def _dicts(rows: Iterable[dict[str, Any]], columns: Sequence[str]) -> Rows:
    return collections.Counter(tuple(freeze(r[c]) for c in columns) for r in rows)


class Engines:
    """PyIceberg, DuckDB (iceberg_scan of the metadata file) and Polars over one published catalog."""

    def __init__(self, catalog: Catalog, engines: Sequence[str] = ("pyiceberg", "duckdb", "polars")) -> None:
        self.catalog = catalog
        self.engines = tuple(engines)
        self.sql = sql_catalog(catalog)
        self._duck = None

    def duck(self) -> Any:
        if self._duck is None:
            import duckdb

            from lakestep.query.duck import load_extensions

            con = duckdb.connect()
            load_extensions(con, "avro", "iceberg")
            opts = self.catalog.storage.as_dict()
            if opts:
                load_extensions(con, "httpfs")
                s3 = s3_properties(opts)
                endpoint = s3["s3.endpoint"].split("://", 1)
                con.execute(
                    "CREATE SECRET lakestep_s3 (TYPE s3, KEY_ID ?, SECRET ?, REGION ?, ENDPOINT ?, URL_STYLE 'path', "
                    "USE_SSL ?)", [s3["s3.access-key-id"], s3["s3.secret-access-key"], s3.get("s3.region", "us-east-1"),
                                   endpoint[1], str(endpoint[0] == "https").lower()])
            self._duck = con
        return self._duck

    def polars_options(self) -> dict[str, str] | None:
        """Polars reads the files itself (object_store): the S3 endpoint and keys, its way."""
        opts = self.catalog.storage.as_dict()
        if not opts:
            return None
        s3 = s3_properties(opts)
        return {"aws_endpoint_url": s3["s3.endpoint"], "aws_access_key_id": s3["s3.access-key-id"],
                "aws_secret_access_key": s3["s3.secret-access-key"], "aws_region": s3.get("s3.region", "us-east-1"),
                "aws_allow_http": str(s3["s3.endpoint"].startswith("http://")).lower()}

    def table(self, ident: str) -> Any:
        return self.sql.load_table(ident)

    def read(self, engine: str, ident: str, ref: str, table: Any = None) -> tuple[list[str], Rows]:
        """(columns, rows) of ``ref`` (a tag or ``main``) of the Iceberg table ``ident`` (``table``: its
        metadata as the caller loaded it, else loaded now)."""
        t = table if table is not None else self.table(ident)
        snap = t.snapshot_by_name(ref)
        assert snap is not None, f"{ident} has no ref {ref!r}: {sorted(t.metadata.refs)}"
        if engine == "pyiceberg":
            got = t.scan(snapshot_id=snap.snapshot_id).to_arrow()
            return got.column_names, counter(got)
        if engine == "duckdb":
            # iceberg_scan of a metadata file takes a snapshot id (a ref name is not resolved there)
            rel = self.duck().execute("SELECT * FROM iceberg_scan(?, snapshot_from_id => ?)",
                                      [t.metadata_location, snap.snapshot_id])
            cols = [d[0] for d in rel.description]
            return cols, collections.Counter(tuple(freeze(x) for x in r) for r in rel.fetchall())
        if engine == "polars":
            import polars as pl

            df = pl.scan_iceberg(t, snapshot_id=snap.snapshot_id, storage_options=self.polars_options()).collect()
            return df.columns, _dicts(df.to_dicts(), df.columns)
        raise AssertionError(engine)


def lakestep_rows(catalog: Catalog, ident: str, version: int) -> pa.Table:
    return catalog.load_table(ident).to_arrow(version=version)


def assert_same(engines: Engines, ident: str, ref: str, expected: pa.Table, table: Any = None) -> None:
    """Every engine reads ``ref`` of ``ident`` as exactly ``expected`` (lakestep's rows); the table's
    metadata loaded once for all of them (``table``: as the caller loaded it)."""
    t = table if table is not None else engines.table(ident)
    for engine in engines.engines:
        cols, got = engines.read(engine, ident, ref, t)
        extra = [c for c in expected.column_names if c not in cols]
        for c in extra:  # added after this snapshot: null in lakestep's rows too
            assert expected.column(c).null_count == expected.num_rows, (engine, ident, ref, c)
        missing = [c for c in cols if c not in expected.column_names]
        assert not missing, f"{engine} read columns lakestep does not have: {missing}"
        want = counter(expected, cols)
        assert got == want, (f"{engine} read {ident}@{ref} as {sorted(got.items(), key=repr)[:8]}, "
                             f"lakestep {sorted(want.items(), key=repr)[:8]} "
                             f"({sum(got.values())} rows against {sum(want.values())})")
