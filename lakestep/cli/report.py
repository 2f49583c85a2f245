"""``lakestep report --html FILE``: the pipeline as one self-contained HTML page."""

from __future__ import annotations

import os

import click

from ..report import collect, render
from .common import common, open_catalog
from .output import Output

PARTS = 4  # status, lag history, consistent read, doctor


@click.command("report")
@click.option("--html", "path", type=click.Path(dir_okay=False, writable=True), required=True,
              help="the HTML file to write")
@click.option("--last", type=click.IntRange(min=1), default=20, show_default=True,
              help="how many recent sealed barriers the grid shows")
@click.option("--minutes", type=click.FloatRange(min=1), default=60.0, show_default=True,
              help="the window of the lag charts")
@click.option("--no-storage", is_flag=True, help="skip the doctor's storage checks (one cleanup dry run per table)")
@click.option("--stuck-after", type=click.FloatRange(min=0), default=300.0, show_default=True,
              help="the doctor's threshold for stuck jobs (see lakestep doctor --help)")
@common
def report_cmd(out: Output, catalog_url: str, path: str, last: int, minutes: float, no_storage: bool,
               stuck_after: float) -> None:
    """Write a self-contained HTML page: lineage graph, barrier grid, lag charts,
    the explanation of a consistent read, and the doctor's findings.

    The page has no external resources (inline CSS and SVG): open it offline
    or mail it.

    \b
    Example:
      lakestep report --html pipeline.html --catalog postgresql://lake@db/lake
    """
    with open_catalog(catalog_url) as cat:
        with out.progress("reading", PARTS) as step:
            def part(name: str) -> None:
                step.label(f"reading {name}")
                step.advance()

            data = collect(cat, last=last, seconds=minutes * 60, storage=not no_storage, stuck_after=stuck_after,
                           step=part)
    page = render(data)
    tmp = f"{path}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(page)
    os.replace(tmp, path)
    st = data.status
    out.emit({"path": os.path.abspath(path), "bytes": len(page.encode()), "tables": len(st.tables),
              "jobs": len(data.jobs), "barriers": list(st.barriers)})
    out.print(f"wrote {path} ({len(page.encode())} bytes): {len(data.jobs)} job(s), {len(st.managed())} managed "
              f"table(s), barriers {st.barriers.start}..{st.barriers.stop - 1}" if st.barriers else
              f"wrote {path} ({len(page.encode())} bytes): no barrier sealed yet")


COMMANDS = [report_cmd]
