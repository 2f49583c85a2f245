"""``lakestep coordinator`` and ``lakestep maintenance``: the two long-running services.

``python -m lakestep.barrier.coordinator`` and ``python -m lakestep.catalog.maintenance``
remain as aliases without the CLI's dependencies; both run the same code
(:func:`lakestep.barrier.coordinator.serve`, :meth:`MaintenanceLoop.run`).
"""

from __future__ import annotations

import logging
from typing import Any

import click
from rich.table import Table as RichTable

from ..barrier.coordinator import Coordinator, serve
from .._cli import stopped_by_signals
from ..catalog.maintenance import MaintenanceLoop, RoundReport
from ..secrets import mask_url
from .common import common, open_catalog
from .output import Output


class _MaskingFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        return mask_url(super().format(record))


def _logging(level: str) -> None:
    handler = logging.StreamHandler()
    handler.setFormatter(_MaskingFormatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())


LOG_LEVEL = click.option("--log-level", type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"], case_sensitive=False),
                         default="INFO", show_default=True, help="log lines on stderr")


@click.command("coordinator")
@click.option("--interval", type=click.FloatRange(min=0, min_open=True), default=1.0, show_default=True,
              help="seconds between seals (--seal interval)")
@click.option("--seal", type=click.Choice(["interval", "per_batch"]), default="interval", show_default=True,
              help="seal on an interval, or after every root micro-batch")
@click.option("--lease", type=click.FloatRange(min=0, min_open=True), default=10.0, show_default=True,
              help="lease seconds: a standby takes over this long after the holder dies")
@click.option("--poll", type=click.FloatRange(min=0, min_open=True), default=0.05, show_default=True,
              help="seconds between checks (--seal per_batch)")
@click.option("--snapshot-every", type=click.IntRange(min=0), default=1, show_default=True,
              help="snapshot every k-th committed barrier (0: never)")
@click.option("--retain-count", type=click.IntRange(min=0), default=100, show_default=True,
              help="barrier snapshots kept (0: all)")
@click.option("--retain-seconds", type=click.FloatRange(min=0, min_open=True), default=None,
              help="age after which a barrier snapshot expires (default: never)")
@click.option("--holder", default=None, help="this coordinator's name (default host:pid:random)")
@click.option("--duration", type=click.FloatRange(min=0), default=None, help="stop after this many seconds")
@click.option("--max-seals", type=click.IntRange(min=1), default=None, help="stop after sealing this many epochs")
@LOG_LEVEL
@common
def coordinator_cmd(out: Output, catalog_url: str, interval: float, seal: str, lease: float, poll: float,
                    snapshot_every: int, retain_count: int, retain_seconds: float | None, holder: str | None,
                    duration: float | None, max_seals: int | None, log_level: str) -> None:
    """Run the barrier coordinator: seal epochs and snapshot committed barriers.

    Runs until SIGTERM/SIGINT (or --duration / --max-seals), then releases
    the lease. Run several: one seals, the others stand by and take over
    when its lease lapses. Replaces `python -m lakestep.barrier.coordinator`.

    \b
    Example:
      lakestep coordinator --catalog postgresql://lake@db/lake --interval 5
    """
    _logging(log_level)
    with open_catalog(catalog_url) as cat:
        coord = Coordinator(cat, interval=interval, seal=seal, lease_seconds=lease, poll=poll,  # type: ignore[arg-type]
                            snapshot_every=snapshot_every or None, retain_count=retain_count or None,
                            retain_seconds=retain_seconds, holder=holder)
        logging.getLogger("lakestep.cli").info("coordinator %s on %s (seal=%s, interval=%gs, lease=%gs)",
                                               coord.holder, cat.url, seal, interval, lease)
        serve(coord, duration=duration, max_seals=max_seals)
    seals = [{"barrier": s.barrier, "opened_at": s.opened_at, "sealed_at": s.sealed_at, "token": s.token}
             for s in coord.seals]
    out.emit({"holder": coord.holder, "seals": seals})
    if seals:
        out.print(f"coordinator {coord.holder} sealed {len(seals)} epoch(s): barriers "
                  f"{seals[0]['barrier']}..{seals[-1]['barrier']}")
    else:
        out.print(f"coordinator {coord.holder} sealed nothing (another coordinator held the lease, or no "
                  "epoch was due)")


@click.command("maintenance")
@click.option("--table", "tables", multiple=True, help="a table to maintain (repeatable; default: every table)")
@click.option("--interval", type=click.FloatRange(min=0), default=60.0, show_default=True,
              help="seconds between rounds")
@click.option("--major-every", type=click.IntRange(min=0), default=0, show_default=True,
              help="every n-th round compacts major (0: never)")
@click.option("--min-files", type=click.IntRange(min=2), default=4, show_default=True,
              help="compact a partition once it has this many small files")
@click.option("--rounds", type=click.IntRange(min=1), default=None, help="stop after this many rounds")
@click.option("--no-cleanup", is_flag=True, help="compact and apply TTLs only")
@click.option("--no-ttl", is_flag=True, help="do not apply table TTLs")
@LOG_LEVEL
@common
def maintenance_cmd(out: Output, catalog_url: str, tables: tuple[str, ...], interval: float, major_every: int,
                    min_files: int, rounds: int | None, no_cleanup: bool, no_ttl: bool, log_level: str) -> None:
    """Run TTL, compaction and cleanup in a loop beside live writers.

    Each round, per table: apply its TTL, compact, clean up. A failing table
    is reported and retried next round. Runs until SIGTERM/SIGINT or
    --rounds. Replaces `python -m lakestep.catalog.maintenance`.

    \b
    Example:
      lakestep maintenance --catalog ./wh --interval 60 --major-every 10
      lakestep maintenance --table shop.orders --rounds 1 --json
    """
    _logging(log_level)
    with open_catalog(catalog_url) as cat:
        for t in tables:
            cat.load_table(t)  # a mistyped name fails now, not every round
        loop = MaintenanceLoop(cat, list(tables) or None, interval=interval, min_files=min_files,
                               major_every=major_every, cleanup=not no_cleanup, ttl=not no_ttl)
        done: list[dict[str, Any]] = []

        def on_round(r: RoundReport) -> None:
            done.append({"round": r.round, "seconds": r.seconds, "tables": r.tables})
            if out.json:
                return
            grid = RichTable(title=f"maintenance round {r.round} ({r.seconds:.2f} s)", title_justify="left")
            for col in ("table", "compaction", "files merged", "files deleted", "bytes deleted", "error"):
                grid.add_column(col)
            for name, d in r.tables.items():
                grid.add_row(name, str(d.get("compaction", "-")), str(d.get("compacted_files", "-")),
                             str(d.get("deleted_files", "-")), str(d.get("deleted_bytes", "-")), d.get("error", ""),
                             style="red" if "error" in d else None)
            out.print(grid)

        with stopped_by_signals(loop.stop):
            loop.run(max_rounds=rounds, on_round=on_round)
    out.emit({"rounds": done})


COMMANDS = [coordinator_cmd, maintenance_cmd]
