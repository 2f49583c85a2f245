"""The report as one HTML document: :func:`render` a :class:`~lakestep.report.data.ReportData`
(inline CSS and SVG only: the page opens offline), or :func:`html_report` a catalog."""

from __future__ import annotations

import datetime as dt
from html import escape
from typing import TYPE_CHECKING

from ..barrier import Diagnosis, Status
from ..barrier.health import duration_text
from ..secrets import mask_url
from .data import ReportData, collect
from .svg import Node, lag_chart, lineage_svg

if TYPE_CHECKING:
    from ..catalog import Catalog

ORDER = ("SNAPSHOT", "COMMIT", "PRECOMMIT")


def html_report(catalog: "Catalog", **kwargs: object) -> str:
    """The report page of ``catalog`` (``collect``'s keyword arguments apply)."""
    return render(collect(catalog, **kwargs))  # type: ignore[arg-type]


CSS = """
:root { --snap: #1f6feb; --commit: #1a7f37; --pre: #d4a72c; --none: #eaeef2; --alert: #cf222e; }
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; color: #1f2328; margin: 0;
       background: #f6f8fa; }
header { background: #24292f; color: #fff; padding: 14px 24px; }
header h1 { margin: 0; font-size: 20px; } header p { margin: 4px 0 0; color: #d0d7de; }
main { padding: 8px 24px 32px; max-width: 1400px; }
section { background: #fff; border: 1px solid #d0d7de; border-radius: 6px; padding: 12px 16px; margin: 16px 0; }
h2 { font-size: 16px; margin: 0 0 10px; }
.facts span { display: inline-block; margin-right: 18px; } .facts b { font-variant-numeric: tabular-nums; }
.muted { color: #57606a; }
svg.lineage { max-width: 100%; height: auto; }
svg text { font: 12px ui-monospace, SFMono-Regular, Menlo, monospace; }
.lineage .node rect { stroke: #57606a; stroke-width: 1.2; }
.lineage .node.root rect { fill: #ddf4ff; } .lineage .node.derived rect { fill: #dafbe1; }
.lineage .node.unmanaged rect { fill: #f6f8fa; stroke-dasharray: 4 3; }
.lineage .node.job-root rect { fill: #fbefff; } .lineage .node.job-derived rect { fill: #fff8c5; }
.lineage .node.alert rect { stroke: var(--alert); stroke-width: 2.5; }
.lineage .label { text-anchor: middle; font-weight: 600; } .lineage .sub { text-anchor: middle; fill: #57606a; font-size: 11px; }
.lineage .node.alert .sub { fill: var(--alert); }
.lineage .edge { fill: none; stroke: #8c959f; stroke-width: 1.5; }
table { border-collapse: collapse; } th, td { padding: 3px 8px; text-align: left; }
table.grid th, table.grid td { border: 1px solid #d0d7de; }
table.grid td.cell { text-align: center; font: 600 12px ui-monospace, monospace; width: 26px; }
td.s-SNAPSHOT { background: var(--snap); color: #fff; } td.s-COMMIT { background: var(--commit); color: #fff; }
td.s-PRECOMMIT { background: var(--pre); color: #1f2328; } td.s-none { background: var(--none); color: #8c959f; }
tr.lagging td.name { color: var(--alert); font-weight: 700; } td.num { text-align: right; font-variant-numeric: tabular-nums; }
tr.lagging td.behind { color: var(--alert); font-weight: 700; }
.legend span { display: inline-block; padding: 1px 8px; margin-right: 8px; border-radius: 3px; font-size: 12px; }
.legend .s-SNAPSHOT { background: var(--snap); color: #fff; } .legend .s-COMMIT { background: var(--commit); color: #fff; }
.legend .s-PRECOMMIT { background: var(--pre); } .legend .s-none { background: var(--none); }
.lag { display: flex; flex-wrap: wrap; gap: 8px 24px; align-items: flex-start; margin-bottom: 12px; }
.lag h3 { font-size: 14px; margin: 4px 0; width: 100%; }
.chart .axis { stroke: #8c959f; } .chart .line { fill: none; stroke: var(--alert); stroke-width: 2; }
.chart .ctitle { font-weight: 600; } .chart .ylab { text-anchor: end; fill: #57606a; font-size: 11px; }
.chart .xlab { text-anchor: middle; fill: #57606a; font-size: 11px; }
pre { background: #f6f8fa; border: 1px solid #d0d7de; border-radius: 6px; padding: 10px; overflow-x: auto; }
.sev { font-weight: 700; font-size: 12px; } .sev-ok { color: #1a7f37; } .sev-info { color: #0969da; }
.sev-warning { color: #9a6700; } .sev-error { color: var(--alert); }
table.findings td { border-bottom: 1px solid #eaeef2; vertical-align: top; }
"""


