"""DerivedJob (lakestep/streaming/derived.py): derived jobs run from the driver, Spark's own scan and writer.

Every check is exact: at every sealed barrier each sink equals, row for row, what
plain Python computes from its sources' rows at that barrier.
"""

from __future__ import annotations

import collections
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from lakestep import Catalog
from lakestep.barrier import Pipeline
from lakestep.errors import InvalidArgumentError, SchemaMismatchError
from lakestep.services import Coordinator
from lakestep.streaming import DerivedJob
from tests.waiting import wait_until

pytestmark = pytest.mark.spark

REPO = Path(__file__).resolve().parents[2]
ORDERS = pa.schema([("order_id", pa.int64()), ("customer", pa.string()), ("cents", pa.int64())])
TIERS = pa.schema([("customer", pa.string()), ("tier", pa.string())])
ENRICHED = pa.schema([("order_id", pa.int64()), ("customer", pa.string()), ("cents", pa.int64()),
                      ("tier", pa.string())])
TOTALS = pa.schema([("tier", pa.string()), ("cents", pa.int64()), ("orders", pa.int64())])
LATEST = pa.schema([("customer", pa.string()), ("order_id", pa.int64()), ("cents", pa.int64())])
CUSTOMERS = ["ann", "bob", "cy"]


# ------------------------------------------------------------------ the jobs' functions
def enrich(batch: Any) -> Any:
    """New orders joined with the tiers at the batch's barrier (two sources, aligned)."""
    return batch.changes("s.orders").join(batch.table("s.tiers"), "customer", "left") \
        .select("order_id", "customer", "cents", "tier")


def totals(batch: Any) -> Any:
    """All enriched orders per tier (overwrites the sink)."""
    return batch.table("s.enriched").groupBy("tier").agg({"cents": "sum", "*": "count"}) \
        .selectExpr("tier", "CAST(`sum(cents)` AS BIGINT) AS cents", "CAST(`count(1)` AS BIGINT) AS orders")


def latest(batch: Any) -> Any:
    """Each customer's newest order among the batch's new ones (upserted by key)."""
    new = batch.changes("s.orders")
    top = new.groupBy("customer").agg({"order_id": "max"}).withColumnRenamed("max(order_id)", "order_id")
    return new.join(top, ["customer", "order_id"]).select("customer", "order_id", "cents")


# ------------------------------------------------------------------ the model
def rows(t: pa.Table, cols: list[str]) -> collections.Counter:
    return collections.Counter(zip(*(t.column(c).to_pylist() for c in cols)))


def check_every_barrier(cat: Catalog, last: int) -> int:
    """Each sink at each barrier 1..last against plain Python over the sources at that barrier."""
    p = Pipeline(cat)
    tbl = {n: cat.load_table(n) for n in ("s.orders", "s.tiers", "s.enriched", "s.totals", "s.latest")}

    def at(name: str, b: int) -> pa.Table:
        return tbl[name].to_arrow(version=p.version_at(name, b))

    first_tier: dict[int, str | None] = {}  # order -> the tier of its customer when it first appeared
    for b in range(1, last + 1):
        orders, tiers = at("s.orders", b), at("s.tiers", b)
        tier_of = dict(zip(tiers.column("customer").to_pylist(), tiers.column("tier").to_pylist()))
        for o, c in zip(orders.column("order_id").to_pylist(), orders.column("customer").to_pylist()):
            first_tier.setdefault(o, tier_of.get(c))
        want_enriched = collections.Counter(
            (o, c, a, first_tier[o]) for o, c, a in zip(*(orders.column(n).to_pylist() for n in ORDERS.names)))
        got = at("s.enriched", b)
        assert rows(got, ENRICHED.names) == want_enriched, f"s.enriched at barrier {b}"
        sums: dict[str | None, list[int]] = {}
        for (_, _, cents, tier), n in want_enriched.items():
            s = sums.setdefault(tier, [0, 0])
            s[0] += cents * n
            s[1] += n
        assert rows(at("s.totals", b), TOTALS.names) == collections.Counter(
            (t, s, n) for t, (s, n) in sums.items()), f"s.totals at barrier {b}"
        newest: dict[str, tuple[int, int]] = {}
        for o, c, a in zip(*(orders.column(n).to_pylist() for n in ORDERS.names)):
            if c not in newest or o > newest[c][0]:
                newest[c] = (o, a)
        assert rows(at("s.latest", b), LATEST.names) == collections.Counter(
            (c, o, a) for c, (o, a) in newest.items()), f"s.latest at barrier {b}"
    return last


