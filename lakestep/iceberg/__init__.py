"""Open tables: lakestep tables published as Apache Iceberg tables, a tag per consistent barrier.

Needs the ``iceberg`` extra (``pip install 'lakestep[iceberg]'``: PyIceberg).

* :class:`Publisher` keeps an Iceberg SQL catalog (``lakestep`` by default, in
  the catalog's own database) in step with lakestep: each table's snapshots
  list lakestep's Parquet files (metadata only, no data copied), every
  barrier ``read_committed`` at scope ``global`` can choose gets a tag
  ``barrier-B`` on every table, and ``main`` follows the newest barrier all
  tables have a tag for (publisher.py);
* :func:`enable` turns publishing on for the maintenance loop; :func:`status`
  tells where it stands;
* :func:`sql_catalog` opens the published catalog with PyIceberg, and
  :func:`pyiceberg_properties` gives the properties other readers need.

docs/iceberg.md shows how PyIceberg, Polars, DuckDB, Spark, Trino, Flink and
Snowflake read them, and what is and is not guaranteed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # Catalog for annotations; the others for type checkers, loaded lazily by __getattr__
    from ..catalog import Catalog
    from .metadata import TAG_PREFIX, tag_name
    from .publisher import Publisher, PublishReport, TableReport
    from .sqlcat import DEFAULT_NAME

from ..barrier.publishing import PublisherStatus, enable, enabled, status  # noqa: E402  (no PyIceberg needed)

_NEEDS_PYICEBERG = {"Publisher": "publisher", "PublishReport": "publisher", "TableReport": "publisher",
                    "TAG_PREFIX": "metadata", "tag_name": "metadata", "DEFAULT_NAME": "sqlcat"}

__all__ = ["Publisher", "PublishReport", "PublisherStatus", "TableReport", "enable", "enabled", "status",
           "sql_catalog", "pyiceberg_properties", "s3_properties", "tag_name", "TAG_PREFIX", "DEFAULT_NAME"]


def _pyiceberg() -> None:
    try:
        import pyiceberg  # noqa: F401
    except ImportError as e:
        from ..errors import IcebergError

        raise IcebergError("publishing to Iceberg needs the 'iceberg' extra (PyIceberg): "
                           "pip install 'lakestep[iceberg]'") from e


def __getattr__(name: str) -> Any:
    if name in _NEEDS_PYICEBERG:
        _pyiceberg()
        import importlib

        return getattr(importlib.import_module(f".{_NEEDS_PYICEBERG[name]}", __name__), name)
    raise AttributeError(f"module 'lakestep.iceberg' has no attribute {name!r}")


def pyiceberg_properties(catalog: "Catalog", *, iceberg_url: str | None = None, name: str = "lakestep"
                         ) -> dict[str, str]:
    """The properties of a PyIceberg ``SqlCatalog`` that reads what ``catalog`` publishes:
    the SQL catalog's URI and, for an S3 warehouse, the endpoint and credentials of the
    catalog's storage options (they hold secrets: never log them)."""
    url = iceberg_url or catalog.connection_url()
    if url.startswith("postgresql://"):
        url = "postgresql+psycopg2://" + url[len("postgresql://"):]
    props = {"uri": url, "warehouse": catalog.warehouse}
    props.update(s3_properties(catalog.storage.as_dict()))
    return props


def s3_properties(options: dict[str, Any]) -> dict[str, str]:
    """PyIceberg's ``s3.*`` properties for lakestep storage options (catalog/storage.py Storage)."""
    import os

    out: dict[str, str] = {}
    endpoint = options.get("endpoint_override") or os.environ.get("AWS_ENDPOINT_URL_S3") or \
        os.environ.get("AWS_ENDPOINT_URL")
    if endpoint:
        endpoint = str(endpoint)
        if "://" not in endpoint:
            endpoint = f"{options.get('scheme', 'https')}://{endpoint}"
        out["s3.endpoint"] = endpoint
    for k, v in (("access_key", "s3.access-key-id"), ("secret_key", "s3.secret-access-key"),
                 ("session_token", "s3.session-token"), ("region", "s3.region")):
        if options.get(k):
            out[v] = str(options[k])
    if "region" not in options and (os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")):
        out["s3.region"] = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or ""
    if options.get("force_virtual_addressing") is not None:
        out["s3.force-virtual-addressing"] = str(options["force_virtual_addressing"]).lower()
    return out


def sql_catalog(catalog: "Catalog", *, iceberg_url: str | None = None, name: str = "lakestep") -> Any:
    """PyIceberg's ``SqlCatalog`` over what ``catalog`` publishes (for scripts and tests)."""
    _pyiceberg()
    from pyiceberg.catalog.sql import SqlCatalog

    return SqlCatalog(name, **pyiceberg_properties(catalog, iceberg_url=iceberg_url, name=name))
