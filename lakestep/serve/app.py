"""The ASGI app of ``lakestep serve``: the Iceberg REST catalog's read endpoints on Starlette.

1. **Token.** With a token set, every request (``/health`` too) must carry
   ``Authorization: Bearer <token>``, compared with :func:`hmac.compare_digest`; anything
   else is 401 with the spec's error body (``NotAuthorizedException``).
2. **Routing.** The path is split on ``/`` *before* percent-decoding (``raw_path``),
   then each segment is decoded: ``..%2F..`` is one segment, a malformed name (400),
   never a path. ``/v1/config``, then ``/v1[/{prefix}]/namespaces[/{ns}[/tables[/{t}]]]``;
   a namespace's levels are joined by ``%1F`` (the spec's separator).
3. **Reads** run in Starlette's thread pool (the catalog's queries block), each answered
   by :class:`~lakestep.serve.rest.PublishedCatalog`.
4. **Writes** (any POST, PUT, DELETE on the catalog's paths) are refused with 403
   ``ForbiddenException`` (the status the spec gives every write endpoint for an
   operation the server does not allow; PyIceberg raises ``ForbiddenError``): lakestep
   writes through its own paths. The config endpoint lists only the read endpoints, so
   PyIceberg refuses a write before sending it.
5. **Errors** are the spec's ``{"error": {"message", "type", "code"}}``: 400 for a
   malformed request, 404 ``NoSuchNamespaceException`` / ``NoSuchTableException`` /
   ``NoSuchWarehouseException``, 503 ``ServiceUnavailableException`` when the catalog
   database does not answer, 500 otherwise. A message never holds a stack trace, the
   catalog's URL or a secret (it is built here, or masked by
   :func:`lakestep.secrets.mask_url`); a log line gets the error's type and masked text.
6. ``/health``: 200 ``{"status": "ok"}`` when the catalog answers a query, else 503.
7. ``/``: the live page, the report of ``lakestep report`` (without the storage checks,
   which list every table's files) as it is at the request, reloading itself every
   ``refresh`` seconds; ``/metrics``: the pipeline in Prometheus's text format
   (metrics.py). Both answer 503 when the catalog database does not.

Not guaranteed: see rest.py for what each warehouse pins. Request bodies are never read.
"""

from __future__ import annotations

import hmac
import logging
from typing import Any, Callable
from urllib.parse import unquote

import sqlalchemy as sa
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, PlainTextResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from ..barrier.topology import Topology
from ..errors import CatalogUnavailableError, InvalidArgumentError, LakestepError, ServeRequestError
from ..secrets import mask_url
from .metrics import render as render_metrics
from .metrics import scrape
from .rest import PublishedCatalog, bad_request, check_name

METRICS_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

log = logging.getLogger("lakestep.serve")

MAX_PATH = 8192


def error_body(status: int, kind: str, message: str) -> dict[str, Any]:
    return {"error": {"message": message, "type": kind, "code": status}}


def error_response(status: int, kind: str, message: str, head: bool = False) -> Response:
    if head:
        return Response(status_code=status)
    return JSONResponse(error_body(status, kind, message), status_code=status)


class BearerToken:
    """Step 1: an ASGI middleware refusing every request without the token."""

    def __init__(self, app: ASGIApp, token: str | None) -> None:
        self.app = app
        self.token = token.encode() if token else None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or self.token is None:
            await self.app(scope, receive, send)
            return
        given = b""
        for k, v in scope.get("headers") or ():
            if k.lower() == b"authorization":
                given = v
        scheme, _, value = given.partition(b" ")
        if scheme.lower() != b"bearer" or not hmac.compare_digest(value.strip(), self.token):
            resp = JSONResponse(error_body(401, "NotAuthorizedException", "a bearer token is required "
                                           "(Authorization: Bearer <token>)"), status_code=401,
                                headers={"WWW-Authenticate": "Bearer"})
            await resp(scope, receive, send)
            return
        await self.app(scope, receive, send)


def _segments(request: Request) -> list[str]:
    """Step 2: the path's segments after ``/v1``, each percent-decoded on its own."""
    raw: bytes = request.scope.get("raw_path") or request.scope["path"].encode()
    raw = raw.split(b"?", 1)[0]
    if len(raw) > MAX_PATH:
        raise bad_request("request path too long")
    try:
        parts = [unquote(p.decode("ascii"), errors="strict") for p in raw.split(b"/")]
    except UnicodeError:
        raise bad_request("malformed request path: not percent-encoded UTF-8") from None
    if parts[:2] != ["", "v1"]:
        raise ServeRequestError("no such endpoint", status=404, kind="NotFoundException")
    return parts[2:]


def _namespace(segment: str) -> str:
    return ".".join(check_name(p, "namespace") for p in segment.split("\x1f"))


def live_page(catalog: Any, refresh: int) -> str:
    """Step 7: the report of ``lakestep report --no-storage`` as it is now, reloading itself."""
    from ..report.data import collect
    from ..report.page import render

    return render(collect(catalog, storage=False), refresh=refresh)


