"""Named failpoints: deliberate faults at fixed places of a protocol.

Crash and fault tests need to stop a real process *inside* a commit, at a
known step. lakestep's code calls :func:`hit` at those steps; nothing happens
unless a failpoint of that name is armed, either in the process with
:func:`arm` or, for child processes, through the environment variable
``LAKESTEP_FAILPOINTS`` (``name=action[,name=action...]``).

Actions:
    ``exit``        the process dies at once (``os._exit(137)``), like SIGKILL
    ``exit@N``      the same at the N-th time the failpoint is reached (1 is the first)
    ``raise``       :class:`FailpointError` is raised
    ``sleep:SECS``  the step waits, widening a race window
    ``stop@N``      the process stops itself (SIGSTOP, as a pause of the machine or
                    a debugger would) the N-th time the failpoint is reached, and
                    only then; it goes on when sent SIGCONT
    ``disconnect``  :class:`~lakestep.errors.CatalogUnavailableError` is raised, as
                    when the connection to the catalog database breaks at that step
    a callable      (in-process only) called with the failpoint's name

Disarmed, a failpoint costs one dictionary lookup.
"""

from __future__ import annotations

import os
import signal
import time
from typing import Callable, Union

Action = Union[str, Callable[[str], None]]

_armed: dict[str, Action] = {}
_hits: dict[str, int] = {}


class FailpointError(RuntimeError):
    """Raised by a failpoint armed with the ``raise`` action."""


def _load_env() -> None:
    spec = os.environ.get("LAKESTEP_FAILPOINTS", "")
    for item in filter(None, (part.strip() for part in spec.split(","))):
        name, _, action = item.partition("=")
        _armed[name.strip()] = action.strip() or "raise"


def arm(name: str, action: Action = "raise") -> None:
    _armed[name] = action


def disarm(name: str | None = None) -> None:
    if name is None:
        _armed.clear()
    else:
        _armed.pop(name, None)


def hit(name: str) -> None:
    if not _armed:
        return
    action = _armed.get(name)
    if action is None:
        return
    if callable(action):
        action(name)
    elif action == "exit":
        os._exit(137)
    elif action.startswith("exit@"):
        _hits[name] = _hits.get(name, 0) + 1
        if _hits[name] >= int(action.split("@", 1)[1]):
            os._exit(137)
    elif action.startswith("stop@"):
        _hits[name] = _hits.get(name, 0) + 1
        if _hits[name] == int(action.split("@", 1)[1]):
            os.kill(os.getpid(), signal.SIGSTOP)
    elif action == "raise":
        raise FailpointError(f"failpoint {name!r}")
    elif action == "disconnect":
        from .errors import CatalogUnavailableError

        raise CatalogUnavailableError(f"failpoint {name!r}: the connection to the catalog database broke")
    elif action.startswith("sleep:"):
        time.sleep(float(action.split(":", 1)[1]))
    else:
        from .errors import InvalidArgumentError

        raise InvalidArgumentError(f"unknown failpoint action {action!r} for {name!r}", argument="action", value=action)


_load_env()
