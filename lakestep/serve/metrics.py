"""``/metrics`` of ``lakestep serve``: the pipeline in Prometheus's text format, read from the catalog.

The writers (jobs, the coordinator, the publisher, cleanup) are other processes, so a
scrape reads what they recorded in the catalog, the same way ``lakestep barriers``
and ``lakestep doctor --no-storage`` do:

1. :func:`scrape` reads, with the catalog's clock, :func:`lakestep.barrier.status`
   (``last=1``), the publisher's state (:func:`lakestep.barrier.publishing.status`), and in
   one more read transaction each table's live files and bytes, each job's newest
   committed batch and :func:`lakestep.catalog.cleanup.reclaimable` (what a cleanup dry
   run would delete now, per table). It is a bounded number of statements whatever the
   number of tables (up to 5,000 tables per statement; tests/serve/test_metrics.py counts
   them at two catalog sizes, ``benchmarks/serve.py --metrics`` times 1,000 tables);
2. :func:`render` writes the samples with ``prometheus_client``'s exposition format;
3. a scrape that cannot read the catalog answers 503: Prometheus records it as ``up 0``.

Names follow Prometheus's advice: base units in the name (``_seconds``, ``_bytes``),
``_total`` for the one counter, ``_timestamp_seconds`` for Unix times, one metric per
quantity with labels for the table (``table``, ``kind``) or the job (``job_id``, ``kind``: not
``job``, which Prometheus gives the scrape job).
:data:`METRICS` lists every name with its help text (docs/metrics.md shows them, and
the example Grafana dashboard and alert rules there use only these names).

Each value is the one ``lakestep barriers --json`` or ``lakestep doctor --json`` shows at
that moment: a table's ``frontier``, ``behind``, ``lag_seconds``; a job's doctor facts;
the coordinator's lease; the publisher's ``complete`` barrier and ``lag``; a table's
``reclaimable`` bytes. Ages (``..._age_seconds``) are the catalog clock's ``now`` minus
the matching ``..._timestamp_seconds``.

Not guaranteed: the parts are read in three transactions, a few milliseconds apart, so a
commit landing between them may show in one part and not yet in another (the next scrape
agrees). ``lakestep_job_batches_committed_total`` is the newest committed micro-batch id
plus one (Spark numbers a query's batches from 0): it starts again with a new checkpoint,
which Prometheus's ``rate()`` treats as a counter reset. Orphan files are not in
``reclaimable`` (finding them lists storage: ``lakestep doctor`` does that).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa

from ..barrier.status import Status, status
from ..barrier.topology import Topology
from ..catalog import inventory, retention
from ..catalog.cleanup import reclaimable
from ..errors import InternalError

if TYPE_CHECKING:
    from ..catalog import Catalog

#: name -> (type, help). Every metric a scrape can return.
METRICS: dict[str, tuple[str, str]] = {
    "lakestep_catalog_time_timestamp_seconds": ("gauge", "The catalog clock's time at this scrape (ages are measured from it)"),
    "lakestep_open_epoch": ("gauge", "The open epoch: the barrier commits are tagged with now"),
    "lakestep_sealed_barrier": ("gauge", "The newest sealed barrier (0: none yet)"),
    "lakestep_committed_barrier": ("gauge", "The newest COMMIT barrier: every managed table has reached it"),
    "lakestep_oldest_retained_barrier": ("gauge", "The oldest barrier the coordinator's snapshots retain"),
    "lakestep_epoch_open_seconds": ("gauge", "How long the open epoch has been open"),
    "lakestep_last_seal_timestamp_seconds": ("gauge", "When the newest sealed barrier was sealed"),
    "lakestep_last_seal_age_seconds": ("gauge", "Seconds since the newest barrier was sealed"),
    "lakestep_coordinator_leader": ("gauge", "1 when a coordinator holds an unexpired lease, else 0"),
    "lakestep_coordinator_lease_expires_in_seconds": ("gauge", "Seconds until the coordinator lease expires "
                                                      "(negative: expired that long ago)"),
    "lakestep_table_version": ("gauge", "A table's newest version"),
    "lakestep_table_frontier_barrier": ("gauge", "A managed table's frontier: the newest barrier it has precommitted"),
    "lakestep_table_behind_barriers": ("gauge", "Barriers a managed table is behind the newest sealed one"),
    "lakestep_table_behind_seconds": ("gauge", "How long the first barrier a managed table lacks has been sealed"),
    "lakestep_table_catching_up": ("gauge", "1 while a table's job catches up after registering late"),
    "lakestep_table_last_commit_timestamp_seconds": ("gauge", "When a table's newest commit landed"),
    "lakestep_table_last_commit_age_seconds": ("gauge", "Seconds since a table's newest commit"),
    "lakestep_table_live_files": ("gauge", "Data files in a table's newest version"),
    "lakestep_table_live_bytes": ("gauge", "Bytes of the data files in a table's newest version"),
    "lakestep_table_reclaimable_files": ("gauge", "Expired files a cleanup run would delete now"),
    "lakestep_table_reclaimable_bytes": ("gauge", "Bytes of the expired files a cleanup run would delete now"),
    "lakestep_reclaimable_bytes": ("gauge", "Bytes a cleanup run over every table would delete now (orphans aside)"),
    "lakestep_job_frontier_barrier": ("gauge", "A derived job's frontier: the lowest of its sinks' frontiers"),
    "lakestep_job_behind_barriers": ("gauge", "Barriers a derived job is behind the newest sealed one"),
    "lakestep_job_behind_seconds": ("gauge", "The largest behind_seconds of a derived job's sinks"),
    "lakestep_job_batches_committed_total": ("counter", "Micro-batches a streaming job committed: its newest "
                                             "committed batch id + 1"),
    "lakestep_job_last_batch_timestamp_seconds": ("gauge", "When a job's newest micro-batch committed"),
    "lakestep_job_last_batch_age_seconds": ("gauge", "Seconds since a job's newest micro-batch committed"),
    "lakestep_publishing_enabled": ("gauge", "1 when the catalog publishes its tables as Iceberg tables"),
    "lakestep_published_barrier": ("gauge", "The newest barrier every published table has an Iceberg tag of"),
    "lakestep_publishing_lag_barriers": ("gauge", "COMMIT barriers not yet published to Iceberg"),
    "lakestep_publishing_behind_seconds": ("gauge", "How long the oldest barrier not yet published has been sealed"),
    "lakestep_publishing_last_round_timestamp_seconds": ("gauge", "When the publisher's last round ended"),
    "lakestep_publishing_last_round_failed": ("gauge", "1 when the publisher's last round failed"),
    "lakestep_publishing_table_errors": ("gauge", "Tables left out of publishing by an error"),
}


@dataclass
class Scrape:
    """The samples of one scrape: name -> [(labels, value)], in :data:`METRICS` order."""

    samples: dict[str, list[tuple[dict[str, str], float]]] = field(default_factory=dict)

    def add(self, name: str, value: float | int | None, **labels: str) -> None:
        if name not in METRICS:
            raise InternalError(f"metric {name!r} is not in METRICS")
        if value is not None:
            self.samples.setdefault(name, []).append((labels, float(value)))


def scrape(catalog: "Catalog", topology: Topology | None = None) -> Scrape:
    """Read the catalog once (module docstring, step 1)."""
    from ..barrier.publishing import status as publishing

    topology = topology or Topology(catalog)
    st = status(catalog, topology, last=1)
    pub = publishing(catalog, topology)
    now = catalog.clock.now()
    with catalog.backend.read() as conn:
        extra = _table_rows(conn, now)
    out = Scrape()
    _pipeline(out, st)
    _tables(out, st, extra)
    _jobs(out, st, topology, extra["batches"])
    out.add("lakestep_publishing_enabled", int(pub.enabled))
    if pub.published:
        out.add("lakestep_published_barrier", pub.complete)
        out.add("lakestep_publishing_lag_barriers", pub.lag)
        out.add("lakestep_publishing_behind_seconds",
                0.0 if not pub.lag or pub.behind_since is None else st.now - pub.behind_since)
        out.add("lakestep_publishing_last_round_timestamp_seconds", pub.round_at)
        out.add("lakestep_publishing_last_round_failed", int(bool(pub.error)))
        out.add("lakestep_publishing_table_errors", sum(1 for r in pub.tables.values() if r.get("error")))
    return out


def _table_rows(conn: sa.Connection, now: float) -> dict[str, Any]:
    """Step 1's last transaction: live files, batches, reclaimable bytes (bounded statements)."""
    return {"live": inventory.live_storage(conn), "batches": inventory.newest_batches(conn),
            "reclaim": reclaimable(conn, retention.windows(conn, warned=_WARNED), now)}


