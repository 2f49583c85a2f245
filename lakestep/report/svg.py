"""The report's pictures as inline SVG: the lineage graph (a layered layout) and lag charts.

No JavaScript and no external resources: the page must open offline.

**Layout** (:func:`layout`): jobs and tables are nodes, edges go source table
-> job -> sink table. Layers are columns: a node sits one column right of
the furthest node feeding it (root jobs and unmanaged source tables in column
0). Within a column nodes are ordered by the mean row of their predecessors
(two sweeps), then by name, which keeps most edges short and uncrossed.
"""

from __future__ import annotations

from dataclasses import dataclass
from html import escape
from typing import Sequence

CHAR_W = 7.4  # px per character of the 12px monospace label font
NODE_H = 40
ROW_GAP = 18
COL_GAP = 56
PAD = 12


@dataclass
class Node:
    key: str  # "job:<id>" or "table:<name>"
    label: str
    sub: str  # second line
    kind: str  # job-root, job-derived, root, derived, unmanaged
    alert: bool = False
    col: int = 0
    row: float = 0.0
    x: float = 0.0
    y: float = 0.0
    w: float = 0.0


def layout(nodes: dict[str, Node], edges: Sequence[tuple[str, str]]) -> tuple[float, float]:
    """Place ``nodes`` (sets x, y, w); returns the drawing's (width, height)."""
    preds: dict[str, list[str]] = {k: [] for k in nodes}
    for a, b in edges:
        preds[b].append(a)
    col: dict[str, int] = {}

    def depth(k: str) -> int:  # the topology is acyclic
        if k not in col:
            col[k] = 1 + max((depth(p) for p in preds[k]), default=-1)
        return col[k]

    for k in nodes:
        nodes[k].col = depth(k)
    columns: dict[int, list[Node]] = {}
    for n in sorted(nodes.values(), key=lambda n: n.label):
        columns.setdefault(n.col, []).append(n)
    for c in sorted(columns):
        for i, n in enumerate(columns[c]):
            n.row = float(i)
    for _ in range(2):
        for c in sorted(columns):
            if c == 0:
                continue
            for n in columns[c]:
                ps = [nodes[p].row for p in preds[n.key]]
                n.row = sum(ps) / len(ps) if ps else n.row
            columns[c].sort(key=lambda n: (n.row, n.label))
            for i, n in enumerate(columns[c]):
                n.row = float(i)
    x: float = PAD
    height = 0.0
    for c in sorted(columns):
        w = max(max(len(n.label), len(n.sub)) * CHAR_W + 24 for n in columns[c])
        for n in columns[c]:
            n.x, n.w = x, w
            n.y = PAD + n.row * (NODE_H + ROW_GAP)
            height = max(height, n.y + NODE_H + PAD)
        x += w + COL_GAP
    return x - COL_GAP + PAD, height


def lineage_svg(nodes: dict[str, Node], edges: Sequence[tuple[str, str]]) -> str:
    if not nodes:
        return '<p class="muted">No job is registered: there is no lineage to draw.</p>'
    width, height = layout(nodes, edges)
    out = [f'<svg class="lineage" xmlns="http://www.w3.org/2000/svg" width="{width:.0f}" height="{height:.0f}" '
           f'viewBox="0 0 {width:.0f} {height:.0f}" role="img" aria-label="lineage graph">',
           '<defs><marker id="arrow" viewBox="0 0 10 10" refX="10" refY="5" markerWidth="7" markerHeight="7" '
           'orient="auto-start-reverse"><path d="M 0 0 L 10 5 L 0 10 z" fill="#57606a"/></marker></defs>']
    for a, b in edges:
        s, d = nodes[a], nodes[b]
        x1, y1 = s.x + s.w, s.y + NODE_H / 2
        x2, y2 = d.x, d.y + NODE_H / 2
        mid = (x1 + x2) / 2
        out.append(f'<path class="edge" d="M {x1:.1f} {y1:.1f} C {mid:.1f} {y1:.1f}, {mid:.1f} {y2:.1f}, '
                   f'{x2 - 1:.1f} {y2:.1f}" marker-end="url(#arrow)"/>')
    for n in nodes.values():
        rx = NODE_H / 2 if n.kind.startswith("job") else 4
        cls = f"node {n.kind}" + (" alert" if n.alert else "")
        out.append(f'<g class="{cls}" data-key="{escape(n.key)}">'
                   f'<rect x="{n.x:.1f}" y="{n.y:.1f}" width="{n.w:.1f}" height="{NODE_H}" rx="{rx:.0f}"/>'
                   f'<text x="{n.x + n.w / 2:.1f}" y="{n.y + 16:.1f}" class="label">{escape(n.label)}</text>'
                   f'<text x="{n.x + n.w / 2:.1f}" y="{n.y + 31:.1f}" class="sub">{escape(n.sub)}</text></g>')
    out.append("</svg>")
    return "\n".join(out)


def lag_chart(points: Sequence[tuple[float, float]], start: float, end: float, *, title: str, unit: str,
              sawtooth: Sequence[bool] | None = None, width: int = 420, height: int = 130) -> str:
    """A step chart of ``points`` (time, value) over [start, end]. With ``sawtooth``, a value
    whose flag is set grows by one per second until the next point (seconds of lag)."""
    left, right, top, bottom = 48, 10, 22, 24
    pw, ph = width - left - right, height - top - bottom
    segs: list[tuple[float, float]] = []
    for i, (t, v) in enumerate(points):
        nxt = points[i + 1][0] if i + 1 < len(points) else end
        grow = bool(sawtooth and sawtooth[i])
        segs.append((t, v))
        segs.append((nxt, v + (nxt - t) if grow else v))
    top_v = max([v for _, v in segs] + [1.0])
    span = max(end - start, 1e-9)

    def X(t: float) -> float:
        return left + (min(max(t, start), end) - start) / span * pw

    def Y(v: float) -> float:
        return top + ph - v / top_v * ph

    path = " ".join(f"{'M' if i == 0 else 'L'} {X(t):.1f} {Y(v):.1f}" for i, (t, v) in enumerate(segs))
    ticks = [(start + span * f, f"-{(1 - f) * span / 60:.0f} min" if f < 1 else "now") for f in (0, 0.5, 1)]
    out = [f'<svg class="chart" xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           f'viewBox="0 0 {width} {height}" role="img" aria-label="{escape(title)}">',
           f'<text x="{left}" y="14" class="ctitle">{escape(title)}</text>',
           f'<line x1="{left}" y1="{top + ph}" x2="{left + pw}" y2="{top + ph}" class="axis"/>',
           f'<line x1="{left}" y1="{top}" x2="{left}" y2="{top + ph}" class="axis"/>',
           f'<text x="{left - 4}" y="{top + 4}" class="ylab">{_num(top_v)}{escape(unit)}</text>',
           f'<text x="{left - 4}" y="{top + ph}" class="ylab">0</text>']
    for t, lab in ticks:
        out.append(f'<text x="{X(t):.1f}" y="{height - 6}" class="xlab">{lab}</text>')
    if segs:
        out.append(f'<path d="{path}" class="line"/>')
    out.append("</svg>")
    return "".join(out)


def _num(v: float) -> str:
    return f"{v:.0f}" if v >= 10 or v == int(v) else f"{v:.1f}"
