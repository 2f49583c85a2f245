"""Row predicates: the filters of overwrite, delete, update and scans.

A filter is written as pyarrow's ``filters`` are (disjunctive normal form)::

    [("day", "=", "2024-05-01"), ("amount", ">", 10)]            # AND
    [[("day", "=", "2024-05-01")], [("status", "in", ["x"])]]    # OR of ANDs

Operators: ``=`` ``==`` ``!=`` ``<`` ``<=`` ``>`` ``>=`` ``in`` ``not in``
``is_null`` ``not_null`` (the last two take ``None`` as their value). A null
matches only ``is_null``: ``("x", "not in", [1])`` leaves out the rows where
``x`` is null, as ``!=`` does (and SQL's ``NOT IN``). On an integer column a
float, or an integer beyond the column's type, compares exactly, as in Python
(``("n", ">", 2.5)`` is ``n >= 3``; see ``_exact_integer_term``).

A :class:`Predicate` turns into a pyarrow expression for rows, and judges a
data file from its statistics alone: ``NONE`` (no row can match), ``ALL``
(every row matches) or ``SOME`` (cannot tell without reading). Commits decide
conflicts and overwrites decide which files to drop with this verdict, so the
rules err to ``SOME`` whenever statistics are missing or not comparable.
"""

from __future__ import annotations

import enum
import itertools
import math
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Sequence, Union, cast

import pyarrow as pa
import pyarrow.compute as pc

from ..errors import FilterValueError, InvalidPredicateError
from .columns import stored_names
from .files import ColumnStats, DataFile, partition_key

Term = tuple[str, str, Any]
Filter = Union[Sequence[Term], Sequence[Sequence[Term]]]

_OPS = {"=", "==", "!=", "<", "<=", ">", ">=", "in", "not in", "is_null", "not_null"}

#: More candidate partitions than this: no narrowing by partition key (the files are
#: listed and judged one by one instead).
MAX_PARTITION_KEYS = 1024


class Verdict(enum.Enum):
    NONE = 0
    SOME = 1
    ALL = 2


def _is_term(x: Any) -> bool:
    return isinstance(x, tuple) and len(x) == 3 and isinstance(x[0], str) and isinstance(x[1], str)


