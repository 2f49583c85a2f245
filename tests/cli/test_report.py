"""``lakestep report --html``: written by the console script, opened in headless Chromium, and
checked on what the page renders (text, colours, layout) and on what it fetches (nothing)."""

from __future__ import annotations

import re
import struct
from pathlib import Path

import pytest

from lakestep.barrier import Pipeline

from .chromium import Browser, chromium_binary
from .conftest import Shop, lakestep

COLOURS = {"S": "rgb(31, 111, 235)", "C": "rgb(26, 127, 55)", "P": "rgb(212, 167, 44)", "·": "rgb(234, 238, 242)"}
ALERT = "rgb(207, 34, 46)"
GRID = {"shop.customers": "SCPP", "shop.orders": "SCPP", "shop.daily": "SCP·", "shop.vip": "SC··",
        "shop.summary": "SC··"}


@pytest.fixture(scope="module")
def browser():  # type: ignore[no-untyped-def]
    binary = chromium_binary()
    if binary is None:
        pytest.fail("chromium is not installed: scripts/ensure-services.sh installs it (make test runs it)")
    with Browser(binary) as b:
        yield b


def png_size(path: Path) -> tuple[int, int]:
    head = path.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    return struct.unpack(">II", head[16:24])


def test_report_renders_in_chromium(shop: Shop, browser: Browser, tmp_path: Path) -> None:
    page = tmp_path / "report.html"
    run = lakestep("report", "--html", str(page), "--stuck-after", "100000", "--json", catalog=shop.url)
    doc = run.json()
    assert doc["barriers"] == list(range(1, 5)) and doc["jobs"] == 5 and doc["tables"] == 6
    html = page.read_text()
    # self-contained: no stylesheet, script or image from elsewhere (the SVG namespace is a name, not a fetch)
    assert not re.search(r"<link|<script[^>]*src|<img|@import|url\(\s*['\"]?(?:https?:)?//", html)
    assert set(re.findall(r"https?://[^\s\"'<>]+", html)) == {"http://www.w3.org/2000/svg"}

    browser.open(page.as_uri())
    assert [u for u in browser.requests() if u != page.as_uri()] == []  # nothing but the page itself is fetched
    text = browser.evaluate("document.body.innerText")
    assert "lakestep pipeline report" in text
    assert re.search(r"open epoch\s+5\s+newest sealed\s+4\s+committed\s+2\s+oldest retained\s+1\s+coordinator\s+"
                     r"coord-1 \(token 1\)", text), text[:600]

    # the barrier grid as rendered: letters, cell colours, lagging rows in red
    grid = browser.evaluate("""[...document.querySelectorAll('#barriers tr[data-table]')].map(tr => ({
        table: tr.dataset.table,
        cells: [...tr.querySelectorAll('td.cell')].map(td => [td.innerText.trim(), getComputedStyle(td).backgroundColor]),
        name: getComputedStyle(tr.querySelector('td.name')).color,
        behind: tr.querySelector('td.behind').innerText}))""")
    assert [r["table"] for r in grid] == list(GRID)
    for r in grid:
        assert "".join(c[0] for c in r["cells"]) == GRID[r["table"]], r
        assert all(c[1] == COLOURS[c[0]] for c in r["cells"]), r
        lagging = r["table"] in ("shop.daily", "shop.vip", "shop.summary")
        assert (r["name"] == ALERT) == lagging, r
    assert {r["table"]: r["behind"] for r in grid} == {"shop.orders": "0", "shop.customers": "0", "shop.daily": "1",
                                                       "shop.vip": "2", "shop.summary": "2"}
    assert [h.strip() for h in browser.evaluate(
        "[...document.querySelectorAll('#barriers thead th')].map(th => th.innerText)")][3:7] == ["1", "2", "3", "4"]

    # the lineage graph: every job and table drawn, inside the picture, no two nodes overlapping
    nodes = browser.evaluate("""(() => { const svg = document.querySelector('#lineage svg').getBoundingClientRect();
        return [...document.querySelectorAll('#lineage g.node')].map(g => { const r = g.querySelector('rect')
            .getBoundingClientRect(); return {key: g.dataset.key, label: g.querySelector('.label').textContent,
            sub: g.querySelector('.sub').textContent, alert: g.classList.contains('alert'),
            x: r.left, y: r.top, w: r.width, h: r.height, inside: r.left >= svg.left && r.right <= svg.right + 0.5
            && r.top >= svg.top && r.bottom <= svg.bottom + 0.5}; }); })()""")
    assert sorted(n["key"] for n in nodes) == sorted(
        [f"job:{j}" for j in ("ingest", "crm", "daily", "vip", "summary")]
        + [f"table:shop.{t}" for t in ("orders", "customers", "daily", "vip", "summary")])
    assert all(n["inside"] and n["w"] > 0 for n in nodes)
    for i, a in enumerate(nodes):
        for b in nodes[i + 1:]:
            apart = (a["x"] + a["w"] <= b["x"] or b["x"] + b["w"] <= a["x"] or a["y"] + a["h"] <= b["y"]
                     or b["y"] + b["h"] <= a["y"])
            assert apart, (a["key"], b["key"])
    by = {n["key"]: n for n in nodes}
    assert by["table:shop.vip"]["sub"] == "derived · frontier 2 · 2 behind" and by["table:shop.vip"]["alert"]
    assert by["table:shop.orders"]["sub"] == "root · frontier 4" and not by["table:shop.orders"]["alert"]
    # layers left to right: ingest | orders | daily | shop.daily | vip | shop.vip | summary | shop.summary
    xs = [by[k]["x"] for k in ("job:ingest", "table:shop.orders", "job:daily", "table:shop.daily", "job:vip",
                               "table:shop.vip", "job:summary", "table:shop.summary")]
    assert xs == sorted(xs) and len(set(xs)) == len(xs)
    assert browser.evaluate("document.querySelectorAll('#lineage path.edge').length") == 9

    # lag of each derived table, with two charts each; the consistent read's explanation; the doctor
    lag = browser.evaluate("document.querySelector('#lag').innerText")
    for name, behind in (("shop.daily", 1), ("shop.vip", 2), ("shop.summary", 2)):
        assert re.search(rf"{re.escape(name)}: {behind} barrier\(s\), [\d.]+ (?:s|min|h) behind now", lag), lag
    assert browser.evaluate("document.querySelectorAll('#lag svg.chart path.line').length") == 6
    read = browser.evaluate("document.querySelector('#read pre').innerText")
    assert read.splitlines()[:3] == [
        "read_committed (scope query): barrier 2 (newest sealed 4, open epoch 5)",
        "held back by shop.summary (derived, job 'summary'): precommitted up to 2, 2 barrier(s) behind",
        "held back by shop.vip (derived, job 'vip'): precommitted up to 2, 2 barrier(s) behind"]
    assert "  shop.daily: version 2 (head 3); derived, frontier 3" in read.splitlines()
    assert read == Pipeline(shop.catalog).choose([t for t in GRID]).explanation.text()
    doctor = browser.evaluate("document.querySelector('#doctor').innerText")
    assert "Doctor: healthy" in doctor and re.search(r"WARNING\s+job\s+summary\s+lagging", doctor), doctor

    shot = tmp_path / "report.png"
    w, h = browser.screenshot(str(shot))
    assert png_size(shot) == (w, h) and w >= 1280 and h > 900
    assert shot.stat().st_size > 20_000  # a real picture, not a blank page


def test_report_of_an_empty_catalog(catalog_spec, browser: Browser, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    catalog_spec.open().close()
    page = tmp_path / "empty.html"
    run = lakestep("report", "--html", str(page), catalog=catalog_spec.url)
    assert run.code == 0 and run.out == f"wrote {page} ({page.stat().st_size} bytes): no barrier sealed yet\n"
    browser.open(page.as_uri())
    text = browser.evaluate("document.body.innerText")
    assert "No job is registered: there is no lineage to draw." in text
    assert "No managed table: no job is registered, so there is no barrier to read at." in text
    assert "no coordinator holds the lease" in text
