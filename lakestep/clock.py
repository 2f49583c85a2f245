"""Where lakestep reads the time: an injectable clock (docs/design.md §6.1).

Every age, lease and expiry the catalog and the barrier layer decide on is
read from the catalog's clock (``Catalog(..., clock=...)``), never from
:func:`time.time` directly. A clock answers three questions:

* :meth:`Clock.now`: wall seconds since the Unix epoch on this host: commit
  times, snapshot and lock expiry, the retention window, orphan ages, TTL;
* :meth:`Clock.shared_now`: the time every host agrees on, read inside a
  database transaction: the coordinator's lease, when an epoch opened and
  was sealed. :class:`SystemClock` asks the database server, so that
  coordinators on several hosts agree on expiry whatever their own clocks say;
* :meth:`Clock.monotonic`: intervals inside one process (when the
  coordinator renews its lease).

Production uses :class:`SystemClock` (the default). Tests use
:class:`ManualClock`, whose three answers are one number that only moves when
the test moves it: a lease lapses, a snapshot expires, a file leaves the
retention window exactly when the test says, however loaded the machine is.

Example::

    clock = ManualClock()
    cat = Catalog(warehouse="./wh", clock=clock)
    t.create_snapshot("short", retain_seconds=60)
    clock.advance(60)                 # now the snapshot has expired
"""

from __future__ import annotations

import datetime as dt
import time
from typing import TYPE_CHECKING

from .errors import InvalidArgumentError, QueryError

if TYPE_CHECKING:
    from sqlalchemy.engine import Connection

_DB_NOW = {
    "sqlite": "SELECT (julianday('now') - 2440587.5) * 86400.0",
    "postgresql": "SELECT EXTRACT(EPOCH FROM clock_timestamp())::float8",
}


def parse_timestamp(text: str, what: str = "TIMESTAMP AS OF") -> dt.datetime:
    """An ISO timestamp to travel to (``TIMESTAMP AS OF``, the option ``timestampAsOf``), UTC when
    it names no zone; :class:`~lakestep.errors.QueryError` naming ``what`` when it is none."""
    try:
        ts = dt.datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    except ValueError:
        raise QueryError(f"{what} needs an ISO timestamp, got {text!r}") from None
    return ts if ts.tzinfo is not None else ts.replace(tzinfo=dt.timezone.utc)


def database_now(conn: "Connection") -> float:
    """The database server's clock, in seconds since the Unix epoch."""
    return float(conn.exec_driver_sql(_DB_NOW[conn.dialect.name]).scalar_one())


class Clock:
    """The interface (see the module docstring)."""

    def now(self) -> float:
        raise NotImplementedError

    def shared_now(self, conn: "Connection") -> float:
        raise NotImplementedError

    def monotonic(self) -> float:
        raise NotImplementedError


class SystemClock(Clock):
    """This host's clock; the database server's for :meth:`shared_now`."""

    def now(self) -> float:
        return time.time()

    def shared_now(self, conn: "Connection") -> float:
        return database_now(conn)

    def monotonic(self) -> float:
        return time.monotonic()

    def __repr__(self) -> str:
        return "SystemClock()"


SYSTEM_CLOCK = SystemClock()


class ManualClock(Clock):
    """A clock that stands still until told to move (tests). All three readings are
    the same number; it never goes back."""

    # 2020-09-13: a whole number, so ages compute exactly; in the past, so a file written now
    # (its mtime is the real time) looks young to cleanup unless a test ages it on purpose
    START = 1_600_000_000.0

    def __init__(self, start: float = START) -> None:
        self._t = float(start)

    def now(self) -> float:
        return self._t

    def shared_now(self, conn: "Connection") -> float:
        return self._t

    def monotonic(self) -> float:
        return self._t

    def advance(self, seconds: float) -> float:
        """Move forward by ``seconds`` (>= 0); returns the new time."""
        if not seconds >= 0:
            raise InvalidArgumentError(f"a clock moves forward: advance({seconds!r})", argument="seconds",
                                       value=seconds)
        self._t += float(seconds)
        return self._t

    def set(self, t: float) -> None:
        """Jump to ``t`` (not earlier than now)."""
        if not t >= self._t:
            raise InvalidArgumentError(f"a clock moves forward: set({t!r}) is before {self._t!r}", argument="t",
                                       value=t)
        self._t = float(t)

    def __repr__(self) -> str:
        return f"ManualClock({self._t!r})"
