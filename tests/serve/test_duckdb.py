"""DuckDB's iceberg extension attached to ``lakestep serve`` (``ATTACH ... (TYPE iceberg,
ENDPOINT ...)``, the extensions loaded from their wheels as in tests/iceberg): a join of the
two derived tables, the one kept up and the lagging one, at each pinned barrier equals the
same join of lakestep's rows at that barrier, exactly."""

from __future__ import annotations

import collections
from typing import Any

import duckdb
import pytest

from lakestep.barrier import Pipeline
from lakestep.query.duck import load_extensions
from tests.serve.conftest import TOKEN, Served
from tests.serve.test_rest import SQLITE, Shop

JOIN = "SELECT t.region, t.total, c.total, c.n FROM {a}.shop.totals t JOIN {a}.shop.counts c USING (region)"


def lakestep_join(shop: Shop, barrier: int) -> collections.Counter[tuple[Any, ...]]:
    p = Pipeline(shop.cat)
    totals = shop.cat.load_table("shop.totals").to_arrow(version=p.version_at("shop.totals", barrier)).to_pylist()
    counts = shop.cat.load_table("shop.counts").to_arrow(version=p.version_at("shop.counts", barrier)).to_pylist()
    return collections.Counter((t["region"], t["total"], c["total"], c["n"])
                               for t in totals for c in counts if t["region"] == c["region"])


def duck() -> Any:
    con = duckdb.connect()
    load_extensions(con, "avro", "httpfs", "iceberg")
    return con


def rows(con: Any, alias: str) -> collections.Counter[tuple[Any, ...]]:
    return collections.Counter(tuple(r) for r in con.execute(JOIN.format(a=alias)).fetchall())


def test_duckdb_joins_the_derived_tables_at_pinned_barriers(shop: Shop, served: Served) -> None:
    con = duck()
    seen = set()
    for n in (1, 2, 3):
        con.execute(f"ATTACH 'lakestep@barrier={n}' AS b{n} (TYPE iceberg, ENDPOINT '{served.uri}', "
                    "AUTHORIZATION_TYPE 'none')")
        want = lakestep_join(shop, n)
        got = rows(con, f"b{n}")
        assert got == want, n
        assert all(r[1] == r[2] for r in got)  # both derived tables at the same barrier: the same totals
        seen.add(frozenset(want.items()))
    assert len(seen) == 2  # barriers 1 and 2 hold the same rows, 3 more
    con.execute(f"ATTACH 'lakestep' AS l (TYPE iceberg, ENDPOINT '{served.uri}', AUTHORIZATION_TYPE 'none')")
    assert rows(con, "l") == lakestep_join(shop, 3)  # main: the newest complete cut


@SQLITE
def test_duckdb_with_a_bearer_token(shop: Shop, served_token: Served) -> None:
    con = duck()
    con.execute("CREATE SECRET lakestep_rest (TYPE iceberg, TOKEN ?)", [TOKEN])
    con.execute(f"ATTACH 'lakestep@barrier=2' AS b (TYPE iceberg, ENDPOINT '{served_token.uri}', "
                "SECRET lakestep_rest)")
    assert rows(con, "b") == lakestep_join(shop, 2)
    wrong = duck()
    wrong.execute("CREATE SECRET bad (TYPE iceberg, TOKEN 'wrong')")
    with pytest.raises(duckdb.Error):
        wrong.execute(f"ATTACH 'lakestep' AS b (TYPE iceberg, ENDPOINT '{served_token.uri}', SECRET bad)")
        wrong.execute("SELECT * FROM b.shop.totals").fetchall()
