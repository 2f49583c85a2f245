"""The open epoch: its one owner, for the catalog and the barrier layer alike.

The catalog sits below the barrier layer and may not import it, yet both
need the open epoch: the catalog's commit path stamps root commits with it,
the barrier layer seals it and reads barriers against it. This module holds
everything about it that is not the sealing protocol (barrier/sealing.py):

1. ``OPEN_EPOCH`` (-1), the placeholder a root commit carries: "stamp me
   with the open epoch of my own commit transaction";
2. the reads of row ``ls_epoch``: :func:`read` (open epoch and when it
   opened), :func:`open_epoch`, and :func:`read_for_commit`, the commit
   path's read under the lock that sealing waits for (FOR SHARE on
   PostgreSQL; SQLite has one writer), also as SQL text for a CTE
   (:data:`FOR_COMMIT_SQL`); :data:`LOCK_FOR_SEAL` is the seal's FOR UPDATE;
3. :func:`stamp`, the substitution of the placeholder;
4. :func:`sealed`, the newest sealed barrier ``O - 1``: barriers below the
   open epoch are sealed, and a seal never reopens one.

Not guaranteed: a plain :func:`read` outside a commit may be one seal behind
by the time it is used; only :func:`read_for_commit` inside the commit's
transaction is fenced against a seal.
"""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql
from sqlalchemy.engine import Connection

from . import schema as S

#: A commit with this barrier is stamped with the catalog's open epoch, read in
#: the commit's own database transaction under a lock that sealing waits for.
OPEN_EPOCH = -1

_ROW = sa.select(S.epoch.c.open_epoch, S.epoch.c.opened_at).where(S.epoch.c.id == 1)
#: The seal's lock of the epoch row (it waits for every root commit in flight).
LOCK_FOR_SEAL = _ROW.with_for_update()
#: The commit path's read: FOR SHARE on PostgreSQL (a seal's FOR UPDATE waits for it).
READ_FOR_COMMIT = sa.select(S.epoch.c.open_epoch).where(S.epoch.c.id == 1).with_for_update(read=True)
#: :data:`READ_FOR_COMMIT` as PostgreSQL text, for a CTE of a one-statement commit.
FOR_COMMIT_SQL = str(READ_FOR_COMMIT.compile(dialect=postgresql.dialect(), compile_kwargs={"literal_binds": True}))


def read(conn: Connection) -> tuple[int, float]:
    """(open epoch, when it was opened), as the database clock recorded it."""
    r = conn.execute(_ROW).one()
    return int(r[0]), float(r[1])


def open_epoch(conn: Connection) -> int:
    """The open epoch ``O``: barriers below it are sealed."""
    return read(conn)[0]


def read_for_commit(conn: Connection) -> int:
    """The open epoch, read inside a commit's own database transaction under the lock
    that sealing waits for: once a seal commits, no commit can carry its barrier."""
    return int(conn.execute(READ_FOR_COMMIT).scalar_one())


def stamp(barrier: int | None, open_: int) -> int | None:
    """The barrier a commit records: ``open_`` for the placeholder, else ``barrier`` as given."""
    return open_ if barrier == OPEN_EPOCH else barrier


def sealed(open_: int) -> int:
    """The newest sealed barrier, ``O - 1`` (0: none sealed yet)."""
    return open_ - 1