def create_app(catalog: Any, *, token: str | None = None, name: str = "lakestep", refresh: int = 5) -> ASGIApp:
    """The ASGI app serving ``catalog``'s published Iceberg tables (``name``: the Iceberg SQL
    catalog the publisher writes, and the warehouse name clients give), its metrics and
    its live page (reloading every ``refresh`` seconds)."""
    if not isinstance(refresh, int) or refresh < 1:
        raise InvalidArgumentError("refresh must be a whole number of seconds >= 1", argument="refresh", value=refresh)
    served = PublishedCatalog(catalog, name)

    def dispatch(method: str, parts: list[str], q: Any) -> Any:
        head = method == "HEAD"
        if parts == ["config"]:
            if method != "GET":
                raise ServeRequestError("the config endpoint answers GET", status=405, kind="MethodNotAllowed")
            return served.config(q.get("warehouse"))
        prefix: str | None = None
        if parts and parts[0] != "namespaces":
            prefix, parts = parts[0], parts[1:]
        if not parts or parts[0] != "namespaces" or len(parts) > 4:
            raise ServeRequestError("no such endpoint", status=404, kind="NotFoundException")
        if method not in ("GET", "HEAD"):
            raise ServeRequestError("lakestep serve is read-only: lakestep writes its tables through its own "
                                    "paths", status=403, kind="ForbiddenException")
        if len(parts) == 1:
            if head:
                raise ServeRequestError("no such endpoint", status=405, kind="MethodNotAllowed")
            return served.list_namespaces(prefix, q.get("parent"), q.get("pageToken"), q.get("pageSize"))
        ns = _namespace(parts[1])
        if len(parts) == 2:
            return served.namespace(prefix, ns)
        if parts[2] != "tables":
            if parts[2] == "views" and len(parts) == 3 and not head:
                served.namespace(prefix, ns)
                return {"identifiers": []}
            raise ServeRequestError("no such endpoint", status=404, kind="NotFoundException")
        if len(parts) == 3:
            if head:
                raise ServeRequestError("no such endpoint", status=405, kind="MethodNotAllowed")
            return served.list_tables(prefix, ns, q.get("pageToken"), q.get("pageSize"))
        return served.load_table(prefix, ns, check_name(parts[3], "table name"))

    async def v1(request: Request) -> Response:
        head = request.method == "HEAD"
        try:
            parts = _segments(request)
            body = await run_in_threadpool(dispatch, request.method, parts, request.query_params)
        except ServeRequestError as e:
            return error_response(e.status, e.kind, str(e), head)
        except (CatalogUnavailableError, sa.exc.OperationalError) as e:
            log.warning("catalog unavailable: %s: %s", type(e).__name__, mask_url(str(e)).splitlines()[0])
            return error_response(503, "ServiceUnavailableException", "the catalog database does not answer", head)
        except Exception as e:  # noqa: BLE001  (any other failure: a 500 with no detail, logged masked)
            first = (mask_url(str(e)).splitlines() or [""])[0][:500]
            log.error("%s %s failed: %s: %s", request.method, mask_url(request.url.path[:200]), type(e).__name__, first)
            kind = "InternalServerError"
            msg = "internal error: " + type(e).__name__ if isinstance(e, LakestepError) else "internal error"
            return error_response(500, kind, msg, head)
        if head:
            return Response(status_code=204)
        return JSONResponse(body)

    async def health(request: Request) -> Response:
        try:
            await run_in_threadpool(served.ping)
        except Exception as e:  # noqa: BLE001  (whatever it is, the catalog does not answer)
            log.warning("health: the catalog does not answer: %s", type(e).__name__)
            return JSONResponse({"status": "unavailable"}, status_code=503)
        return JSONResponse({"status": "ok"})

    topology = Topology(catalog)

    async def metrics(request: Request) -> Response:
        try:
            body = await run_in_threadpool(lambda: render_metrics(scrape(catalog, topology)))
        except Exception as e:  # noqa: BLE001  (a scrape that cannot read the catalog: Prometheus's up 0)
            log.warning("metrics: the catalog does not answer: %s: %s", type(e).__name__,
                        (mask_url(str(e)).splitlines() or [""])[0][:300])
            return PlainTextResponse("# the catalog database does not answer\n", status_code=503)
        return Response(body, media_type=METRICS_CONTENT_TYPE)

    async def page(request: Request) -> Response:
        try:
            html = await run_in_threadpool(live_page, catalog, refresh)
        except Exception as e:  # noqa: BLE001
            log.warning("page: %s: %s", type(e).__name__, (mask_url(str(e)).splitlines() or [""])[0][:300])
            return HTMLResponse("<!DOCTYPE html><title>lakestep</title><meta http-equiv=\"refresh\" "
                                f"content=\"{refresh}\"><p>the catalog database does not answer</p>", status_code=503)
        return HTMLResponse(html)

    async def not_found(request: Request, exc: Exception) -> Response:
        return error_response(404, "NotFoundException", "no such endpoint", request.method == "HEAD")

    async def not_allowed(request: Request, exc: Exception) -> Response:
        return error_response(405, "MethodNotAllowed", "method not allowed", request.method == "HEAD")

    async def internal(request: Request, exc: Exception) -> Response:
        log.error("request failed: %s", type(exc).__name__)
        return error_response(500, "InternalServerError", "internal error", request.method == "HEAD")

    methods = ["GET", "HEAD", "POST", "PUT", "DELETE", "PATCH"]
    handlers: dict[Any, Callable[..., Any]] = {404: not_found, 405: not_allowed, 500: internal}
    app = Starlette(routes=[Route("/", page, methods=["GET"]), Route("/metrics", metrics, methods=["GET"]),
                            Route("/health", health, methods=["GET"]),
                            Route("/v1/{rest:path}", v1, methods=methods)],
                    exception_handlers=handlers)
    app.state.served = served
    return BearerToken(app, token)