@dataclass(frozen=True)
class Predicate:
    clauses: tuple[tuple[Term, ...], ...]  # OR of ANDs
    #: the integer columns' types (set by ``parse`` with a schema): their values become
    #: literals of the column's type in the row expression, so that pyarrow compares in
    #: that type (it compares a uint64 column with an int64 literal by casting the column)
    int_types: tuple[tuple[str, pa.DataType], ...] = field(default=(), compare=False)
    #: the columns stored under another name (columns.py rule 6; set by ``parse`` with a
    #: schema): files' statistics and partition values are judged by the stored names
    stored: tuple[tuple[str, str], ...] = field(default=(), compare=False)

    @classmethod
    def parse(cls, where: Filter | "Predicate", schema: pa.Schema | None = None) -> "Predicate":
        if isinstance(where, Predicate):
            pred = where
        else:
            if not isinstance(where, (list, tuple)) or len(where) == 0:
                raise InvalidPredicateError(f"a filter is a non-empty list of (column, op, value) terms, got {where!r}")
            # _is_term tells the two shapes of a Filter apart, which mypy cannot follow: the casts
            clauses: tuple[tuple[Term, ...], ...]
            if all(_is_term(t) for t in where):
                clauses = (tuple(cast(Sequence[Term], where)),)
            elif all(isinstance(c, (list, tuple)) and c and all(_is_term(t) for t in c) for c in where):
                clauses = tuple(tuple(c) for c in cast(Sequence[Sequence[Term]], where))
            else:
                raise InvalidPredicateError(
                    f"cannot read filter {where!r}: use [(col, op, value), ...] or a list of such lists"
                )
            pred = cls(clauses)
        if schema is not None:
            clauses = tuple(tuple(_exact_integer_term(schema, t) for t in clause) for clause in pred.clauses)
            ints = tuple((f.name, f.type) for f in schema if pa.types.is_integer(f.type)
                         and any(t[0] == f.name for c in clauses for t in c))
            pred = cls(clauses, ints, tuple(sorted(stored_names(schema).items())))
        int_types = dict(pred.int_types)
        for clause in pred.clauses:
            for col, op, val in clause:
                if op not in _OPS:
                    raise InvalidPredicateError(f"unknown operator {op!r} in filter; use one of {sorted(_OPS)}")
                if schema is not None and schema.get_field_index(col) < 0:
                    raise InvalidPredicateError(f"filter names column {col!r}, which the table does not have")
                if op in ("in", "not in") and (isinstance(val, (str, bytes)) or not isinstance(val, Iterable)):
                    raise InvalidPredicateError(f"operator {op!r} takes a list of values, got {val!r}")
                if schema is not None:
                    _check_value(schema, (col, op, val), int_types.get(col))
        return pred

    @classmethod
    def partitions(cls, values: Sequence[Mapping[str, Any]]) -> "Predicate":
        """The predicate that selects exactly the given partitions."""
        if not values:
            raise InvalidPredicateError("an overwrite of partitions needs at least one partition")
        clauses = []
        for part in values:
            clauses.append(tuple((k, "is_null" if v is None else "=", v) for k, v in part.items()))
        return cls(tuple(clauses))

    @property
    def columns(self) -> set[str]:
        return {t[0] for c in self.clauses for t in c}

    def stored_name(self, column: str) -> str:
        """The name ``column``'s statistics and partition values are recorded under."""
        for name, stored in self.stored:
            if name == column:
                return stored
        return column

    def partition_keys(self, schema: pa.Schema, partition_by: Sequence[str]) -> frozenset[str] | None:
        """The stored partition keys (:func:`~lakestep.catalog.files.partition_key`) of every
        partition that may hold a matching row, or ``None`` when that cannot be told
        exactly: some clause leaves a partition column free (no ``=``, ``in`` or
        ``is_null`` term on it), a value does not convert exactly to the column's type,
        or there are more than :data:`MAX_PARTITION_KEYS` candidates.

        A superset, never less: a row matches a clause only if its partition
        values satisfy that clause's terms on the partition columns. Reads
        narrow their file listing to these keys (one indexed lookup each), then
        judge the files by :meth:`verdict` as before.
        """
        if not partition_by:
            return None
        keys: set[str] = set()
        for clause in self.clauses:
            per_col: list[list[Any]] = []
            for col in partition_by:
                allowed: list[Any] | None = None
                for c, op, val in clause:
                    if c != col or op not in ("=", "==", "in", "is_null"):
                        continue
                    vals = [None] if op == "is_null" else list(val) if op == "in" else [val]
                    exact = _exact_values(schema.field(col).type, vals)
                    if exact is None:
                        return None
                    allowed = exact if allowed is None else [v for v in allowed if v in exact]
                if allowed is None:
                    return None
                per_col.append(allowed)
            combos = 1
            for vals in per_col:
                combos *= len(vals)
            if combos + len(keys) > MAX_PARTITION_KEYS:
                return None
            stored = [self.stored_name(c) for c in partition_by]
            keys.update(partition_key(dict(zip(stored, combo))) for combo in itertools.product(*per_col))
        return frozenset(keys)

    # ---------------------------------------------------------------- rows
    def file_expression(self) -> pc.Expression:
        """:meth:`expression` over the names the files store the columns under (columns.py
        rule 6): what a scan of the files filters with."""
        if not self.stored:
            return self.expression()
        return Predicate(tuple(tuple((self.stored_name(c), op, v) for c, op, v in clause) for clause in self.clauses),
                         tuple((self.stored_name(n), t) for n, t in self.int_types)).expression()

    def expression(self) -> pc.Expression:
        ors = []
        types = dict(self.int_types)
        for clause in self.clauses:
            ands = [_term_expr(t, types.get(t[0])) for t in clause]
            e = ands[0]
            for a in ands[1:]:
                e = e & a
            ors.append(e)
        out = ors[0]
        for o in ors[1:]:
            out = out | o
        return out

    def mask(self, table: pa.Table) -> pa.ChunkedArray | pa.Array:
        """Boolean mask of the rows that match (null counts as no match)."""
        if table.num_rows == 0:
            return pa.array([], pa.bool_())
        import pyarrow.dataset as ds  # here: importing it imports pandas (0.4 s), which most processes never need

        result = ds.dataset(table).to_table(columns={"m": self.expression()})
        return pc.fill_null(result.column("m"), False)

    # --------------------------------------------------------------- files
    def verdict(self, f: DataFile) -> Verdict:
        stats = f.stats
        count = f.record_count
        if count == 0:
            return Verdict.NONE
        any_some = False
        all_none = True
        for clause in self.clauses:
            v = _and((_term_verdict(t, stats.get(self.stored_name(t[0]) if self.stored else t[0]), count)
                      for t in clause))
            if v is Verdict.ALL:
                return Verdict.ALL
            if v is Verdict.SOME:
                any_some = True
                all_none = False
        if all_none and not any_some:
            return Verdict.NONE
        return Verdict.SOME


