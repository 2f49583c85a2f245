"""Barriers: epochs, the job topology, per-table states, consistent reads, rollback.

No pyspark here: the barrier coordinator works, and is tested, with no JVM.

* :class:`Pipeline` - the whole API of one catalog in one object;
* :class:`Topology` - jobs, their source and sink tables, lineage (topology.py);
* :class:`Coordinator` - seals epochs and snapshots committed barriers, in a
  thread or as ``python -m lakestep.barrier.coordinator`` (coordinator.py);
* derived jobs plan and commit barrier batches with :class:`BatchPlan` and
  :class:`JobBatch` (jobs.py); root jobs commit with ``barrier=OPEN_EPOCH``;
* reads choose versions with :meth:`Pipeline.choose` (choose.py);
* :meth:`Pipeline.rollback` rolls the topology back to a barrier (rollback.py);
* :meth:`Pipeline.status` and :func:`diagnose` give the operator's view: where
  each table stands, lag, health checks (status.py, health.py).

How states are derived from commits and seals: the rules in rules.py (each defined once), applied by
states.py to the facts facts.py reads.
"""

from typing import TYPE_CHECKING

from ..catalog.epoch import OPEN_EPOCH
from .choose import Choice, Explanation, Level, Scope, TableChoice
from .epochs import Lease, Seal
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
from .rollback import RollbackResult, TableRollback
from .states import BarrierState
from .status import LagSample, Status, TableStatus, lag_history, status
from .topology import DOWNSTREAM_SQL, UPSTREAM_SQL, Topology

if TYPE_CHECKING:  # for type checkers; loaded lazily by __getattr__ at run time
    from .coordinator import Coordinator, Tick

__all__ = [
    "OPEN_EPOCH",
    "Pipeline",
    "Topology",
    "Job",
    "Graph",
    "TableKind",
    "DOWNSTREAM_SQL",
    "UPSTREAM_SQL",
    "Coordinator",
    "Tick",
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


def __getattr__(name: str) -> object:
    # Imported on first use, so that ``python -m lakestep.barrier.coordinator``
    # does not find its own module already imported by the package.
    if name in ("Coordinator", "Tick"):
        from . import coordinator

        return getattr(coordinator, name)
    raise AttributeError(name)
