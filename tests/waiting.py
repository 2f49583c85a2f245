"""Waiting on a condition, the one way the tests do it.

A wait has a generous timeout that catches a hang, never a speed limit: the
condition decides, and the loop polls it (the short interval is how often it
looks, not how long anything may take). ``failed`` is asked on every round
and ends the wait at once with its message (a query or a process that died
will not make the condition true later).
"""

from __future__ import annotations

import time
from typing import Callable, TypeVar

T = TypeVar("T")


def wait_until(
    cond: Callable[[], T],
    what: str,
    *,
    timeout: float = 120.0,
    failed: Callable[[], str | None] | None = None,
    interval: float = 0.05,
    detail: Callable[[], str] | None = None,
) -> T:
    """Poll ``cond`` until it returns something true, and return that.

    Raises ``AssertionError`` naming ``what`` when ``failed`` reports a
    failure or after ``timeout`` seconds (with ``detail()`` appended).
    """
    deadline = time.monotonic() + timeout
    while True:
        got = cond()
        if got:
            return got
        if failed is not None and (why := failed()):
            raise AssertionError(f"{why} while waiting for {what}")
        if time.monotonic() > deadline:
            extra = f": {detail()}" if detail is not None else ""
            raise AssertionError(f"timed out after {timeout:g}s waiting for {what}{extra}")
        time.sleep(interval)
