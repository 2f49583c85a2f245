"""Table properties: the ``lakestep.*`` keys there are, and what their values may be.

1. **At create and at change** (``Catalog.create_table``,
   ``Table.set_properties``): every ``lakestep.*`` key must be one of
   :data:`KNOWN` and its value well formed (:func:`validate`), else
   :class:`InvalidPropertyError` and nothing is written. Keys outside
   ``lakestep.`` belong to the user and are stored as given.
2. **On use** (:func:`value`, :func:`ttl`): a stored value is parsed again.
   A table created by an older lakestep may hold a value step 1 refuses; it
   never fails a read, a write or the maintenance loop. It is logged (once
   per table handle, key and value) and replaced by the key's *fallback*, the value
   that loses nothing: the default retention (keeps files longer), no TTL
   (deletes no rows), serializable isolation (refuses rewrites that snapshot
   isolation would let through), no compaction on write. Fix it with ``Table.set_properties``.

Not guaranteed: a retention of 0 is accepted (tests and throwaway tables use
it): time travel then reaches only the newest version, and a reader without a
version lock may find a file gone that a concurrent commit removed.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Any, Callable, Mapping

import pyarrow as pa

from ..errors import InvalidArgumentError, InvalidPropertyError

log = logging.getLogger(__name__)

RETENTION = "lakestep.retention-seconds"
ISOLATION = "lakestep.isolation"
TTL_COLUMN = "lakestep.ttl.column"
TTL_SECONDS = "lakestep.ttl.seconds"
ICEBERG_PUBLISH = "lakestep.iceberg.publish"
PK_COMPACTION_TRIGGER = "lakestep.pk.compaction-trigger"
DEFAULT_PK_COMPACTION_TRIGGER = 8

DEFAULT_RETENTION_SECONDS = 7 * 24 * 3600.0
ISOLATIONS = ("snapshot", "serializable")


def _seconds(v: str, *, zero: bool) -> float:
    try:
        x = float(v)
    except (TypeError, ValueError):
        raise InvalidArgumentError("not a number of seconds", argument="value", value=v) from None
    if not math.isfinite(x):
        raise InvalidArgumentError("not a finite number of seconds", argument="value", value=v)
    if x < 0 or (x == 0 and not zero):
        raise InvalidArgumentError("must be " + ("at least 0" if zero else "more than 0"), argument="value", value=v)
    return x


def _isolation(v: str) -> str:
    if v not in ISOLATIONS:
        raise InvalidArgumentError(f"must be one of {', '.join(ISOLATIONS)}", argument="value", value=v)
    return v


def _bool(v: str) -> bool:
    if v.lower() not in ("true", "false"):
        raise InvalidArgumentError("must be true or false", argument="value", value=v)
    return v.lower() == "true"


def _trigger(v: str) -> int:
    try:
        n = int(v)
    except (TypeError, ValueError):
        raise InvalidArgumentError("not a whole number", argument="value", value=v) from None
    if n < 0 or n == 1:
        raise InvalidArgumentError("must be 0 (off) or at least 2", argument="value", value=v)
    return n


def _column_name(v: str) -> str:
    if not v:
        raise InvalidArgumentError("must name a column", argument="value", value=v)
    return v


@dataclass(frozen=True)
class Spec:
    parse: Callable[[str], Any]
    default: Any
    fallback: Any  # used instead of a stored value that does not parse (step 2)
    doc: str


KNOWN: dict[str, Spec] = {
    RETENTION: Spec(lambda v: _seconds(v, zero=True), DEFAULT_RETENTION_SECONDS, DEFAULT_RETENTION_SECONDS,
                    "seconds of history kept for time travel and cleanup (a number >= 0, default 7 days)"),
    ISOLATION: Spec(_isolation, "snapshot", "serializable",
                    "isolation of deletes and updates: snapshot | serializable"),
    TTL_COLUMN: Spec(_column_name, None, None,
                     "the timestamp, date or epoch-seconds column the TTL reads (with lakestep.ttl.seconds)"),
    TTL_SECONDS: Spec(lambda v: _seconds(v, zero=False), None, None,
                      "rows older than this many seconds are removed by maintenance.apply_ttl "
                      "(with lakestep.ttl.column)"),
    ICEBERG_PUBLISH: Spec(_bool, True, True,
                          "false keeps the table out of Iceberg publishing when the catalog publishes "
                          "(lakestep.iceberg; default true)"),
    PK_COMPACTION_TRIGGER: Spec(_trigger, DEFAULT_PK_COMPACTION_TRIGGER, 0,
                                "on a primary-key table, every this many writes (upserts, deletes, updates) "
                                "through one catalog object the newest files of similar size, when there are "
                                "at least this many, are merged into one, so that reads merge few files "
                                f"(0 turns it off, else at least 2; default {DEFAULT_PK_COMPACTION_TRIGGER})"),
}


def _refuse(key: str, value: Any, reason: str) -> InvalidPropertyError:
    known = tuple(sorted(KNOWN))
    return InvalidPropertyError(f"table property {key}={value!r}: {reason}", key=key, value=value, known=known)


def validate(props: Mapping[Any, Any], schema: pa.Schema) -> dict[str, str]:
    """Step 1: the properties as stored (keys and values as strings), or InvalidPropertyError."""
    out = {str(k): str(v) for k, v in props.items()}
    for key, v in out.items():
        if not key.startswith("lakestep."):
            continue
        spec = KNOWN.get(key)
        if spec is None:
            raise _refuse(key, v, "unknown lakestep property; the known ones are " + ", ".join(
                f"{k} ({s.doc})" for k, s in sorted(KNOWN.items())))
        try:
            spec.parse(v)
        except ValueError as e:
            raise _refuse(key, v, f"{e}; {key} is {spec.doc}") from None
    _validate_ttl(out, schema)
    return out


def _validate_ttl(props: Mapping[str, str], schema: pa.Schema) -> None:
    col, secs = props.get(TTL_COLUMN), props.get(TTL_SECONDS)
    if (col is None) != (secs is None):
        key = TTL_COLUMN if col is None else TTL_SECONDS
        raise _refuse(key, None, f"a TTL needs both {TTL_COLUMN} and {TTL_SECONDS}; set {key} too")
    if col is None:
        return
    i = schema.get_field_index(col)
    if i < 0:
        raise _refuse(TTL_COLUMN, col, f"the table has no column {col!r} (columns: {schema.names})")
    t = schema.field(i).type
    if not (pa.types.is_timestamp(t) or pa.types.is_date(t) or pa.types.is_integer(t) or pa.types.is_floating(t)):
        raise _refuse(TTL_COLUMN, col, f"column {col!r} is {t}; a TTL column is a timestamp, a date or a number "
                                       "of seconds since the epoch")


def _fallback(table: str, key: str, raw: str, why: str, fallback: Any, warned: set[Any] | None) -> Any:
    if warned is None or (key, raw) not in warned:
        if warned is not None:
            warned.add((key, raw))
        log.warning("table %s has an invalid property %s=%r (%s); using %r instead. Fix it with "
                    "Table.set_properties", table, key, raw, why, fallback)
    return fallback


def value(table: str, props: Mapping[str, str], key: str, *, warned: set[Any] | None = None) -> Any:
    """Step 2: the parsed value of ``key`` (its default if unset, its fallback if invalid).

    ``warned``: the (key, value) pairs already logged for this table handle."""
    spec = KNOWN[key]
    raw = props.get(key)
    if raw is None:
        return spec.default
    try:
        return spec.parse(raw)
    except (TypeError, ValueError) as e:
        return _fallback(table, key, raw, str(e), spec.fallback, warned)


def ttl(table: str, props: Mapping[str, str], schema: pa.Schema, *,
        warned: set[Any] | None = None) -> tuple[str, float] | None:
    """Step 2 for the TTL pair: (column, seconds), or None when unset or invalid (no TTL)."""
    if props.get(TTL_COLUMN) is None and props.get(TTL_SECONDS) is None:
        return None
    try:
        _validate_ttl(props, schema)
    except InvalidPropertyError as e:
        return _fallback(table, e.key, str(e.value), str(e), None, warned)
    for key in (TTL_COLUMN, TTL_SECONDS):
        try:
            KNOWN[key].parse(props[key])
        except ValueError as e:
            return _fallback(table, key, props[key], str(e), None, warned)
    return props[TTL_COLUMN], float(props[TTL_SECONDS])
