"""What every command shares: ``--catalog`` and ``--json``, opening the catalog read-only."""

from __future__ import annotations

import contextlib
import functools
import os
from typing import Any, Callable, Iterator

import click
import sqlalchemy as sa

from ..catalog import Catalog
from ..catalog.backend import DatabaseTimeouts
from ..errors import CatalogError
from ..secrets import mask_url
from .output import Output

CATALOG_HELP = ("the catalog: a database URL (sqlite:///wh/catalog.db, postgresql://user@host/db) or a "
                "warehouse directory holding catalog.db; default: $LAKESTEP_CATALOG")


def common(f: Callable[..., Any] | None = None, *, url_alias: bool = False) -> Any:
    """Add ``--catalog URL`` and ``--json``; the command receives ``out`` (an :class:`Output`)
    and ``catalog_url`` and returns its exit code (None: 0). ``url_alias``: a hidden ``--url``
    names the catalog too (the services: ``python -m lakestep coordinator --url ...``
    and ``python -m lakestep maintenance --url ...`` always took it)."""
    if f is None:
        return functools.partial(common, url_alias=url_alias)

    @click.option("--json", "as_json", is_flag=True, help="print one JSON document instead of tables")
    @click.option("--catalog", "catalog_url", envvar="LAKESTEP_CATALOG", required=not url_alias, metavar="URL",
                  help=CATALOG_HELP + ("  [required]" if url_alias else ""))
    @functools.wraps(f)
    def wrapper(*args: Any, as_json: bool, **kwargs: Any) -> Any:
        if url_alias:
            url = kwargs.pop("url")
            kwargs["catalog_url"] = url if url is not None else kwargs["catalog_url"]
            if kwargs["catalog_url"] is None:
                raise click.MissingParameter(param_hint="'--catalog'", param_type="option")
        return f(*args, out=Output(as_json), **kwargs)

    if url_alias:
        wrapper = click.option("--url", "url", default=None, hidden=True, metavar="URL")(wrapper)
    return wrapper


def catalog_url(value: str) -> str:
    """A database URL, or a warehouse directory's SQLite catalog."""
    if "://" in value:
        return value
    return f"sqlite:///{os.path.abspath(os.path.join(value, 'catalog.db')) if os.path.isdir(value) else value}"


@contextlib.contextmanager
def open_catalog(value: str, *, timeouts: DatabaseTimeouts | None = None) -> Iterator[Catalog]:
    """Open an existing catalog (never create one: a mistyped URL must not make a new catalog)."""
    url = catalog_url(value)
    try:
        parsed = sa.make_url(url)
    except sa.exc.ArgumentError:
        raise CatalogError(f"not a catalog URL or warehouse directory: {mask_url(value)!r}") from None
    if parsed.get_backend_name() == "sqlite":
        path = parsed.database or ""
        if not path or path == ":memory:" or not os.path.isfile(path):
            raise CatalogError(f"no lakestep catalog at {mask_url(url)}: {path or '(no file)'} does not exist")
    try:
        cat = Catalog(url, create=False, timeouts=timeouts)
    except sa.exc.SQLAlchemyError as e:
        first = str(getattr(e, "orig", None) or e).strip().splitlines()[0]
        raise CatalogError(f"cannot open the catalog at {mask_url(url)}: {mask_url(first)}") from None
    try:
        yield cat
    finally:
        cat.close()


def table_names(cat: Catalog, given: tuple[str, ...], all_tables: bool, what: str) -> list[str]:
    """The tables a command works on: those given, or every table with ``--all``."""
    if given and all_tables:
        raise click.UsageError("give table names or --all, not both")
    if not given and not all_tables:
        raise click.UsageError(f"name the tables to {what}, or pass --all")
    if given:
        for t in given:
            cat.load_table(t)  # TableNotFoundError before any work
        return list(dict.fromkeys(given))
    return cat.list_tables()
