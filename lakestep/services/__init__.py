"""The long-running services, on one base (base.py: start, stop, errors, health):

* :class:`Coordinator` (coordinator.py): seals epochs and snapshots committed barriers;
* :class:`MaintenanceLoop` (maintenance.py): TTL, compaction, Iceberg publishing and
  cleanup beside live writers;
* :class:`PublishLoop` (publisher.py): the Iceberg publisher's rounds on their own.

Each runs in a thread of a driver (``start()`` / ``stop()``) or as a process of its own:
``lakestep coordinator``, ``lakestep maintenance``, ``lakestep publish`` (or ``python -m
lakestep <command>``). Services sit above the library layers (catalog, barrier, iceberg)
and below the command line and ``lakestep serve``; nothing below imports them.

Names are imported on first use: the publisher's loop needs the ``iceberg`` extra only when
it is used.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .. import _lazy

if TYPE_CHECKING:  # for type checkers and readers; loaded lazily by __getattr__ at run time
    from .base import Service, ServiceHealth
    from .coordinator import Coordinator, Tick
    from .maintenance import MaintenanceLoop, RoundReport
    from .publisher import PublishLoop

_PUBLIC: dict[str, str] = {
    "Service": "base", "ServiceHealth": "base", "Coordinator": "coordinator", "Tick": "coordinator",
    "MaintenanceLoop": "maintenance", "RoundReport": "maintenance", "PublishLoop": "publisher",
}
__all__ = ["Coordinator", "MaintenanceLoop", "PublishLoop", "RoundReport", "Service", "ServiceHealth", "Tick"]


__getattr__, __dir__ = _lazy.exports(__name__, _PUBLIC)
