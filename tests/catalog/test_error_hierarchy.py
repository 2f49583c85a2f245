"""Everything lakestep raises derives from :class:`LakestepError` (issue 16 §2).

A walk over the public API's error paths with bad arguments: the Catalog,
tables, transactions, the pipeline (barriers, jobs, the coordinator, status and
health), read plans, consistent reads and the injected clock. Each case names
the exact :class:`LakestepError` subclass it must raise; the builtin it also
is (``ValueError`` for a bad value, ``TypeError`` for an object of the wrong
type) stays, so ``except ValueError`` keeps working. No plain
``ValueError``/``TypeError``/``KeyError``/``RuntimeError`` may escape.
Every case runs on SQLite and PostgreSQL.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pytest

from lakestep import Catalog, errors
from lakestep.barrier import Pipeline
from lakestep.barrier import errors as berrors
from lakestep.barrier.health import diagnose
from lakestep.catalog.backend import DatabaseTimeouts
from lakestep.clock import ManualClock
from lakestep.query.read import consistent_read
from lakestep.services import Coordinator

from .test_bad_input import ROWS, SCHEMA, state, t, with_tables
from .test_bad_input import Case as BadInputCase


@dataclass(frozen=True)
class Case(BadInputCase):
    builtin: type[Exception] | None = ValueError  # the builtin the error also is
    fresh: bool = False  # the case registers jobs or seals before the refused call: a catalog of its own


def two_writes(cat: Catalog) -> None:
    tx = cat.transaction()
    tx.delete("s.t", [("id", "=", 1)])
    try:
        tx.overwrite("s.t", ROWS)
    finally:
        tx.abort()


def add_files_bad_mode(cat: Catalog) -> None:
    tx = cat.transaction()
    try:
        tx.add_files("s.t", [], mode="bogus")  # type: ignore[arg-type]
    finally:
        tx.abort()


def batch_to_a_non_sink(cat: Catalog) -> None:
    p = Pipeline(cat)
    p.register_job("ingest", sinks=["s.t"], external_input=True)
    p.register_job("copy", sources=["s.t"], sinks=["s.pk"])
    coord = Coordinator(p.catalog, lease_seconds=30.0)
    try:
        coord.seal()
    finally:
        coord.release()
    plan = p.next_batch("copy")
    assert plan is not None
    p.batch(plan).append("s.flat", ROWS)


def external_job_plans(cat: Catalog) -> None:
    p = Pipeline(cat)
    p.register_job("ext", sinks=["s.t"], external_input=True)
    p.next_batch("ext")


CASES = [
    # Catalog
    Case("catalog-no-url-no-warehouse", lambda c: Catalog(), errors.InvalidArgumentError),
    Case("catalog-sqlite-remote-warehouse", lambda c: Catalog(warehouse="s3://bucket/wh"),
         errors.InvalidLocationError),
    Case("create-table-schema-not-a-schema", lambda c: c.create_table("s.new", {"id": "int64"}),
         errors.ArgumentTypeError, TypeError),
    Case("load-missing-table", lambda c: c.load_table("s.nope"), errors.TableNotFoundError, None),
    Case("create-namespace-twice", lambda c: c.create_namespace("s"), errors.NamespaceAlreadyExistsError, None),
    Case("drop-missing-namespace", lambda c: c.drop_namespace("nope"), errors.NamespaceNotFoundError, None),
    Case("load-table-no-namespace", lambda c: c.load_table("nodot"), errors.InvalidIdentifierError),
    Case("database-timeout-0", lambda c: DatabaseTimeouts(connect=0), errors.InvalidArgumentError),
    Case("create-table-twice", lambda c: c.create_table("s.t", SCHEMA), errors.TableAlreadyExistsError, None),
    # Table
    Case("append-not-data", lambda c: t(c).append(object()), errors.ArgumentTypeError, TypeError),
    Case("overwrite-partitions-and-where", lambda c: t(c).overwrite(ROWS, partitions=[{"day": "d1"}],
                                                                     where=[("id", "=", 1)]),
         errors.InvalidArgumentError),
    Case("overwrite-dynamic-unpartitioned", lambda c: c.load_table("s.flat").overwrite(ROWS, partitions="dynamic"),
         errors.InvalidArgumentError),
    Case("overwrite-unknown-partition-column", lambda c: t(c).overwrite(ROWS, partitions=[{"name": "a"}]),
         errors.InvalidArgumentError),
    Case("rewrite-file-not-live", lambda c: t(c).rewrite_file(10 ** 9, lambda rows: rows),
         errors.InvalidArgumentError),
    Case("snapshot-empty-name", lambda c: t(c).create_snapshot(""), errors.InvalidArgumentError),
    Case("lock-empty-locker", lambda c: t(c).lock(locker=""), errors.InvalidArgumentError),
    Case("add-column-reserved", lambda c: t(c).add_columns(("_ls_x", pa.int64())), errors.InvalidSchemaError),
    Case("add-column-not-null", lambda c: t(c).add_columns(pa.field("x", pa.int64(), nullable=False)),
         errors.InvalidSchemaError),
    Case("add-column-twice", lambda c: t(c).add_columns(("x", pa.int64()), ("x", pa.int64())),
         errors.InvalidSchemaError),
    Case("read-two-versions", lambda c: t(c).to_arrow(version=1, snapshot="x"), errors.InvalidArgumentError),
    Case("read-missing-version", lambda c: t(c).to_arrow(version=99), errors.VersionNotFoundError, None),
    Case("cleanup-shorter-than-retention", lambda c: t(c).cleanup(retention_seconds=1),
         errors.InvalidArgumentError),
    Case("restore--1", lambda c: t(c).restore(-1), errors.VersionNotFoundError, None),
    Case("filter-unknown-column", lambda c: t(c).to_arrow(where=[("nope", "=", 1)]), errors.InvalidPredicateError),
    Case("ttl-on-a-string-column", lambda c: c.create_table("s.ttl", SCHEMA, properties={
        "lakestep.ttl.column": "name", "lakestep.ttl.seconds": "10"}), errors.InvalidPropertyError),
    Case("restore-missing-version", lambda c: t(c).restore(99), errors.VersionNotFoundError, None),
    Case("dataset-of-a-keyed-table", lambda c: c.load_table("s.pk").read_plan().dataset(),
         errors.InvalidArgumentError),
    # Transaction
    Case("tx-two-writes-to-a-table", two_writes, errors.InvalidArgumentError),
    Case("tx-add-files-bad-mode", add_files_bad_mode, errors.InvalidArgumentError),
    Case("tx-job-without-batch", lambda c: c.transaction(job_id="j"), errors.InvalidArgumentError),
    # Pipeline and barriers
    Case("register-job-sinks-a-string", lambda c: Pipeline(c).register_job("j", sources="s.t", sinks="s.flat"),
         errors.ArgumentTypeError, TypeError),
    Case("register-job-no-sink", lambda c: Pipeline(c).register_job("j", sinks=[]), berrors.TopologyError, None),
    Case("next-batch-unknown-job", lambda c: Pipeline(c).next_batch("nope"), berrors.JobNotFoundError, None),
    Case("next-batch-max-barriers-0", lambda c: (Pipeline(c).register_job("j", sinks=["s.t"]),
                                                Pipeline(c).next_batch("j", max_barriers=0)),
         errors.InvalidArgumentError, fresh=True),
    Case("next-batch-external-job", external_job_plans, errors.InvalidArgumentError, fresh=True),
    Case("batch-writes-a-non-sink", batch_to_a_non_sink, errors.InvalidArgumentError, fresh=True),
    Case("choose-bad-level", lambda c: Pipeline(c).choose(["s.t"], level="bogus"),  # type: ignore[arg-type]
         errors.InvalidArgumentError),
    Case("choose-bad-scope", lambda c: Pipeline(c).choose(["s.t"], scope="bogus"),  # type: ignore[arg-type]
         errors.InvalidArgumentError),
    Case("choose-no-table", lambda c: Pipeline(c).choose([]), errors.InvalidArgumentError),
    Case("status-last-0", lambda c: Pipeline(c).status(last=0), errors.InvalidArgumentError),
    Case("coordinator-bad-seal", lambda c: Coordinator(c, seal="bogus"), errors.InvalidArgumentError),
    Case("coordinator-interval-0", lambda c: Coordinator(c, interval=0), errors.InvalidArgumentError),
    Case("coordinator-snapshot-every-0", lambda c: Coordinator(c, snapshot_every=0),
         errors.InvalidArgumentError),
    Case("coordinator-retain-count-0", lambda c: Coordinator(c, retain_count=0),
         errors.InvalidArgumentError),
    Case("diagnose-stuck-after--1", lambda c: diagnose(c, stuck_after=-1), errors.InvalidArgumentError),
    Case("rollback--1", lambda c: Pipeline(c).rollback(to=-1), errors.InvalidArgumentError),
    # consistent reads
    Case("read-bad-level", lambda c: consistent_read(c, ["s.t"], level="bogus"), errors.QueryError),
    Case("read-no-table", lambda c: consistent_read(c, []), errors.QueryError),
    # the injected clock
    Case("clock-backwards", lambda c: ManualClock(10.0).advance(-1), errors.InvalidArgumentError),
    Case("clock-set-back", lambda c: ManualClock(10.0).set(5.0), errors.InvalidArgumentError),
]


@pytest.fixture
def cat(shared_catalog: tuple[Any, Catalog]) -> Catalog:
    """The tables of test_bad_input.py, and s.flat (not partitioned, empty), made once in the module's
    catalog of the backend (conftest.SharedCatalogs): every case checks that it changed nothing, so the
    next case finds the same catalog as a fresh one."""
    catalog = shared_catalog[1]
    if "s" not in catalog.list_namespaces():
        with_tables(catalog).create_table("s.flat", SCHEMA)
    return catalog


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_every_error_is_a_lakestep_error(catalog_spec: Any, cat: Catalog, case: Case) -> None:
    with contextlib.ExitStack() as stack:
        if case.fresh:
            cat = stack.enter_context(contextlib.closing(catalog_spec.open()))
            with_tables(cat).create_table("s.flat", SCHEMA)
        before = state(cat)
        with pytest.raises(Exception) as ei:
            case.call(cat)
        if not case.fresh:
            assert state(cat) == before, "a refused call changed the catalog"
    assert type(ei.value) is case.error, repr(ei.value)
    assert isinstance(ei.value, errors.LakestepError) and str(ei.value)
    if case.builtin is not None:
        assert isinstance(ei.value, case.builtin)


def test_the_public_errors_all_derive_from_lakestep_error() -> None:
    for mod in (errors, berrors):
        for name in dir(mod):
            obj = getattr(mod, name)
            if isinstance(obj, type) and issubclass(obj, BaseException):
                assert issubclass(obj, errors.LakestepError), name
