"""A streaming job's micro-batch on the driver: registering the job, committing the batch's files.

No pyspark here (it runs in Spark's driver-side Python workers, and is tested
without a JVM too).

**Alignment.** The lakestep sources of a job agree on the barrier each
trigger reads up to, and the sink commits its batch with the barriers of the
decision the batch was planned from: the protocol is in
:mod:`lakestep.barrier.triggers`.
"""

from __future__ import annotations

import logging
from typing import Sequence

from ..barrier import OPEN_EPOCH, JobNotFoundError, Pipeline, triggers
from ..catalog import Catalog
from ..catalog.changes import CommitResult, FilesMode
from ..catalog.files import NewFile
from ..errors import StreamingJobError

log = logging.getLogger(__name__)


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


def commit_batch(
    cat: Catalog,
    job: str,
    batch_id: int,
    table: str,
    files: Sequence[NewFile],
    *,
    mode: FilesMode,
    dead_letter: tuple[str, Sequence[NewFile]] | None = None,
) -> list[CommitResult]:
    """Publish one micro-batch's files in one catalog transaction (see sink.py for the protocol)."""
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
    prior = cat.recorded(job, int(batch_id))
    if prior is not None:
        log.info("job %s batch %d was committed before: replay", job, batch_id)
        return prior
    start = p.job_frontier(job)
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
    with p.batch(plan, job_id=job, batch_id=int(batch_id)) as b:  # the key is recorded: a replay finds it (above)
        b.add_files(table, files, mode=mode)
        if dead_letter and dead_letter[1]:
            b.add_files(dead_letter[0], dead_letter[1])
    assert b.result is not None
    return b.result.results
