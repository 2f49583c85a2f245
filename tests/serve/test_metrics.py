"""``/metrics`` of ``lakestep serve`` (issue 34), on both backends.

* Scraped over HTTP and parsed with ``prometheus_client``'s own parser, every value equals
  what ``lakestep barriers --json`` and ``lakestep doctor --json`` print at that moment: a
  :class:`~lakestep.clock.ManualClock` fixes the moment, and the documents are built by the
  functions the two commands print (``status_doc``, ``doctor_doc``).
* A scrape's catalog statements do not grow with the number of tables (counted, not timed).
* A catalog that does not answer gives 503 (Prometheus's ``up 0``), never a stack trace.
"""

from __future__ import annotations

import http.client
import json
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import pytest
from prometheus_client.parser import text_string_to_metric_families

from lakestep import Catalog
from lakestep.barrier import OPEN_EPOCH, Pipeline, diagnose
from lakestep.barrier.topology import Topology
from lakestep.cli.barriers import status_doc
from lakestep.cli.doctor import doctor_doc
from lakestep.clock import ManualClock
from lakestep.serve import create_app
from lakestep.serve.metrics import METRICS, scrape
from lakestep.testing.serving import Served
from tests.catalog.test_statement_count import statements
from tests.iceberg.conftest import orders
from tests.serve.conftest import published_shop

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def get(uri: str, path: str, token: str | None = None) -> tuple[int, str, str]:
    host, port = uri.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=60)
    try:
        conn.request("GET", path, headers={"Authorization": f"Bearer {token}"} if token else {})
        r = conn.getresponse()
        return r.status, r.getheader("Content-Type") or "", r.read().decode()
    finally:
        conn.close()


def parse(text: str) -> tuple[Samples, dict[str, str]]:
    """Every sample by (name, labels), and each family's type, as Prometheus reads them."""
    samples: Samples = {}
    types: dict[str, str] = {}
    for fam in text_string_to_metric_families(text):
        types[fam.name] = fam.type
        for s in fam.samples:
            if s.name.endswith("_created"):
                continue
            key = (s.name, frozenset(s.labels.items()))
            assert key not in samples, f"duplicate sample {key}"
            samples[key] = s.value
    return samples, types


def one(samples: Samples, name: str, **labels: str) -> float | None:
    return samples.get((name, frozenset(labels.items())))


@pytest.fixture
def shop_clocked(clocked: Catalog, clock: ManualClock) -> Iterator[Any]:
    shop = published_shop(clocked)
    # something for cleanup to find: shop.totals keeps no history, and the totals job rewrote it
    clocked.load_table("shop.totals").set_properties({"lakestep.retention-seconds": "0"})
    # a streaming root batch (its idempotency key is what the batch counter reads)
    with clocked.transaction(job_id="ingest", batch_id=41) as tx:
        tx.append("shop.orders", orders((8, "eu", 5)), barrier=OPEN_EPOCH)
    clock.advance(90)
    yield shop
    shop.pub.close()


