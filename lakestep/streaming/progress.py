"""Driver-side bookkeeping of streaming jobs: registration, agreed barriers, batch commits.

No pyspark here (it runs in Spark's driver-side Python workers, and is tested
without a JVM too).

**Alignment.** The lakestep sources of a job agree on the barrier each
trigger reads up to, and the sink commits its batch with the barriers of the
decision the batch was planned from: the protocol is in
:mod:`lakestep.barrier.triggers`.
"""

from __future__ import annotations

import logging
import threading
from typing import Any, Sequence

import sqlalchemy as sa

from ..barrier import OPEN_EPOCH, JobNotFoundError, Pipeline, triggers
from ..catalog import Catalog
from ..catalog import schema as S
from ..catalog.commit import CommitResult, find_txn, txn_results
from ..catalog.files import NewFile, Storage
from ..errors import LakestepError

log = logging.getLogger(__name__)

_catalogs: dict[tuple[str, Storage], Catalog] = {}
_lock = threading.Lock()


class StreamingJobError(LakestepError):
    """A streaming job that is not set up to run (unregistered, misaligned, ...)."""


def required(options: Any, key: str) -> str:
    value = options.get(key)
    if not value:
        raise ValueError(f"the lakestep format needs option {key!r}")
    return str(value)


def storage_of(options: Any) -> Storage:
    """The object-store options among a Spark data source's options (``storage.<name>``)."""
    return Storage.of({k[len("storage."):]: v for k, v in dict(options or {}).items()
                       if k.lower().startswith("storage.")})


def open_catalog(url: str, storage: Storage | None = None) -> Catalog:
    """One catalog per process, URL and storage options (driver-side Python workers are reused)."""
    key = (url, storage or Storage())
    with _lock:
        cat = _catalogs.get(key)
        if cat is None:
            cat = _catalogs[key] = Catalog(url, storage_options=key[1])
        return cat


def ensure_sink_registered(cat: Catalog, job: str, table: str, dead_letter: str | None) -> None:
    """A sink of an unknown job registers it as a root job (external input)."""
    p = Pipeline(cat)
    sinks = [table] + ([dead_letter] if dead_letter else [])
    try:
        j = p.topology.job(job)
    except JobNotFoundError:
        p.register_job(job, sinks=sinks, external_input=True)
        log.info("registered root job %s writing %s", job, sinks)
        return
    missing = [t for t in sinks if t not in j.sinks]
    if missing:
        p.register_job(job, sources=j.sources, sinks=list(j.sinks) + missing, external_input=j.external_input)


def ensure_source_registered(cat: Catalog, job: str, table: str) -> None:
    p = Pipeline(cat)
    try:
        j = p.topology.job(job)
    except JobNotFoundError:
        raise StreamingJobError(
            f"job {job!r} reads lakestep table {table!r} but is not registered: register it with its sources "
            f"and sinks before starting the query (lakestep.streaming.register_job(...) or "
            f"Pipeline(catalog).register_job({job!r}, sources=[...], sinks=[...]))") from None
    if table not in j.sources:
        p.register_job(job, sources=list(j.sources) + [table], sinks=j.sinks, external_input=j.external_input)


def job_frontier(cat: Catalog, job: str) -> int:
    """The barrier the job's sinks have all precommitted (what its batches reached)."""
    p = Pipeline(cat)
    j = p.topology.job(job)
    fronts = [p.frontier(t) for t in j.sinks]
    return min((f if f is not None else 0) for f in fronts) if fronts else 0


def ready_barrier(cat: Catalog, job: str) -> int:
    """The newest barrier every lakestep source of ``job`` has precommitted (what it could read up to)."""
    p = Pipeline(cat)
    fronts = [p.frontier(t) for t in p.topology.job(job).sources]
    known = [f for f in fronts if f is not None]
    return min(known) if known else job_frontier(cat, job)


def commit_batch(
    cat: Catalog,
    job: str,
    batch_id: int,
    table: str,
    files: Sequence[NewFile],
    *,
    mode: str,
    dead_letter: tuple[str, Sequence[NewFile]] | None = None,
) -> list[CommitResult]:
    """Publish one micro-batch's files (see sink.py for the protocol)."""
    p = Pipeline(cat)
    j = p.topology.job(job)
    if j.external_input or not j.sources:
        with cat.transaction(job_id=job, batch_id=batch_id) as tx:
            if files or mode == "overwrite":
                tx.add_files(table, files, mode=mode, barrier=OPEN_EPOCH)
            if dead_letter and dead_letter[1]:
                tx.add_files(dead_letter[0], dead_letter[1], barrier=OPEN_EPOCH)
        return tx.results
    # A batch Spark replays after a crash between our commit and its commit log
    # was committed under (job, batchId): return that, whatever the plan says now.
    with cat.backend.read() as conn:
        prior = find_txn(conn, key=(job, int(batch_id)))
        if prior is not None:
            log.info("job %s batch %d was committed before: replay", job, batch_id)
            return txn_results(conn, prior, {})
    start = job_frontier(cat, job)
    hi = triggers.batch_end(cat, job, start)
    if hi is None or hi <= start:
        if files:
            raise StreamingJobError(f"job {job!r}: batch {batch_id} wrote rows but its sources agreed on no "
                                    f"barrier after {start}")
        return []
    plan = p.next_batch(job, max_barriers=hi - start)
    if plan is None or plan.hi != hi:
        raise StreamingJobError(f"job {job!r}: batch {batch_id} read up to barrier {hi}, but the job's next "
                                f"batch is {None if plan is None else (plan.lo, plan.hi)}")
    b = p.batch(plan)
    b.tx.job_id, b.tx.batch_id = job, int(batch_id)  # recorded: a replay finds it (above)
    with b:
        b.tx.add_files(table, files, mode=mode, barrier=plan.hi)
        if dead_letter and dead_letter[1]:
            b.tx.add_files(dead_letter[0], dead_letter[1], barrier=plan.hi)
    assert b.result is not None
    return b.result.results


def data_version_at(cat: Catalog, table: str, barrier: int) -> tuple[int, int]:
    """(version, data version) of ``table`` at ``barrier``."""
    t = cat.load_table(table)
    v = Pipeline(cat).version_at(table, barrier) if barrier > 0 else 0
    c = S.commits.c
    with cat.backend.read() as conn:
        dv = conn.execute(sa.select(c.data_version).where(c.table_id == t.table_id, c.version == v)).scalar()
    return v, int(dv or 0)


def added_files(cat: Catalog, table: str, from_dv: int, to_dv: int) -> list[tuple[str, int, int]]:
    """(path, rows, bytes) of the files whose rows a stream emits for data versions ``(from_dv, to_dv]``.

    Appends and upserts emit their files; an overwrite emits its new rows (not
    the rows it kept by rewriting). Compactions have no data version, and the
    rewrites of copy-on-write deletes and updates are not emitted: the stream
    is the table's appended and upserted rows.
    """
    t = cat.load_table(table)
    f, c = S.files.c, S.commits.c
    q = (
        sa.select(f.path, f.record_count, f.file_size)
        .select_from(S.files.join(S.commits, sa.and_(c.table_id == f.table_id, c.version == f.added_version)))
        .where(f.table_id == t.table_id, c.data_version > from_dv, c.data_version <= to_dv,
               c.operation.in_(["APPEND", "MERGE", "OVERWRITE"]), f.source_ids.is_(None))
        .order_by(f.file_id)
    )
    with cat.backend.read() as conn:
        return [(r[0], int(r[1]), int(r[2])) for r in conn.execute(q)]
