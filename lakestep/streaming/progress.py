"""Deprecated: lakestep.streaming.progress held two things, now in their own modules; removed in lakestep 0.3.0.

* the commit of a micro-batch and the job registration it needs:
  :mod:`lakestep.streaming.microbatch` (``commit_batch``,
  ``ensure_sink_registered``, ``ensure_source_registered``);
* the process-wide catalog cache and the options that name a catalog:
  :mod:`lakestep.streaming.catalog_cache` (``open_catalog``, ``required``,
  ``storage_of``).

Import from those; this module only re-exports them.
"""

import warnings

from .catalog_cache import open_catalog, required, storage_of
from .microbatch import commit_batch, ensure_sink_registered, ensure_source_registered

__all__ = ["commit_batch", "ensure_sink_registered", "ensure_source_registered", "open_catalog", "required",
           "storage_of"]

warnings.warn("lakestep.streaming.progress is deprecated (removed in 0.3.0): import from "
              "lakestep.streaming.microbatch and lakestep.streaming.catalog_cache", DeprecationWarning, stacklevel=2)
