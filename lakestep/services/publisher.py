"""The Iceberg publisher's loop: rounds of :meth:`lakestep.iceberg.Publisher.publish` on the
services' base (start, stop, health; base.py), as ``lakestep publish`` runs them.

1. Each round is one :meth:`~lakestep.iceberg.Publisher.publish` (lakestep/iceberg/publisher.py
   steps 1-6); a round that fails for another reason than the catalog database's absence
   is logged and retried next interval (the tags it made are kept; a rerun makes the missing
   ones).
2. When the loop ends the publisher's lease is given up, so a standby publisher takes over
   without waiting for it to lapse.

Example::

    from lakestep.iceberg import Publisher
    from lakestep.services import PublishLoop

    loop = PublishLoop(Publisher(catalog), interval=1.0)
    loop.start()        # a daemon thread
    ...
    loop.stop()

Not guaranteed: see lakestep/iceberg/publisher.py.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Callable

from ..errors import LakestepError
from .base import Service

if TYPE_CHECKING:
    from ..iceberg.publisher import Publisher, PublishReport

log = logging.getLogger(__name__)


class PublishLoop(Service):
    """Publishes every ``interval`` seconds until :meth:`stop` (module docstring)."""

    def __init__(self, publisher: "Publisher", *, interval: float = 1.0) -> None:
        super().__init__("publisher", interval=interval, retry=publisher.retry)
        self.publisher = publisher

    def round(self) -> "PublishReport":
        return self.publisher.publish()

    def run(self, *, max_rounds: int | None = None, duration: float | None = None,
            on_round: "Callable[[PublishReport], None] | None" = None) -> "list[PublishReport]":
        """Rounds until :meth:`stop`, ``max_rounds`` or ``duration`` seconds; ``on_round`` sees each report."""
        out: list[Any] = super().run(max_rounds=max_rounds, duration=duration, on_round=on_round)
        return out

    def finish(self) -> None:
        try:
            self.publisher.release()
        except LakestepError as e:  # the lease then lapses by itself
            log.debug("could not release the publisher lease: %s", e)
