"""Fixtures of the barrier tests: a pipeline on the catalog fixture (SQLite and PostgreSQL)."""

from __future__ import annotations

from typing import Iterator

import pyarrow as pa
import pytest

from lakestep import Catalog, Table
from lakestep.barrier import Pipeline
from lakestep.services import Coordinator

KV = pa.schema([("k", pa.int64()), ("v", pa.int64())])


def kv(*pairs: tuple[int, int]) -> pa.Table:
    return pa.table({"k": [p[0] for p in pairs], "v": [p[1] for p in pairs]}, schema=KV)


def rows(table: pa.Table) -> list[tuple[int, int]]:
    return sorted((r["k"], r["v"]) for r in table.to_pylist())


@pytest.fixture
def pipeline(catalog: Catalog) -> Pipeline:
    catalog.create_namespace("s")
    return Pipeline(catalog)


@pytest.fixture
def coordinator(catalog: Catalog) -> Iterator[Coordinator]:
    coord = Coordinator(catalog, interval=0.01, lease_seconds=30.0)
    yield coord
    coord.stop()
    if coord.is_leader:
        coord.release()


def make_tables(catalog: Catalog, *names: str) -> list[str]:
    return [catalog.create_table(f"s.{n}", KV).ident for n in names]


def root_and_copy(catalog: Catalog, p: Pipeline, *, copy: bool = True) -> Table:
    """The usual topology, in the namespace s (made already): s.a, the table of the root job
    ``ingest``, and (``copy``) s.d, made from s.a by the job ``copy``. Returns s.a."""
    make_tables(catalog, *(("a", "d") if copy else ("a",)))
    p.register_job("ingest", sinks=["s.a"], external_input=True)
    if copy:
        p.register_job("copy", sources=["s.a"], sinks=["s.d"])
    return catalog.load_table("s.a")
