"""Barriers: epochs, the job topology, per-table states, consistent reads, rollback.

No pyspark here: the barrier protocol works, and is tested, with no JVM. The coordinator
that seals epochs runs it as a service (:class:`lakestep.services.Coordinator`).

* :class:`Pipeline` - the whole API of one catalog in one object;
* :class:`Topology` - jobs, their source and sink tables, lineage (topology.py);
* epochs, leases, seals and barrier snapshots (sealing.py), which the coordinator
  service (lakestep/services/coordinator.py) drives;
* derived jobs plan and commit barrier batches with :class:`BatchPlan` and
  :class:`JobBatch` (jobs.py); root jobs commit with ``barrier=OPEN_EPOCH``;
* reads choose versions with :meth:`Pipeline.choose` (choose.py);
* :meth:`Pipeline.rollback` rolls the topology back to a barrier (rollback.py);
* :meth:`Pipeline.status` and :func:`diagnose` give the operator's view: where
  each table stands, lag, health checks (status.py, health.py).

How states are derived from commits and seals: the rules in rules.py (each defined once), applied by
progress.py to the facts facts.py reads.
"""

from ..catalog.epoch import OPEN_EPOCH
from .choose import Choice, Explanation, Level, Scope, TableChoice
from .errors import (
    BarrierError,
    BarrierNotRetainedError,
    CycleError,
    JobNotFoundError,
    NoSnapshotError,
    NotCoordinatorError,
    RollbackRefusedError,
    RollbackRetriesExhaustedError,
    StaleBatchError,
    TopologyError,
)
from .graph import Graph, Job, TableKind
from .health import Diagnosis, Finding, diagnose
from .jobs import BatchPlan, BatchResult, JobBatch, SourceRange
from .pipeline import Pipeline
from .progress import BarrierState
from .rollback import RollbackResult, TableRollback
from .sealing import Lease, Seal
from .status import JobLag, LagSample, Status, TableStatus, lag_history, status
from .topology import DOWNSTREAM_SQL, UPSTREAM_SQL, Topology

__all__ = [
    "OPEN_EPOCH",
    "Pipeline",
    "Topology",
    "Job",
    "Graph",
    "TableKind",
    "DOWNSTREAM_SQL",
    "UPSTREAM_SQL",
    "Lease",
    "Seal",
    "BarrierState",
    "BatchPlan",
    "BatchResult",
    "JobBatch",
    "SourceRange",
    "Choice",
    "Explanation",
    "TableChoice",
    "Level",
    "Scope",
    "Status",
    "TableStatus",
    "JobLag",
    "LagSample",
    "status",
    "lag_history",
    "Diagnosis",
    "Finding",
    "diagnose",
    "RollbackResult",
    "TableRollback",
    "BarrierError",
    "BarrierNotRetainedError",
    "CycleError",
    "JobNotFoundError",
    "NoSnapshotError",
    "NotCoordinatorError",
    "RollbackRefusedError",
    "RollbackRetriesExhaustedError",
    "StaleBatchError",
    "TopologyError",
]

