"""The exceptions of the barrier coordinator, all under :class:`BarrierError`.

Each carries the facts as attributes (job, tables, barriers, lease tokens) so
that callers can decide without parsing messages.
"""

from __future__ import annotations

from typing import Sequence

from ..errors import LakestepError


class BarrierError(LakestepError):
    """Root of every error of ``lakestep.barrier``."""


class TopologyError(BarrierError):
    """A job registration that would make the topology invalid. Nothing was changed."""

    def __init__(self, job_id: str, reason: str) -> None:
        super().__init__(f"job {job_id!r}: {reason}")
        self.job_id = job_id
        self.reason = reason


class CycleError(TopologyError):
    """Registering the job would close a cycle; ``cycle`` lists its tables, first == last."""

    def __init__(self, job_id: str, cycle: Sequence[str]) -> None:
        super().__init__(job_id, "would close a cycle: " + " -> ".join(cycle))
        self.cycle = list(cycle)


class JobNotFoundError(BarrierError):
    def __init__(self, job_id: str) -> None:
        super().__init__(f"job {job_id!r} is not registered (or is retired)")
        self.job_id = job_id


class NotCoordinatorError(BarrierError):
    """This process does not hold the coordinator lease (any more): it must not seal.

    ``holder``/``token`` are what this process presented; ``current_holder``,
    ``current_token`` and ``expires_at`` what the catalog holds.
    """

    def __init__(self, *, holder: str, token: int, current_holder: str | None, current_token: int,
                 expires_at: float) -> None:
        super().__init__(
            f"coordinator {holder!r} (token {token}) does not hold the lease: it is held by "
            f"{current_holder!r} with token {current_token}, expiring at {expires_at:.3f}"
        )
        self.holder = holder
        self.token = token
        self.current_holder = current_holder
        self.current_token = current_token
        self.expires_at = expires_at


class RollbackRefusedError(BarrierError):
    """A rollback below the newest SNAPSHOT barrier: snapshots are never rolled back."""

    def __init__(self, *, to_barrier: int, snapshot_barrier: int, table: str) -> None:
        super().__init__(
            f"cannot roll back to barrier {to_barrier}: table {table!r} has a snapshot of barrier "
            f"{snapshot_barrier}, and snapshots are never rolled back"
        )
        self.to_barrier = to_barrier
        self.snapshot_barrier = snapshot_barrier
        self.table = table


class RollbackRetriesExhaustedError(BarrierError):
    """The topology kept gaining tables between a rollback's reading and its locking;
    nothing was rolled back. Retry when job registrations have settled."""

    def __init__(self, *, to_barrier: int, attempts: int) -> None:
        super().__init__(f"rollback to barrier {to_barrier}: the topology kept changing during the rollback "
                         f"({attempts} attempts); nothing was rolled back")
        self.to_barrier = to_barrier
        self.attempts = attempts


class StaleBatchError(BarrierError):
    """A derived job's batch no longer matches the catalog (a rollback, another instance
    of the job, a sink written by someone else). Nothing was committed; plan again."""

    def __init__(self, *, job_id: str, barrier: int, table: str, reason: str) -> None:
        super().__init__(f"batch of job {job_id!r} for barrier {barrier} is stale ({table}): {reason}")
        self.job_id = job_id
        self.barrier = barrier
        self.table = table
        self.reason = reason


class NoSnapshotError(BarrierError):
    """``repeatable_read`` found no barrier that is a SNAPSHOT of every table asked for."""

    def __init__(self, tables: Sequence[str], missing: str) -> None:
        super().__init__(
            f"no barrier is a snapshot of all of {list(tables)}: {missing!r} has none in common with the others"
        )
        self.tables = list(tables)
        self.missing = missing


class BarrierNotRetainedError(BarrierError):
    """A barrier older than the oldest retained one (the since-frontier), or whose
    commit records cleanup has pruned: it is no longer addressable."""

    def __init__(self, table: str, barrier: int, since: int | None) -> None:
        extra = f" (the oldest retained barrier is {since})" if since is not None else ""
        super().__init__(f"table {table!r} cannot be read at barrier {barrier}: not retained{extra}")
        self.table = table
        self.barrier = barrier
        self.since = since


__all__ = [
    "BarrierError",
    "TopologyError",
    "CycleError",
    "JobNotFoundError",
    "NotCoordinatorError",
    "RollbackRefusedError",
    "RollbackRetriesExhaustedError",
    "StaleBatchError",
    "NoSnapshotError",
    "BarrierNotRetainedError",
]
