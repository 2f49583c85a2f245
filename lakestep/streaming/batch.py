"""Deprecated: renamed lakestep.streaming.batch_io (Spark batch reads and writes of the ``lakestep``
format, not a micro-batch); removed in lakestep 0.3.0. This module only re-exports it.
"""

import warnings

from .batch_io import LakestepBatchReader, LakestepBatchWriter, PlanPartition, read_plan, write_barrier

__all__ = ["LakestepBatchReader", "LakestepBatchWriter", "PlanPartition", "read_plan", "write_barrier"]

warnings.warn("lakestep.streaming.batch is deprecated (removed in 0.3.0): import from lakestep.streaming.batch_io",
              DeprecationWarning, stacklevel=2)
