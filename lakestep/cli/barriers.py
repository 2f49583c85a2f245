"""``lakestep barriers`` (the grid of tables x barriers) and ``lakestep lineage`` (the tree of jobs)."""

from __future__ import annotations

from typing import Any

import click
from rich.table import Table as RichTable
from rich.text import Text
from rich.tree import Tree

from ..barrier import Pipeline, Status
from ..barrier.graph import Job
from .common import common, open_catalog
from .output import STATE_LETTER, STATE_STYLE, Output, duration

ORDER = ("SNAPSHOT", "COMMIT", "PRECOMMIT")


def top_state(states: frozenset[str]) -> str:
    """The state a grid cell shows: SNAPSHOT over COMMIT over PRECOMMIT ("" for none)."""
    return next((s for s in ORDER if s in states), "")


def summary(st: Status) -> str:
    lease = st.lease
    if st.coordinator_alive:
        coord = f"coordinator {lease.holder} (lease expires in {duration(lease.expires_at - st.now)})"
    elif lease.holder is not None:
        coord = f"coordinator lease EXPIRED {duration(st.now - lease.expires_at)} ago ({lease.holder})"
    else:
        coord = "NO coordinator"
    retained = "" if st.oldest_retained is None else f" · oldest retained {st.oldest_retained}"
    return (f"open epoch {st.open_epoch} · newest sealed {st.sealed} · committed {st.committed}"
            f"{retained} · {coord}")


def status_doc(st: Status, tables: list[Any]) -> dict[str, Any]:
    return {
        "now": st.now, "open_epoch": st.open_epoch, "sealed": st.sealed, "committed": st.committed,
        "oldest_retained": st.oldest_retained, "barriers": list(st.barriers),
        "sealed_at": {str(b): at for b, at in st.seals.items()},
        "coordinator": {"holder": st.lease.holder, "token": st.lease.token, "alive": st.coordinator_alive,
                        "expires_in_seconds": st.lease.expires_at - st.now},
        "tables": [{
            "table": t.table, "kind": t.kind, "job": t.job, "frontier": t.frontier, "behind": t.behind,
            "lag_seconds": t.lag_seconds, "catching_up": t.catching_up, "version": t.version,
            "states": {str(b): sorted(st.states(t.table, b), key=ORDER.index) for b in st.barriers},
        } for t in tables],
    }


@click.command("barriers")
@click.option("--last", type=click.IntRange(min=1), default=10, show_default=True,
              help="how many recent sealed barriers to show")
@click.option("--all", "all_tables", is_flag=True, help="also show unmanaged tables (no job writes them)")
@common
def barriers_cmd(out: Output, catalog_url: str, last: int, all_tables: bool) -> None:
    """The grid of tables x recent barriers, each cell coloured by its state.

    S = SNAPSHOT (blue), C = COMMIT (green), P = PRECOMMIT (yellow), · = not yet.
    Tables behind the newest sealed barrier are red, with how far behind
    (barriers, and how long the first barrier they lack has been sealed).

    \b
    Example:
      lakestep barriers --catalog postgresql://lake@db/lake --last 8
    """
    with open_catalog(catalog_url) as cat:
        st = Pipeline(cat).status(last=last)
    shown = [t for t in st.tables.values() if all_tables or t.kind != "unmanaged"]
    out.emit(status_doc(st, shown))
    if out.json:
        return
    out.print(summary(st))
    grid = RichTable(show_lines=False)
    grid.add_column("table")
    grid.add_column("kind")
    grid.add_column("job")
    for b in st.barriers:
        grid.add_column(str(b), justify="center")
    grid.add_column("frontier", justify="right")
    grid.add_column("behind", justify="right")
    grid.add_column("lag", justify="right")
    for t in shown:
        lagging = bool(t.behind)
        name = Text(t.table, style="bold red" if lagging else "")
        job = (t.job or "-") + (" (catching up)" if t.catching_up else "")
        cells = []
        for b in st.barriers:
            s = top_state(st.states(t.table, b)) if t.kind != "unmanaged" else ""
            cells.append(Text(f" {STATE_LETTER[s]} ", style=STATE_STYLE[s]))
        grid.add_row(name, t.kind, job, *cells, "-" if t.frontier is None else str(t.frontier),
                     Text("-" if t.behind is None else str(t.behind), style="bold red" if lagging else ""),
                     Text("-" if t.lag_seconds is None else duration(t.lag_seconds),
                          style="bold red" if lagging else ""))
    out.print(grid)
    legend = Text()
    for s in ORDER:
        legend.append(f" {STATE_LETTER[s]} ", style=STATE_STYLE[s])
        legend.append(f" {s}  ")
    legend.append(f"{STATE_LETTER['']} not yet")
    out.print(legend)
    if not st.barriers:
        out.print("no barrier sealed yet")


