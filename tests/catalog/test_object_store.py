"""Object-storage warehouses: what lakestep asks of the store (docs/design.md §2, §6).

Object stores have no atomic rename and list slowly. The S3 server of these
tests (moto's, in its own process: tests/s3server.py) records every request
it gets, so the tests can say exactly what lakestep did on the wire:

* commits of every kind, and reads of every kind (time travel, merge on read,
  the query helpers), never list and never copy (S3's only "rename"): each
  data file is written once, under its final name, and read by the path and
  size the catalog recorded;
* cleanup lists exactly once per run (the orphan scan of ``data/``);
* the storage options, or else the standard AWS environment variables, reach
  the store, and a credential is never shown.
"""

from __future__ import annotations

import datetime as dt
from urllib.parse import unquote

import pyarrow as pa
import pytest

from lakestep import Catalog, errors
from lakestep.barrier import OPEN_EPOCH, Pipeline
from lakestep.catalog.cleanup import IN_FLIGHT_FLOOR_SECONDS
from lakestep.query import consistent_arrow, duckdb_query
from lakestep.services import Coordinator
from tests.s3server import SECRET_KEY, Request, S3Server, summary

ORDERS = pa.schema([("id", pa.int64()), ("day", pa.string()), ("cents", pa.int64())])
CUSTOMERS = pa.schema([("id", pa.int64()), ("tier", pa.string())])
S3_ONLY = pytest.mark.parametrize("catalog_spec", ["sqlite-s3"], indirect=True)


def _key(r: Request) -> str:
    """The object key of a request, bucket included (as pyarrow's paths spell it)."""
    return unquote(r.path).lstrip("/")


def _recorded_paths(cat: Catalog, *tables: str) -> set[str]:
    """Every data file the catalog records for ``tables`` (live or removed), as bucket/key."""
    import sqlalchemy as sa

    from lakestep.catalog import schema as S

    out: set[str] = set()
    for name in tables:
        t = cat.load_table(name)
        with cat.backend.read() as conn:
            paths = conn.execute(sa.select(S.files.c.path).where(S.files.c.table_id == t.table_id)).scalars().all()
        out |= {t.writer.full_path(p) for p in paths}
    return out


def _no_listing_or_copy(requests: list[Request], what: str) -> None:
    bad = [r for r in requests if r.is_list or r.is_copy]
    assert not bad, f"{what} listed or copied: {summary(bad)}"


