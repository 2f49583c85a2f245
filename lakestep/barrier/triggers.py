"""Trigger agreement: the barrier every source of a streaming job reads up to in one trigger.

A derived streaming job reads several lakestep tables. Spark asks each of its
sources, one after the other and each in its own process, how far the next
micro-batch reads (``latestOffset``). If each answered on its own, one could
see barrier ``e`` become ready and the next not yet, and the batch would join
rows of ``e`` with rows of ``e-1``. So the sources of a job agree, through the
catalog database, on one answer per trigger. The protocol:

1. **Runs.** A *run* is one start of the query (a restart on the same
   checkpoint is a new run). Every source takes, when it is created,
   :func:`run_mark`: the number of the newest decision of its job. Decisions
   are numbered by the database in the order they are made (never by a
   clock), so the decisions numbered above a source's mark were made by its
   own run. Spark creates every source of a query before it plans any
   trigger, so all sources of one run hold the same mark.
2. **Decisions.** The ``n``-th ``latestOffset`` call of a source since its
   batches reached barrier ``start`` belongs to the same trigger as the
   ``n``-th call of every other source of the job (:func:`decide`). The first
   source to arrive computes the answer (the job's next batch plan, or
   "nothing new": ``end == start``) and records it under ``(job, start, n)``;
   the others read it and answer the same. A decision under that key made by
   an earlier run (numbered at or below the caller's mark) is replaced, never
   followed: an availableNow run would otherwise stop at an old "nothing new".
3. **The batch's decision.** When the sink commits the micro-batch that
   starts after ``start``, it commits the barriers of :func:`batch_end`: the
   newest decision at ``start`` that read anything (``end > start``). That is
   the decision the batch was planned from, whichever run made it:
   * in one run, a decision that reads something is the last one at its
     start: Spark runs that batch before it plans again, and the next
     trigger starts where the batch ended;
   * after a restart, the new run's decisions are numbered above every
     decision of the runs before it, so they win over any number of older
     calls (call numbers restart at 0 with each run and cannot tell runs
     apart);
   * a batch that Spark replays from its offset log after a crash (planned
     by the earlier run, not yet committed) is replayed without a new
     ``latestOffset`` call: its decision is still the newest one at
     ``start``.
4. Decisions more than ten barriers behind the newest start are deleted.

Not guaranteed: two queries running the same job at once (they would share
decisions and each commit only what the barrier layer's commit checks allow;
:class:`~lakestep.barrier.StaleBatchError` stops the second); sources created
after their run's first decision (Spark does not do this).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Callable

import sqlalchemy as sa

from ..catalog import schema as S

if TYPE_CHECKING:
    from ..catalog import Catalog

_KEEP_BARRIERS = 10


def run_mark(cat: "Catalog", job: str) -> int:
    """Step 1: the newest decision number of ``job`` (0 if none). Decisions above it are this run's."""
    d = S.trigger_decisions.c
    with cat.backend.read() as conn:
        return int(conn.execute(sa.select(sa.func.max(d.decision_id)).where(d.job_id == job)).scalar() or 0)


def decide(cat: "Catalog", job: str, start: int, call_no: int, compute: Callable[[], int], *, mark: int) -> int:
    """Step 2: the barrier the trigger of call ``call_no`` at ``start`` reads up to.

    ``compute`` gives the caller's own answer; it is used only when no source
    of this run (decision number above ``mark``) has decided this call yet.
    """
    t = S.trigger_decisions
    key = (t.c.job_id == job, t.c.start_barrier == start, t.c.call_no == call_no)
    with cat.backend.read() as conn:
        row = conn.execute(sa.select(t.c.end_barrier, t.c.decision_id).where(*key)).first()
    if row is not None and int(row[1]) > mark:
        return int(row[0])
    end = max(start, compute())
    try:
        with cat.backend.write() as conn:
            conn.execute(sa.delete(t).where(*key, t.c.decision_id <= mark))
            conn.execute(sa.insert(t).values(job_id=job, start_barrier=start, call_no=call_no, end_barrier=end,
                                             created_at=time.time()))
            # step 4: decisions of batches long done are of no use
            conn.execute(sa.delete(t).where(t.c.job_id == job, t.c.start_barrier < start - _KEEP_BARRIERS))
        return end
    except sa.exc.IntegrityError:  # another source of this run decided first
        with cat.backend.read() as conn:
            return int(conn.execute(sa.select(t.c.end_barrier).where(*key)).scalar_one())


def batch_end(cat: "Catalog", job: str, start: int) -> int | None:
    """Step 3: the barrier the job's micro-batch after ``start`` read up to (None: it read nothing)."""
    d = S.trigger_decisions.c
    with cat.backend.read() as conn:
        row = conn.execute(sa.select(d.end_barrier)
                           .where(d.job_id == job, d.start_barrier == start, d.end_barrier > start)
                           .order_by(d.decision_id.desc()).limit(1)).first()
    return None if row is None else int(row[0])
