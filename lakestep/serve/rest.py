"""The Iceberg REST catalog's read side over what the publisher wrote (lakestep/iceberg).

Nothing here knows HTTP: :class:`PublishedCatalog` answers the read operations of the
Iceberg REST spec with plain JSON-ready dicts, or raises :class:`ServeRequestError` with
the spec's status and error type; lakestep/serve/app.py puts it behind Starlette.

1. **Rows.** The Iceberg SQL catalog's rows (``iceberg_tables``,
   ``iceberg_namespace_properties``, catalog ``lakestep`` by default: sqlcat.py) name
   each table's current metadata file; the namespaces are those rows' namespaces.
   Every request reads them anew, through lakestep's own backend (one query each).
2. **Metadata.** A metadata file is written once and never changed (the publisher
   swaps a table to a *new* file), so its parsed JSON is cached by location (a
   bounded LRU); a request reads a file only the first time it is named.
3. **Plain warehouse** (no prefix, or ``latest``): ``loadTable`` answers the metadata
   file as the publisher wrote it: ``main`` is the newest barrier every table has
   (publisher.py), each table read at the moment of its own request.
4. **Pinned warehouse** (prefix ``barrier=N``): the same metadata with ``main``
   (``current-snapshot-id``, ``refs.main`` and the end of ``snapshot-log``: :func:`pinned`)
   moved to the snapshot the tag ``barrier-N`` names. A table with no barrier tag at all (an unmanaged table: no
   barrier covers it) is answered as published; a table with barrier tags but not
   ``barrier-N`` is not there at N: 404.
5. **Warehouses at config time** (:meth:`PublishedCatalog.config`):
   ``<name>@barrier=N`` answers prefix ``barrier=N`` when N is a complete cut (every
   table with barrier tags has ``barrier-N``), else 404; ``<name>@consistent`` answers
   prefix ``barrier=<newest complete cut>``, fixed for the session that asked.
6. **Paging.** Listings are sorted and paged: ``pageSize`` (at most
   :data:`MAX_PAGE_SIZE`, :data:`DEFAULT_PAGE_SIZE` when not given), ``pageToken`` an
   opaque token naming the last entry of the previous page.

Not guaranteed: the plain warehouse pins nothing: two ``loadTable`` calls either side of
a publishing round see two different ``main`` cuts. A pinned warehouse's listings name
the tables and namespaces that exist now (a table created after N is listed, and its
``loadTable`` is 404). ``metadata-location`` names the file the table's metadata came
from; under a pinned prefix that file's own ``main`` is the newest one (an engine that
re-reads the file instead of the answered ``metadata`` reads the plain warehouse).
Cleanup that expires a tag makes its barrier unknown from then on.
"""

from __future__ import annotations

import base64
import binascii
import collections
import gzip
import json
import re
import threading
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa

from ..catalog import schema as S
from ..errors import ServeRequestError

if TYPE_CHECKING:
    from ..catalog import Catalog

DEFAULT_PAGE_SIZE = 1000
MAX_PAGE_SIZE = 1000
MAX_NAME = 512  # longest namespace or table name answered (lakestep's own names are shorter)
CACHE_FILES = 4096
TAG_PREFIX = "barrier-"  # lakestep.iceberg.metadata.TAG_PREFIX (kept here: no PyIceberg import for it)
PINNED = re.compile(r"barrier=(0|[1-9][0-9]{0,17})")
LATEST = "latest"

#: The endpoints this server answers, as the config endpoint lists them.
ENDPOINTS = (
    "GET /v1/{prefix}/namespaces",
    "GET /v1/{prefix}/namespaces/{namespace}",
    "HEAD /v1/{prefix}/namespaces/{namespace}",
    "GET /v1/{prefix}/namespaces/{namespace}/tables",
    "GET /v1/{prefix}/namespaces/{namespace}/tables/{table}",
    "HEAD /v1/{prefix}/namespaces/{namespace}/tables/{table}",
)


def bad_request(message: str) -> ServeRequestError:
    return ServeRequestError(message, status=400, kind="BadRequestException")


