"""What every lakestep command-line entry point shares: errors as one readable line."""

from __future__ import annotations

import contextlib
import logging
import signal
import sys
from typing import Callable, Iterator

from .errors import LakestepError
from .secrets import mask_url


@contextlib.contextmanager
def stopped_by_signals(stop: Callable[[], None]) -> Iterator[None]:
    """While inside, SIGTERM and SIGINT call ``stop()`` (a loop running in this thread is
    told to return); the previous handlers are put back on the way out."""

    def handler(signum: int, _frame: object) -> None:
        logging.getLogger("lakestep").info("signal %d: stopping", signum)
        stop()

    previous = {s: signal.signal(s, handler) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for s, h in previous.items():
            signal.signal(s, h)


def run(main: Callable[[], int | None]) -> int:
    """Run ``main``; a :class:`LakestepError` becomes ``error: <message>`` on stderr and exit code 1."""
    try:
        return int(main() or 0)
    except LakestepError as e:
        print(f"error: {mask_url(str(e))}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
