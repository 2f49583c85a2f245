"""A streaming pipeline across a 12-second outage of its PostgreSQL catalog database.

The pipeline of the exactly-once test (``pipeline_app.py``: Kafka -> ``s.raw``
(root job) -> ``s.agg`` (derived job), a coordinator in the driver) runs on
the suite's own PostgreSQL server (lakestep/testing/pgcluster.py), which is stopped for
``OUTAGE_SECONDS`` while records keep arriving in Kafka, then started again.
Meanwhile this process runs ``read_committed`` queries of both tables and a
maintenance loop (compaction and cleanup beside the streams).

What must hold: the application never fails or restarts (sinks, sources and
the coordinator wait and go on); the coordinator logs one line when its wait
starts and one when it ends, and so does every sink or source call that
waited; a query during the outage fails fast with
:class:`CatalogUnavailableError`; every Kafka record is in ``s.raw`` exactly
once; ``s.agg`` is the transformation of ``s.raw`` at every barrier it
precommitted; no consistent read saw anything else.
"""

from __future__ import annotations

import collections
import re
import threading
import time

import pytest

from lakestep.barrier import Pipeline
from lakestep.errors import CatalogUnavailableError
from lakestep.retry import RetryPolicy
from lakestep.services import MaintenanceLoop
from tests.streaming.test_exactly_once import App, KeyedPipeline, agg_rows, check_exactly_once, transform
from tests.waiting import wait_until

pytestmark = [pytest.mark.spark, pytest.mark.kafka, pytest.mark.slow]

OUTAGE_SECONDS = 12.0  # how long the database stays away: the fault itself, never a threshold


def test_a_streaming_pipeline_survives_its_catalog_database_going_away(own_pg, pg_cluster, kafka_broker,
                                                                      kafka_topic_name, tmp_path) -> None:  # type: ignore[no-untyped-def]
    spec = own_pg
    topic = kafka_topic_name()
    kp = KeyedPipeline(spec, kafka_broker, topic, pad=lambda i: i % 17)
    cat, raw, produce, produced = kp.cat, kp.raw, kp.produce, kp.produced

    p = Pipeline(cat)
    stop = threading.Event()
    reads = {"ok": 0, "failed": 0}
    inconsistent: list[str] = []
    errors: list[BaseException] = []

    def reader() -> None:  # read_committed answers of both tables, all along
        q = Pipeline(spec.open())
        try:
            while not stop.is_set():
                try:
                    ch = q.choose(["s.raw", "s.agg"])
                    if ch.barrier is not None:
                        want = transform(ch.read("s.raw").to_pylist())
                        got = agg_rows(ch.read("s.agg").to_pylist())
                        reads["ok"] += 1
                        if got != want:
                            inconsistent.append(f"barrier {ch.barrier} {ch.versions}: {len(got)} != {len(want)}")
                except CatalogUnavailableError:
                    reads["failed"] += 1
                stop.wait(0.5)
        except BaseException as e:  # noqa: BLE001 - reported by the test
            errors.append(e)
        finally:
            q.catalog.close()

    maint_cat = spec.open()
    maint = MaintenanceLoop(maint_cat, ["s.raw", "s.agg"], interval=2.0, min_files=4,
                            retry=RetryPolicy(initial=0.1, max_delay=1.0, deadline=None))
    args = ["--catalog", spec.url, "--bootstrap", kafka_broker.bootstrap_servers, "--topic", topic,
            "--checkpoints", str(tmp_path / "ck")]
    produce(150)
    app = App(tmp_path, 1, args, None, log_lakestep=True)
    threads = [threading.Thread(target=reader, daemon=True)]
    try:
        app.wait(app.ready, "READY", 180)
        for t in threads:
            t.start()
        maint.start()
        app.wait(lambda: raw.count() >= 100 and (p.frontier("s.agg") or 0) >= 2, "a running pipeline", 240)

        pg_cluster.stop("fast")
        began = time.monotonic()
        try:
            produce(60)  # records keep coming while the database is away
            with pytest.raises(CatalogUnavailableError):
                p.choose(["s.raw", "s.agg"])  # a query fails fast
            time.sleep(max(0.0, OUTAGE_SECONDS - (time.monotonic() - began)))
            assert app.exited() is None, app.tail()
        finally:
            pg_cluster.start()
        outage = time.monotonic() - began
        produce(60)
        # the test's own catalog may not reach the database yet either: not yet, not an error
        app.wait(lambda: raw.count() >= len(produced), f"{len(produced)} rows in s.raw", 300,
                 ignoring=(CatalogUnavailableError,))
        last = max(h.barrier for h in raw.history() if h.barrier is not None and h.added_rows)
        app.wait(lambda: (p.frontier("s.agg") or 0) >= last, f"s.agg to precommit barrier {last}", 300,
                 ignoring=(CatalogUnavailableError,))
        ok_after = reads["ok"]
        wait_until(lambda: reads["ok"] >= ok_after + 2, "consistent reads after the outage", timeout=120)
        assert app.exited() is None, f"the application failed:\n{app.tail()}"
    finally:
        stop.set()
        maint.stop(120)
        for t in threads:
            t.join(120)
        app.kill()
        maint_cat.close()
    assert not errors, errors

    # the wait lines: the coordinator (driver) and every sink or source call that waited (Python workers)
    text = app.err.read_text(errors="replace")
    started = re.findall(r"pid (\d+) WARNING \S+: (.+?): the catalog database is unavailable", text)
    ended = re.findall(r"pid (\d+) INFO \S+: (.+?): the catalog database is back", text)
    coordinators = [w for _, w in started if w.startswith("coordinator ")]
    assert len(coordinators) == 1 and [w for _, w in ended if w.startswith("coordinator ")] == coordinators, text[-5000:]
    assert collections.Counter(started) == collections.Counter(ended), (started, ended)

    # every record exactly once; s.agg = f(s.raw) at every barrier it precommitted
    check_exactly_once(cat, produced, last)
    assert inconsistent == [], inconsistent[:5]
    seals = [s.barrier for s in p.seals()]
    assert seals == list(range(1, len(seals) + 1))
    print(f"\nFAULT streaming, PostgreSQL stopped {outage:.0f}s: {len(produced)} records, lost 0, "
          f"duplicated 0, inconsistent reads {len(inconsistent)} of {reads['ok']} "
          f"({reads['failed']} failed fast), {len(seals)} epochs; waits: "
          + ", ".join(f"{w}" for _, w in started))
    cat.close()