def _exact_values(typ: pa.DataType, vals: list[Any]) -> list[Any] | None:
    """``vals`` as the column's values (what a file's partition holds), deduplicated;
    ``None`` if one does not convert exactly (no narrowing then)."""
    try:
        out = pa.array(vals, typ).to_pylist()
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError, TypeError, OverflowError):
        return None
    for given, got in zip(vals, out):
        if given is not None and (got is None or got != given):  # e.g. 5.5 on an integer column
            return None
    unique: list[Any] = []
    for v in out:
        if v not in unique:
            unique.append(v)
    return unique


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _term_expr(t: Term, int_type: pa.DataType | None = None) -> pc.Expression:
    """``t`` as a pyarrow expression; on an integer column (``int_type``) its integer values
    are literals of that type (``_exact_integer_term`` made them fit it)."""
    col, op, val = t
    f = pc.field(col)
    if int_type is not None:
        if op in ("in", "not in") and all(v is None or _is_int(v) for v in val):
            val = pa.array([v for v in val if v is not None], int_type)
        elif _is_int(val):
            val = pa.scalar(val, int_type)
    if op in ("in", "not in") and not isinstance(val, pa.Array):
        val = [v for v in val if v is not None]
        if not val:  # no value (nothing, or nulls only): no row is in it; every non-null row is outside it
            return f.is_valid() & pc.scalar(False) if op == "in" else f.is_valid()
    if op in ("=", "=="):
        return f == val
    if op == "!=":
        return f != val
    if op == "<":
        return f < val
    if op == "<=":
        return f <= val
    if op == ">":
        return f > val
    if op == ">=":
        return f >= val
    if op == "in":  # a null is in no list, also one holding None (pyarrow's isin would match it; SQL's IN does not)
        return f.is_valid() & f.isin(val if isinstance(val, pa.Array) else list(val))
    if op == "not in":  # a null is in no list and not outside it: no match, as with "!=" (and SQL)
        return f.is_valid() & ~f.isin(val if isinstance(val, pa.Array) else list(val))
    if op == "is_null":
        return f.is_null()
    if op == "not_null":
        return f.is_valid()
    raise InvalidPredicateError(f"unknown operator {op!r}")


def _exact_integer_term(schema: pa.Schema, t: Term) -> Term:
    """A float, or an integer beyond the column type's range, compared with an integer
    column: the same comparison in integers of the column's type.

    pyarrow compares an integer column with a float in floating point, and
    refuses column values it cannot convert exactly (an int64 beyond 2**24
    against ``2.5``); an integer beyond the type does not fit its literal. The
    integers that satisfy ``k > 2.5`` are those with ``k >= 3``, and none
    equals ``2.5``: the term becomes ``(">=", 3)``, an empty ``in`` (no row)
    or ``not_null`` (every row with a value), whichever says the same. Bounds
    beyond the column type's range, infinities and NaN (which no value equals
    or is ordered with) are decided the same way.
    """
    col, op, val = t
    i = schema.get_field_index(col) if isinstance(col, str) else -1
    if i < 0 or not pa.types.is_integer(schema.field(i).type) or op not in _OPS:
        return t
    typ = schema.field(i).type
    lo, hi = ((-(2 ** (typ.bit_width - 1)), 2 ** (typ.bit_width - 1) - 1) if pa.types.is_signed_integer(typ)
              else (0, 2 ** typ.bit_width - 1))
    none: Term = (col, "in", [])
    every: Term = (col, "not_null", None)

    def exact(v: Any) -> int | None:  # the integer of the type that equals v, if any
        if isinstance(v, float) and not (math.isfinite(v) and v.is_integer()):
            return None
        n = int(v)
        return n if lo <= n <= hi else None

    def number(v: Any) -> bool:
        return isinstance(v, float) or _is_int(v)

    if op in ("in", "not in"):
        if isinstance(val, (str, bytes)) or not isinstance(val, Iterable):
            return t  # (refused by parse)
        vals = list(val)
        if not all(v is None or number(v) for v in vals):
            return t  # (refused by _check_value, or left to pyarrow)
        return (col, op, [v if v is None else n for v in vals if v is None or (n := exact(v)) is not None])
    if not number(val):
        return t
    if _is_int(val) and lo <= val <= hi:
        return t
    if isinstance(val, float) and math.isnan(val):
        return every if op == "!=" else none
    if op in ("=", "=="):
        n = exact(val)
        return none if n is None else (col, op, n)
    if op == "!=":
        n = exact(val)
        return every if n is None else (col, op, n)
    if isinstance(val, float) and math.isinf(val):
        above = val > 0
        return (none if above else every) if op in (">", ">=") else (every if above else none)
    if op in (">", ">="):  # k > x <=> k >= floor(x) + 1;  k >= x <=> k >= ceil(x)
        b = math.floor(val) + 1 if op == ">" else math.ceil(val)
        return every if b <= lo else none if b > hi else (col, ">=", b)
    if op in ("<", "<="):  # k < x <=> k <= ceil(x) - 1;  k <= x <=> k <= floor(x)
        b = math.ceil(val) - 1 if op == "<" else math.floor(val)
        return every if b >= hi else none if b < lo else (col, "<=", b)
    return t


