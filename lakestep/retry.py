"""Waiting out an outage of the catalog database: one policy for every long-running part.

Streaming sinks and sources, the coordinator and the maintenance loop run for
days; the catalog database may go away meanwhile (PostgreSQL restarted or
failed over, a SQLite file that another process holds locked). They all wait
the same way, through :func:`retrying` and a :class:`RetryPolicy`:

1. a call fails with :class:`CatalogUnavailableError`: the wait starts and
   one line is logged (WARNING: who waits, the database's error, the
   deadline);
2. the call is made again after a delay that doubles from ``initial`` up to
   ``max_delay`` (bounded exponential backoff); the failures in between are
   logged at DEBUG only;
3. the first call that succeeds ends the wait: one line is logged (INFO: how
   long it waited, how many attempts failed);
4. when ``deadline`` seconds have passed since the wait started (or
   ``attempts`` attempts failed), it gives up with
   :class:`~lakestep.errors.CatalogWaitExpiredError`, a
   ``CatalogUnavailableError`` that says who waited, how long and how often.

**Commits inside a wait.** A catalog commit made inside :func:`retrying`
waits under the same wait (one pair of log lines, one deadline) in the commit
loop of ``catalog/commit.py``, which looks the commit up by its uuid after
every failure: a commit whose answer was lost is returned, never made twice.
A commit outside any wait uses the catalog's own policy
(``Catalog(commit_retries=n)``: ``n`` quick retries), so an ordinary call
still fails fast when the database is gone.

**What is never redone.** :func:`retrying` does not redo a call whose error
has ``outcome_unknown`` set, unless the caller says that redoing it is safe
(``redo_unknown=True``: the maintenance loop, whose steps plan again from
what the catalog holds). A streaming sink that redid a commit whose outcome is
unknown would be told "replay" and would delete the files that the landed
commit published; it fails the micro-batch instead, and Spark's replay of the
batch is recognised by its ``(job, batchId)`` key.

Not guaranteed: waiting is measured with ``time.monotonic()`` (the database
is away in real time; tests inject ``clock``/``sleep``), so the deadline is a
lower bound of the time spent (a call in flight when it passes is not cut
short: the backend's timeouts bound each call, ``DatabaseTimeouts``). Errors
other than ``CatalogUnavailableError`` are never retried here.
"""

from __future__ import annotations

import contextvars
import logging
import threading
import time
from dataclasses import dataclass
from typing import Callable, Optional, TypeVar

from .errors import CatalogUnavailableError, CatalogWaitExpiredError, InvalidArgumentError

log = logging.getLogger(__name__)

T = TypeVar("T")


