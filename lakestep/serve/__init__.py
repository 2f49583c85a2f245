"""``lakestep serve``: an Iceberg REST catalog (read side) of the tables lakestep publishes,
with warehouses pinned at consistent cuts.

Needs the ``serve`` extra (``pip install 'lakestep[serve]'``: Starlette and uvicorn) and the
``iceberg`` extra (the publisher writes what is served: lakestep/iceberg).

* :func:`create_app` is the ASGI app (app.py): the read endpoints of the Iceberg REST
  spec, an optional bearer token, ``/health``, ``/metrics`` (Prometheus's text format,
  metrics.py) and the live page ``/``;
* :class:`PublishedCatalog` answers them from the published Iceberg SQL catalog (rest.py):
  the plain warehouse, ``<name>@barrier=N`` and ``<name>@consistent``;
* :func:`serve` runs the app with uvicorn until SIGTERM or SIGINT; ``lakestep serve``
  and ``python -m lakestep serve`` call it.

docs/iceberg.md ("The REST catalog") says what each warehouse guarantees.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..catalog import Catalog
    from .app import create_app
    from .rest import PublishedCatalog

__all__ = ["create_app", "PublishedCatalog", "serve", "INSTALL_HINT"]

INSTALL_HINT = "pip install 'lakestep[serve]'"


def _needs_extra() -> None:
    try:
        import starlette  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError as e:
        raise ImportError(f"lakestep serve needs the 'serve' extra ({e.name} is missing): {INSTALL_HINT}") from e


def __getattr__(name: str) -> Any:
    if name == "create_app":
        _needs_extra()
        from .app import create_app

        return create_app
    if name == "PublishedCatalog":
        from .rest import PublishedCatalog

        return PublishedCatalog
    raise AttributeError(f"module 'lakestep.serve' has no attribute {name!r}")


def serve(catalog: "Catalog", *, host: str = "127.0.0.1", port: int = 8181, token: str | None = None,
          name: str = "lakestep", refresh: int = 5, log_level: str = "info") -> None:
    """Serve ``catalog``'s published tables on ``host:port`` until SIGTERM or SIGINT
    (uvicorn's own handlers: it finishes the requests under way, then returns)."""
    _needs_extra()
    import uvicorn

    from .app import create_app

    app = create_app(catalog, token=token, name=name, refresh=refresh)
    # log_config=None: uvicorn's lines go to the handlers the caller set (the command's masking one)
    uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level=log_level.lower(), access_log=False,
                                  server_header=False, log_config=None)).run()