def setup(cat: Catalog) -> Pipeline:
    cat.create_namespace("s")
    for name, schema in (("s.orders", ORDERS), ("s.tiers", TIERS), ("s.enriched", ENRICHED), ("s.totals", TOTALS)):
        cat.create_table(name, schema)
    cat.create_table("s.latest", LATEST, primary_key=["customer"])
    p = Pipeline(cat)
    p.register_job("ingest", sinks=["s.orders"], external_input=True)
    p.register_job("tiers", sinks=["s.tiers"], external_input=True)
    return p


def jobs(spark: Any, cat: Catalog, **kw: Any) -> list[DerivedJob]:
    return [DerivedJob(spark, cat, "enrich", sources=["s.orders", "s.tiers"], sinks=["s.enriched"],
                       transform=enrich, **kw),
            DerivedJob(spark, cat, "totals", sources=["s.enriched"], sinks={"s.totals": "overwrite"},
                       transform=totals, **kw),
            DerivedJob(spark, cat, "latest", sources=["s.orders"], sinks=["s.latest"], transform=latest, **kw)]


class Feed:
    """Root commits on the open epoch, as root jobs make them; seals by a coordinator."""

    def __init__(self, cat: Catalog, p: Pipeline) -> None:
        self.orders, self.tiers = cat.load_table("s.orders"), cat.load_table("s.tiers")
        self.coord = Coordinator(p.catalog)
        self.n = 0

    def step(self, i: int) -> None:
        if i % 4 == 0:  # the tiers change now and then (every customer's row replaced)
            self.tiers.overwrite(pa.table({"customer": CUSTOMERS, "tier": [f"t{(i + k) % 2}" for k in range(3)]},
                                          schema=TIERS), barrier=-1)
        if i % 3 != 2:  # some barriers bring no orders
            ids = list(range(self.n, self.n + 5))
            self.orders.append(pa.table({"order_id": ids, "customer": [CUSTOMERS[x % 3] for x in ids],
                                         "cents": [100 + 7 * x for x in ids]}, schema=ORDERS), barrier=-1)
            self.n += 5
        self.coord.seal()


def run_watched(spark: Any, cat: Catalog, p: Pipeline, steps: int, **kw: Any) -> tuple[list[DerivedJob], dict[str, str]]:
    """The three jobs (``kw`` to each) run barrier by barrier over ``steps`` feed steps; and the read
    paths the enrich job's batches reported."""
    feed = Feed(cat, p)
    js = jobs(spark, cat, **kw)
    seen: dict[str, str] = {}

    def spy(batch: Any) -> Any:
        out = enrich(batch)
        seen.update(batch.paths)
        return out

    js[0].transform = spy
    for i in range(steps):
        feed.step(i)
        for j in js:
            j.run_available()
    return js, seen


def test_pipeline_exact_at_every_barrier(spark: Any, catalog_spec: Any) -> None:
    """Two sources aligned, an overwriting aggregate, an upserting primary-key sink: run barrier by
    barrier, then as threads beside the feed; every barrier is checked; unchanged barriers run no
    Spark job; the reads and the plain sinks went through Spark's own scan and writer."""
    cat = catalog_spec.open()
    p = setup(cat)
    feed = Feed(cat, p)
    js = jobs(spark, cat)
    for i in range(6):
        feed.step(i)
        for j in js:
            j.run_available()
    assert all(p.job_frontier(j.job) == p.open_epoch() - 1 for j in js)
    assert js[0].stats.skipped >= 1 and js[0].stats.batches > js[0].stats.skipped
    assert js[1].stats.skipped >= 1  # s.enriched unchanged at the barriers without orders
    running = [j.start(poll=0.01) for j in js]
    try:
        for i in range(6, 12):
            feed.step(i)
        sealed = p.open_epoch() - 1
        wait_until(lambda: all(p.job_frontier(j.job) >= sealed for j in js), "every job at the last sealed barrier",
                   failed=lambda: next((f"{r.job.job}: {r.error!r}" for r in running if r.error), None))
    finally:
        for r in running:
            r.stop()
    for r in running:
        assert r.await_termination(0) and r.error is None
    assert check_every_barrier(cat, p.open_epoch() - 1) >= 12
    assert js[0].stats.rows == feed.n and js[2].stats.rows > 0
    # the last batch's reads: Spark's own scan for every plain read, lakestep's for merged ones
    b = js[0].stats.last
    assert b is not None and not b.replayed


