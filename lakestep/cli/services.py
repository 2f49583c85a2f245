"""``lakestep coordinator``, ``lakestep maintenance`` and ``lakestep publish``: the long-running services.

``python -m lakestep <command>`` runs each (with the ``cli`` extra too); the coordinator
and maintenance take ``--url`` for ``--catalog``, as they always did. The loops themselves
are lakestep.services'. Each runs until
SIGTERM or SIGINT (:func:`stopped_by_signals`), then stops cleanly: the coordinator
releases its lease, the maintenance loop finishes its round.
"""

from __future__ import annotations

import contextlib
import logging
import signal
from typing import Any, Callable, Iterator

import click
from rich.table import Table as RichTable

from ..catalog.backend import DatabaseTimeouts
from ..secrets import mask_url
from ..services.coordinator import Coordinator
from ..services.maintenance import MaintenanceLoop, RoundReport
from .common import common, open_catalog
from .output import Output


class _MaskingFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        return mask_url(super().format(record))


def log_to_stderr(level: str) -> None:
    handler = logging.StreamHandler()
    handler.setFormatter(_MaskingFormatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())


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


LOG_LEVEL = click.option("--log-level", type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"], case_sensitive=False),
                         default="INFO", show_default=True, help="log lines on stderr")


@click.command("coordinator")
@click.option("--interval", type=click.FloatRange(min=0, min_open=True), default=1.0, show_default=True,
              help="at least this many seconds between seals (--seal interval)")
@click.option("--idle", type=click.FloatRange(min=0, min_open=True), default=None,
              help="seal an epoch without root commits after this many seconds (--seal interval; default 10 x "
                   "--interval; = --interval: seal on the clock alone)")
@click.option("--seal", type=click.Choice(["interval", "per_batch"]), default="interval", show_default=True,
              help="seal on an interval, or after every root micro-batch")
@click.option("--lease", type=click.FloatRange(min=0, min_open=True), default=10.0, show_default=True,
              help="lease seconds: a standby takes over this long after the holder dies")
@click.option("--poll", type=click.FloatRange(min=0, min_open=True), default=0.05, show_default=True,
              help="seconds between checks for root commits (past --interval; --seal per_batch)")
@click.option("--snapshot-every", type=click.IntRange(min=0), default=1, show_default=True,
              help="snapshot every k-th committed barrier (0: never)")
@click.option("--retain-count", type=click.IntRange(min=0), default=100, show_default=True,
              help="barrier snapshots kept (0: all)")
@click.option("--retain-seconds", type=click.FloatRange(min=0, min_open=True), default=None,
              help="age after which a barrier snapshot expires (default: never)")
@click.option("--seal-history", type=click.IntRange(min=0), default=10_000, show_default=True,
              help="seal rows kept beyond the retained barriers (0: every seal)")
@click.option("--holder", default=None, help="this coordinator's name (default host:pid:random)")
@click.option("--duration", type=click.FloatRange(min=0), default=None, help="stop after this many seconds")
@click.option("--max-seals", type=click.IntRange(min=1), default=None, help="stop after sealing this many epochs")
@LOG_LEVEL
@common(url_alias=True)
def coordinator_cmd(out: Output, catalog_url: str, interval: float, idle: float | None, seal: str, lease: float,
                    poll: float,
                    snapshot_every: int, retain_count: int, retain_seconds: float | None, seal_history: int,
                    holder: str | None,
                    duration: float | None, max_seals: int | None, log_level: str) -> None:
    """Run the barrier coordinator: seal epochs and snapshot committed barriers.

    Runs until SIGTERM/SIGINT (or --duration / --max-seals), then releases
    the lease. Run several: one seals, the others stand by and take over
    when its lease lapses. `python -m lakestep coordinator` runs
    this command.

    \b
    Example:
      lakestep coordinator --catalog postgresql://lake@db/lake --interval 5
    """
    log_to_stderr(log_level)
    # on PostgreSQL the server ends this process's session if it stalls inside a transaction longer than
    # its lease (paused, swapped out): the lease row and the epoch row it holds are then free for a standby
    # and for root commits; its lease is lost by then anyway
    with open_catalog(catalog_url, timeouts=DatabaseTimeouts(idle_in_transaction=lease)) as cat:
        coord = Coordinator(cat, interval=interval, seal=seal, lease_seconds=lease, poll=poll,  # type: ignore[arg-type]
                            snapshot_every=snapshot_every or None, retain_count=retain_count or None,
                            retain_seconds=retain_seconds, seal_history=seal_history or None, holder=holder,
                            idle=idle)
        logging.getLogger("lakestep.cli").info("coordinator %s on %s (seal=%s, interval=%gs, idle=%gs, lease=%gs)",
                                               coord.holder, cat.url, seal, interval, coord.idle, lease)
        try:
            with stopped_by_signals(coord.stop):  # run() is in this thread: stop() only tells it to return
                coord.run(duration=duration, max_seals=max_seals)
        finally:
            coord.release()
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
@common(url_alias=True)
def maintenance_cmd(out: Output, catalog_url: str, tables: tuple[str, ...], interval: float, major_every: int,
                    min_files: int, rounds: int | None, no_cleanup: bool, no_ttl: bool, log_level: str) -> None:
    """Run TTL, compaction and cleanup in a loop beside live writers.

    Each round, per table: apply its TTL, compact, clean up. A failing table
    is reported and retried next round. Runs until SIGTERM/SIGINT or
    --rounds. `python -m lakestep maintenance` runs this command.

    \b
    Example:
      lakestep maintenance --catalog ./wh --interval 60 --major-every 10
      lakestep maintenance --table shop.orders --rounds 1 --json
    """
    log_to_stderr(log_level)
    with open_catalog(catalog_url) as cat:
        for t in tables:
            cat.load_table(t)  # a mistyped name fails now, not every round
        loop = MaintenanceLoop(cat, list(tables) or None, interval=interval, min_files=min_files,
                               major_every=major_every, cleanup=not no_cleanup, ttl=not no_ttl)
        done: list[dict[str, Any]] = []

        def on_round(r: RoundReport) -> None:
            done.append({"round": r.round, "seconds": r.seconds, "tables": r.tables,
                         **({"publish": r.publish} if r.publish is not None else {})})
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


