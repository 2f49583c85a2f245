"""Table TTL: removing rows older than a table's time to live (step 1 of a maintenance round,
lakestep/services/maintenance.py), as an ordinary overwrite commit."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pyarrow as pa

from ..errors import InvalidPropertyError
from . import properties as P
from .changes import CommitResult
from .table import Table


def apply_ttl(table: Table, *, now: float | None = None) -> CommitResult | None:
    """Remove rows older than the table's TTL with an ordinary overwrite commit
    (step 1 of a maintenance round).

    Properties: ``lakestep.ttl.column`` (a timestamp, date, or integer epoch-seconds
    column; a partition column makes it metadata-only) and ``lakestep.ttl.seconds``.
    The bytes go later, with :meth:`Table.cleanup`. Returns None when no TTL is set,
    or when the stored TTL properties are invalid (logged; ``properties.py`` step 2):
    an invalid TTL removes no rows.
    """
    if P.ttl(table.ident, table.properties, table.schema, warned=table.warned) is None:
        return None
    col = table.properties.get("lakestep.ttl.column")
    secs = table.properties.get("lakestep.ttl.seconds")
    if not col or not secs:
        return None
    now = table.catalog.clock.now() if now is None else now
    cutoff = _cutoff_value(table.schema.field(col).type, now - float(secs), column=col)
    empty = table.schema.empty_table()
    return table.overwrite(empty, where=[(col, "<", cutoff)])


def _cutoff_value(t: pa.DataType, epoch: float, *, column: str) -> Any:
    if pa.types.is_timestamp(t):
        when = dt.datetime.fromtimestamp(epoch, dt.timezone.utc)
        return when if t.tz else when.replace(tzinfo=None)
    if pa.types.is_date(t):
        return dt.datetime.fromtimestamp(epoch, dt.timezone.utc).date()
    if pa.types.is_integer(t):
        return int(epoch)
    if pa.types.is_floating(t):
        return float(epoch)
    raise InvalidPropertyError(f"a TTL column must be a timestamp, date or epoch-seconds number, not {t}",
                               key=P.TTL_COLUMN, value=column)
