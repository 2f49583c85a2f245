"""Under a running pipeline (a thread appends, seals, derives with the lagging job skipping
rounds, and publishes), every DuckDB session attached to ``lakestep@consistent`` and every
PyIceberg session at ``lakestep@consistent`` answers a join of the two derived tables at one
barrier: exactly lakestep's join at some complete cut, both tables agreeing row by row."""

from __future__ import annotations

import collections
import threading
from typing import Any

import requests
from pyiceberg.catalog.rest import RestCatalog

from lakestep.barrier import OPEN_EPOCH
from lakestep.iceberg import status
from tests.iceberg.conftest import orders
from tests.serve.conftest import Served
from tests.serve.test_duckdb import duck, lakestep_join, rows
from tests.serve.test_rest import SQLITE, Shop

ROUNDS = 12


def advance(shop: Shop, done: threading.Event, failures: list[BaseException]) -> None:
    try:
        for i in range(ROUNDS):
            shop.orders.append(orders((100 + i, ("eu", "us", "apac")[i % 3], 10 + i)), barrier=OPEN_EPOCH)
            shop.step(lagging=i % 3 != 1, check=False)
    except BaseException as e:  # noqa: BLE001 - handed to the test
        failures.append(e)
    finally:
        done.set()


@SQLITE
def test_consistent_sessions_under_a_running_pipeline(shop: Shop, served: Served) -> None:
    done, failures = threading.Event(), []  # type: ignore[var-annotated]
    worker = threading.Thread(target=advance, args=(shop, done, failures), daemon=True)
    answers: list[tuple[int, collections.Counter[tuple[Any, ...]]]] = []
    pyiceberg: list[tuple[int, collections.Counter[tuple[Any, ...]]]] = []
    worker.start()
    sessions = 0
    while not done.is_set() or sessions < 3:
        sessions += 1
        con = duck()
        con.execute(f"ATTACH 'lakestep@consistent' AS c (TYPE iceberg, ENDPOINT '{served.uri}', "
                    "AUTHORIZATION_TYPE 'none')")
        first = rows(con, "c")
        again = rows(con, "c")  # the same session, later: the same barrier
        assert first == again
        answers.append((sessions, first))
        rc = RestCatalog("lakestep", uri=served.uri, warehouse="lakestep@consistent")
        n = int(rc.properties["prefix"].split("=")[1])
        t = collections.Counter((r["region"], r["total"]) for r in rc.load_table("shop.totals").scan().to_arrow().to_pylist())
        c = collections.Counter((r["region"], r["total"], r["n"])
                                for r in rc.load_table("shop.counts").scan().to_arrow().to_pylist())
        pyiceberg.append((n, collections.Counter((reg, tot, tot2, cnt) for reg, tot in t for reg2, tot2, cnt in c
                                                 if reg == reg2)))
    worker.join(timeout=120)
    assert not failures, failures
    complete = status(shop.cat).complete
    assert complete is not None and complete > 3
    joins = {b: lakestep_join(shop, b) for b in range(1, complete + 1)}
    for session, got in answers:
        assert all(r[1] == r[2] for r in got), (session, got)  # both tables at one barrier
        assert any(got == want for want in joins.values()), (session, got)
    for n, got in pyiceberg:
        assert got == joins[n], n
    assert len({n for n, _ in pyiceberg}) >= 1
    assert requests.get(f"{served.uri}/health").status_code == 200
