"""The catalog's metadata schema: created, versioned, upgraded, and refused when too new."""

from __future__ import annotations

import pyarrow as pa
import pytest
import sqlalchemy as sa

from lakestep import Catalog, errors
from lakestep.catalog import schema as S
from lakestep.catalog.backend import create_backend


@pytest.mark.parametrize("start", range(0, S.LATEST))
def test_upgrade_from_every_older_version(catalog_spec, start: int) -> None:  # type: ignore[no-untyped-def]
    backend = create_backend(catalog_spec.url)
    with backend.write() as conn:
        assert S.upgrade(conn, target=start) == start
    backend.dispose()
    cat = catalog_spec.open()
    with cat.backend.read() as conn:
        assert S.current_version(conn) == S.LATEST
    cat.create_namespace("s")
    t = cat.create_table("s.t", pa.schema([("id", pa.int64())]))
    t.append({"id": [1]})
    assert t.to_arrow().num_rows == 1
    cat.close()


def test_newer_catalog_is_refused(catalog_spec) -> None:  # type: ignore[no-untyped-def]
    cat = catalog_spec.open()
    with cat.backend.write() as conn:
        conn.execute(sa.update(S.meta).where(S.meta.c.key == "schema_version").values(value=str(S.LATEST + 1)))
    cat.close()
    with pytest.raises(errors.CatalogVersionError) as ei:
        catalog_spec.open()
    assert ei.value.found == S.LATEST + 1 and ei.value.supported == S.LATEST


def test_open_without_create(catalog_spec) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(errors.CatalogError):
        catalog_spec.open(create=False)
    catalog_spec.open().close()
    catalog_spec.open(create=False).close()