def no_namespace(namespace: str) -> ServeRequestError:
    return ServeRequestError(f"namespace does not exist: {namespace}", status=404, kind="NoSuchNamespaceException")


def no_table(message: str) -> ServeRequestError:
    return ServeRequestError(message, status=404, kind="NoSuchTableException")


def no_warehouse(message: str) -> ServeRequestError:
    return ServeRequestError(message, status=404, kind="NoSuchWarehouseException")


def check_name(name: str, what: str) -> str:
    """A namespace part or table name as sent: 400 when empty, too long or holding a control
    character or a path separator (nothing lakestep publishes has one)."""
    if not name or len(name) > MAX_NAME:
        raise bad_request(f"malformed {what}: empty or longer than {MAX_NAME} characters")
    if any(ord(c) < 32 or c in "/\\" for c in name) or name in (".", ".."):
        raise bad_request(f"malformed {what}: it holds a control character or a path separator")
    return name


def parse_prefix(prefix: str | None) -> int | None:
    """The barrier a prefix pins (None: the plain warehouse)."""
    if prefix is None or prefix == LATEST:
        return None
    m = PINNED.fullmatch(prefix)
    if m is None:
        raise no_warehouse("unknown prefix: this server answers no prefix, 'latest' or 'barrier=N' "
                           "(GET /v1/config?warehouse=<name>@barrier=N names it)")
    return int(m.group(1))


def encode_token(last: str) -> str:
    return base64.urlsafe_b64encode(last.encode()).decode()


def decode_token(token: str | None) -> str | None:
    if not token:
        return None
    try:
        last = base64.b64decode(token.encode("ascii"), altchars=b"-_", validate=True).decode()
    except (binascii.Error, UnicodeError, ValueError):
        raise bad_request("malformed pageToken") from None
    if not last:
        raise bad_request("malformed pageToken")
    return last


def page_size(value: str | None) -> int:
    if value is None or value == "":
        return DEFAULT_PAGE_SIZE
    if not value.isdigit() or not 1 <= int(value) <= 10**9:
        raise bad_request("malformed pageSize: a positive integer")
    return min(int(value), MAX_PAGE_SIZE)


def paged(keys: list[str], token: str | None, size: str | None) -> tuple[list[str], str | None]:
    """One page of the sorted ``keys``: those after the token's key, and the next token."""
    after, n = decode_token(token), page_size(size)
    rest = [k for k in keys if after is None or k > after]
    page = rest[:n]
    return page, (encode_token(page[-1]) if len(rest) > n else None)


def pinned(md: dict[str, Any], sid: int) -> dict[str, Any]:
    """Step 4: a metadata (not changed) with ``main`` at snapshot ``sid``: its
    ``current-snapshot-id``, ``refs.main``, and the ``snapshot-log`` (the history of
    ``main``) ending with ``sid``, stamped with ``sid``'s own creation time: the entries
    made before it, then ``sid``. The answer for one pin is the same whenever it is asked,
    whether or not ``main`` reached ``sid`` since: DuckDB resolves a table's current
    snapshot from the log, by time, and must find ``sid`` in every answer of a session."""
    ts = next((int(x["timestamp-ms"]) for x in md.get("snapshots") or () if int(x["snapshot-id"]) == sid), None)
    if ts is None:  # a tag naming no snapshot: not a table the publisher wrote
        raise ServeRequestError("the table's metadata is inconsistent", status=500, kind="InternalServerError")
    log = [e for e in md.get("snapshot-log") or () if int(e["timestamp-ms"]) < ts and int(e["snapshot-id"]) != sid]
    return {**md, "current-snapshot-id": sid, "snapshot-log": [*log, {"timestamp-ms": ts, "snapshot-id": sid}],
            "refs": {**(md.get("refs") or {}), "main": {"snapshot-id": sid, "type": "branch"}}}


