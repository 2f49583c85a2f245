"""``lakestep serve`` as an Iceberg REST catalog: PyIceberg's ``RestCatalog`` reads every
published table, at ``main`` and at pinned barriers, exactly as lakestep reads it; bad
input gets the spec's error body with nothing leaked."""

from __future__ import annotations

import json
from typing import Any, Iterator

import pytest
import requests
from pyiceberg.catalog.rest import RestCatalog
from pyiceberg.exceptions import ForbiddenError, NoSuchNamespaceError, NoSuchTableError, RESTError, UnauthorizedError

from lakestep.barrier import OPEN_EPOCH, Pipeline
from lakestep.iceberg import s3_properties, status
from tests.iceberg.conftest import TABLES, Shop, orders
from tests.iceberg.readers import counter
from tests.serve.conftest import TOKEN, Served, published_shop

SQLITE = pytest.mark.parametrize("catalog_spec", ["sqlite"], indirect=True)
#: the root, the primary-key root, the derived table kept up and the lagging one
MANAGED = ("shop.orders", "shop.customers", "shop.totals", "shop.counts")


def rest(served: Served, warehouse: str | None = None, **props: str) -> RestCatalog:
    """PyIceberg's REST client; on an S3 warehouse with the reader's own keys (the server
    hands out none)."""
    own = s3_properties(served.catalog.storage.as_dict()) if served.catalog.storage.as_dict() else {}
    return RestCatalog("lakestep", uri=served.uri, **({"warehouse": warehouse} if warehouse else {}), **own,
                       **props)


def rows_at(shop: Shop, ident: str, barrier: int) -> Any:
    return counter(shop.cat.load_table(ident).to_arrow(version=Pipeline(shop.cat).version_at(ident, barrier)))


def iceberg_rows(rc: RestCatalog, ident: str) -> Any:
    return counter(rc.load_table(ident).scan().to_arrow())


@pytest.mark.s3("postgres")
def test_reads_every_published_table_at_main(shop: Shop, served: Served) -> None:
    rc = rest(served)
    assert rc.list_namespaces() == [("shop",)]
    assert sorted(rc.list_tables("shop")) == sorted(tuple(t.split(".")) for t in TABLES)
    assert rc.load_namespace_properties("shop") == {}
    complete = status(shop.cat).complete
    assert complete == 3  # counts lags: totals holds barrier 5's rows, main stays at 3
    assert counter(shop.totals.to_arrow()) != rows_at(shop, "shop.totals", 3)
    for ident in TABLES:
        t = rc.load_table(ident)
        published = shop.engines.table(ident)
        assert t.metadata_location == published.metadata_location
        assert t.metadata.current_snapshot_id == published.metadata.current_snapshot_id
        assert sorted(t.metadata.refs) == sorted(published.metadata.refs)  # the same tags
        want = counter(shop.regions.to_arrow()) if ident == "shop.regions" else rows_at(shop, ident, complete)
        assert iceberg_rows(rc, ident) == want, ident
        assert rc.table_exists(ident)
    assert rc.namespace_exists("shop") and not rc.namespace_exists("nope")
    assert not rc.table_exists("shop.nope")
    assert "s3.secret-access-key" not in requests.get(f"{served.uri}/v1/namespaces/shop/tables/orders").json()["config"]


@SQLITE
def test_a_missing_metadata_file_is_a_500_that_names_nothing(shop: Shop, served: Served) -> None:
    import os

    loc = shop.engines.table("shop.counts").metadata_location.removeprefix("file://")
    os.rename(loc, loc + ".moved")
    try:
        r = requests.get(f"{served.uri}/v1/namespaces/shop/tables/counts")
    finally:
        os.rename(loc + ".moved", loc)
    assert r.status_code == 500 and r.json() == {"error": {"message": "internal error", "type": "InternalServerError",
                                                           "code": 500}}


