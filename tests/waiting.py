"""Waiting on a condition, the one way the tests do it.

A wait has a generous timeout that catches a hang, never a speed limit: the
condition decides, and the loop polls it (the short interval is how often it
looks, not how long anything may take). ``failed`` is asked on every round
and ends the wait at once with its message (a query or a process that died
will not make the condition true later): :func:`exited` and :func:`died` make
the usual ones, :func:`tail` the usual ``detail`` (a process's log).
:func:`in_thread` is the same idea for one call: it must return, and the limit
only catches a hang.

Every test waits with :func:`wait_until`; benchmarks/ (which must not import
tests/) has its own loop in benchmarks/freshness.py.
"""

from __future__ import annotations

import re
import threading
import time
from pathlib import Path
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
    ignoring: tuple[type[BaseException], ...] = (),
) -> T:
    """Poll ``cond`` until it returns something true, and return that.

    Raises ``AssertionError`` naming ``what`` when ``failed`` reports a
    failure or after ``timeout`` seconds; ``detail()`` (a process's log, what
    the condition saw last) is appended to either message. ``cond`` raising one
    of ``ignoring`` counts as "not yet" (a database the test made unavailable);
    any other error ends the wait.
    """
    deadline = time.monotonic() + timeout
    while True:
        try:
            got = cond()
        except ignoring:
            got = None  # type: ignore[assignment]
        if got:
            return got
        why = failed() if failed is not None else None
        if why or time.monotonic() > deadline:
            head = f"{why} while waiting for {what}" if why else f"timed out after {timeout:g}s waiting for {what}"
            raise AssertionError(head + _detail(detail))
        time.sleep(interval)


def _detail(detail: Callable[[], str] | None) -> str:
    if detail is None:
        return ""
    try:
        return f"\n{detail()}"
    except Exception as e:  # noqa: BLE001 - the failure is the wait's; say why there is no detail
        return f"\n(no detail: {e!r})"


def exited(proc: Any, name: str) -> Callable[[], str | None]:
    """A ``failed`` for a process (a ``subprocess.Popen``): None while it runs, else that
    ``name`` exited, with its status."""
    return lambda: None if proc.poll() is None else f"{name} exited (status {proc.returncode})"


def died(query: Any, name: str = "the query") -> Callable[[], str | None]:
    """A ``failed`` for a Spark streaming query: None while it runs, else what killed it
    (:func:`query_failure`)."""
    def why() -> str | None:
        failure = query_failure(query)
        return None if failure is None else f"{name} died: {failure}"

    return why


def tail(path: Path, chars: int = 3000) -> Callable[[], str]:
    """A ``detail``: the last ``chars`` characters of the file at ``path`` (a process's log)."""
    return lambda: path.read_text(errors="replace")[-chars:]


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