def lineage_doc(jobs: list[Job], st: Status) -> dict[str, Any]:
    return {
        "jobs": [{"job": j.job_id, "external_input": j.external_input, "sources": list(j.sources),
                  "sinks": list(j.sinks), "joined_barrier": j.joined_barrier, "description": j.description}
                 for j in jobs],
        "tables": {t.table: t.kind for t in st.tables.values() if t.kind != "unmanaged" or t.readers},
        "edges": [[s, j.job_id, k] for j in jobs for s in (j.sources or (None,)) for k in j.sinks],
    }


@click.command("lineage")
@common
def lineage_cmd(out: Output, catalog_url: str) -> None:
    """The tree of jobs and tables: who writes what, and who reads it.

    Each job hangs under the tables it reads (a job reading several tables
    appears under each, expanded once); root jobs (external input) and
    unmanaged tables that jobs read start the tree.

    \b
    Example:
      lakestep lineage --catalog ./wh
    """
    with open_catalog(catalog_url) as cat:
        p = Pipeline(cat)
        jobs = p.topology.jobs()
        st = p.status(last=1)
    out.emit(lineage_doc(jobs, st))
    if out.json:
        return
    readers: dict[str, list[Job]] = {}
    for j in jobs:
        for s in j.sources:
            readers.setdefault(s, []).append(j)
    shown: set[str] = set()

    def table_label(name: str) -> Text:
        t = st.tables.get(name)
        kind = t.kind if t else "?"
        label = Text(name, style="bold")
        label.append(f"  {kind}", style="dim")
        if t is not None and t.frontier is not None:
            label.append(f"  frontier {t.frontier}", style="dim")
            if t.behind:
                label.append(f"  {t.behind} behind", style="bold red")
        return label

    def add_job(parent: Tree, j: Job) -> None:
        style = "magenta" if j.external_input else "cyan"
        label = Text(f"job {j.job_id}", style=style)
        if j.external_input:
            label.append("  external input", style="dim")
        if j.job_id in shown:
            label.append("  (see above)", style="dim")
            parent.add(label)
            return
        shown.add(j.job_id)
        node = parent.add(label)
        for k in j.sinks:
            add_table(node.add(table_label(k)), k)

    def add_table(node: Tree, name: str) -> None:
        for j in readers.get(name, []):
            add_job(node, j)

    tree = Tree(Text(f"lineage of {cat.url}", style="bold"))
    for j in jobs:
        if j.external_input:
            add_job(tree, j)
    sinks = {k for j in jobs for k in j.sinks}
    for name in sorted(readers):
        if name not in sinks:  # read by jobs, written by none: unmanaged
            add_table(tree.add(table_label(name)), name)
    for j in jobs:  # derived jobs with no source (nothing feeds them)
        if j.job_id not in shown:
            add_job(tree, j)
    if not jobs:
        tree.add(Text("no job registered", style="dim"))
    out.print(tree)


COMMANDS = [barriers_cmd, lineage_cmd]
