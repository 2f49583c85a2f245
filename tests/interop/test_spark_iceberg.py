"""Spark with Iceberg's runtime (a JVM engine, not lakestep's code) reads lakestep's published
tables exactly, on both catalog backends:

* through `lakestep serve`, Iceberg's REST catalog: every ``lakestep@barrier=N`` warehouse and
  ``lakestep@consistent`` give, for a join of the derived table kept up (``shop.totals``) and the
  lagging one (``shop.counts``), exactly lakestep's rows at that barrier;
* through Iceberg's JDBC catalog on lakestep's own catalog database (SQLite's or PostgreSQL's
  JDBC driver): ``VERSION AS OF 'barrier-N'`` (the tag) gives the same, ``main`` the complete cut;
  the primary-key table (position deletes) and the decimal and date columns read as lakestep reads.

Spark 4.1 with Iceberg's runtime runs in the JVM peers' virtualenv (scripts/jars.py), one
application for both backends (tests/interop/spark_reader.py), its answers compared here.
"""

from __future__ import annotations

import contextlib
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any, Iterator

import pytest
import sqlalchemy as sa

from tests.conftest import CatalogSpec
from tests.interop.shops import JOIN, check, customers, joined, orders_rows, served_shops
from tests.serve.conftest import Served

pytestmark = pytest.mark.spark

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))
import jars  # noqa: E402  (scripts/jars.py)


def doc_catalog(name: str) -> dict[str, str]:
    """The Spark properties docs/iceberg.md gives for catalog ``name`` ("" -> its class)."""
    text = (ROOT / "docs" / "iceberg.md").read_text()
    found = re.findall(rf"^spark\.sql\.catalog\.{name}(?:\.(\S+))?[ \t]+(\S.*)$", text, flags=re.M)
    return {k: v.strip() for k, v in found}


def jdbc_catalog(spec: CatalogSpec) -> dict[str, str]:
    """The docs' JDBC catalog (their keys, this database's values) on the catalog database of ``spec``."""
    doc = doc_catalog("lakestep")
    assert set(doc) == {"", "type", "uri", "jdbc.user", "warehouse"} and doc["type"] == "jdbc", doc
    props = {**doc, "warehouse": spec.warehouse}
    if spec.backend == "sqlite":
        del props["jdbc.user"]
        return {**props, "uri": f"jdbc:sqlite:{spec.url.removeprefix('sqlite:///')}"}
    url = sa.make_url(spec.url)
    schema = url.query["options"].split("search_path=", 1)[1]
    props.update({"jdbc.user": url.username or "postgres",
                  "uri": f"jdbc:postgresql://{url.host}:{url.port or 5432}/{url.database}?currentSchema={schema}"})
    if url.password:
        props["jdbc.password"] = url.password
    return props


def rest_catalog(served: Served, warehouse: str) -> dict[str, str]:
    """The docs' REST catalog (their keys; no token: the server has none) on ``served``."""
    doc = doc_catalog("lake")
    assert set(doc) == {"", "type", "uri", "warehouse", "token"} and doc["type"] == "rest", doc
    return {"": doc[""], "type": doc["type"], "uri": served.uri, "warehouse": warehouse}


@pytest.fixture(scope="module")
def spark_answers(tmp_path_factory: pytest.TempPathFactory, pg_admin: sa.Engine
                  ) -> Iterator[tuple[dict[str, Any], dict[str, list[list[Any]]]]]:
    """Both backends' shops published and served (tests/interop/shops.py); the peer's Spark asked
    every query once, a session per backend. Yields (its answers, lakestep's answers by query name)."""
    work = tmp_path_factory.mktemp("interop")
    with contextlib.ExitStack() as stack:
        sessions, want = [], {}
        for s in served_shops(stack, work, pg_admin):
            b = s.backend
            catalogs = {"lakestep": jdbc_catalog(s.spec), "cons": rest_catalog(s.served, "lakestep@consistent")}
            queries = {f"{b} consistent join": JOIN.format(a="cons.shop.totals", b="cons.shop.counts"),
                       f"{b} jdbc main join": JOIN.format(a="lakestep.shop.totals", b="lakestep.shop.counts")}
            want[f"{b} consistent join"] = want[f"{b} jdbc main join"] = joined(s.cat, s.complete)
            for n in s.barriers:
                catalogs[f"b{n}"] = rest_catalog(s.served, f"lakestep@barrier={n}")
                queries[f"{b} rest barrier {n} join"] = JOIN.format(a=f"b{n}.shop.totals", b=f"b{n}.shop.counts")
                queries[f"{b} jdbc tag {n} join"] = JOIN.format(
                    a=f"lakestep.shop.totals VERSION AS OF 'barrier-{n}'",
                    b=f"lakestep.shop.counts VERSION AS OF 'barrier-{n}'")
                want[f"{b} rest barrier {n} join"] = want[f"{b} jdbc tag {n} join"] = joined(s.cat, n)
            queries[f"{b} customers"] = "SELECT cid, name, tier FROM cons.shop.customers ORDER BY cid"
            want[f"{b} customers"] = customers(s)
            queries[f"{b} orders"] = "SELECT id, region, amount, price, day FROM cons.shop.orders ORDER BY id"
            want[f"{b} orders"] = orders_rows(s)
            sessions.append({"catalogs": catalogs, "queries": queries})
        py, peer_jars, env = jars.peer_spark()
        spec_file, out_file = work / "spec.json", work / "out.json"
        spec_file.write_text(json.dumps({"jars": [str(j) for j in peer_jars],
                                         "workdir": str(work / "spark"), "sessions": sessions}))
        proc = subprocess.run([str(py), str(ROOT / "tests" / "interop" / "spark_reader.py"), str(spec_file),
                               str(out_file)], capture_output=True, text=True, timeout=900, env=env, cwd=work)
        assert proc.returncode == 0, proc.stderr[-5000:]
        yield json.loads(out_file.read_text()), want


def test_rest_catalog_pinned_warehouses_give_lakesteps_rows(spark_answers: Any) -> None:
    answers, want = spark_answers
    assert check("Spark", answers, want, "rest barrier") >= 4  # at least two barriers on each backend
    assert check("Spark", answers, want, "consistent join") == 2


def test_jdbc_catalog_tags_and_main(spark_answers: Any) -> None:
    answers, want = spark_answers
    assert check("Spark", answers, want, "jdbc tag") >= 6
    assert check("Spark", answers, want, "jdbc main") == 2


def test_primary_keys_decimals_and_dates(spark_answers: Any) -> None:
    answers, want = spark_answers
    assert check("Spark", answers, want, "customers") == 2
    assert [2, "bobby", 2] in answers["sqlite customers"]  # an upserted row: its old one deleted by position
    assert check("Spark", answers, want, "orders") == 2