_WARNED: set[Any] = set()  # an invalid retention property is logged once per process, not per scrape


def _pipeline(out: Scrape, st: Status) -> None:
    out.add("lakestep_catalog_time_timestamp_seconds", st.now)
    out.add("lakestep_open_epoch", st.open_epoch)
    out.add("lakestep_sealed_barrier", st.sealed)
    out.add("lakestep_committed_barrier", st.committed)
    out.add("lakestep_oldest_retained_barrier", st.oldest_retained)
    out.add("lakestep_epoch_open_seconds", st.now - st.opened_at)
    sealed_at = st.seals.get(st.sealed)
    out.add("lakestep_last_seal_timestamp_seconds", sealed_at)
    out.add("lakestep_last_seal_age_seconds", None if sealed_at is None else st.now - sealed_at)
    out.add("lakestep_coordinator_leader", int(st.coordinator_alive))
    if st.lease.holder is not None:
        out.add("lakestep_coordinator_lease_expires_in_seconds", st.lease.expires_at - st.now)


def _tables(out: Scrape, st: Status, extra: dict[str, Any]) -> None:
    total = 0
    for t in st.tables.values():
        ls = {"table": t.table, "kind": t.kind}
        out.add("lakestep_table_version", t.version, **ls)
        if t.kind != "unmanaged":
            out.add("lakestep_table_frontier_barrier", t.frontier, **ls)
            out.add("lakestep_table_behind_barriers", t.behind, **ls)
            out.add("lakestep_table_behind_seconds", t.lag_seconds, **ls)
            out.add("lakestep_table_catching_up", int(t.catching_up), **ls)
        out.add("lakestep_table_last_commit_timestamp_seconds", t.last_commit_at, **ls)
        out.add("lakestep_table_last_commit_age_seconds", st.now - t.last_commit_at, **ls)
        files, size = extra["live"].get(t.table_id, (0, 0))
        out.add("lakestep_table_live_files", files, **ls)
        out.add("lakestep_table_live_bytes", size, **ls)
        n, b = extra["reclaim"].get(t.table_id, (0, 0))
        out.add("lakestep_table_reclaimable_files", n, **ls)
        out.add("lakestep_table_reclaimable_bytes", b, **ls)
        total += b
    out.add("lakestep_reclaimable_bytes", total)