def test_python_paths_and_arrow_writer(spark: Any, tmp_path: Path) -> None:
    """native=False and writer='arrow': lakestep's reader and writer in Python workers, same rows."""
    cat = Catalog(warehouse=str(tmp_path / "wh"))
    p = setup(cat)
    js, seen = run_watched(spark, cat, p, 5, native=False, writer="arrow")
    assert seen == {"changes s.orders": "python (native=False)", "table s.tiers": "python (native=False)"}
    assert check_every_barrier(cat, p.open_epoch() - 1) >= 5


def test_native_paths_reported(spark: Any, tmp_path: Path) -> None:
    """The default reads plain tables natively; a primary-key table read whole is merged by lakestep."""
    cat = Catalog(warehouse=str(tmp_path / "wh"))
    p = setup(cat)
    Feed(cat, p).step(0)
    cat.create_table("s.copy", LATEST, primary_key=["customer"])
    paths: dict[str, str] = {}

    def copy(batch: Any) -> Any:
        df = batch.table("s.latest")
        batch.changes("s.latest")
        batch.changes("s.orders")
        paths.update(batch.paths)
        return df

    DerivedJob(spark, cat, "latest", sources=["s.orders"], sinks=["s.latest"], transform=latest).run_available()
    job = DerivedJob(spark, cat, "copy", sources=["s.latest", "s.orders"], sinks=["s.copy"], transform=copy)
    job.run_available()
    assert paths == {"table s.latest": "python (a primary-key table, merged on read)",
                     "changes s.latest": "native", "changes s.orders": "native"}
    assert rows(cat.load_table("s.copy").to_arrow(), LATEST.names) == \
        rows(cat.load_table("s.latest").to_arrow(), LATEST.names)


def test_a_source_renamed_mid_stream_reaches_the_next_batch(spark: Any, tmp_path: Path) -> None:
    """Issue 35: a derived job reads each barrier with the schema of the version it reads: after a
    rename of a source column (and of the sink's), its next batch sees the new name, over files
    written before the rename and by a root writer still holding the old schema."""
    cat = Catalog(warehouse=str(tmp_path / "wh"))
    p = setup(cat)
    feed = Feed(cat, p)  # its handles keep the schema from before the rename
    cat.create_table("s.copy", ORDERS)
    seen: list[list[str]] = []

    def copy(batch: Any) -> Any:
        df = batch.changes("s.orders")
        seen.append(df.columns)
        return df

    job = DerivedJob(spark, cat, "copy", sources=["s.orders"], sinks=["s.copy"], transform=copy)
    feed.step(0)
    job.run_available()
    cat.load_table("s.orders").rename_column("cents", "amount")
    cat.load_table("s.copy").rename_column("cents", "amount")
    feed.step(1)
    job.run_available()
    assert seen == [ORDERS.names, ["order_id", "customer", "amount"]]
    cols = ["order_id", "customer", "amount"]
    assert rows(cat.load_table("s.copy").to_arrow(), cols) == rows(cat.load_table("s.orders").to_arrow(), cols)
    assert sorted(cat.load_table("s.copy").to_arrow().column("amount").to_pylist()) == [100 + 7 * x for x in range(10)]


def test_bad_output_refused_before_writing(spark: Any, tmp_path: Path) -> None:
    """Columns the sink lacks, or a type it cannot take: SchemaMismatchError before any file is
    written; nothing committed; the next run with a fixed transform commits those barriers."""
    cat = Catalog(warehouse=str(tmp_path / "wh"))
    p = setup(cat)
    feed = Feed(cat, p)
    feed.step(0)
    enriched = cat.load_table("s.enriched")
    job = DerivedJob(spark, cat, "enrich", sources=["s.orders", "s.tiers"], sinks=["s.enriched"],
                     transform=lambda b: enrich(b).selectExpr("*", "cents AS extra"))
    with pytest.raises(SchemaMismatchError, match="extra"):
        job.run_once()
    job.transform = lambda b: enrich(b).selectExpr("order_id", "customer", "customer AS cents", "tier")
    with pytest.raises(SchemaMismatchError, match="cents"):
        job.run_once()
    assert p.job_frontier("enrich") == 0 and enriched.version == 0
    assert not list((Path(enriched.location) / "data").glob("**/*.parquet"))
    job.transform = enrich
    assert job.run_once() is not None and p.job_frontier("enrich") == 1
    feed.step(1)
    with pytest.raises(InvalidArgumentError, match="not one of its sinks"):
        DerivedJob(spark, cat, "enrich", sources=["s.orders", "s.tiers"], sinks=["s.enriched"],
                   transform=lambda b: {"s.totals": enrich(b)}, skip_unchanged=False).run_once()
    with pytest.raises(InvalidArgumentError, match="primary key"):
        DerivedJob(spark, cat, "x", sources=["s.orders"], sinks={"s.totals": "upsert"}, transform=enrich)