class PublishedCatalog:
    """The read side of the Iceberg REST catalog over one lakestep catalog's published tables."""

    def __init__(self, catalog: "Catalog", name: str = "lakestep") -> None:
        from ..iceberg.sqlcat import SqlCatalogRows

        self.catalog = catalog
        self.name = name
        self.rows = SqlCatalogRows(catalog.backend, name)
        self._cache: collections.OrderedDict[str, dict[str, Any]] = collections.OrderedDict()
        self._lock = threading.Lock()
        self._io: Any = None

    # ----------------------------------------------------------------- step 1: rows
    def _has_tables(self, conn: sa.Connection) -> bool:
        insp = sa.inspect(conn)
        return insp.has_table(self.rows.tables_t.name) and insp.has_table(self.rows.ns_t.name)

    def namespaces(self) -> dict[str, dict[str, str]]:
        """Every namespace and its properties."""
        t, n = self.rows.tables_t.c, self.rows.ns_t.c
        out: dict[str, dict[str, str]] = {}
        with self.catalog.backend.read() as conn:
            if not self._has_tables(conn):
                return out
            for ns, key, value in conn.execute(sa.select(n.namespace, n.property_key, n.property_value).where(
                    n.catalog_name == self.name)):
                props = out.setdefault(ns, {})
                if key and key != "exists":
                    props[key] = value or ""
            for (ns,) in conn.execute(sa.select(t.table_namespace).where(t.catalog_name == self.name).distinct()):
                out.setdefault(ns, {})
        return out

    def tables(self, namespace: str) -> list[str]:
        t = self.rows.tables_t.c
        with self.catalog.backend.read() as conn:
            if not self._has_tables(conn):
                return []
            return sorted(r[0] for r in conn.execute(sa.select(t.table_name).where(
                t.catalog_name == self.name, t.table_namespace == namespace)))

    def location(self, namespace: str, table: str) -> str | None:
        t = self.rows.tables_t.c
        with self.catalog.backend.read() as conn:
            if not self._has_tables(conn):
                return None
            return conn.execute(sa.select(t.metadata_location).where(
                t.catalog_name == self.name, t.table_namespace == namespace, t.table_name == table)).scalar()

    def ping(self) -> None:
        """One query of the catalog's own tables (a database that answers but holds no
        lakestep catalog fails it)."""
        with self.catalog.backend.read() as conn:
            conn.execute(sa.select(S.publisher.c.id).limit(1)).scalar()

    # ------------------------------------------------------------- step 2: metadata
    def metadata(self, location: str) -> dict[str, Any]:
        """The parsed metadata file at ``location`` (cached: the file never changes)."""
        with self._lock:
            if location in self._cache:
                self._cache.move_to_end(location)
                return self._cache[location]
        if self._io is None:
            from ..iceberg.metadata import StorageFileIO

            self._io = StorageFileIO(self.catalog.storage)
        with self._io.new_input(location).open() as f:
            raw = f.read()
        if raw[:2] == b"\x1f\x8b":
            raw = gzip.decompress(raw)
        md: dict[str, Any] = json.loads(raw)
        with self._lock:
            self._cache[location] = md
            while len(self._cache) > CACHE_FILES:
                self._cache.popitem(last=False)
        return md

    @staticmethod
    def tags(md: dict[str, Any]) -> dict[int, int]:
        """barrier -> snapshot id of a metadata's ``barrier-N`` tags."""
        out: dict[int, int] = {}
        for ref, r in (md.get("refs") or {}).items():
            if ref.startswith(TAG_PREFIX) and ref[len(TAG_PREFIX):].isdigit():
                out[int(ref[len(TAG_PREFIX):])] = int(r["snapshot-id"])
        return out

    def complete_cuts(self) -> set[int]:
        """The barriers every table with barrier tags has a tag for."""
        cuts: set[int] | None = None
        for loc in self.rows.locations().values() if self._tables_exist() else ():
            if loc is None:
                continue
            tags = self.tags(self.metadata(loc))
            if tags:
                cuts = set(tags) if cuts is None else cuts & set(tags)
        return cuts or set()

    def _tables_exist(self) -> bool:
        with self.catalog.backend.read() as conn:
            return self._has_tables(conn)

    # -------------------------------------------------------- the REST operations
    def config(self, warehouse: str | None) -> dict[str, Any]:
        """``GET /v1/config``: the prefix of the warehouse asked for (step 5)."""
        overrides: dict[str, str] = {}
        if warehouse not in (None, "", self.name):
            assert warehouse is not None
            base, sep, pin = warehouse.partition("@")
            if base != self.name or not sep:
                raise no_warehouse(f"unknown warehouse: this server serves {self.name!r}, {self.name}@barrier=N "
                                   f"and {self.name}@consistent")
            cuts = self.complete_cuts()
            if pin == "consistent":
                if not cuts:
                    raise no_warehouse("no barrier is published for every table yet")
                overrides["prefix"] = f"barrier={max(cuts)}"
            elif pin == LATEST:
                overrides["prefix"] = LATEST
            else:
                m = PINNED.fullmatch(pin)
                if m is None:
                    raise no_warehouse(f"unknown warehouse: {self.name}@barrier=N (N a barrier) or "
                                       f"{self.name}@consistent")
                n = int(m.group(1))
                if n not in cuts:
                    have = f"{min(cuts)}..{max(cuts)}" if cuts else "none yet"
                    raise no_warehouse(f"barrier {n} is not published for every table "
                                       f"(barriers published for every table: {have})")
                overrides["prefix"] = f"barrier={n}"
        return {"defaults": {}, "overrides": overrides, "endpoints": list(ENDPOINTS)}

    def list_namespaces(self, prefix: str | None, parent: str | None, token: str | None,
                        size: str | None) -> dict[str, Any]:
        parse_prefix(prefix)
        names = sorted(self.namespaces())
        if parent:
            parent = ".".join(check_name(p, "namespace") for p in parent.split("\x1f"))
            if parent not in names and not any(n.startswith(parent + ".") for n in names):
                raise no_namespace(parent)
            depth = parent.count(".") + 2
            names = sorted({".".join(n.split(".")[:depth]) for n in names
                            if n.startswith(parent + ".") and n.count(".") + 1 >= depth})
        else:
            names = sorted({n.split(".")[0] for n in names})
        page, nxt = paged(names, token, size)
        out: dict[str, Any] = {"namespaces": [n.split(".") for n in page]}
        if nxt:
            out["next-page-token"] = nxt
        return out

    def namespace(self, prefix: str | None, namespace: str) -> dict[str, Any]:
        parse_prefix(prefix)
        all_ns = self.namespaces()
        if namespace not in all_ns:
            raise no_namespace(namespace)
        return {"namespace": namespace.split("."), "properties": all_ns[namespace]}

    def list_tables(self, prefix: str | None, namespace: str, token: str | None, size: str | None) -> dict[str, Any]:
        parse_prefix(prefix)
        names = self.tables(namespace)
        if not names and namespace not in self.namespaces():
            raise no_namespace(namespace)
        page, nxt = paged(names, token, size)
        out: dict[str, Any] = {"identifiers": [{"namespace": namespace.split("."), "name": t} for t in page]}
        if nxt:
            out["next-page-token"] = nxt
        return out

    def load_table(self, prefix: str | None, namespace: str, table: str) -> dict[str, Any]:
        """``loadTable``: the LoadTableResult (steps 3 and 4)."""
        barrier = parse_prefix(prefix)
        loc = self.location(namespace, table)
        if loc is None:
            if namespace not in self.namespaces():
                raise no_namespace(namespace)
            raise no_table(f"table does not exist: {namespace}.{table}")
        md = self.metadata(loc)
        if barrier is not None:
            tags = self.tags(md)
            if tags:
                if barrier not in tags:
                    raise no_table(f"table {namespace}.{table} has no tag {TAG_PREFIX}{barrier} (its barriers: "
                                   f"{min(tags)}..{max(tags)}): it is not published at barrier {barrier}")
                md = pinned(md, tags[barrier])
        # no "config": storage credentials are never handed out; readers bring their own
        return {"metadata-location": loc, "metadata": md, "config": {}}