@click.command("publish")
@click.option("--once", is_flag=True, help="one round (main moved to the cut it completes), then exit")
@click.option("--interval", type=click.FloatRange(min=0, min_open=True), default=1.0, show_default=True,
              help="seconds between rounds")
@click.option("--rounds", type=click.IntRange(min=1), default=None, help="stop after this many rounds")
@click.option("--duration", type=click.FloatRange(min=0), default=None, help="stop after this many seconds")
@click.option("--iceberg-url", default=None, metavar="URL",
              help="the Iceberg SQL catalog's database (default: the lakestep catalog's own)")
@click.option("--name", default="lakestep", show_default=True, help="the Iceberg catalog name")
@click.option("--lease", type=click.FloatRange(min=0, min_open=True), default=30.0, show_default=True,
              help="lease seconds: a standby publisher takes over this long after the holder dies")
@click.option("--holder", default=None, help="this publisher's name (default host:pid:random)")
@click.option("--enable/--disable", "switch", default=None,
              help="turn publishing on or off for the catalog (the maintenance loop publishes while it is on), "
                   "then exit")
@LOG_LEVEL
@common
def publish_cmd(out: Output, catalog_url: str, once: bool, interval: float, rounds: int | None,
                duration: float | None, iceberg_url: str | None, name: str, lease: float, holder: str | None,
                switch: bool | None, log_level: str) -> int:
    """Publish the catalog's tables as Iceberg tables, a tag per consistent barrier.

    Each round gives every table an Iceberg snapshot per barrier at which it
    changed, the tag barrier-N for every barrier read_committed could
    choose, and moves main to the newest barrier every table has a tag for.
    Metadata only: the snapshots list lakestep's own files. Runs until
    SIGTERM/SIGINT (or --once, --rounds, --duration); one publisher holds the
    lease at a time. Needs the iceberg extra. docs/iceberg.md shows how
    engines read the result.

    \b
    Example:
      lakestep publish --catalog ./wh --once
      lakestep publish --catalog postgresql://lake@db/lake --interval 1
      lakestep publish --catalog ./wh --enable
    """
    log_to_stderr(log_level)
    from ..iceberg import Publisher, enable
    from ..services.publisher import PublishLoop

    with open_catalog(catalog_url) as cat:
        if switch is not None:
            enable(cat, switch)
            out.emit({"enabled": switch})
            out.print(f"publishing to Iceberg is {'on' if switch else 'off'} for {cat.url}")
            return 0
        pub = Publisher(cat, iceberg_url=iceberg_url, name=name, holder=holder, lease_seconds=lease)
        done: list[dict[str, Any]] = []
        failed = False

        def on_round(r: Any) -> None:
            nonlocal failed
            failed = failed or bool(r.errors)
            done.append({"leader": r.leader, "holder": r.holder, "barriers": r.barriers, "complete": r.complete,
                         "seconds": r.seconds, "tables": {t: vars(x) for t, x in r.tables.items()}})
            if out.json:
                return
            if not r.leader:
                out.print(f"another publisher holds the lease ({r.holder}): nothing done")
                return
            span = "none" if not r.barriers else f"{r.barriers[0]}..{r.barriers[-1]}"
            grid = RichTable(title=f"publish: barriers {span}, complete cut {r.complete} ({r.seconds:.2f} s)",
                             title_justify="left")
            for col in ("table", "snapshots", "tags", "main (version)", "expired", "error"):
                grid.add_column(col)
            for t, x in r.tables.items():
                tags = "-" if not x.tags else f"{x.tags[0]}..{x.tags[-1]}" if len(x.tags) > 1 else str(x.tags[0])
                grid.add_row(t, str(x.snapshots), tags, "-" if x.main is None else str(x.main), str(x.expired),
                             x.error or "", style="red" if x.error else None)
            out.print(grid)

        try:
            if once:
                on_round(pub.publish_once())
            else:
                loop = PublishLoop(pub, interval=interval)
                with stopped_by_signals(loop.stop):
                    loop.run(max_rounds=rounds, duration=duration, on_round=on_round)
        finally:
            pub.close()
    out.emit({"rounds": done})
    return 1 if failed else 0


COMMANDS = [coordinator_cmd, maintenance_cmd, publish_cmd]
