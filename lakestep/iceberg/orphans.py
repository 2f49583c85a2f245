"""Metadata files no Iceberg metadata names (publisher.py, crash safety): swept once old enough.

* :func:`sweep_orphans` deletes the files under a table's ``metadata/`` that its
  metadata does not name and that are older than :data:`ORPHAN_SECONDS` (left by
  commits that never swapped); :meth:`Publisher.sweep <lakestep.iceberg.Publisher.sweep>`
  runs it on each table's first round, then every ``sweep_every`` rounds;
* :func:`delete_metadata_dir` removes the metadata of an Iceberg table whose
  lakestep table was dropped.
"""

from __future__ import annotations

import datetime as dt
import logging
import os
from typing import TYPE_CHECKING

import pyarrow.fs as pafs

if TYPE_CHECKING:
    from ..catalog import Catalog
    from ..catalog.storage import Storage
    from .metadata import IcebergTable
    from .planning import Row

log = logging.getLogger("lakestep.iceberg.publisher")  # the publisher's logger (the module it was split from)

#: A file under a table's ``metadata/`` that no metadata names is deleted once this old.
ORPHAN_SECONDS = 600.0


def sweep_orphans(catalog: "Catalog", row: "Row", pub: "IcebergTable") -> list[str]:
    """Delete files under the table's ``metadata/`` that its metadata does not name and
    that are older than :data:`ORPHAN_SECONDS` (left by commits that never swapped)."""
    if not pub.metadata_location:
        return []
    fs, root = catalog.storage.filesystem(row.meta.location)
    base = f"{root.rstrip('/')}/metadata"
    try:
        infos = fs.get_file_info(pafs.FileSelector(base, recursive=True, allow_not_found=True))
    except OSError as e:
        log.warning("could not list %s: %s", base, e)
        return []
    known = {plain(p) for p in pub.referenced()}
    cutoff = catalog.clock.now() - ORPHAN_SECONDS
    gone = []
    for i in infos:
        if i.type != pafs.FileType.File:
            continue
        full = i.path if "://" not in row.meta.location else f"{row.meta.location.split('://', 1)[0]}://{i.path}"
        mtime = i.mtime.timestamp() if isinstance(i.mtime, dt.datetime) else 0.0
        if plain(full) in known or mtime + 1.0 > cutoff:
            continue
        try:
            fs.delete_file(i.path)
            gone.append(i.path)
        except OSError:
            pass
    if gone:
        log.info("swept %d orphan metadata file(s) of %s", len(gone), row.ident)
    return gone


def delete_metadata_dir(storage: "Storage", metadata_location: str) -> None:
    """Delete every file of the directory of ``metadata_location`` (and the directory, on a local disk)."""
    base = metadata_location.rsplit("/", 1)[0]
    fs, path = storage.filesystem(base[len("file://"):] if base.startswith("file://") else base)
    try:
        infos = fs.get_file_info(pafs.FileSelector(path, recursive=True, allow_not_found=True))
    except OSError:
        return
    for i in infos:
        if i.type == pafs.FileType.File:
            try:
                fs.delete_file(i.path)
            except OSError:
                pass
    if "://" not in base or base.startswith("file://"):
        try:
            os.rmdir(path)
        except OSError:
            pass


def plain(uri: str) -> str:
    """``uri`` without its scheme (``file://`` or another)."""
    return uri[len("file://"):] if uri.startswith("file://") else uri.split("://", 1)[-1]
