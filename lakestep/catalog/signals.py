"""In-process change signals: a write this process commits to a catalog wakes this process's pollers.

A poller (a :class:`~lakestep.streaming.DerivedJob` waiting for its next batch,
say) checks the catalog every ``poll`` seconds, because most changes come from
other processes (a coordinator, a root job's commits). A change made by this
process (a seal of a coordinator thread, another job's commit) need not wait
for that: every write transaction a backend commits bumps a counter, and
:func:`wait` returns as soon as it moved.

Not guaranteed: anything about other processes, or which catalog changed (a
poller re-reads its change token either way); a signal is a hint to look now.
"""

from __future__ import annotations

import threading

_cond = threading.Condition()
_seq = 0


def changed() -> None:
    """A write transaction committed (backend.py calls it)."""
    global _seq
    with _cond:
        _seq += 1
        _cond.notify_all()


def sequence() -> int:
    """The number of writes committed by this process so far (compare it, then :func:`wait`)."""
    return _seq


def wait(since: int, timeout: float) -> int:
    """Wait until a write has committed after ``sequence()`` returned ``since``, at most ``timeout``
    seconds; returns the sequence now."""
    with _cond:
        if _seq == since:
            _cond.wait(timeout)
        return _seq
