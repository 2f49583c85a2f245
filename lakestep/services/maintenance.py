"""A long-running maintenance loop: compaction, TTL and cleanup beside live writers.

Each round, for each table: (1) apply its TTL, (2) compact (minor; major every
``major_every``-th round), (3) clean up. When the catalog publishes its tables
as Iceberg tables (``lakestep publish --enable``, lakestep/iceberg), the round
publishes before its cleanups (a round of :class:`lakestep.iceberg.Publisher`). Every step is an ordinary commit or a
retention-safe cleanup, so the loop can run while streaming jobs append and
upsert and readers read: a compaction that loses a race is discarded, never
an ingest (docs/design.md §2). A failing table (an invalid property, a corrupt
data file, a storage error, a bug) is logged with its error and retried next
round; the other tables of the round still run. While the catalog database is
unavailable the round stops and waits through :func:`lakestep.retry.retrying`
(``retry``: bounded exponential backoff, one log line when the wait starts
and one when it ends, no deadline by default), then runs again from its first
table: every step plans afresh from what the catalog holds, so redoing one
whose outcome was lost is safe. The loop itself never dies of an error,
except :class:`~lakestep.errors.CatalogWaitExpiredError` when ``retry`` has
a deadline and the database stayed away longer.

Run it in a thread of a driver (:meth:`MaintenanceLoop.start`) or as its own
process: the command ``lakestep maintenance --catalog URL [--table ns.t]``
(lakestep/cli/services.py; ``python -m lakestep maintenance`` runs the same
command). The loop is a :class:`~lakestep.services.base.Service` (start, stop, health).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from .. import retry as _retry
from ..barrier.publishing import enabled as publishing_enabled
from ..catalog.catalog import Catalog
from ..catalog.table import Table
from ..catalog.ttl import apply_ttl
from ..errors import CatalogUnavailableError, LakestepError
from .base import Service

log = logging.getLogger(__name__)


@dataclass
class RoundReport:
    round: int
    seconds: float
    tables: dict[str, dict[str, Any]] = field(default_factory=dict)
    publish: dict[str, Any] | None = None  # the Iceberg publishing round, when the catalog publishes


class MaintenanceLoop(Service):
    """Compacts, expires and cleans up ``tables`` (default: every table) every ``interval`` seconds.

    Example::

        loop = MaintenanceLoop(catalog, ["shop.orders"], interval=30, major_every=10)
        loop.start()      # a daemon thread
        ...
        loop.stop()
    """

    def __init__(
        self,
        catalog: Catalog,
        tables: Sequence[str] | None = None,
        *,
        interval: float = 60.0,
        target_file_size: int = 128 << 20,
        min_files: int = 4,
        major_every: int = 0,
        cleanup: bool = True,
        ttl: bool = True,
        retry: _retry.RetryPolicy = _retry.SERVICE,
    ) -> None:
        super().__init__("maintenance", interval=interval, retry=retry)
        self.catalog = catalog
        self.tables = list(tables) if tables is not None else None
        self.target_file_size = target_file_size
        self.min_files = min_files
        self.major_every = major_every
        self.cleanup = cleanup
        self.ttl = ttl
        self.publisher: Any = None  # made on first use, when publishing is on (lakestep.iceberg)

    def run_once(self) -> RoundReport:
        """One round, counted. Raises :class:`CatalogUnavailableError` (the round is not counted)
        when the catalog database is unavailable: :meth:`run` waits and runs it again."""
        report = self.round()
        self.rounds += 1
        return report

    def round(self) -> RoundReport:
        """One round (the module docstring's steps); :meth:`run` counts it."""
        n = self.rounds + 1
        start = time.perf_counter()
        report = RoundReport(n, 0.0)
        major = self.major_every > 0 and n % self.major_every == 0
        idents = self.tables if self.tables is not None else self.catalog.list_tables()
        cleanups: list[tuple[str, Table]] = []
        for ident in idents:
            out: dict[str, Any] = {}
            try:
                table = self.catalog.load_table(ident)
                if self.ttl:
                    r = apply_ttl(table)
                    if r is not None:
                        out["ttl_removed_rows"] = r.removed_rows
                c = table.compact(target_file_size=self.target_file_size, min_files=self.min_files, major=major)
                out["compaction"] = "noop" if c.summary.get("noop") else "discarded" if c.discarded else c.version
                out["compacted_files"] = 0 if c.discarded else c.removed_files
                if self.cleanup:
                    cleanups.append((ident, table))
            except CatalogUnavailableError:  # not this table's trouble: the round waits for the database
                raise
            except LakestepError as e:  # one table's trouble must not stop the others
                log.warning("maintenance of %s failed this round: %s", ident, e)
                out["error"] = f"{type(e).__name__}: {e}"
            except Exception as e:  # nor an unexpected one: logged with its traceback
                log.exception("maintenance of %s failed this round", ident)
                out["error"] = f"{type(e).__name__}: {e}"
            report.tables[ident] = out
        self._publish(report)
        for ident, table in cleanups:
            out = report.tables[ident]
            try:
                cr = table.cleanup()
                out["deleted_files"] = len(cr.deleted_files) + len(cr.orphan_files)
                out["deleted_bytes"] = cr.deleted_bytes + cr.orphan_bytes
            except CatalogUnavailableError:
                raise
            except LakestepError as e:
                log.warning("cleanup of %s failed this round: %s", ident, e)
                out["error"] = f"{type(e).__name__}: {e}"
            except Exception as e:
                log.exception("cleanup of %s failed this round", ident)
                out["error"] = f"{type(e).__name__}: {e}"
        report.seconds = time.perf_counter() - start
        log.info("maintenance round %d in %.2fs: %s", report.round, report.seconds, report.tables)
        return report

    def _publish(self, report: RoundReport) -> None:
        """A publishing round when the catalog publishes to Iceberg (its errors are reported, not raised)."""
        if not publishing_enabled(self.catalog):
            return
        try:
            if self.publisher is None:
                from ..iceberg import Publisher

                self.publisher = Publisher(self.catalog)
            r = self.publisher.publish()
            report.publish = {"leader": r.leader, "barriers": len(r.barriers), "complete": r.complete,
                              "errors": r.errors}
        except CatalogUnavailableError:
            raise
        except Exception as e:  # noqa: BLE001 - publishing must not stop compaction and cleanup
            log.warning("publishing failed this round: %s", e)
            report.publish = {"error": f"{type(e).__name__}: {e}"}

    def run(self, *, max_rounds: int | None = None, duration: float | None = None,
            on_round: Callable[[RoundReport], None] | None = None) -> list[RoundReport]:
        """Rounds until :meth:`stop`, ``max_rounds`` or ``duration`` seconds; ``on_round`` sees each report."""
        return super().run(max_rounds=max_rounds, duration=duration, on_round=on_round)

    def finish(self) -> None:
        if self.publisher is not None:  # a standby publisher need not wait for the lease to lapse
            try:
                self.publisher.release()
            except LakestepError as e:
                log.debug("could not release the publisher lease: %s", e)

    def stop(self, timeout: float | None = 10.0) -> None:
        super().stop(timeout)
        if self.publisher is not None:
            self.publisher.close()
            self.publisher = None  # a restarted loop makes a new one