def _when(ts: float) -> str:
    return dt.datetime.fromtimestamp(ts, tz=dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def _lineage(data: ReportData) -> str:
    st = data.status
    nodes: dict[str, Node] = {}
    edges: list[tuple[str, str]] = []

    def table_node(name: str) -> str:
        key = f"table:{name}"
        if key not in nodes:
            t = st.tables.get(name)
            kind = t.kind if t else "unmanaged"
            sub = kind if t is None or t.frontier is None else f"{kind} · frontier {t.frontier}"
            if t is not None and t.behind:
                sub += f" · {t.behind} behind"
            nodes[key] = Node(key, name, sub, kind, alert=bool(t and t.behind))
        return key

    for j in data.jobs:
        key = f"job:{j.job_id}"
        nodes[key] = Node(key, j.job_id, "job · external input" if j.external_input else "job",
                          "job-root" if j.external_input else "job-derived")
        for s in j.sources:
            edges.append((table_node(s), key))
        for k in j.sinks:
            edges.append((key, table_node(k)))
    return lineage_svg(nodes, edges)


def _grid(st: Status) -> str:
    rows = []
    head = "".join(f"<th>{b}</th>" for b in st.barriers)
    for t in st.managed():
        cells = []
        for b in st.barriers:
            states = st.states(t.table, b)
            top = next((s for s in ORDER if s in states), "")
            letter = {"SNAPSHOT": "S", "COMMIT": "C", "PRECOMMIT": "P", "": "·"}[top]
            title = ", ".join(s for s in ORDER if s in states) or "not yet"
            cells.append(f'<td class="cell s-{top or "none"}" title="barrier {b}: {title}">{letter}</td>')
        cls = "lagging" if t.behind else ""
        job = escape(t.job or "-") + (" (catching up)" if t.catching_up else "")
        rows.append(f'<tr class="{cls}" data-table="{escape(t.table)}"><td class="name">{escape(t.table)}</td>'
                    f"<td>{t.kind}</td><td>{job}</td>{''.join(cells)}<td class=\"num\">{t.frontier}</td>"
                    f'<td class="num behind">{t.behind}</td><td class="num behind">{duration_text(t.lag_seconds)}</td></tr>')
    if not rows:
        return '<p class="muted">No managed table.</p>'
    if not st.barriers:
        head = ""
    return (f'<table class="grid"><thead><tr><th>table</th><th>kind</th><th>job</th>{head}<th>frontier</th>'
            f'<th>behind</th><th>lag</th></tr></thead><tbody>{"".join(rows)}</tbody></table>'
            '<p class="legend"><span class="s-SNAPSHOT">S SNAPSHOT</span><span class="s-COMMIT">C COMMIT</span>'
            '<span class="s-PRECOMMIT">P PRECOMMIT</span><span class="s-none">· not yet</span></p>')


def _lag(data: ReportData) -> str:
    if not data.lag:
        return '<p class="muted">No derived table.</p>'
    start, end = data.window
    out = []
    for name, samples in data.lag.items():
        t = data.status.tables[name]
        head = (f"<h3>{escape(name)}: {t.behind} barrier(s), {duration_text(t.lag_seconds)} behind now"
                f"{' (catching up)' if t.catching_up else ''}</h3>")
        worst_b = max((s.barriers for s in samples), default=0)
        b = lag_chart([(s.at, float(s.barriers)) for s in samples], start, end,
                      title=f"barriers behind (max {worst_b})", unit="")
        s_ = lag_chart([(s.at, s.seconds) for s in samples], start, end, title="seconds behind", unit=" s",
                       sawtooth=[s.barriers > 0 for s in samples])
        out.append(f'<div class="lag" data-table="{escape(name)}">{head}{b}{s_}</div>')
    return "".join(out)


def _findings(d: Diagnosis | None) -> str:
    if d is None:
        return ""
    rows = "".join(
        f'<tr><td class="sev sev-{f.severity}">{f.severity.upper()}</td><td>{escape(f.check)}</td>'
        f"<td>{escape(f.subject)}</td><td>{escape(f.message)}</td></tr>" for f in d.findings)
    verdict = "healthy" if d.healthy else "problems found"
    return (f'<section id="doctor"><h2>Doctor: {verdict}</h2><table class="findings">{rows}</table></section>')


def render(data: ReportData, *, refresh: int | None = None) -> str:
    """The HTML document of ``data``: inline CSS and SVG only; with ``refresh``, the page
    reloads itself every ``refresh`` seconds (``lakestep serve``'s live page)."""
    st = data.status
    lease = st.lease
    coord = (f"{escape(str(lease.holder))} (token {lease.token})" if st.coordinator_alive
             else "none: the lease expired" if lease.holder else "none")
    facts = " ".join(f"<span>{k} <b>{v}</b></span>" for k, v in (
        ("open epoch", st.open_epoch), ("newest sealed", st.sealed), ("committed", st.committed),
        ("oldest retained", "-" if st.oldest_retained is None else st.oldest_retained), ("coordinator", coord)))
    # a live page also names an empty icon: a browser reloading it would otherwise ask for /favicon.ico each time
    reload = "" if refresh is None else (f'\n<meta http-equiv="refresh" content="{int(refresh)}">'
                                         '\n<link rel="icon" href="data:,">')
    live = "" if refresh is None else f" · live: reloads every {int(refresh)} s"
    doc = f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">{reload}
<title>lakestep report: {escape(data.catalog)}</title>
<style>{CSS}</style></head>
<body>
<header><h1>lakestep pipeline report</h1>
<p>{escape(data.catalog)} · generated {_when(data.generated_at)}{live}</p></header>
<main>
<section id="summary"><h2>Summary</h2><p class="facts">{facts}</p></section>
<section id="lineage"><h2>Lineage</h2>{_lineage(data)}</section>
<section id="barriers"><h2>Barriers: tables × the last {len(st.barriers)} sealed barriers</h2>{_grid(st)}</section>
<section id="lag"><h2>Lag of derived tables over the last {(data.window[1] - data.window[0]) / 60:.0f} minutes</h2>
{_lag(data)}</section>
<section id="read"><h2>Last consistent read (read_committed over every managed table)</h2>
<pre>{escape(data.explanation)}</pre></section>
{_findings(data.diagnosis)}
</main></body></html>
"""
    return mask_url(doc)