@SQLITE
def test_pinned_warehouses_read_every_table_at_one_barrier(shop: Shop, served: Served) -> None:
    newest = {ident: counter(shop.cat.load_table(ident).to_arrow()) for ident in MANAGED}
    differs = set()
    for n in (1, 2, 3):
        rc = rest(served, f"lakestep@barrier={n}")
        assert rc.properties["prefix"] == f"barrier={n}"
        for ident in MANAGED:
            got = iceberg_rows(rc, ident)
            assert got == rows_at(shop, ident, n), (ident, n)
            if got != newest[ident]:
                differs.add(ident)
        # the unmanaged table has no barrier: answered as published
        assert iceberg_rows(rc, "shop.regions") == counter(shop.regions.to_arrow())
    assert differs >= {"shop.orders", "shop.totals", "shop.counts"}  # the pins are not the newest rows
    # the moving warehouse pins the newest complete cut at config time
    rc = rest(served, "lakestep@consistent")
    assert rc.properties["prefix"] == "barrier=3"
    assert all(iceberg_rows(rc, ident) == rows_at(shop, ident, 3) for ident in MANAGED)
    shop.orders.append(orders((9, "eu", 900)), barrier=OPEN_EPOCH)
    shop.step(check=False)  # main advances to 6 ...
    assert status(shop.cat).complete == 6
    assert iceberg_rows(rc, "shop.orders") == rows_at(shop, "shop.orders", 3)  # ... the session stays at 3
    assert iceberg_rows(rest(served), "shop.orders") == rows_at(shop, "shop.orders", 6)
    assert rest(served, "lakestep@consistent").properties["prefix"] == "barrier=6"  # a new session moves
    # an unknown barrier, warehouse or prefix: 404 with a clear message
    for wh in ("lakestep@barrier=99", "other", "lakestep@barrier=x"):
        with pytest.raises(RESTError) as e:
            rest(served, wh)
        assert "NoSuchWarehouseException" in str(e.value)
    r = requests.get(f"{served.uri}/v1/config", params={"warehouse": "lakestep@barrier=99"})
    assert r.status_code == 404 and "barrier 99 is not published for every table" in r.json()["error"]["message"]
    r = requests.get(f"{served.uri}/v1/barrier=99/namespaces/shop/tables/orders")
    assert r.status_code == 404 and r.json()["error"]["type"] == "NoSuchTableException"
    assert "barrier-99" in r.json()["error"]["message"]


@SQLITE
def test_paging(shop: Shop, served: Served) -> None:
    rc = rest(served, **{"rest-page-size": "2"})
    assert sorted(rc.list_tables("shop")) == sorted(tuple(t.split(".")) for t in TABLES)
    names, token, pages = [], None, 0
    while True:
        r = requests.get(f"{served.uri}/v1/namespaces/shop/tables",
                         params={"pageSize": "2", **({"pageToken": token} if token else {})}).json()
        names += [i["name"] for i in r["identifiers"]]
        pages += 1
        token = r.get("next-page-token")
        if not token:
            break
    assert pages == 3 and names == sorted(t.split(".")[1] for t in TABLES)


@SQLITE
def test_unknown_names_and_writes(shop: Shop, served: Served) -> None:
    rc = rest(served)
    with pytest.raises(NoSuchTableError):
        rc.load_table("shop.nope")
    with pytest.raises(NoSuchNamespaceError):
        rc.list_tables("nope")
    with pytest.raises(NoSuchNamespaceError):
        rc.load_namespace_properties("nope")
    with pytest.raises(NotImplementedError):  # the config lists the read endpoints only
        rc.create_table("shop.new", shop.engines.table("shop.orders").schema())
    with pytest.raises(NotImplementedError):
        rc.drop_table("shop.orders")
    for method, path in (("POST", "/v1/namespaces"), ("POST", "/v1/namespaces/shop/tables"),
                         ("POST", "/v1/namespaces/shop/tables/orders"), ("DELETE", "/v1/namespaces/shop/tables/orders"),
                         ("DELETE", "/v1/namespaces/shop"), ("PUT", "/v1/barrier=3/namespaces/shop/tables/orders")):
        r = requests.request(method, served.uri + path, json={"name": "x"})
        assert r.status_code == 403 and r.json()["error"]["type"] == "ForbiddenException", (method, path, r.text)
    with pytest.raises(ForbiddenError):  # what PyIceberg makes of that status
        from pyiceberg.catalog.rest.response import _handle_non_200_response

        r = requests.post(served.uri + "/v1/namespaces", json={})
        try:
            r.raise_for_status()
        except requests.HTTPError as e:
            _handle_non_200_response(e, {})
    assert shop.cat.list_tables() and len(shop.engines.sql.list_tables("shop")) == len(TABLES)  # nothing written


