"""``lakestep serve``: the Iceberg REST catalog of the published tables (lakestep/serve).

``python -m lakestep serve`` runs this command. It needs the ``serve`` extra besides the
``cli`` one. The token comes from ``--token`` or ``$LAKESTEP_SERVE_TOKEN`` and is never
printed; the catalog's URL is printed masked.
"""

from __future__ import annotations

import logging

import click

from .common import common, open_catalog
from .output import Output
from .services import LOG_LEVEL, log_to_stderr, stopped_by_signals


@click.command("serve")
@click.option("--host", default="127.0.0.1", show_default=True,
              help="address to bind (another than loopback exposes the catalog: set a token)")
@click.option("--port", type=click.IntRange(min=0, max=65535), default=8181, show_default=True, help="TCP port")
@click.option("--token", envvar="LAKESTEP_SERVE_TOKEN", default=None, metavar="TOKEN",
              help="require 'Authorization: Bearer TOKEN' on every request (default: $LAKESTEP_SERVE_TOKEN)")
@click.option("--name", default="lakestep", show_default=True,
              help="the Iceberg SQL catalog the publisher writes, and the warehouse name clients give")
@click.option("--refresh", type=click.IntRange(min=1), default=5, show_default=True,
              help="seconds between reloads of the live page at /")
@LOG_LEVEL
@common
def serve_cmd(out: Output, catalog_url: str, host: str, port: int, token: str | None, name: str,
              refresh: int, log_level: str) -> None:
    """Serve the published Iceberg tables over the Iceberg REST catalog protocol (read only),
    Prometheus metrics at /metrics and the live report page at /.

    Warehouses: NAME (each table's newest published main), NAME@barrier=N (every table
    at barrier N), NAME@consistent (the newest barrier every table has, fixed for the
    session). Runs until SIGTERM/SIGINT.

    \b
    Example:
      lakestep serve --catalog postgresql://lake@db/lake --port 8181
      # PyIceberg: RestCatalog("l", uri="http://127.0.0.1:8181", warehouse="lakestep@consistent")
    """
    from ..serve import serve

    try:
        import starlette  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError as e:
        raise click.ClickException(f"lakestep serve needs the 'serve' extra ({e.name} is missing): "
                                   "pip install 'lakestep[serve]'") from None
    log_to_stderr(log_level)
    with open_catalog(catalog_url) as cat:
        # the catalog's URL is not logged, even masked (issue 34: no URL in any log line)
        logging.getLogger("lakestep.cli").info("serving the published Iceberg tables on http://%s:%d (token %s); "
                                               "metrics at /metrics, the live page at /",
                                               host, port, "required" if token else "not required")
        # uvicorn handles SIGTERM/SIGINT itself (it drains the requests under way), then raises the
        # signal again for the handler it found: this one, so the command ends with status 0
        with stopped_by_signals(lambda: None):
            serve(cat, host=host, port=port, token=token or None, name=name, refresh=refresh, log_level=log_level)


COMMANDS = [serve_cmd]