def test_every_value_equals_the_cli_json(shop_clocked: Any, clock: ManualClock) -> None:
    cat: Catalog = shop_clocked.cat
    with Served(create_app(cat)) as s:
        status, ctype, text = get(s.uri, "/metrics")
    assert status == 200 and ctype.startswith("text/plain; version=0.0.4"), (status, ctype)
    samples, types = parse(text)
    # the documents the two commands print, at the same moment (the clock did not move)
    st = Pipeline(cat).status(last=10)
    barriers = status_doc(st, list(st.tables.values()))  # lakestep barriers --json --all
    doctor = doctor_doc(diagnose(cat))  # lakestep doctor --json
    assert barriers["now"] == clock.now()

    assert one(samples, "lakestep_catalog_time_timestamp_seconds") == clock.now()
    for key in ("open_epoch", "sealed", "committed", "oldest_retained"):
        name = {"sealed": "lakestep_sealed_barrier", "committed": "lakestep_committed_barrier",
                "oldest_retained": "lakestep_oldest_retained_barrier"}.get(key, f"lakestep_{key}")
        assert one(samples, name) == barriers[key], key
    assert one(samples, "lakestep_coordinator_leader") == int(barriers["coordinator"]["alive"]) == 1
    assert one(samples, "lakestep_coordinator_lease_expires_in_seconds") == barriers["coordinator"]["expires_in_seconds"]
    sealed_at = barriers["sealed_at"][str(barriers["sealed"])]
    assert one(samples, "lakestep_last_seal_timestamp_seconds") == sealed_at
    assert one(samples, "lakestep_last_seal_age_seconds") == clock.now() - sealed_at == 90

    # per table, as the grid shows it
    lagging = 0
    for t in barriers["tables"]:
        ls = {"table": t["table"], "kind": t["kind"]}
        assert one(samples, "lakestep_table_version", **ls) == t["version"]
        if t["kind"] == "unmanaged":
            assert one(samples, "lakestep_table_frontier_barrier", **ls) is None
            continue
        assert one(samples, "lakestep_table_frontier_barrier", **ls) == t["frontier"]
        assert one(samples, "lakestep_table_behind_barriers", **ls) == t["behind"]
        assert one(samples, "lakestep_table_behind_seconds", **ls) == t["lag_seconds"]
        assert one(samples, "lakestep_table_catching_up", **ls) == int(t["catching_up"])
        lagging += t["behind"] > 0
    assert lagging == 1  # shop.counts: the fixture's lagging job, seen through both

    # per job and publishing, as the doctor says
    findings = doctor["findings"]
    for f in findings:
        if f["check"] == "job" and f["facts"].get("kind") == "derived":
            ls = {"job_id": f["subject"], "kind": "derived"}
            assert one(samples, "lakestep_job_frontier_barrier", **ls) == f["facts"]["frontier"]
            assert one(samples, "lakestep_job_behind_barriers", **ls) == f["facts"]["behind"]
            assert one(samples, "lakestep_job_behind_seconds", **ls) == f["facts"]["lag_seconds"]
    pub = next(f for f in findings if f["check"] == "publishing" and f["subject"] == "publisher")
    assert one(samples, "lakestep_publishing_enabled") == int(pub["facts"]["enabled"])
    assert one(samples, "lakestep_published_barrier") == pub["facts"]["complete"]
    assert one(samples, "lakestep_publishing_lag_barriers") == pub["facts"]["lag"]
    assert one(samples, "lakestep_publishing_last_round_timestamp_seconds") == pub["facts"]["round_at"]
    assert one(samples, "lakestep_publishing_last_round_failed") == 0
    # reclaimable bytes: the doctor's cleanup dry run of each table
    reclaim = {f["subject"]: f["facts"] for f in findings if f["check"] == "reclaimable"}
    assert reclaim.get("shop.totals", {}).get("bytes", 0) > 0  # the test sees a non-zero value
    for t in barriers["tables"]:
        ls = {"table": t["table"], "kind": t["kind"]}
        assert one(samples, "lakestep_table_reclaimable_bytes", **ls) == reclaim.get(t["table"], {}).get("bytes", 0)
        assert one(samples, "lakestep_table_reclaimable_files", **ls) == reclaim.get(t["table"], {}).get("files", 0)
    assert one(samples, "lakestep_reclaimable_bytes") == sum(r["bytes"] for r in reclaim.values())

    # live files and bytes: the newest version's files, as the catalog lists them
    for ident in ("shop.orders", "shop.totals", "shop.regions"):
        t = cat.load_table(ident)
        files = t.files()
        kind = st.tables[ident].kind
        assert one(samples, "lakestep_table_live_files", table=ident, kind=kind) == len(files)
        assert one(samples, "lakestep_table_live_bytes", table=ident, kind=kind) == sum(f.file_size for f in files)
        assert one(samples, "lakestep_table_last_commit_age_seconds", table=ident, kind=kind) == \
            clock.now() - st.tables[ident].last_commit_at
    # the streaming batch counter, and its age
    assert types["lakestep_job_batches_committed"] == "counter"
    assert one(samples, "lakestep_job_batches_committed_total", job_id="ingest", kind="root") == 42
    assert one(samples, "lakestep_job_last_batch_age_seconds", job_id="ingest", kind="root") == 90
    # every family is documented, with its type
    for name in types:
        full = name + ("_total" if types[name] == "counter" else "")
        assert METRICS[full][0] == types[name]


def _tables(cat: Catalog, first: int, n: int) -> None:
    schema = pa.schema([("k", pa.int64())])
    cat.create_namespace("many", exist_ok=True)
    p = Pipeline(cat)
    for i in range(first, first + n):
        t = cat.create_table(f"many.t{i}", schema)
        t.append({"k": [i]})
        t.overwrite({"k": [i, i]})
        if i % 2:
            p.register_job(f"root{i}", sinks=[f"many.t{i}"], external_input=True)
            t.append({"k": [1]}, barrier=OPEN_EPOCH)