HOSTILE = [
    ("/v1/namespaces/..%2F../tables/orders", 400),
    ("/v1/namespaces/shop/tables/..%2F..%2Fcatalog.db", 400),
    ("/v1/namespaces/shop/tables/" + "x" * 5000, 400),
    ("/v1/namespaces/" + "n" * 600, 400),
    ("/v1/namespaces/shop%00/tables", 400),
    ("/v1/namespaces/%ff%fe/tables", 400),
    ("/v1/namespaces/shop/tables/orders%0A", 400),
    ("/v1/namespaces?pageToken=%%%", 400),
    ("/v1/namespaces?pageSize=-1", 400),
    ("/v1/namespaces?pageSize=abc", 400),
    ("/v1/namespaces/shop/tables?pageToken=not-base64!", 400),
    ("/v1/../../etc/passwd", 404),
    ("/v1/no/such/endpoint", 404),
    ("/v1/namespaces/shop/views/x", 404),
    ("/v1/barrier=-1/namespaces", 404),
    ("/v1/barrier=99999999999999999999999/namespaces", 404),
    ("/v1/namespaces/nope", 404),
    ("/v1/namespaces/nope/tables/orders", 404),
    ("/v1/config?warehouse=" + "w" * 3000, 404),
    ("/nothing", 404),
]


@pytest.fixture(scope="module")
def one_served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Shop, Served]]:
    """One published shop on SQLite and its server for the module's bad-input cases: each
    request only reads, and the last step of each case checks the server still serves."""
    from lakestep import Catalog

    where = tmp_path_factory.mktemp("one-served") / "warehouse"
    cat = Catalog(f"sqlite:///{where}/catalog.db", warehouse=str(where))
    shop = published_shop(cat)
    s = Served(cat)
    yield shop, s
    s.stop()
    shop.pub.close()
    cat.close()


@pytest.mark.parametrize("path,code", HOSTILE, ids=[p[:40] for p, _ in HOSTILE])
def test_bad_input_gets_the_spec_error_body(one_served: tuple[Shop, Served], path: str, code: int) -> None:
    shop, served = one_served
    r = requests.get(served.uri + path)
    assert r.status_code == code, r.text
    body = r.json()
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "code"}, body
    assert body["error"]["code"] == code and body["error"]["type"].endswith(("Exception", "Error"))
    text = r.text
    for secret in (shop.cat.connection_url(), shop.cat.warehouse, "Traceback", "sqlite", "File \""):
        assert secret not in text, (secret, text)


# Malformed and oversized requests, sent as raw bytes (no client library tidies them up):
# (request, status, whether the body is the spec's error). What the HTTP parser itself
# refuses (a broken request line, an oversized header) never reaches the app: uvicorn
# answers it with its own short 400, with nothing of ours in it either.
RAW = [
    (b"PATCH /v1/config HTTP/1.1\r\nHost: x\r\n\r\n", 405, True),
    (b"POST /v1/namespaces HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 9\r\n\r\n{not json", 403, True),
    (b"POST /v1/namespaces/shop/tables HTTP/1.1\r\nHost: x\r\nContent-Length: 4000000\r\n\r\n" + b"x" * 65536, 403, True),
    (b"GET /v1/namespaces/shop/tables/orders?snapshots=%ZZ HTTP/1.1\r\nHost: x\r\n\r\n", 200, False),
    (b"GET /v1/config?warehouse=lakestep@barrier=abc HTTP/1.1\r\nHost: x\r\n\r\n", 404, True),
    (b"GET /v1/config?warehouse=lakestep%00 HTTP/1.1\r\nHost: x\r\n\r\n", 404, True),
    (b"GET /v1/" + b"a/" * 5000 + b" HTTP/1.1\r\nHost: x\r\n\r\n", 400, True),
    (b"GET /metrics?x=" + b"%" * 3000 + b" HTTP/1.1\r\nHost: x\r\n\r\n", 200, False),
    (b"GARBAGE\r\n\r\n", 400, False),
    (b"GET /v1/config HTTP/1.1\r\nHost: x\r\nX-Big: " + b"y" * 200_000 + b"\r\n\r\n", 400, False),
]