@S3_ONLY
def test_commits_and_reads_neither_list_nor_rename(catalog_spec, s3_server: S3Server) -> None:  # type: ignore[no-untyped-def]
    cat = catalog_spec.open()
    cat.create_namespace("s")
    orders = cat.create_table("s.orders", ORDERS, partition_by=["day"])
    customers = cat.create_table("s.customers", CUSTOMERS, primary_key=["id"])
    p = Pipeline(cat)
    p.register_job("feed", sinks=["s.orders"], external_input=True)
    coord = Coordinator(p.catalog, interval=3600)
    assert coord.acquire()

    # ---- commits of every kind
    start = s3_server.mark()
    orders.append({"id": [1, 2, 3], "day": ["d1", "d1", "d2"], "cents": [100, 200, 300]}, barrier=OPEN_EPOCH)
    orders.append({"id": [4], "day": ["d2"], "cents": [400]}, barrier=OPEN_EPOCH)
    coord.seal()
    orders.overwrite({"id": [5], "day": ["d1"], "cents": [500]}, partitions="dynamic")
    orders.update({"cents": 401}, where=[("id", "=", 4)])
    orders.delete(where=[("id", "=", 3)])
    orders.compact()
    customers.upsert({"id": [1, 2], "tier": ["gold", "free"]})
    customers.upsert({"id": [2], "tier": ["gold"]})
    customers.delete(where=[("id", "=", 1)])
    customers.compact(major=True)
    with cat.transaction(job_id="both", batch_id=1) as tx:
        tx.append("s.orders", {"id": [6], "day": ["d3"], "cents": [600]})
        tx.upsert("s.customers", {"id": [3], "tier": ["free"]})
    with cat.transaction(job_id="both", batch_id=1) as tx:  # a replay: its second copy is deleted
        tx.append("s.orders", {"id": [6], "day": ["d3"], "cents": [600]})
    assert all(r.replayed for r in tx.results)
    commits = s3_server.requests(start)
    _no_listing_or_copy(commits, "commits")
    # every file is written once under its final name: each PUT is a data file the catalog
    # recorded, or the replay's second copy, deleted again (pyarrow puts an empty "dir/"
    # marker after deleting an object; not a data file)
    puts = [_key(r) for r in commits if r.method == "PUT" and not r.path.endswith("/")]
    deleted = {_key(r) for r in commits if r.method == "DELETE"}
    recorded = _recorded_paths(cat, "s.orders", "s.customers")
    assert len(puts) == len(set(puts))
    assert set(puts) - recorded == deleted - recorded != set()
    assert {r.method for r in commits} <= {"PUT", "GET", "HEAD", "DELETE"}

    # ---- reads of every kind
    start = s3_server.mark()
    assert sorted(orders.to_arrow().column("id").to_pylist()) == [4, 5, 6]  # d1 overwritten, 3 deleted
    assert sorted(orders.to_arrow(version=2).column("id").to_pylist()) == [1, 2, 3, 4]
    assert orders.to_arrow(where=[("day", "=", "d2")]).column("cents").to_pylist() == [401]
    assert orders.to_arrow(as_of=dt.datetime.now(dt.timezone.utc)).num_rows == 3
    assert sorted(customers.to_arrow().to_pylist(), key=lambda r: r["id"]) == [
        {"id": 2, "tier": "gold"}, {"id": 3, "tier": "free"}]
    assert customers.to_arrow(version=2).num_rows == 2
    assert orders.read_plan().to_arrow().num_rows == 3
    assert orders.read_plan().dataset().to_table().num_rows == 3
    tables, info = consistent_arrow(cat, ["s.orders", "s.customers"])
    # read_committed: s.orders at sealed barrier 1 (the two appends), s.customers (unmanaged) newest
    assert sorted(tables["s.orders"].column("id").to_pylist()) == [1, 2, 3, 4] and info.barrier == 1
    assert tables["s.customers"].num_rows == 2
    res = duckdb_query(cat, "SELECT sum(cents) AS c FROM s.orders WHERE day = 'd1'")
    assert res.table.column("c").to_pylist() == [300]
    reads = s3_server.requests(start)
    _no_listing_or_copy(reads, "reads")
    # reads open the recorded paths with the recorded sizes: GETs of recorded files only (no HEAD)
    assert {r.method for r in reads} == {"GET"}
    assert {_key(r) for r in reads} <= recorded
    coord.release()
    cat.close()


@S3_ONLY
def test_cleanup_lists_once_per_run_and_purge_leaves_nothing(catalog_spec, s3_server: S3Server, clock) -> None:  # type: ignore[no-untyped-def]
    cat = catalog_spec.open(clock=clock)
    cat.create_namespace("s")
    t = cat.create_table("s.t", ORDERS, partition_by=["day"], properties={"lakestep.retention-seconds": "60"})
    for i in range(6):
        t.append({"id": [i], "day": [f"d{i % 3}"], "cents": [i]})
    t.compact()
    catalog_spec.put(t.location, "data/d0/never-committed.parquet", b"x" * 7)
    # past the window and the in-flight floor, by the store's clock plus the second of slack
    clock.set(catalog_spec.mtime(t.location, "data/d0/never-committed.parquet") + 1 + IN_FLIGHT_FLOOR_SECONDS)
    for run in range(2):
        start = s3_server.mark()
        report = t.cleanup()
        reqs = s3_server.requests(start)
        lists = [r for r in reqs if r.is_list]
        assert len(lists) == 1, f"cleanup run {run} listed {len(lists)} times: {summary(lists)}"
        assert not any(r.is_copy for r in reqs)
        if run == 0:
            assert len(report.deleted_files) == 6 and report.orphan_files == ["data/d0/never-committed.parquet"]
    left = {p for p in catalog_spec.files_under(t.location) if p.startswith("data/")}
    assert left == {f.path for f in t.files()}
    assert sorted(t.to_arrow().column("id").to_pylist()) == list(range(6))
    cat.drop_table("s.t", purge=True)
    assert catalog_spec.files_under(t.location) == {}
    cat.close()


