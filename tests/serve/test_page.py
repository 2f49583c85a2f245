"""``lakestep serve``'s live page at ``/``, opened in headless Chromium (tests/cli/chromium.py):
the report of the published shop as rendered (lineage, barrier grid, the lagging table), self-
contained, reloading itself; after a commit to the catalog, the next load shows it (the page
is read at each request, never cached). With a token, the page is 401 without it."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator

import pytest
import requests

from tests.cli.chromium import Browser, chromium_binary
from tests.cli.test_report import png_size
from tests.serve.conftest import TOKEN, Served
from tests.serve.test_rest import MANAGED, SQLITE, Shop
from tests.waiting import wait_until

JOBS = ("ingest", "totals", "counts")
#: seconds between reloads: longer than a test, so that the page does not reload under a check
REFRESH = 3600

GRID = """[...document.querySelectorAll('#barriers tr[data-table]')].map(tr => ({
    table: tr.dataset.table, lagging: tr.classList.contains('lagging'),
    cells: [...tr.querySelectorAll('td.cell')].map(td => td.innerText.trim()),
    behind: tr.querySelector('td.behind').innerText}))"""
SEALED = "document.querySelector('#summary').innerText.match(/newest sealed\\s+(\\d+)/)[1]"


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    binary = chromium_binary()
    if binary is None:
        pytest.fail("chromium is not installed: scripts/ensure-services.sh installs it (make test runs it)")
    with Browser(binary) as b:
        yield b


@pytest.fixture
def live(shop: Shop) -> Iterator[Served]:
    s = Served(shop.cat, refresh=REFRESH)
    yield s
    s.stop()


def fetched(browser: Browser) -> list[str]:
    """What the page requested since it was opened (the live page names an empty icon, so
    not even Chromium's own ``/favicon.ico``)."""
    return browser.requests()


def shown(browser: Browser) -> dict[str, Any] | None:
    """Whether the loaded page shows shop.counts lagging, and its newest sealed barrier; None
    while a reload is under way."""
    try:
        return browser.evaluate("""(() => {
            const tr = document.querySelector('#barriers tr[data-table="shop.counts"]');
            if (document.readyState !== 'complete' || !tr) return null;
            return {lagging: tr.classList.contains('lagging'), sealed: """ + SEALED + "}; })()")
    except RuntimeError:  # the page's context went away under the call: it is being reloaded
        return None


def grid(browser: Browser) -> dict[str, dict[str, Any]]:
    return {r["table"]: r for r in browser.evaluate(GRID)}


@SQLITE
def test_live_page_renders_and_follows_the_catalog(shop: Shop, live: Served, browser: Browser,
                                                   tmp_path: Path) -> None:
    page = live.uri + "/"
    browser.open(page)
    assert fetched(browser) == [page]  # the page itself, nothing else (no script, style, image, font)
    text = browser.evaluate("document.body.innerText")
    assert "lakestep pipeline report" in text and f"live: reloads every {REFRESH} s" in text
    assert browser.evaluate("[...document.querySelectorAll('meta[http-equiv=refresh]')].map(m => m.content)") \
        == [str(REFRESH)]

    # the lineage: one SVG, a node for every job and every managed table
    assert browser.evaluate("document.querySelectorAll('#lineage svg').length") == 1
    nodes = browser.evaluate("""Object.fromEntries([...document.querySelectorAll('#lineage svg g.node')].map(g =>
        [g.dataset.key, {label: g.querySelector('.label').textContent, alert: g.classList.contains('alert'),
                         w: g.querySelector('rect').getBoundingClientRect().width}]))""")
    assert set(nodes) == {f"job:{j}" for j in JOBS} | {f"table:{t}" for t in MANAGED}
    assert all(n["label"] == key.split(":", 1)[1] and n["w"] > 0 for key, n in nodes.items()), nodes
    assert nodes["table:shop.counts"]["alert"] and not nodes["table:shop.totals"]["alert"]

    # the barrier grid: a row per managed table, a cell per sealed barrier; shop.counts lags
    assert browser.evaluate(SEALED) == "5"
    rows = grid(browser)
    assert sorted(rows) == sorted(MANAGED)
    assert all(len(r["cells"]) == 5 and all(r["cells"]) for r in rows.values()), rows
    assert rows["shop.counts"]["lagging"] and rows["shop.counts"]["behind"] == "2"
    assert [t for t, r in rows.items() if r["lagging"]] == ["shop.counts"]
    assert rows["shop.totals"]["cells"][-1] != "·" and rows["shop.counts"]["cells"][-2:] == ["·", "·"], rows

    shot = tmp_path / "live.png"
    w, h = browser.screenshot(str(shot))
    assert png_size(shot) == (w, h) and w >= 1280 and h > 900
    assert shot.stat().st_size > 20_000  # a real picture, not a blank page

    # a commit to the catalog: a new barrier sealed, counts catches up; the next load shows it
    shop.step(lagging=True, check=False)
    browser.open(page)
    assert fetched(browser) == [page]
    assert browser.evaluate(SEALED) == "6"
    rows = grid(browser)
    assert not any(r["lagging"] for r in rows.values()), rows
    assert rows["shop.counts"]["behind"] == "0" and all(len(r["cells"]) == 6 for r in rows.values())
    assert not browser.evaluate("document.querySelector('#lineage g.node[data-key=\"table:shop.counts\"]')"
                                ".classList.contains('alert')")


@SQLITE
def test_live_page_reloads_itself(shop: Shop, browser: Browser) -> None:
    """The browser reloads the page every ``refresh`` seconds on its own, and each load is read
    from the catalog anew: the commit made after the page was opened appears without opening it."""
    with Served(shop.cat, refresh=1) as live:
        browser.open(live.uri + "/")
        assert shown(browser) == {"lagging": True, "sealed": "5"}
        shop.step(lagging=True, check=False)
        wait_until(lambda: shown(browser) == {"lagging": False, "sealed": "6"}, "the page reloads itself",
                   timeout=60, interval=0.2, detail=lambda: str(shown(browser)))
        assert set(fetched(browser)) == {live.uri + "/"}  # reloads of the page only
        browser.open("about:blank")  # stop reloading before the server goes


@SQLITE
def test_live_page_needs_the_token(served_token: Served) -> None:
    page = served_token.uri + "/"
    r = requests.get(page)
    assert r.status_code == 401 and r.headers["WWW-Authenticate"] == "Bearer"
    assert r.json()["error"]["type"] == "NotAuthorizedException" and "lakestep pipeline report" not in r.text
    assert requests.get(page, headers={"Authorization": "Bearer wrong"}).status_code == 401
    r = requests.get(page, headers={"Authorization": f"Bearer {TOKEN}"})
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    assert "lakestep pipeline report" in r.text and '<meta http-equiv="refresh" content="5">' in r.text
