"""The catalog a Spark data source's options name, opened once per process.

Spark reuses its driver-side Python workers (the planners and committers of the
``lakestep`` source and sink, :class:`~lakestep.streaming.DerivedJob`), so a
:class:`~lakestep.catalog.Catalog`, with its connection pool and its caches, is
kept per URL and storage options for the life of the process
(:func:`open_catalog`). No pyspark here.
"""

from __future__ import annotations

import threading
from typing import Any

from ..catalog import Catalog
from ..catalog.storage import Storage
from ..errors import InvalidArgumentError

_catalogs: dict[tuple[str, Storage], Catalog] = {}
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