@S3_ONLY
def test_credentials_from_the_environment(catalog_spec, s3_server: S3Server, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """Without storage options the standard AWS variables reach the store (endpoint included)."""
    writer = catalog_spec.open()
    writer.create_namespace("s")
    writer.create_table("s.t", CUSTOMERS).append({"id": [1], "tier": ["gold"]})
    for name, value in s3_server.env().items():
        monkeypatch.setenv(name, value)
    cat = Catalog(catalog_spec.url)  # no storage options: the environment's
    t = cat.load_table("s.t")
    t.append({"id": [2], "tier": ["free"]})
    assert sorted(t.to_arrow().column("id").to_pylist()) == [1, 2]
    assert sorted(writer.load_table("s.t").to_arrow().column("id").to_pylist()) == [1, 2]
    cat.close()
    writer.close()


@S3_ONLY
def test_wrong_credentials_fail_without_showing_them(catalog_spec, s3_server: S3Server, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_ENDPOINT_URL"):
        monkeypatch.delenv(name, raising=False)
    bad_secret = "not-the-secret-" + SECRET_KEY
    good = catalog_spec.open()
    good.create_namespace("s")
    good.create_table("s.t", CUSTOMERS).append({"id": [1], "tier": ["gold"]})
    # moto accepts any key pair; a store that cannot be reached shows the same path
    options = {**catalog_spec.storage_options, "secret_key": bad_secret, "endpoint_override": "http://127.0.0.1:9",
               "connect_timeout": "2", "request_timeout": "2"}
    cat = Catalog(catalog_spec.url, storage_options=options)
    assert bad_secret not in repr(cat.storage) and "secret_key=***" in repr(cat.storage)
    with pytest.raises(errors.StorageError) as err:
        cat.create_namespace("x")
        cat.create_table("x.t", CUSTOMERS)
    assert bad_secret not in str(err.value) and SECRET_KEY not in str(err.value)
    with pytest.raises(ValueError, match="unknown storage option"):
        Catalog(catalog_spec.url, storage_options={"secret": "x"})
    cat.close()
    good.close()


def test_storage_options_are_checked_masked_and_travel_as_spark_options() -> None:
    import pickle

    from lakestep.catalog.storage import Storage
    from lakestep.streaming.catalog_cache import storage_of

    s = Storage.of({"endpoint_override": "http://127.0.0.1:9", "secret_key": "s3cr3t", "session_token": "t0k3n",
                    "force_virtual_addressing": "false", "request_timeout": "2.5"})
    assert s.as_dict() == {"endpoint_override": "http://127.0.0.1:9", "secret_key": "s3cr3t", "session_token": "t0k3n",
                           "force_virtual_addressing": False, "request_timeout": 2.5}
    assert repr(s) == ("Storage(endpoint_override='http://127.0.0.1:9', force_virtual_addressing=False, "
                       "request_timeout=2.5, secret_key=***, session_token=***)")
    # what the driver reads from a Spark source's or sink's options, and what executors unpickle
    options = {"catalog": "postgresql://db/lake", "table": "s.t", **s.spark_options()}
    assert storage_of(options) == s and pickle.loads(pickle.dumps(s)) == s
    assert storage_of({"catalog": "x"}) == Storage()
    with pytest.raises(ValueError, match="true or false"):
        Storage.of({"force_virtual_addressing": "maybe"})
    with pytest.raises(ValueError, match="unknown storage option"):
        storage_of({"storage.secret": "x"})