def _jobs(out: Scrape, st: Status, topology: Topology, batches: dict[str, tuple[int | None, float]]) -> None:
    graph_jobs = topology.graph().jobs
    for job in sorted(graph_jobs.values(), key=lambda j: j.job_id):
        ls = {"job_id": job.job_id, "kind": "root" if job.external_input else "derived"}
        pos = st.job(job)  # what the doctor reports of the job (barrier/status.py)
        if pos is not None and pos.frontier is not None:
            out.add("lakestep_job_frontier_barrier", pos.frontier, **ls)
            out.add("lakestep_job_behind_barriers", pos.behind, **ls)
            out.add("lakestep_job_behind_seconds", pos.lag_seconds, **ls)
        last_batch, at = batches.get(job.job_id, (None, None))
        if last_batch is not None:
            out.add("lakestep_job_batches_committed_total", last_batch + 1, **ls)
        if at is not None:
            out.add("lakestep_job_last_batch_timestamp_seconds", at, **ls)
            out.add("lakestep_job_last_batch_age_seconds", st.now - at, **ls)


def render(s: Scrape) -> bytes:
    """The Prometheus text exposition of ``s`` (step 2)."""
    from prometheus_client import CollectorRegistry, generate_latest
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

    class Collector:
        def collect(self) -> Any:
            for name, (kind, text) in METRICS.items():
                rows = s.samples.get(name)
                if not rows:
                    continue
                keys = sorted({k for ls, _ in rows for k in ls})
                if kind == "counter":
                    fam: Any = CounterMetricFamily(name.removesuffix("_total"), text, labels=keys)
                else:
                    fam = GaugeMetricFamily(name, text, labels=keys)
                for ls, v in rows:
                    fam.add_metric([ls.get(k, "") for k in keys], v)
                yield fam

    reg = CollectorRegistry(auto_describe=False)
    reg.register(Collector())
    return generate_latest(reg)