@pytest.mark.parametrize("raw,code,spec", RAW, ids=[f"{i}:{r[:24]!r}" for i, (r, _, _) in enumerate(RAW)])
def test_malformed_and_oversized_requests(one_served: tuple[Shop, Served], raw: bytes, code: int, spec: bool) -> None:
    import socket

    shop, served = one_served

    with socket.create_connection(("127.0.0.1", served.port), timeout=60) as sock:
        try:
            sock.sendall(raw)
        except OSError:  # the server may answer and close before it read everything sent
            pass
        data = b""
        while b"\r\n\r\n" not in data or len(data) < _length(data):
            chunk = sock.recv(65536)
            if not chunk:
                break
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 %d " % code), data[:300]
    text = body.decode(errors="replace")
    if spec:
        err = json.loads(text)["error"]
        assert err["code"] == code and set(err) == {"message", "type", "code"}, text
    # (a table's metadata location, under the warehouse, is what a 200 of loadTable is for)
    for secret in (shop.cat.connection_url(), "Traceback", "File \"", *([shop.cat.warehouse] if code != 200 else [])):
        assert secret not in text, (secret, text)
    assert requests.get(served.uri + "/health").status_code == 200  # the server still serves


def _length(data: bytes) -> int:
    """The size a response will have once whole: its head and its Content-Length."""
    head, sep, _ = data.partition(b"\r\n\r\n")
    for line in head.split(b"\r\n")[1:]:
        k, _, v = line.partition(b":")
        if k.strip().lower() == b"content-length":
            return len(head) + len(sep) + int(v)
    return 0


@SQLITE
def test_bearer_token(shop: Shop, served_token: Served) -> None:
    uri = served_token.uri
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": f"Basic {TOKEN}"},
                    {"Authorization": "Bearer"}, {"Authorization": TOKEN}):
        for path in ("/v1/config", "/v1/namespaces/shop/tables/orders", "/health", "/v1/nope", "/metrics", "/"):
            r = requests.get(uri + path, headers=headers)
            assert r.status_code == 401, (headers, path)
            assert r.json() == {"error": {"message": "a bearer token is required (Authorization: Bearer <token>)",
                                          "type": "NotAuthorizedException", "code": 401}}
            assert TOKEN not in r.text
    with pytest.raises(UnauthorizedError):
        RestCatalog("lakestep", uri=uri)
    rc = RestCatalog("lakestep", uri=uri, token=TOKEN, warehouse="lakestep@barrier=2")
    assert iceberg_rows(rc, "shop.totals") == rows_at(shop, "shop.totals", 2)
    assert requests.get(uri + "/health", headers={"Authorization": f"Bearer {TOKEN}"}).json() == {"status": "ok"}


@SQLITE
def test_health(shop: Shop, served: Served) -> None:
    assert requests.get(served.uri + "/health").status_code == 200
    shop.cat.backend.dispose()
    import os

    os.rename(shop.cat.backend.engine.url.database, shop.cat.backend.engine.url.database + ".gone")
    try:
        r = requests.get(served.uri + "/health")
        assert r.status_code == 503 and shop.cat.warehouse not in r.text
    finally:
        os.rename(shop.cat.backend.engine.url.database + ".gone", shop.cat.backend.engine.url.database)


def test_a_pinned_answer_does_not_depend_on_where_main_is() -> None:
    """The pinned ``snapshot-log`` ends with the tag's snapshot at its creation time, before
    ``main`` reached it and after (DuckDB resolves the current snapshot from the log by time)."""
    from lakestep.serve.rest import pinned

    snaps = [{"snapshot-id": i, "timestamp-ms": 100 * i} for i in (1, 2, 3, 4)]
    before = {"snapshots": snaps, "current-snapshot-id": 2, "refs": {"main": {"snapshot-id": 2, "type": "branch"}},
              "snapshot-log": [{"snapshot-id": 1, "timestamp-ms": 150}, {"snapshot-id": 2, "timestamp-ms": 250}]}
    after = {**before, "current-snapshot-id": 4,
             "snapshot-log": [*before["snapshot-log"], {"snapshot-id": 3, "timestamp-ms": 420},  # type: ignore[list-item]
                              {"snapshot-id": 4, "timestamp-ms": 430}]}
    for md in (before, after):
        p = pinned(md, 3)
        assert p["current-snapshot-id"] == 3 and p["refs"]["main"] == {"snapshot-id": 3, "type": "branch"}
        assert p["snapshot-log"] == [{"snapshot-id": 1, "timestamp-ms": 150}, {"snapshot-id": 2, "timestamp-ms": 250},
                                     {"snapshot-id": 3, "timestamp-ms": 300}]
    assert before["current-snapshot-id"] == 2 and len(after["snapshot-log"]) == 4  # the cached metadata untouched
