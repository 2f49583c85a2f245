"""The one base of lakestep's long-running services: a loop of rounds, in a thread or not.

The coordinator (coordinator.py), the maintenance loop (maintenance.py) and the Iceberg
publisher's loop (publisher.py) are each a :class:`Service` that says what one round is;
the base runs the rounds:

1. :meth:`Service.run` calls :meth:`Service.round` until :meth:`Service.stop`,
   ``max_rounds`` rounds, ``duration`` seconds, or :meth:`Service.enough` says so; between
   rounds it sleeps :meth:`Service.pause` seconds, woken early by :meth:`Service.stop` or
   :meth:`Service.wake`.
2. While the catalog database is unavailable a round waits through
   :func:`lakestep.retry.retrying` (the service's ``retry`` policy: bounded exponential
   backoff, one log line when the wait starts and one when it ends) and is then run again
   from its start: each service's round plans afresh from what the catalog holds, so
   redoing one whose outcome was lost is safe. When the policy has a deadline and the
   database stayed away longer, :class:`~lakestep.errors.CatalogWaitExpiredError` ends
   the loop; a stop while waiting ends it quietly.
3. Any other error of a round: a service with ``survives_errors`` (maintenance,
   publishing) logs it with its traceback, counts the round and goes on next interval;
   the coordinator does not (its round is a fenced seal: an error there is a bug to see).
4. On the way out of :meth:`Service.run` (however it ends) :meth:`Service.finish` runs
   once: a service gives its lease up there, so a standby takes over at once.
5. :meth:`Service.start` runs :meth:`Service.run` in a daemon thread (a running service's
   ``start`` returns its thread); :meth:`Service.stop` stops the loop and joins the thread.
   A stopped service may be started again.
6. :meth:`Service.health` says whether it runs, its rounds and errors, when the last round
   ended, the last error, and whether it is waiting for the database.

Not guaranteed: a round in progress is not interrupted by :meth:`Service.stop` (the join
waits for it, up to ``timeout``); the interval is the pause *between* rounds, not a
period.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable

from .. import retry as _retry
from ..errors import CatalogUnavailableError

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ServiceHealth:
    """What :meth:`Service.health` reports."""

    name: str
    running: bool  # its thread is alive (False when it runs in the caller's thread and is idle)
    rounds: int
    errors: int  # rounds that failed with an error other than the database's absence
    last_round_at: float | None  # time.time() when the last round ended (None: none yet)
    last_error: str | None  # "<type>: <message>" of the last failed round
    waiting_for_database: bool


class Service:
    """A loop of rounds (module docstring). Subclasses define :meth:`round` and may override
    :meth:`pause`, :meth:`enough` and :meth:`finish`."""

    #: A round's error other than the database's absence is logged and the loop goes on (step 3).
    survives_errors = True

    def __init__(self, name: str, *, interval: float, retry: _retry.RetryPolicy) -> None:
        self.name = name
        self.interval = float(interval)
        self.retry = retry
        self.rounds = 0
        self.errors = 0
        self.last_round_at: float | None = None
        self.last_error: str | None = None
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._outage: _retry.Wait | None = None

    # ------------------------------------------------------------ what a service says
    def round(self) -> Any:
        """One round; its result goes to ``on_round`` and into :meth:`run`'s list."""
        raise NotImplementedError

    def pause(self, result: Any) -> float:
        """Seconds to sleep after a round that returned ``result`` (None after a failed one)."""
        return self.interval

    def enough(self, result: Any) -> bool:
        """True to end the loop after a round that returned ``result``."""
        return False

    def finish(self) -> None:
        """Runs once when the loop ends (step 4): give leases up."""

    # ------------------------------------------------------------------ the loop
    def run(self, *, max_rounds: int | None = None, duration: float | None = None,
            on_round: Callable[[Any], None] | None = None) -> list[Any]:
        """Rounds until :meth:`stop`, ``max_rounds`` rounds, ``duration`` seconds or :meth:`enough`
        (steps 1-4); returns the results of the rounds that succeeded."""
        results: list[Any] = []
        first = self.rounds
        deadline = None if duration is None else time.monotonic() + duration
        self._outage = _retry.Wait(self.retry, self.name, stop=self._stop, logger=log)
        try:
            while not self._stop.is_set():
                if deadline is not None and time.monotonic() >= deadline:
                    break
                result = None
                try:
                    result = _retry.retrying(self.round, policy=self.retry, what=self._outage.what,
                                             wait=self._outage, redo_unknown=True)
                except CatalogUnavailableError:
                    if self._stop.is_set():  # stopped while waiting for the database
                        break
                    raise  # gave up waiting: the policy's deadline passed (CatalogWaitExpiredError)
                except Exception as e:
                    if not self.survives_errors:
                        raise
                    self.rounds += 1
                    self.errors += 1
                    self.last_error = f"{type(e).__name__}: {e}"
                    log.exception("%s: round %d failed", self.name, self.rounds)
                else:
                    self.rounds += 1
                    self.last_round_at = time.time()
                    results.append(result)
                    if on_round is not None:
                        on_round(result)
                    if self.enough(result):
                        break
                if max_rounds is not None and self.rounds - first >= max_rounds:
                    break
                wait = self.pause(result)
                if deadline is not None:
                    wait = min(wait, max(0.0, deadline - time.monotonic()))
                if wait > 0 and self._wake.wait(wait):
                    self._wake.clear()
        finally:
            self._outage = None
            self._stop.clear()
            self.finish()
        return results

    def start(self) -> threading.Thread:
        """Run :meth:`run` in a daemon thread (step 5)."""
        if self._thread is not None and self._thread.is_alive():
            return self._thread
        self._stop.clear()
        self._thread = threading.Thread(target=self.run, name=f"lakestep-{self.name}", daemon=True)
        self._thread.start()
        return self._thread

    def stop(self, timeout: float | None = 10.0) -> None:
        """Stop the loop and wait up to ``timeout`` seconds for its thread to end."""
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None

    def wake(self) -> None:
        """End the current pause early (the next round starts now)."""
        self._wake.set()

    def health(self) -> ServiceHealth:
        outage = self._outage
        return ServiceHealth(self.name, self._thread is not None and self._thread.is_alive(), self.rounds,
                             self.errors, self.last_round_at, self.last_error,
                             outage is not None and outage.waiting)
