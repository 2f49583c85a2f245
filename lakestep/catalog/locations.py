"""Table locations never overlap, so no table can delete another's files.

A table's files live under its location, and ``drop_table(purge=True)`` and
``cleanup()`` delete there. Paths are compared as *real* paths: on local
storage every symlink is resolved first, so a link inside the warehouse that
points elsewhere is judged by where it points.

1. **At create** (:func:`check_new_location`, run by ``Catalog.create_table``
   under the catalog lock, so two concurrent creates cannot both pass): a
   location must not contain, equal or lie inside another table's location,
   the warehouse root or the catalog database file (SQLite), and must lie
   inside the warehouse unless the table is external. No existing component
   of it may be a file (:func:`check_not_under_file`).
2. **At deletion** (:func:`Deletions`): purge and cleanup delete only the
   files the catalog recorded for the table, and orphans under the table's
   own ``data/`` prefix. A path is deleted only if its real path still lies
   under the table's real ``data/`` directory (a symlink under ``data/`` is
   never followed out of it), is not inside another table's real location,
   and is not the catalog file or one of its sidecars (``-wal``, ``.lock``).
3. A catalog made by an older lakestep may already hold overlapping tables,
   and a symlink may be changed after a table was created: step 2 is checked
   again at every deletion, against the locations in the catalog then.

Not guaranteed: object stores have no symlinks, and their paths are compared
as written (``s3://b/x`` and ``s3a://b/x`` are different places to this
check). Writers follow a symlink changed after create; only deletions are
guarded against it (step 3).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterable

from ..errors import InvalidLocationError, LocationOverlapError

if TYPE_CHECKING:
    from .writer import FileWriter


def is_remote(location: str) -> bool:
    return "://" in location


def real(location: str) -> str:
    """``location`` with every symlink resolved (local storage); a URI as it is."""
    return location if is_remote(location) else os.path.realpath(location)


def inside(path: str, root: str) -> bool:
    """True if ``path`` is ``root`` or lies under it (both real, normalized)."""
    return path == root or path.startswith(root.rstrip("/") + "/")


def check_not_under_file(location: str) -> None:
    """Refuse a local location that is a file, or lies under one (it could never hold files)."""
    if is_remote(location):
        return
    path = location
    while True:
        if os.path.lexists(path):
            if not os.path.isdir(path):  # a file, or a dangling or file symlink
                what = "is a file" if path == location else f"lies under the file {path!r}"
                raise InvalidLocationError(
                    f"location {location!r} {what}: a table or warehouse location must be a directory; "
                    "choose another path, or move the file away", location=location)
            return
        parent = os.path.dirname(path)
        if parent == path:
            return
        path = parent


def check_new_location(
    location: str,
    *,
    warehouse: str,
    catalog_file: str | None,
    tables: Iterable[tuple[str, str]],
    external: bool,
) -> None:
    """Step 1: refuse a location that overlaps anything ``tables`` (ident, location) holds."""
    check_not_under_file(location)
    loc, wh = real(location), real(warehouse)
    if not external and not inside(loc, wh):
        raise InvalidLocationError(
            f"location {location!r} is outside the warehouse {warehouse!r}" + (
                f" (it resolves to {loc!r})" if loc != location else "")
            + "; pass external=True to create an external table there", location=location)
    if inside(wh, loc):
        _overlap(location, loc, "the warehouse root", wh, "it would contain every table and the catalog")
    if catalog_file is not None and inside(real(catalog_file), loc):
        _overlap(location, loc, "the catalog file", real(catalog_file), "purging it would delete the catalog")
    for ident, other in tables:
        o = real(other)
        if inside(loc, o) or inside(o, loc):
            _overlap(location, loc, f"table {ident}", o, "cleaning up or purging one would delete the other's files")


def _overlap(location: str, loc: str, other: str, other_loc: str, why: str) -> None:
    raise LocationOverlapError(
        f"location {location!r} (real path {loc!r}) overlaps {other} at {other_loc!r}: {why}. Choose a "
        "location that neither contains nor lies inside another table's location, the warehouse root or the "
        "catalog file",
        location=location, other=other, other_location=other_loc)


@dataclass(frozen=True)
class Deletions:
    """Step 2: which paths a purge or cleanup of one table may delete.

    All real paths: ``root`` the table's location, ``data_root`` its ``data/``
    directory, ``foreign`` the other tables' locations that could lie inside
    it, ``catalog_file`` the SQLite catalog. On an object store (``remote``)
    paths are the filesystem's as written (``bucket/key``: no symlinks to
    resolve, and never a local path).
    """

    root: str
    data_root: str
    foreign: tuple[str, ...]
    catalog_file: str | None
    remote: bool = False

    @classmethod
    def of(cls, writer: "FileWriter", *, others: Iterable[str], catalog_file: str | None) -> "Deletions":
        """For the table ``writer`` writes, beside the other tables' locations ``others``.

        Paths are spelled as the writer spells them (``writer.full_path``). A
        location that contains the table's (a table at the warehouse root) is
        an ancestor, not a stranger: the table's files are its own even though
        they lie inside it.
        """
        location = writer.location
        if is_remote(location):
            own = writer.full_path("").rstrip("/")
            foreign = tuple(own if o == location else writer.full_path(o[len(location) + 1:])
                            for o in others if inside(o, location))
            return cls(own, writer.full_path("data"), foreign, None, remote=True)
        own = real(location)
        foreign = tuple(f for f in map(real, others) if inside(f, own))
        return cls(own, real(writer.full_path("data")), foreign, None if catalog_file is None else real(catalog_file))

    def _catalog(self, p: str) -> bool:
        # the catalog's sidecars share its name as a prefix (catalog.db-wal, catalog.db.lock)
        return self.catalog_file is not None and p.startswith(self.catalog_file)

    def _real(self, full_path: str) -> str:
        return full_path if self.remote else real(full_path)

    def allows_recorded(self, full_path: str) -> bool:
        """A file the catalog recorded for the table: deleted if it still resolves inside the table."""
        p = self._real(full_path)
        return inside(p, self.root) and p != self.root and not self._catalog(p)

    def allows_orphan(self, full_path: str) -> bool:
        """A file no commit recorded: deleted only inside the table's own ``data/``, and no one else's."""
        p = self._real(full_path)
        if not inside(p, self.data_root) or p == self.data_root or self._catalog(p):
            return False
        return not any(inside(p, f) for f in self.foreign)
