"""The Iceberg SQL catalog lakestep publishes into: the tables of Iceberg's JDBC
catalog (``iceberg_tables``, ``iceberg_namespace_properties``; PyIceberg's
``SqlCatalog`` and the JDBC catalogs of Spark, Trino and Flink read them),
under catalog name ``lakestep`` by default.

By default they live in lakestep's own catalog database, and the publisher
writes them through lakestep's backend (the same typed errors, the same SQLite
write lock as every other lakestep writer). Another database can be given
(``iceberg_url``): it gets a backend of its own.

1. **Create.** :meth:`SqlCatalogRows.ensure` creates the two tables if missing,
   with PyIceberg's own definitions (so PyIceberg and the JDBC catalogs find
   the columns they expect).
2. **Commit** (:meth:`SqlCatalogRows.commit`) is Iceberg's compare-and-swap:
   ``UPDATE ... SET metadata_location = new WHERE metadata_location = old``.
   A new metadata file becomes the table's only if nobody swapped since the
   publisher read ``old``; otherwise :class:`IcebergConflictError`, and the
   new file stays unreferenced (the publisher deletes it). The swaps of one
   round's tables go in one database transaction: all of them, or none.

Not guaranteed: readers of ``iceberg_tables`` see each table's swap on its
own; the publisher orders its swaps (docs/iceberg.md) but a reader of several
tables' ``main`` can straddle a round.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import sqlalchemy as sa

from ..errors import IcebergConflictError

if TYPE_CHECKING:
    from ..catalog.backend import Backend

DEFAULT_NAME = "lakestep"


def _tables() -> tuple[sa.Table, sa.Table, sa.MetaData]:
    from pyiceberg.catalog.sql import IcebergNamespaceProperties, IcebergTables, SqlCatalogBaseTable

    return IcebergTables.__table__, IcebergNamespaceProperties.__table__, SqlCatalogBaseTable.metadata  # type: ignore[return-value]


class SqlCatalogRows:
    """The rows of one Iceberg SQL catalog (``name``) in the database behind ``backend``."""

    def __init__(self, backend: "Backend", name: str = DEFAULT_NAME) -> None:
        self.backend = backend
        self.name = name
        self.tables_t, self.ns_t, self._md = _tables()
        self._ensured = False
        self._namespaces: set[str] = set()

    def ensure(self) -> None:
        """Step 1: create the catalog's tables where missing."""
        if self._ensured:
            return
        with self.backend.write() as conn:
            insp = sa.inspect(conn)
            for t in (self.tables_t, self.ns_t):
                if not insp.has_table(t.name):
                    t.create(conn)
        self._ensured = True

    def ensure_namespace(self, namespace: str) -> None:
        if namespace in self._namespaces:
            return
        n = self.ns_t.c
        with self.backend.write() as conn:
            found = conn.execute(sa.select(n.namespace).where(
                n.catalog_name == self.name, n.namespace == namespace)).first()
            if found is None:
                conn.execute(sa.insert(self.ns_t).values(catalog_name=self.name, namespace=namespace,
                                                          property_key="exists", property_value="true"))
        self._namespaces.add(namespace)

    def location(self, namespace: str, table: str) -> str | None:
        """The metadata file a table's row names (None: no such table)."""
        t = self.tables_t.c
        with self.backend.read() as conn:
            return conn.execute(sa.select(t.metadata_location).where(
                t.catalog_name == self.name, t.table_namespace == namespace, t.table_name == table)).scalar()

    def locations(self) -> dict[tuple[str, str], str | None]:
        t = self.tables_t.c
        with self.backend.read() as conn:
            rows = conn.execute(sa.select(t.table_namespace, t.table_name, t.metadata_location).where(
                t.catalog_name == self.name)).all()
        return {(r[0], r[1]): r[2] for r in rows}

    def commit(self, swaps: "list[tuple[str, str, str | None, str]]") -> None:
        """Step 2 for several tables in one database transaction: each ``(namespace, table, old,
        new)`` swaps ``old`` for ``new`` (``old`` None: registers a new table), all of them or
        none (:class:`IcebergConflictError` names the first table that moved under us)."""
        t = self.tables_t.c
        for ns in sorted({s[0] for s in swaps if s[2] is None}):
            self.ensure_namespace(ns)
        with self.backend.write() as conn:
            for namespace, table, old, new in swaps:
                if old is None:
                    if conn.execute(sa.select(t.table_name).where(
                            t.catalog_name == self.name, t.table_namespace == namespace,
                            t.table_name == table)).first():
                        raise IcebergConflictError(
                            f"Iceberg table {self.name}.{namespace}.{table} exists already", table=f"{namespace}.{table}")
                    conn.execute(sa.insert(self.tables_t).values(
                        catalog_name=self.name, table_namespace=namespace, table_name=table,
                        metadata_location=new, previous_metadata_location=None))
                    continue
                n = conn.execute(sa.update(self.tables_t).where(
                    t.catalog_name == self.name, t.table_namespace == namespace, t.table_name == table,
                    t.metadata_location == old).values(metadata_location=new, previous_metadata_location=old)).rowcount
                if n != 1:
                    raise IcebergConflictError(
                        f"the Iceberg metadata of {namespace}.{table} changed under the publisher (it no longer is "
                        f"{old}); nothing was made visible, the next round reloads it", table=f"{namespace}.{table}")

    def rename(self, old: tuple[str, str], new: tuple[str, str]) -> None:
        self.ensure_namespace(new[0])
        t = self.tables_t.c
        with self.backend.write() as conn:
            conn.execute(sa.update(self.tables_t).where(
                t.catalog_name == self.name, t.table_namespace == old[0], t.table_name == old[1]).values(
                table_namespace=new[0], table_name=new[1]))

    def drop(self, namespace: str, table: str) -> None:
        t = self.tables_t.c
        with self.backend.write() as conn:
            conn.execute(sa.delete(self.tables_t).where(
                t.catalog_name == self.name, t.table_namespace == namespace, t.table_name == table))
