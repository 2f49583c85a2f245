"""Waiting on a condition, the one way the tests do it.

A wait has a generous timeout that catches a hang, never a speed limit: the
condition decides, and the loop polls it (the short interval is how often it
looks, not how long anything may take). ``failed`` is asked on every round
and ends the wait at once with its message (a query or a process that died
will not make the condition true later). :func:`in_thread` is the same idea
for one call: it must return, and the limit only catches a hang.
"""

from __future__ import annotations

import re
import threading
import time
from typing import Any, Callable, TypeVar

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


def in_thread(fn: Callable[[], Any], limit: float = 300.0) -> Any:
    """Run ``fn`` in a thread and return its value (or raise its error); a call that has
    not returned after ``limit`` seconds fails the test as a hang."""
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["value"] = fn()
        except BaseException as e:  # noqa: BLE001 - handed to the test
            box["error"] = e

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(limit)
    assert not t.is_alive(), f"the call did not return within {limit:g} s: it hangs"
    if "error" in box:
        raise box["error"]
    return box.get("value")


def query_failure(query: Any) -> str | None:
    """``None`` while a streaming ``query`` has not died; else what killed it, cause first.

    Spark's message starts with the query's ids and ends with a long JVM stack, and CI keeps
    only the tail of a failing run's output: the summary puts the error itself, every
    ``Caused by`` line and the Python error lines first, then the whole message.
    """
    exc = query.exception()
    if exc is None:
        return None
    text = str(exc)
    head = re.sub(r"^\[STREAM_FAILED\] Query \[[^]]*\] terminated with exception: ", "", text.splitlines()[0])
    causes = [ln.strip() for ln in text.splitlines()[1:]
              if ln.strip().startswith("Caused by") or re.match(r"\s*\w+(\.\w+)*(Error|Exception): ", ln)]
    summary = " | ".join(dict.fromkeys([head[:400], *(c[:300] for c in causes)]))
    return f"{summary}\n--- the whole message ---\n{text}"