def test_killed_and_restarted_exactly_once(tmp_path: Path) -> None:
    """A real process killed after writing a batch's files (before its commit) and after a commit;
    each restart continues from the catalog: every barrier exact, no row twice."""
    cat = Catalog(warehouse=str(tmp_path / "wh"))
    cat.create_namespace("s")
    raw = cat.create_table("s.raw", pa.schema([("id", pa.int64())]))
    cat.create_table("s.d1", pa.schema([("id", pa.int64()), ("v", pa.int64())]))
    cat.create_table("s.agg", pa.schema([("k", pa.int64()), ("n", pa.int64())]))
    p = Pipeline(cat)
    p.register_job("ingest", sinks=["s.raw"], external_input=True)
    p.register_job("d1", sources=["s.raw"], sinks=["s.d1"])
    p.register_job("agg", sources=["s.d1"], sinks=["s.agg"])
    coord = Coordinator(p.catalog)
    for i in range(8):
        raw.append(pa.table({"id": pa.array(range(10 * i, 10 * i + 10), pa.int64())}), barrier=-1)
        coord.seal()
    last = p.open_epoch() - 1

    def run(failpoint: str | None) -> subprocess.CompletedProcess[str]:
        env = dict(os.environ, PYTHONPATH=str(REPO))
        env.pop("LAKESTEP_FAILPOINTS", None)
        if failpoint:
            env["LAKESTEP_FAILPOINTS"] = failpoint
        return subprocess.run([sys.executable, "-m", "tests.streaming.derived_app", "--catalog", cat.url,
                               "--workdir", str(tmp_path / "app")], env=env, cwd=REPO, capture_output=True,
                              text=True, timeout=600)

    first = run("derived.written=exit@3")  # d1's third batch: files written, never committed
    assert first.returncode == 137, first.stderr[-3000:]
    assert p.job_frontier("d1") == 2 and p.job_frontier("agg") == 0
    second = run("derived.committed=exit@9")  # d1's 6 batches, then agg's third: committed, then killed
    assert second.returncode == 137, second.stderr[-3000:]
    assert p.job_frontier("d1") == last and p.job_frontier("agg") == 3
    third = run(None)
    assert third.returncode == 0 and "DONE" in third.stdout, third.stderr[-3000:]
    d1, agg = cat.load_table("s.d1"), cat.load_table("s.agg")
    for b in range(1, last + 1):
        ids = raw.to_arrow(version=p.version_at("s.raw", b)).column("id").to_pylist()
        want = collections.Counter((i, 2 * i + 1) for i in ids)
        assert rows(d1.to_arrow(version=p.version_at("s.d1", b)), ["id", "v"]) == want, f"s.d1 at {b}"
        per_k = collections.Counter((2 * i + 1) % 3 for i in ids)
        assert rows(agg.to_arrow(version=p.version_at("s.agg", b)), ["k", "n"]) == \
            collections.Counter(per_k.items()), f"s.agg at {b}"


def test_readme_example_runs(spark: Any, tmp_path: Path) -> None:
    """The README's DerivedJob snippet, run as written against real tables: both jobs start, follow
    the barriers, and the totals equal the orders' sums per tier at the last barrier."""
    import re

    text = (REPO / "README.md").read_text()
    block = next(b for b in re.findall(r"```python\n(.*?)```", text, flags=re.S) if "DerivedJob(spark, url" in b)
    cat = Catalog(warehouse=str(tmp_path / "wh"))
    cat.create_namespace("shop")
    orders = cat.create_table("shop.orders", ORDERS)
    tiers = cat.create_table("shop.tiers", TIERS)
    cat.create_table("shop.enriched", ENRICHED)
    cat.create_table("shop.totals", pa.schema([("tier", pa.string()), ("cents", pa.int64())]))
    p = Pipeline(cat)
    p.register_job("ingest", sinks=["shop.orders"], external_input=True)
    p.register_job("tiers", sinks=["shop.tiers"], external_input=True)
    scope: dict[str, Any] = {"spark": spark, "url": cat.url}
    exec(compile(block, "README.md (DerivedJob)", "exec"), scope)
    running = scope["jobs"]
    coord = Coordinator(p.catalog)
    try:
        tiers.append(pa.table({"customer": CUSTOMERS, "tier": ["gold", "gold", "tin"]}, schema=TIERS), barrier=-1)
        for i in range(3):
            ids = list(range(4 * i, 4 * i + 4))
            orders.append(pa.table({"order_id": ids, "customer": [CUSTOMERS[x % 3] for x in ids],
                                    "cents": [10 * x for x in ids]}, schema=ORDERS), barrier=-1)
            coord.seal()
        sealed = p.open_epoch() - 1
        wait_until(lambda: p.job_frontier("totals") >= sealed, "the README's jobs at the last barrier",
                   failed=lambda: next((repr(r.error) for r in running if r.error), None))
    finally:
        for r in running:
            r.stop()
    got = cat.load_table("shop.totals").to_arrow(version=p.version_at("shop.totals", sealed))
    assert rows(got, ["tier", "cents"]) == collections.Counter(
        {("gold", sum(10 * x for x in range(12) if x % 3 != 2)): 1, ("tin", sum(10 * x for x in range(12) if x % 3 == 2)): 1})


