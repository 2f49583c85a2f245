"""Checks of arguments at the API's edge, before anything is read or written.

A value that would otherwise reach the database or pyarrow raw (a batch id
beyond int64 is an ``OverflowError`` on SQLite and a ``DataError`` quoting the
whole statement on PostgreSQL; a negative barrier silently reads version 0)
is refused here with :class:`InvalidArgumentError` naming the argument; a namespace,
table, column or job name that is not an identifier with :class:`InvalidIdentifierError`.
"""

from __future__ import annotations

import math
import operator
import re
from typing import Any

from ..errors import InvalidArgumentError, InvalidIdentifierError
from .epoch import OPEN_EPOCH

INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1

_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
MAX_IDENT = 128


def check_identifier(name: object, what: str = "identifier") -> str:
    """Return ``name`` if it is a valid namespace, table, column or job name."""
    if not isinstance(name, str) or not name:
        raise InvalidIdentifierError(f"{what} must be a non-empty string, got {name!r}", identifier=str(name))
    if len(name) > MAX_IDENT:
        raise InvalidIdentifierError(
            f"{what} {name[:20]!r}... is {len(name)} characters long; the limit is {MAX_IDENT}",
            identifier=name,
        )
    if not _IDENT.match(name):
        raise InvalidIdentifierError(
            f"{what} {name!r} may only hold letters, digits and underscores, and must not start "
            "with a digit (no quotes, dots, spaces or semicolons)",
            identifier=name,
        )
    return name


def check_int(value: Any, argument: str, *, lo: int = INT64_MIN, hi: int = INT64_MAX) -> int:
    """``value`` as an int in ``[lo, hi]`` (an int64 by default), or InvalidArgumentError."""
    if isinstance(value, bool):
        raise InvalidArgumentError(f"{argument} must be an integer, got {value!r}", argument=argument, value=value)
    try:
        v = operator.index(value)
    except TypeError:
        raise InvalidArgumentError(f"{argument} must be an integer, got {value!r} ({type(value).__name__})",
                                   argument=argument, value=value) from None
    if not lo <= v <= hi:
        raise InvalidArgumentError(f"{argument}={v} is out of range: it must lie in [{lo}, {hi}]",
                                   argument=argument, value=value)
    return v


def check_batch_id(batch_id: Any) -> int:
    """A batch id of an idempotency key: an integer that fits the catalog's int64 column."""
    return check_int(batch_id, "batch_id")


def check_job_id(job_id: Any) -> str:
    """A job id: a non-empty string of letters, digits, ``_ - . :``, at most 128 characters."""
    if not isinstance(job_id, str):
        raise InvalidIdentifierError(f"job id must be a non-empty string, got {job_id!r}", identifier=str(job_id))
    try:
        check_identifier(job_id.replace("-", "_").replace(".", "_").replace(":", "_"), "job id")
    except InvalidIdentifierError as e:
        raise InvalidIdentifierError(str(e).replace(repr(e.identifier), repr(job_id)) + " (job ids may also "
                                     "hold '-', '.' and ':')", identifier=job_id) from None
    return job_id


def check_barrier(value: Any, argument: str = "barrier", *, open_epoch_ok: bool = False) -> int:
    """A barrier: an epoch number >= 0 (``OPEN_EPOCH`` too where a write may take it)."""
    if open_epoch_ok and not isinstance(value, bool) and value == OPEN_EPOCH:
        return OPEN_EPOCH
    return check_int(value, argument, lo=0)


def check_seconds(value: Any, argument: str) -> float:
    """A duration: a finite number of seconds >= 0."""
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise InvalidArgumentError(f"{argument} must be a number of seconds, got {value!r}",
                                   argument=argument, value=value) from None
    if isinstance(value, bool) or not math.isfinite(v) or v < 0:
        raise InvalidArgumentError(f"{argument} must be a finite number of seconds >= 0, got {value!r}",
                                   argument=argument, value=value)
    return v
