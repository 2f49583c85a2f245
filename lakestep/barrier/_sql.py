"""Hot statements, written once, run the cheapest way each backend allows.

A :class:`Query` is SQL with ``:name`` parameters; a list parameter is
written ``IN :ids``. On SQLite it runs as a SQLAlchemy ``text`` with an
expanding parameter. On PostgreSQL it is ``PREPARE``-d once per database
connection (``= ANY($1)`` with an array, so one plan serves any number of
tables) and run with ``EXECUTE``: the statements of a version choice are
planned once per connection instead of once per call, which is most of
their cost (with ``plan_cache_mode = force_generic_plan`` for the
transaction: these statements seek indexes whatever the values). Prepared
statements outlive transactions (PostgreSQL does not roll them back) and die
with the connection.

Behind a pooler that hands each transaction another server connection
(pgbouncer's transaction pooling), session-level prepared statements break:
open the catalog with ``prepared_statements=False`` (the backend's setting,
:func:`lakestep.catalog.backend.prepared_statements`; its default comes from
``LAKESTEP_PG_PREPARED=0``) and every statement is sent as plain SQL.
"""

from __future__ import annotations

import hashlib
import re
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection, CursorResult

from ..catalog.backend import prepared_statements
from ..errors import InvalidArgumentError

if TYPE_CHECKING:  # typing has it from Python 3.11 only (SQLAlchemy requires typing_extensions)
    from typing_extensions import Unpack

_PARAM = re.compile(r"(?<![:\w]):([a-z_][a-z0-9_]*)")
_GENERIC = "SET LOCAL plan_cache_mode = force_generic_plan; "


class Query:
    def __init__(self, name: str, sql: str, types: dict[str, str]) -> None:
        """``types``: the PostgreSQL type of each parameter (``bigint[]`` for lists)."""
        self.sql = sql
        self.types = types
        lists = [k for k, t in types.items() if t.endswith("[]")]
        text = sa.text(sql)
        if lists:
            text = text.bindparams(*[sa.bindparam(k, expanding=True) for k in lists])
        self._text = text
        pg = sql
        for k in lists:
            pg = pg.replace(f"IN :{k}", f"= ANY(:{k})")
        order: list[str] = []

        def number(m: re.Match[str]) -> str:
            if m.group(1) not in order:
                order.append(m.group(1))
            return f"${order.index(m.group(1)) + 1}"

        pg = _PARAM.sub(number, pg)
        missing = set(order) ^ set(types)
        if missing:
            raise InvalidArgumentError(f"{name}: parameters and types differ: {sorted(missing)}",
                                       argument="types", value=sorted(missing))
        digest = hashlib.sha1(pg.encode()).hexdigest()[:10]
        self.name = f"lakestep_{name}_{digest}"
        self._order = order
        self._prepare = f"PREPARE {self.name} ({', '.join(types[k] for k in order)}) AS {pg}"
        self._execute = f"EXECUTE {self.name} ({', '.join(['%s'] * len(order))})"

    def __call__(self, conn: Connection, **params: Any) -> CursorResult[Unpack[tuple[Any, ...]]]:
        if conn.dialect.name != "postgresql" or not prepared_statements(conn):
            return conn.execute(self._text, params)
        prepared = conn.connection.info.setdefault("lakestep_prepared", set())
        if self.name not in prepared:
            conn.exec_driver_sql(self._prepare)
            prepared.add(self.name)
        values = tuple(list(params[k]) if self.types[k].endswith("[]") else params[k] for k in self._order)
        if (conn.dialect.server_version_info or (0,)) >= (12,):
            # The custom plans PostgreSQL would otherwise keep making cost
            # milliseconds; these statements seek indexes whatever the values.
            return conn.exec_driver_sql(_GENERIC + self._execute, values)
        return conn.exec_driver_sql(self._execute, values)