def _check_value(schema: pa.Schema, t: Term, int_type: pa.DataType | None = None) -> None:
    """Refuse a value the column cannot be compared with, before any file is read.

    The term is bound against an empty table of the schema: pyarrow then
    picks the comparison kernel exactly as it would on the rows.
    """
    col, op, val = t
    if op in ("is_null", "not_null"):
        return
    field = schema.field(col)
    try:
        pa.table({col: pa.array([], field.type)}).filter(_term_expr(t, int_type))
    except (pa.ArrowNotImplementedError, pa.ArrowInvalid, pa.ArrowTypeError, TypeError, OverflowError) as e:
        kind = ", ".join(sorted({type(v).__name__ for v in val})) if op in ("in", "not in") else type(val).__name__
        raise FilterValueError(
            f"filter ({col!r}, {op!r}, {val!r}) compares column {col!r} of type {field.type} with a value of "
            f"type {kind}: pass {'values' if op in ('in', 'not in') else 'a value'} of type {field.type} "
            "(or one pyarrow converts to it)", column=col, op=op, value=val, column_type=str(field.type)) from e


def _and(verdicts: Iterable[Verdict]) -> Verdict:
    out = Verdict.ALL
    for v in verdicts:
        if v is Verdict.NONE:
            return Verdict.NONE
        if v is Verdict.SOME:
            out = Verdict.SOME
    return out


def _term_verdict(t: Term, s: ColumnStats | None, count: int) -> Verdict:
    _, op, val = t
    if s is None:
        return Verdict.SOME
    nulls = s.null_count
    if op == "is_null":
        return Verdict.NONE if nulls == 0 else Verdict.ALL if nulls == count else Verdict.SOME
    if op == "not_null":
        return Verdict.ALL if nulls == 0 else Verdict.NONE if nulls == count else Verdict.SOME
    if nulls == count:
        return Verdict.NONE  # comparisons with null never match
    lo, hi = s.min, s.max
    if lo is None or hi is None:
        return Verdict.SOME
    try:
        if op in ("=", "=="):
            if val < lo or val > hi:
                return Verdict.NONE
            return Verdict.ALL if (lo == hi == val and nulls == 0) else Verdict.SOME
        if op == "!=":
            if lo == hi == val:
                return Verdict.NONE
            return Verdict.ALL if (nulls == 0 and (val < lo or val > hi)) else Verdict.SOME
        if op == "<":
            return Verdict.NONE if lo >= val else Verdict.ALL if (hi < val and nulls == 0) else Verdict.SOME
        if op == "<=":
            return Verdict.NONE if lo > val else Verdict.ALL if (hi <= val and nulls == 0) else Verdict.SOME
        if op == ">":
            return Verdict.NONE if hi <= val else Verdict.ALL if (lo > val and nulls == 0) else Verdict.SOME
        if op == ">=":
            return Verdict.NONE if hi < val else Verdict.ALL if (lo >= val and nulls == 0) else Verdict.SOME
        if op == "in":
            vals = list(val)
            if all(v is None or v < lo or v > hi for v in vals):
                return Verdict.NONE
            return Verdict.ALL if (lo == hi and lo in vals and nulls == 0) else Verdict.SOME
        if op == "not in":
            vals = [v for v in val if v is not None]
            if lo == hi and lo in vals:
                return Verdict.NONE
            if nulls == 0 and all(v < lo or v > hi for v in vals):
                return Verdict.ALL
            return Verdict.SOME
    except TypeError:  # statistics and literal not comparable (e.g. naive vs aware)
        return Verdict.SOME
    return Verdict.SOME
