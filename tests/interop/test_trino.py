"""Trino (the real server, its Iceberg connector: a JVM engine, not lakestep's code) reads
lakestep's published tables through `lakestep serve`, Iceberg's REST catalog, exactly, on both
catalog backends:

* every ``lakestep@barrier=N`` warehouse and ``lakestep@consistent`` give, for a join of the
  derived table kept up (``shop.totals``) and the lagging one (``shop.counts``), exactly
  lakestep's rows at that barrier;
* on the plain ``lakestep`` warehouse, ``FOR VERSION AS OF 'barrier-N'`` (the tag) gives the same;
* the primary-key table (position deletes) and the decimal and date columns read as lakestep reads.

One Trino server (scripts/trino.py: trino-server of Maven Central on Java 25, the Iceberg plugin
only) with a catalog per warehouse of both backends, its catalog properties those of
docs/iceberg.md. Too slow for `make test` (the first run downloads about 820 MB; each run starts
a JVM server): it runs when ``LAKESTEP_TEST_TRINO=1``, which `make interop` sets.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import time
from pathlib import Path
from typing import Any, Iterator

import pytest
import sqlalchemy as sa

from tests.interop.shops import JOIN, check, customers, joined, orders_rows, served_shops
from tests.serve.conftest import Served

pytestmark = [pytest.mark.spark,  # a JVM server: the serial lane
              pytest.mark.skipif(os.environ.get("LAKESTEP_TEST_TRINO") != "1",
                                 reason="starts a Trino server (slow; 820 MB the first time): "
                                        "`make interop` runs it (LAKESTEP_TEST_TRINO=1)")]

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))
import trino  # noqa: E402  (scripts/trino.py)


def doc_trino_rest() -> dict[str, str]:
    """The properties docs/iceberg.md gives for Trino's REST catalog (``etc/catalog/lake.properties``)."""
    text = (ROOT / "docs" / "iceberg.md").read_text()
    m = re.search(r"\*\*Trino\*\* \(`etc/catalog/lake\.properties`.*?```text\n(.*?)```", text, flags=re.S)
    assert m is not None, "docs/iceberg.md has no Trino REST catalog block"
    return dict(line.split("=", 1) for line in m.group(1).splitlines() if line.strip())


def rest_catalog(served: Served, warehouse: str) -> dict[str, str]:
    """The docs' Trino catalog (their keys; no token: the server has none) on ``served``."""
    doc = doc_trino_rest()
    assert doc["connector.name"] == "iceberg" and doc["iceberg.catalog.type"] == "rest", doc
    assert {"iceberg.rest-catalog.uri", "iceberg.rest-catalog.warehouse"} <= set(doc), doc
    return {**doc, "iceberg.rest-catalog.uri": served.uri, "iceberg.rest-catalog.warehouse": warehouse}


@pytest.fixture(scope="module")
def trino_answers(tmp_path_factory: pytest.TempPathFactory, pg_admin: sa.Engine
                  ) -> Iterator[tuple[dict[str, Any], dict[str, list[list[Any]]]]]:
    """Both backends' shops published and served; one Trino server asked every query once.
    Yields (its answers, lakestep's answers by query name)."""
    trino.ensure()  # before the shops: the first run downloads
    work = tmp_path_factory.mktemp("trino")
    with contextlib.ExitStack() as stack:
        catalogs: dict[str, dict[str, str]] = {}
        queries: dict[str, str] = {}
        want: dict[str, list[list[Any]]] = {}
        for s in served_shops(stack, work, pg_admin):
            b = s.backend
            plain, cons = f"{b}_plain", f"{b}_cons"
            catalogs[plain] = rest_catalog(s.served, "lakestep")
            catalogs[cons] = rest_catalog(s.served, "lakestep@consistent")
            queries[f"{b} consistent join"] = JOIN.format(a=f"{cons}.shop.totals", b=f"{cons}.shop.counts")
            want[f"{b} consistent join"] = joined(s.cat, s.complete)
            for n in s.barriers:
                catalogs[f"{b}_b{n}"] = rest_catalog(s.served, f"lakestep@barrier={n}")
                queries[f"{b} rest barrier {n} join"] = JOIN.format(a=f"{b}_b{n}.shop.totals",
                                                                    b=f"{b}_b{n}.shop.counts")
                queries[f"{b} plain tag {n} join"] = JOIN.format(
                    a=f"{plain}.shop.totals FOR VERSION AS OF 'barrier-{n}'",
                    b=f"{plain}.shop.counts FOR VERSION AS OF 'barrier-{n}'")
                want[f"{b} rest barrier {n} join"] = want[f"{b} plain tag {n} join"] = joined(s.cat, n)
            # the primary-key table (its position deletes) and the decimal and date columns
            queries[f"{b} customers"] = f"SELECT cid, name, tier FROM {cons}.shop.customers ORDER BY cid"
            want[f"{b} customers"] = customers(s)
            queries[f"{b} orders"] = (f"SELECT id, region, amount, CAST(price AS varchar), CAST(day AS varchar) "
                                      f"FROM {cons}.shop.orders ORDER BY id")
            want[f"{b} orders"] = orders_rows(s)
        answers: dict[str, Any] = {}
        began = time.monotonic()
        with trino.Trino(work / "trino", catalogs) as server:
            print(f"[trino {trino.VERSION}] started in {server.started_in:.1f} s with {len(catalogs)} catalogs")
            for name, sql in queries.items():
                try:
                    answers[name] = server.query(sql)
                except trino.TrinoError as e:
                    answers[name] = {"error": f"{e}\n--- Trino's log ends:\n{server.tail(3000)}"}
        print(f"[trino {trino.VERSION}] {len(queries)} queries, {time.monotonic() - began:.1f} s with start and stop")
        yield answers, want


def test_rest_catalog_pinned_warehouses_give_lakesteps_rows(trino_answers: Any) -> None:
    answers, want = trino_answers
    assert check("Trino", answers, want, "rest barrier") >= 4  # at least two barriers on each backend
    assert check("Trino", answers, want, "consistent join") == 2


def test_tags_on_the_plain_warehouse(trino_answers: Any) -> None:
    answers, want = trino_answers
    assert check("Trino", answers, want, "plain tag") >= 4


def test_primary_keys_decimals_and_dates(trino_answers: Any) -> None:
    answers, want = trino_answers
    assert check("Trino", answers, want, "customers") == 2
    assert [2, "bobby", 2] in answers["sqlite customers"]  # an upserted row: its old one deleted by position
    assert check("Trino", answers, want, "orders") == 2