def test_a_scrape_costs_the_same_statements_at_any_size(clocked: Catalog, clock: ManualClock) -> None:
    """Bounded work per scrape: the statements one scrape sends are the same at 4 tables
    and at 40 (benchmarks/serve.py --metrics times 1,000)."""
    _tables(clocked, 0, 4)
    clocked.load_table("many.t0").create_snapshot("keep")
    clock.advance(10)
    topology = Topology(clocked)  # one per server, its graph cached by generation
    scrape(clocked, topology)
    with statements(clocked) as small:
        s4 = scrape(clocked, topology)
    _tables(clocked, 4, 36)
    scrape(clocked, topology)
    with statements(clocked) as large:
        s40 = scrape(clocked, topology)
    assert len(s40.samples["lakestep_table_version"]) == 40 and len(s4.samples["lakestep_table_version"]) == 4
    assert len(large) == len(small), "\n".join(large)


def test_metrics_when_the_catalog_does_not_answer(pg_proxied: Any) -> None:
    """The database refuses connections (a fault-injecting proxy): 503, nothing leaked; then
    it comes back and so do the metrics."""
    spec, proxy = pg_proxied
    cat = spec.open()
    try:
        with Served(create_app(cat)) as s:
            assert get(s.uri, "/metrics")[0] == 200
            cat.backend.dispose()
            proxy.refuse()
            status, _, body = get(s.uri, "/metrics")
            assert status == 503 and "Traceback" not in body and "postgres" not in body, body
            page = get(s.uri, "/")
            assert page[0] == 503 and "Traceback" not in page[2] and "postgres" not in page[2], page
            proxy.heal()
            assert get(s.uri, "/metrics")[0] == 200
    finally:
        cat.close()


def test_metrics_need_the_token(shop_clocked: Any) -> None:
    with Served(create_app(shop_clocked.cat, token="t0ken")) as s:
        status, _, body = get(s.uri, "/metrics")
        assert status == 401 and json.loads(body)["error"]["type"] == "NotAuthorizedException"
        assert get(s.uri, "/metrics", token="t0ken")[0] == 200


def test_the_commands_agree(shop: Any, served: Any) -> None:
    """The commands themselves (``lakestep barriers --json --all``, ``lakestep doctor --json``)
    beside a scrape of the running server, on a pipeline that does not move meanwhile: every
    value that does not read the clock is equal (the test above compares the rest)."""
    from tests.cli.conftest import lakestep

    url = shop.cat.connection_url()
    barriers = lakestep("barriers", "--json", "--all", catalog=url).json()
    doctor = lakestep("doctor", "--json", catalog=url).json()
    samples, _ = parse(get(served.uri, "/metrics")[2])
    assert one(samples, "lakestep_open_epoch") == barriers["open_epoch"] == doctor["open_epoch"]
    assert one(samples, "lakestep_sealed_barrier") == barriers["sealed"] == doctor["sealed"]
    assert one(samples, "lakestep_committed_barrier") == barriers["committed"] == doctor["committed"]
    for t in barriers["tables"]:
        ls = {"table": t["table"], "kind": t["kind"]}
        assert one(samples, "lakestep_table_version", **ls) == t["version"]
        if t["kind"] != "unmanaged":
            assert one(samples, "lakestep_table_frontier_barrier", **ls) == t["frontier"]
            assert one(samples, "lakestep_table_behind_barriers", **ls) == t["behind"]
    jobs = [f for f in doctor["findings"] if f["check"] == "job" and f["facts"].get("kind") == "derived"]
    assert {f["subject"] for f in jobs} == {"totals", "counts"}
    for f in jobs:
        assert one(samples, "lakestep_job_frontier_barrier", job_id=f["subject"], kind="derived") == f["facts"]["frontier"]
    pub = next(f for f in doctor["findings"] if f["check"] == "publishing" and f["subject"] == "publisher")
    assert one(samples, "lakestep_published_barrier") == pub["facts"]["complete"]
    assert one(samples, "lakestep_publishing_lag_barriers") == pub["facts"]["lag"]
    assert one(samples, "lakestep_coordinator_leader") == int(barriers["coordinator"]["alive"])