def test_quiet_barriers_wait_for_data_or_quiet_commit(spark: Any, tmp_path: Path) -> None:
    """quiet_commit: barriers without changes are not committed on their own until it has passed;
    the next batch with data covers them; run_available commits them at once."""
    cat = Catalog(warehouse=str(tmp_path / "wh"))
    p = setup(cat)
    feed = Feed(cat, p)
    job = DerivedJob(spark, cat, "enrich", sources=["s.orders", "s.tiers"], sinks=["s.enriched"],
                     transform=enrich, quiet_commit=3600)
    feed.step(0)
    assert job.run_once() is not None and p.job_frontier("enrich") == 1
    feed.coord.seal()
    feed.coord.seal()  # barriers 2 and 3: nothing changed
    assert job.run_once() is None and p.job_frontier("enrich") == 1
    feed.step(1)  # barrier 4: new orders
    res = job.run_once()
    assert res is not None and (res.plan.lo, res.plan.hi) == (2, 4) and p.job_frontier("enrich") == 4
    feed.coord.seal()
    assert job.run_once() is None and job.run_available() == 5
    assert job.stats.skipped == 1 and check_every_barrier_enriched(cat, 5)


def check_every_barrier_enriched(cat: Catalog, last: int) -> bool:
    p = Pipeline(cat)
    orders, enriched = cat.load_table("s.orders"), cat.load_table("s.enriched")
    for b in range(1, last + 1):
        o = orders.to_arrow(version=p.version_at("s.orders", b))
        e = enriched.to_arrow(version=p.version_at("s.enriched", b))
        assert rows(e, ["order_id", "cents"]) == rows(o, ["order_id", "cents"]), f"barrier {b}"
    return True


def test_every_spaces_batches(spark: Any, tmp_path: Path) -> None:
    """every: after a batch that ran the transform, the loop plans nothing more until ``every``
    seconds have passed (3600 here: never within the test), however many barriers are ready."""
    cat = Catalog(warehouse=str(tmp_path / "wh"))
    p = setup(cat)
    feed = Feed(cat, p)
    for i in (0, 1):
        feed.step(i)  # two barriers, each with new orders
    job = DerivedJob(spark, cat, "enrich", sources=["s.orders", "s.tiers"], sinks=["s.enriched"], transform=enrich)
    rounds = {"n": 0}

    def enough() -> bool:
        rounds["n"] += 1
        return rounds["n"] > 50

    job.run(every=3600, poll=0.001, until=enough)
    assert job.stats.batches == 1 and p.job_frontier("enrich") == 1 and p.ready_barrier("enrich") == 2
    job.run(until=lambda: p.job_frontier("enrich") >= 2)  # without every: the next batch runs at once
    assert job.stats.batches == 2


@pytest.mark.parametrize("catalog_spec", ["sqlite-s3"], indirect=True)
def test_on_an_s3_warehouse(spark: Any, catalog_spec: Any) -> None:
    """Tables on an object store Spark is not set up for: every read goes through lakestep's reader
    and every write through lakestep's writer, in Python workers, with the catalog's storage
    options (this process has no AWS variables); every barrier exact."""
    reach = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3")
    assert not [k for k in reach if k in os.environ]  # only the catalog's options reach the store
    cat = catalog_spec.open()
    p = setup(cat)
    js, seen = run_watched(spark, cat, p, 4)
    why = "python (an object store: pass native=True when Spark reaches it itself)"
    assert seen == {"changes s.orders": why, "table s.tiers": why}
    assert all(not j._spark_writes(sink, spark.createDataFrame([], from_arrow(cat.load_table(sink).schema)))
               for j in js for sink in j.modes)
    assert check_every_barrier(cat, p.open_epoch() - 1) >= 4


def from_arrow(schema: pa.Schema) -> Any:
    from pyspark.sql.pandas.types import from_arrow_schema

    return from_arrow_schema(schema)
