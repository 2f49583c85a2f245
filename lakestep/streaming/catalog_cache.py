"""The catalog a Spark data source's options name, opened once per process.

Spark reuses its driver-side Python workers (the planners and committers of the
``lakestep`` source and sink, :class:`~lakestep.streaming.DerivedJob`), so a
:class:`~lakestep.catalog.Catalog`, with its connection pool and its caches, is
kept per URL and storage options for the life of the process
(:func:`open_catalog`), with one :class:`~lakestep.barrier.Pipeline` on it
(:func:`pipeline_of`): its topology graph and table ids stay cached between
micro-batches (checked against the topology's generation on every use), so a
batch's plan and commit do not read the jobs again. No pyspark here.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any

from ..catalog import Catalog
from ..catalog.storage import Storage
from ..errors import InvalidArgumentError

if TYPE_CHECKING:
    from ..barrier import Pipeline

_catalogs: dict[tuple[str, Storage], Catalog] = {}
_pipelines: dict[int, "Pipeline"] = {}  # by id() of a cached catalog (cached catalogs are never dropped)
_lock = threading.Lock()


def required(options: Any, key: str) -> str:
    """The option ``key`` of a ``lakestep`` source or sink; :class:`InvalidArgumentError` when missing."""
    value = options.get(key)
    if not value:
        raise InvalidArgumentError(f"the lakestep format needs option {key!r}", argument=key, value=value)
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


def pipeline_of(url: str, storage: Storage | None = None) -> "Pipeline":
    """The :class:`~lakestep.barrier.Pipeline` of :func:`open_catalog`'s catalog, one per process."""
    from ..barrier import Pipeline

    cat = open_catalog(url, storage)
    with _lock:
        p = _pipelines.get(id(cat))
        if p is None:
            p = _pipelines[id(cat)] = Pipeline(cat)
        return p
