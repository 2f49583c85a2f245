"""``lakestep doctor``: what is wrong with the pipeline, and how far behind it is."""

from __future__ import annotations

from typing import Any

import click
from rich.table import Table as RichTable
from rich.text import Text

from ..barrier import Diagnosis, Finding, diagnose
from .barriers import summary
from .common import common, open_catalog
from .output import SEVERITY_STYLE, Output

#: Exit code of a doctor run that found an error (1 is "could not check", 2 a usage error).
PROBLEMS = 3


def doctor_doc(d: Diagnosis, findings: list[Finding] | None = None) -> dict[str, Any]:
    """What ``lakestep doctor --json`` prints (``findings``: default every finding)."""
    return {"healthy": d.healthy, "worst": d.worst(), "open_epoch": d.status.open_epoch,
            "sealed": d.status.sealed, "committed": d.status.committed,
            "findings": [{"check": f.check, "severity": f.severity, "subject": f.subject, "message": f.message,
                          "facts": f.facts} for f in (d.findings if findings is None else findings)]}


@click.command("doctor")
@click.option("--stuck-after", type=click.FloatRange(min=0), default=300.0, show_default=True,
              help="a job whose input has been ready this many seconds, with no commit for as long, is stuck")
@click.option("--no-storage", is_flag=True, help="skip the storage checks (orphans, pins: one cleanup dry run per table)")
@click.option("--quiet", "-q", is_flag=True, help="show only warnings and errors")
@common
def doctor_cmd(out: Output, catalog_url: str, stuck_after: float, no_storage: bool, quiet: bool) -> int:
    """Check the pipeline: coordinator, lagging or stuck jobs, leases, storage.

    Looks for: no coordinator or an expired coordinator lease; derived jobs
    behind the newest sealed barrier (how many barriers and seconds, stuck
    or waiting for a source); jobs catching up or below the oldest retained
    barrier; lapsed version locks; orphan files; snapshots and locks that
    keep files from cleanup; pruned barriers and history.

    Exit code 0 when nothing is an error, 3 when something is (1: the
    check itself failed).

    \b
    Example:
      lakestep doctor --catalog postgresql://lake@db/lake
      lakestep doctor --stuck-after 60 --json
    """
    with open_catalog(catalog_url) as cat:
        with out.progress("checking storage", None if no_storage else len(cat.list_tables())) as step:
            def on_table(name: str) -> None:
                step.label(f"checking storage of {name}")
                step.advance()

            d = diagnose(cat, stuck_after=stuck_after, storage=not no_storage, on_table=on_table)
    findings = [f for f in d.findings if not quiet or f.severity in ("warning", "error")]
    out.emit(doctor_doc(d, findings))
    if not out.json:
        out.print(summary(d.status))
        grid = RichTable(show_header=True)
        for col in ("", "check", "subject", "finding"):
            grid.add_column(col)
        for f in findings:
            grid.add_row(Text(f.severity.upper(), style=SEVERITY_STYLE[f.severity]), f.check, f.subject, f.message)
        out.print(grid)
        counts = {s: sum(1 for f in d.findings if f.severity == s) for s in ("error", "warning")}
        verdict = "healthy" if d.healthy else "PROBLEMS FOUND"
        out.print(Text(f"{verdict}: {counts['error']} error(s), {counts['warning']} warning(s)",
                       style="bold green" if d.healthy else "bold red"))
    return 0 if d.healthy else PROBLEMS


COMMANDS = [doctor_cmd]