@dataclass(frozen=True)
class RetryPolicy:
    """How long and how often to retry while the catalog database is unavailable.

    ``initial``: the first delay (seconds); each next delay is ``factor`` times
    the last, at most ``max_delay``. ``deadline``: seconds after the first
    failure at which to give up (None: never). ``attempts``: the number of
    failed attempts after which to give up (None: no limit).
    """

    initial: float = 0.1
    factor: float = 2.0
    max_delay: float = 5.0
    deadline: Optional[float] = 300.0
    attempts: Optional[int] = None

    def __post_init__(self) -> None:
        for name in ("initial", "max_delay"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not value > 0:
                raise InvalidArgumentError(f"retry {name} must be a positive number of seconds, got {value!r}",
                                           argument=name, value=value)
        if not isinstance(self.factor, (int, float)) or not self.factor >= 1:
            raise InvalidArgumentError(f"retry factor must be at least 1, got {self.factor!r}", argument="factor",
                                       value=self.factor)
        if self.deadline is not None and (isinstance(self.deadline, bool) or not self.deadline >= 0):
            raise InvalidArgumentError(f"retry deadline must be None or seconds >= 0, got {self.deadline!r}",
                                       argument="deadline", value=self.deadline)
        if self.attempts is not None and (isinstance(self.attempts, bool) or not isinstance(self.attempts, int)
                                          or self.attempts < 0):
            raise InvalidArgumentError(f"retry attempts must be None or an integer >= 0, got {self.attempts!r}",
                                       argument="attempts", value=self.attempts)

    @classmethod
    def counted(cls, retries: int) -> "RetryPolicy":
        """``retries`` quick retries (0.1, 0.2, 0.4 ... s, at most 2 s each), no deadline: a
        catalog's own commits (``Catalog(commit_retries=...)``)."""
        return cls(initial=0.1, factor=2.0, max_delay=2.0, deadline=None, attempts=retries)

    def delay(self, failed: int) -> float:
        """The delay after the ``failed``-th failed attempt (1, 2, ...)."""
        return min(self.max_delay, self.initial * self.factor ** max(0, failed - 1))


#: Streaming sinks and sources: wait up to five minutes, then fail the micro-batch
#: (Spark's query fails; a restart replays it exactly once).
STREAMING = RetryPolicy()
#: The coordinator and the maintenance loop: services that wait as long as it takes.
SERVICE = RetryPolicy(deadline=None)


class Wait:
    """One caller's wait for the catalog database (steps 1 to 4 of the module docstring).

    ``failed(error)`` after each failed attempt (logs the start, sleeps the
    next delay, or raises :class:`CatalogWaitExpiredError`); ``succeeded()``
    after an attempt that worked (logs the end if there was a wait). ``clock``
    and ``sleep`` default to ``time.monotonic`` and a sleep that a ``stop``
    event cuts short; when ``stop`` is set the last error is raised at once.
    """

    def __init__(self, policy: RetryPolicy, what: str, *, clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], object] | None = None, stop: threading.Event | None = None,
                 logger: logging.Logger | None = None) -> None:
        self.policy = policy
        self.what = what
        self.clock = clock
        self.stop = stop
        self._sleep = sleep
        self.log = logger or log
        self.started: float | None = None
        self.failures = 0
        self.waits = 0  # waits that ended (for tests and reports)

    @property
    def waiting(self) -> bool:
        return self.started is not None

    def failed(self, error: CatalogUnavailableError, *, outcome_unknown: bool | None = None,
               detail: str = "") -> None:
        """Record a failed attempt: sleep before the next one, or give up (raises)."""
        now = self.clock()
        if self.started is None:
            self.started = now
            self.failures = 0
            p = self.policy
            limits = ([] if p.deadline is None else [f"up to {p.deadline:g} s"]) + (
                [] if p.attempts is None else [f"at most {p.attempts} retries"])
            limit = ", ".join(limits) or "no deadline"
            self.log.warning("%s: the catalog database is unavailable; waiting (%s, retrying with backoff up to "
                             "%g s): %s", self.what, limit, self.policy.max_delay, _cause(error))
        self.failures += 1
        waited = now - self.started
        unknown = error.outcome_unknown if outcome_unknown is None else outcome_unknown
        p = self.policy
        if ((p.attempts is not None and self.failures > p.attempts)
                or (p.deadline is not None and waited >= p.deadline)):
            self.started = None
            raise CatalogWaitExpiredError(
                f"{self.what}: gave up waiting for the catalog database after {waited:.1f} s and "
                f"{self.failures} failed attempt(s){f' ({detail})' if detail else ''}: {_one_line(error)}",
                what=self.what, waited=waited, attempts=self.failures, deadline=p.deadline,
                outcome_unknown=unknown) from error
        delay = p.delay(self.failures)
        if p.deadline is not None:
            delay = min(delay, p.deadline - waited)
        self.log.debug("%s: attempt %d failed (%s); next in %.2f s", self.what, self.failures, _one_line(error),
                       delay)
        if self.stop is not None and self.stop.is_set():
            raise error
        if self._sleep is not None:
            self._sleep(delay)
        elif self.stop is not None:
            if self.stop.wait(delay):
                raise error
        else:
            time.sleep(delay)

    def succeeded(self) -> None:
        """An attempt worked: end the wait (one log line), if there was one."""
        if self.started is None:
            return
        waited = self.clock() - self.started
        self.started = None
        self.waits += 1
        self.log.info("%s: the catalog database is back after %.1f s (%d failed attempt(s)); continuing",
                      self.what, waited, self.failures)


_active: contextvars.ContextVar[Wait | None] = contextvars.ContextVar("lakestep_retry_wait", default=None)


def active() -> Wait | None:
    """The wait of the :func:`retrying` call this code runs inside, if any (catalog commits join it)."""
    return _active.get()


def retrying(fn: Callable[[], T], *, policy: RetryPolicy, what: str, redo_unknown: bool = False,
             wait: Wait | None = None, stop: threading.Event | None = None) -> T:
    """Call ``fn`` until it does not fail with :class:`CatalogUnavailableError` (module docstring).

    ``wait``: an existing :class:`Wait` to continue (a service keeps one, so
    a wait spanning several calls logs one start and one end); otherwise a
    new one for ``policy`` and ``what``. Catalog commits made by ``fn`` wait
    under it. ``stop``: an event that ends the wait early (the last error is
    raised).
    """
    w = wait if wait is not None else Wait(policy, what, stop=stop)
    token = _active.set(w)
    try:
        while True:
            try:
                result = fn()
            except CatalogWaitExpiredError:
                raise
            except CatalogUnavailableError as e:
                if e.outcome_unknown and not redo_unknown:
                    raise
                w.failed(e)
                continue
            w.succeeded()
            return result
    finally:
        _active.reset(token)


def _cause(error: BaseException) -> str:
    """The database's own words (the backend's "the catalog database is unavailable: " left out)."""
    text = _one_line(error)
    prefix = "the catalog database is unavailable: "
    return text[len(prefix):] if text.startswith(prefix) else text


def _one_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__
