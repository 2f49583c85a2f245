"""``lakestep query``: SQL on DuckDB over tables read at one consistent barrier, through the console script."""

from __future__ import annotations

from lakestep.query.rows import labels

from .conftest import Shop, lakestep

JOIN = "SELECT d.k, d.v AS daily, s.v AS summary FROM shop.daily d JOIN shop.summary s ON d.k = s.k ORDER BY d.k"


def expected(shop: Shop, barrier: int | None) -> list[dict[str, int]]:
    """The join computed from the tables' versions at ``barrier`` (None: their heads), in Python."""
    p, cat = shop.pipeline, shop.catalog

    def rows(name: str) -> dict[int, int]:
        t = cat.load_table(name)
        v = t.version if barrier is None else p.version_at(name, barrier)
        return {r["k"]: r["v"] for r in t.to_arrow(version=v).to_pylist()}

    daily, summary = rows("shop.daily"), rows("shop.summary")
    return [{"k": k, "daily": daily[k], "summary": summary[k]} for k in sorted(daily) if k in summary]


def test_query_reads_one_barrier(shop: Shop) -> None:
    doc = lakestep("query", JOIN, "--json", catalog=shop.url).json()
    read = doc["read"]
    assert read["barrier"] == 2  # shop.summary is 2 behind the newest sealed barrier (4)
    assert read["versions"] == {"shop.daily": shop.pipeline.version_at("shop.daily", 2),
                                "shop.summary": shop.pipeline.version_at("shop.summary", 2)}
    assert read["behind"] == {"shop.daily": 1, "shop.summary": 2}
    assert doc["rows"] == expected(shop, 2) and doc["num_rows"] == len(expected(shop, 2))
    assert "held back by shop.summary" in read["explanation"]


def test_query_levels_and_text_output(shop: Shop) -> None:
    naive = lakestep("query", JOIN, "--level", "read_uncommitted", "--json", catalog=shop.url).json()
    assert naive["read"]["barrier"] is None and naive["rows"] == expected(shop, None)
    run = lakestep("query", JOIN, catalog=shop.url)
    assert run.code == 0, run.err
    assert "read read_committed (scope query) at barrier 2" in run.out
    assert f"{len(expected(shop, 2))} row(s)" in run.out


def test_query_keeps_columns_that_share_a_name(shop: Shop) -> None:
    """README's example (d.v, s.v), with s.v shifted so that the two columns differ: both are shown
    and serialized, the second as v_2."""
    sql = "SELECT d.k, d.v, s.v + 1000 AS v FROM shop.daily d JOIN shop.summary s ON d.k = s.k ORDER BY d.k"
    want = [{"k": r["k"], "v": r["daily"], "v_2": r["summary"] + 1000} for r in expected(shop, 2)]
    assert want and any(r["v"] != r["v_2"] for r in want)  # the two columns differ: a lost one would show
    doc = lakestep("query", sql, "--json", catalog=shop.url).json()
    assert doc["columns"] == ["k", "v", "v_2"] and doc["rows"] == want
    run = lakestep("query", sql, "--max-rows", "1", catalog=shop.url)
    assert run.code == 0, run.err
    first = want[0]
    line = next(ln for ln in run.out.splitlines() if ln.strip().startswith("│") and f" {first['k']} " in ln)
    cells = [c.strip() for c in line.strip().strip("│").split("│")]
    assert cells == [str(first["k"]), str(first["v"]), str(first["v_2"])]


def test_labels_of_duplicate_names() -> None:
    assert labels(["k", "v", "v"]) == ["k", "v", "v_2"]
    assert labels(["v", "v", "v_2", "v"]) == ["v", "v_3", "v_2", "v_4"]  # a label never repeats a real name


def test_query_time_travel_and_errors(shop: Shop) -> None:
    v = shop.pipeline.version_at("shop.daily", 1)
    doc = lakestep("query", f"SELECT count(*) AS n FROM shop.daily VERSION AS OF {v}", "--json", catalog=shop.url).json()
    n1 = shop.catalog.load_table("shop.daily").to_arrow(version=v).num_rows
    assert doc["rows"] == [{"n": n1}] and doc["read"]["versions"] == {f"shop.daily@v{v}": v}
    bad = lakestep("query", "SELECT * FROM shop.nope", catalog=shop.url)
    assert bad.code == 1 and bad.err.startswith("error: ") and "Traceback" not in bad.err
    bad = lakestep("query", "SELECT * FROM shop.daily WHERE (", catalog=shop.url)
    assert bad.code == 1 and "cannot parse" in bad.err
