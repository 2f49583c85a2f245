"""Schema evolution against a model (issue 35), on both backends: random sequences of
appends, schema changes, deletes and compactions, checked after every step.

The model is plain Python: the table's columns in order, their types, and its rows as
dicts keyed by the current column names. Each operation is applied to the table and to
the model the way the table should behave: an added column (or struct field) reads null
in the rows written before; a rename renames the key; a drop removes it; a name used
before by a column that was dropped or renamed away names a new column, which reads null
in old rows and is never matched by a filter through the old column's values
(catalog/columns.py rule 6); a widened column reads the same values as the new type; a
reorder changes only the order of the columns; a delete removes the rows its filter
matches (a null matches only ``is_null``); a compaction changes nothing. Each schema
change is one commit (none when it changes nothing), an append one.

After every step the whole table (names, order and types of the columns, every value)
and two filtered reads (``=``, and any operator, on a column of the schema of the moment:
partition pruning, statistics judged by stored names) equal the model; at the end, time
travel to a few earlier versions returns the rows and the schema the model had then (a
filter at that version by that version's names too), and a freshly loaded handle reads
as the model. The drawing favours what matters most: a name given up lately (dropped,
renamed away) taken again by a new column or field, or by a rename.

Two kinds of table: a plain one partitioned by an int column (never dropped, maybe
renamed: the partitioning follows) and a primary-key table (appends by upsert, which
may replace a live key's row). Both start with a struct column ``s`` whose field ``a``
shares its name with a top-level column, so that nested adds, drops and renames and
top-level names meet (and a new column may itself be a struct). The named scenarios
(``SCENARIOS``, the explicit examples) pin the cases of name reuse: rename a -> b then
add a new a; drop a column then add one of the same name (and another type), at the top
and in the struct; rename back and forth, and two columns swapping names.
"""

from __future__ import annotations

import copy
import itertools
import operator
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from lakestep import Catalog

Type = Any  # "int32" | "int64" | "string" | a struct: [[field name, Type], ...]
Op = tuple[Any, ...]

ARROW = {"int32": pa.int32(), "int64": pa.int64(), "string": pa.string()}
INTS = [-2, -1, 0, 1, 2]
STRINGS = ["x", "y", "z"]
OPS: dict[str, Callable[[Any, Any], bool]] = {
    "=": operator.eq, "!=": operator.ne, "<": operator.lt, "<=": operator.le, ">": operator.gt, ">=": operator.ge,
    "in": lambda x, v: x in v, "not in": lambda x, v: x not in v}
ALL_OPS = [*OPS, "is_null", "not_null"]

_tables = itertools.count()  # the catalog fixture is shared by a test's examples: a table each


def arrow_type(t: Type) -> pa.DataType:
    return pa.struct([(n, arrow_type(ft)) for n, ft in t]) if isinstance(t, list) else ARROW[t]


def matches(value: Any, op: str, literal: Any) -> bool:
    """The model of a filter term: a null matches only ``is_null``."""
    if op == "is_null":
        return value is None
    if op == "not_null":
        return value is not None
    return value is not None and OPS[op](value, literal)


@dataclass
class Snap:
    """The table as the model has it at one version."""

    cols: list[str]
    types: dict[str, Type]
    rows: list[dict[str, Any]]
    key: str  # the id column's name then (the sort key)

    def scalars(self) -> list[str]:
        return [c for c in self.cols if not isinstance(self.types[c], list)]


@dataclass
class Model:
    keyed: bool
    cols: list[str]
    types: dict[str, Type]
    key: str = "id"
    part: str | None = None
    rows: list[dict[str, Any]] = field(default_factory=list)
    used: set[str] = field(default_factory=set)  # every name a column or field ever had
    # names given up (dropped, renamed away), newest last: (struct column or "" for the top level, name)
    retired: list[tuple[str, str]] = field(default_factory=list)
    next_id: int = 1
    fresh: int = 0

    def snap(self) -> Snap:
        return Snap(list(self.cols), copy.deepcopy(self.types), copy.deepcopy(self.rows), self.key)

    def scalars(self) -> list[str]:
        return [c for c in self.cols if not isinstance(self.types[c], list)]

    def structs(self) -> list[str]:
        return [c for c in self.cols if isinstance(self.types[c], list)]

    def fields(self, struct: str) -> list[str]:
        return [n for n, _ in self.types[struct]]


def new_table(catalog: Catalog, keyed: bool, struct: Type = (("a", "int32"),)) -> tuple[Any, Model]:
    """A table of columns id (the key), p (the partition column; plain tables only), a, n and
    the struct column s (of fields ``struct``), and its model."""
    catalog.create_namespace("p", exist_ok=True)
    types: dict[str, Type] = {"id": "int64", **({} if keyed else {"p": "int64"}), "a": "int32", "n": "string",
                              "s": [list(f) for f in struct]}
    schema = pa.schema([pa.field("id", pa.int64(), nullable=False),
                        *((n, arrow_type(typ)) for n, typ in types.items() if n != "id")])
    t = catalog.create_table(f"p.t{next(_tables)}", schema, primary_key=["id"] if keyed else [],
                             partition_by=[] if keyed else ["p"])
    m = Model(keyed, list(types), types, part=None if keyed else "p")
    m.used = set(types) | {n for n, _ in struct}
    return t, m


# ------------------------------------------------------------------ operations
def apply(t: Any, m: Model, op: Op) -> None:
    """Do ``op`` to the table and to the model; check the version it made."""
    kind, before = op[0], t.version
    grew = 1
    if kind == "append":  # ("append", rows (dicts of the columns written, the key among them), narrow)
        _, rows, narrow = op
        names = list(rows[0])
        data = pa.table({c: pa.array([r[c] for r in rows], pa.int32() if narrow and m.types[c] == "int64"
                                     else arrow_type(m.types[c])) for c in names})
        (t.upsert if m.keyed else t.append)(data)
        for r in rows:
            full = {c: copy.deepcopy(r.get(c)) for c in m.cols}  # (struct values change in place)
            if m.keyed:
                m.rows = [x for x in m.rows if x[m.key] != full[m.key]]
            m.rows.append(full)
    elif kind == "add":  # ("add", name or "struct.field", type)
        _, name, typ = op
        typ = copy.deepcopy(typ)  # (the model's struct types change in place)
        t.add_columns((name, arrow_type(typ)))
        if "." in name:
            s, leaf = name.split(".")
            m.types[s].append([leaf, typ])
            for r in m.rows:
                if r[s] is not None:
                    r[s][leaf] = None
        else:
            leaf = name
            m.cols.append(name)
            m.types[name] = typ
            for r in m.rows:
                r[name] = None
        m.used.add(leaf)
    elif kind == "rename":  # ("rename", name or "struct.field", new name)
        _, old, new = op
        t.rename_column(old, new)
        if "." in old:
            s, leaf = old.split(".")
            m.retired.append((s, leaf))
            m.types[s] = [[new if n == leaf else n, ft] for n, ft in m.types[s]]
            for r in m.rows:
                if r[s] is not None:
                    r[s] = {new if k == leaf else k: v for k, v in r[s].items()}
        else:
            m.retired.append(("", old))
            m.retired = [(new if s == old else s, n) for s, n in m.retired]  # (a struct's fields move with it)
            m.cols[m.cols.index(old)] = new
            m.types[new] = m.types.pop(old)
            for r in m.rows:
                r[new] = r.pop(old)
            m.key = new if m.key == old else m.key
            m.part = new if m.part == old else m.part
        m.used.add(new)
    elif kind == "drop":  # ("drop", name or "struct.field")
        _, name = op
        t.drop_column(name)
        if "." in name:
            s, leaf = name.split(".")
            m.retired.append((s, leaf))
            m.types[s] = [[n, ft] for n, ft in m.types[s] if n != leaf]
            for r in m.rows:
                if r[s] is not None:
                    del r[s][leaf]
        else:
            m.retired.append(("", name))
            m.retired = [(s, n) for s, n in m.retired if s != name]
            m.cols.remove(name)
            del m.types[name]
            for r in m.rows:
                del r[name]
    elif kind == "widen":  # ("widen", an int32 column)
        t.update_column(op[1], type=pa.int64())
        m.types[op[1]] = "int64"
    elif kind == "reorder":  # ("reorder", names): these first, then the others as they are
        order = list(op[1]) + [c for c in m.cols if c not in op[1]]
        grew = int(order != m.cols)
        t.reorder_columns(order)
        m.cols = order
    elif kind == "delete":  # ("delete", column, op, value)
        _, col, o, v = op
        t.delete([(col, o, v)])
        m.rows = [r for r in m.rows if not matches(r[col], o, v)]
        grew = -1
    elif kind == "compact":  # ("compact", major)
        t.compact(major=op[1])
        grew = -1
    else:  # pragma: no cover
        raise AssertionError(op)
    after = t.version
    if m.keyed and after > before and "runs" in t.history(limit=1)[0].summary:
        after -= 1  # the write was followed by a compaction on write (a COMPACT commit of its own)
    if grew >= 0:
        assert after == before + grew, (op, before, after)
    else:  # a delete or compaction may commit nothing
        assert after in (before, before + 1), (op, before, after)
    assert t.schema.names == m.cols, op


# ------------------------------------------------------------------ checks
def _sorted(rows: list[dict[str, Any]], key: str) -> list[dict[str, Any]]:
    return sorted(rows, key=lambda r: r[key])


def check(t: Any, snap: Snap, version: int | None = None, where: tuple[str, str, Any] | None = None) -> None:
    """The table (at ``version``, filtered by ``where``) equals the model's snapshot: the
    columns, their order and types, and every row."""
    at = {} if version is None else {"version": version}
    got = t.to_arrow(**at, **({} if where is None else {"where": [where]}))
    want_schema = [(n, arrow_type(snap.types[n])) for n in snap.cols]
    assert [(f.name, f.type) for f in got.schema] == want_schema, (version, where)
    want = snap.rows if where is None else [r for r in snap.rows if matches(r[where[0]], where[1], where[2])]
    assert _sorted(got.to_pylist(), snap.key) == _sorted(want, snap.key), (version, where)


# ------------------------------------------------------------------ drawing operations
def domain(m: Model | Snap, col: str) -> list[Any]:
    if col == m.key:
        return list(range(6))
    return STRINGS if m.types[col] == "string" else INTS


def values(typ: Type) -> st.SearchStrategy[Any]:
    """A value of a column of type ``typ``: null now and then (values are what a column
    reading another's would show)."""
    if isinstance(typ, list):
        struct = st.fixed_dictionaries({n: values(ft) for n, ft in typ})
        return st.sampled_from([False, True, True]).flatmap(lambda valid: struct if valid else st.none())
    return st.sampled_from([*(STRINGS if typ == "string" else INTS), None])


def given_up(m: Model, level: str, taken: list[str]) -> list[str]:
    """The names given up lately at ``level`` (the top, or a struct column) and free now."""
    return list(dict.fromkeys(n for s, n in reversed(m.retired) if s == level and n not in taken))[:2]


def draw_name(data: st.DataObject, m: Model, taken: list[str], level: str = "") -> str:
    """A new name: one a column (or field) gave up lately, one any column had, or a fresh one."""
    recent = given_up(m, level, taken)
    old = sorted(m.used - set(taken))
    how = data.draw(st.sampled_from(["recent", "any", "fresh"]), label="name")
    if how == "recent" and recent:
        return data.draw(st.sampled_from(recent), label="reused name")
    if how == "any" and old:
        return data.draw(st.sampled_from(old), label="reused name")
    m.fresh += 1
    return f"c{m.fresh}"


def draw_term(data: st.DataObject, m: Model | Snap, cols: list[str], ops: list[str]) -> tuple[str, str, Any]:
    col = data.draw(st.sampled_from(cols), label="filter column")
    op = data.draw(st.sampled_from(ops), label="filter op")
    if op in ("is_null", "not_null"):
        return (col, op, None)
    if op in ("in", "not in"):
        # an empty list too: nothing is in it, every non-null value is outside it
        return (col, op, data.draw(st.lists(st.sampled_from(domain(m, col)), min_size=0, max_size=3, unique=True),
                                   label="filter values"))
    present = sorted({r[col] for r in m.rows if r[col] is not None})
    return (col, op, data.draw(st.sampled_from(present or domain(m, col)), label="filter value"))


def draw_append(data: st.DataObject, m: Model) -> Op:
    others = [c for c in m.cols if c != m.key]
    written = data.draw(st.lists(st.sampled_from(others), unique=True) if others else st.just([]), label="written")
    order = data.draw(st.permutations([m.key, *written]), label="column order")
    n = data.draw(st.integers(1, 3), label="rows")
    live = sorted(r[m.key] for r in m.rows)
    ids = data.draw(st.lists(st.sampled_from(live), unique=True, max_size=n), label="upserted keys") \
        if m.keyed and live else []
    while len(ids) < n:
        ids.append(m.next_id)
        m.next_id += 1
    rows = []
    for i in ids:
        vals = data.draw(st.fixed_dictionaries({c: values(m.types[c]) for c in written}), label="row")
        rows.append({c: i if c == m.key else vals[c] for c in order})
    return ("append", rows, data.draw(st.booleans(), label="int64 written as int32"))


def draw_op(data: st.DataObject, m: Model) -> Op:
    droppable = [c for c in m.cols if c not in (m.key, m.part)]
    kinds = ["append", "append", "add", "add", "rename", "rename", "delete", "compact"]
    kinds += ["drop", "drop"] * bool(droppable) + ["reorder"] * (len(m.cols) > 1)
    kinds += ["widen"] * any(m.types[c] == "int32" for c in m.cols)
    kinds += ["add_field", "rename_field"] * bool(m.structs())
    kinds += ["drop_field"] * 3 * any(len(m.types[s]) > 1 for s in m.structs())
    # the case that matters most, made likely: a name given up lately taken by a new column
    kinds += ["readd"] * 3 * bool(given_up(m, "", m.cols))
    readd = [s for s in m.structs() if given_up(m, s, m.fields(s))]
    kinds += ["readd_field"] * 3 * bool(readd)
    kind = data.draw(st.sampled_from(kinds), label="operation")
    if kind == "append":
        return draw_append(data, m)
    if kind == "add":
        typ = data.draw(st.sampled_from(["int64", "string", [["a", "int64"]]]), label="type")
        return ("add", draw_name(data, m, m.cols), typ)
    if kind == "readd":
        typ = data.draw(st.sampled_from(["int64", "string"]), label="type")
        return ("add", data.draw(st.sampled_from(given_up(m, "", m.cols)), label="name given up"), typ)
    if kind == "readd_field":
        s = data.draw(st.sampled_from(readd), label="struct")
        typ = data.draw(st.sampled_from(["int64", "string"]), label="type")
        return ("add", f"{s}.{data.draw(st.sampled_from(given_up(m, s, m.fields(s))), label='name given up')}", typ)
    if kind == "rename":
        old = data.draw(st.sampled_from(m.cols), label="renamed")
        return ("rename", old, draw_name(data, m, m.cols))
    if kind == "drop":
        return ("drop", data.draw(st.sampled_from(droppable), label="dropped"))
    if kind == "widen":
        return ("widen", data.draw(st.sampled_from([c for c in m.cols if m.types[c] == "int32"]), label="widened"))
    if kind == "reorder":
        return ("reorder", data.draw(st.permutations(m.cols), label="order"))
    if kind == "delete":
        return ("delete", *draw_term(data, m, m.scalars(), ALL_OPS))
    if kind == "compact":
        return ("compact", data.draw(st.booleans(), label="major"))
    if kind == "drop_field":
        s = data.draw(st.sampled_from([s for s in m.structs() if len(m.types[s]) > 1]), label="struct")
        return ("drop", f"{s}.{data.draw(st.sampled_from(m.fields(s)), label='dropped field')}")
    s = data.draw(st.sampled_from(m.structs()), label="struct")
    if kind == "add_field":
        typ = data.draw(st.sampled_from(["int64", "string"]), label="type")
        return ("add", f"{s}.{draw_name(data, m, m.fields(s), s)}", typ)
    old = data.draw(st.sampled_from(m.fields(s)), label="renamed field")
    return ("rename", f"{s}.{old}", draw_name(data, m, m.fields(s), s))


# ------------------------------------------------------------------ the property
@pytest.mark.parametrize("keyed", [False, True], ids=["plain", "keyed"])
@settings(max_examples=25, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(data=st.data())
def test_schema_changes_read_as_the_model(catalog: Catalog, keyed: bool, data: st.DataObject) -> None:
    t, m = new_table(catalog, keyed, struct=(("a", "int32"), ("b", "string")))  # (a field may go at once)
    snaps = [(t.version, m.snap())]
    steps = data.draw(st.integers(3, 12), label="steps")
    for i in range(steps):
        op = draw_append(data, m) if i == 0 else draw_op(data, m)  # (the first writes old files)
        nested = op[0] in ("add", "rename", "drop") and "." in op[1]
        event(f"step: {op[0]}{' field' if nested else ''}")
        if op[0] in ("add", "rename"):
            level, new = (op[1].split(".")[0] if nested else ""), (op[1].split(".")[-1] if op[0] == "add" else op[2])
            if (level, new) in m.retired:
                event(f"step: {op[0]}{' field' if nested else ''} to a name given up before")
        apply(t, m, op)
        snap = m.snap()
        check(t, snap)
        check(t, snap, where=draw_term(data, m, m.scalars(), ["="]))
        check(t, snap, where=draw_term(data, m, m.scalars(), ALL_OPS))
        snaps.append((t.version, snap))
    # time travel: a few versions (the one after the first append always), with that version's names
    picked = data.draw(st.lists(st.sampled_from(range(2, len(snaps))), max_size=2, unique=True), label="versions")
    for k in [1, *picked]:
        v, snap = snaps[k]
        check(t, snap, version=v)
        check(t, snap, version=v, where=draw_term(data, snap, snap.scalars(), ALL_OPS))
    check(catalog.load_table(t.ident), m.snap())  # a handle loaded now: nothing cached


# ------------------------------------------------------------------ named scenarios
def row(i: int, **cols: Any) -> dict[str, Any]:
    return {"id": i, **cols}


SCENARIOS: dict[str, list[Op]] = {
    # the name a moves to a new column: old rows read null in it, a filter on it never sees
    # their old values (which are b's now); the same one level down, in the struct
    "rename-then-add-the-old-name": [
        ("append", [row(1, a=1, n="x", s={"a": 1}), row(2, a=2, n=None, s=None)], False),
        ("rename", "a", "b"),
        ("add", "a", "int64"),
        ("append", [row(3, a=1, b=3, s={"a": 3})], False),
        ("rename", "s.a", "b"),
        ("add", "s.a", "int64"),
        ("append", [row(4, a=4, s={"b": 4, "a": 1})], True),
        ("delete", "a", "=", 1),  # row 3 only: row 1's 1 is under b
        ("compact", True),
        ("append", [row(5, b=1, a=2)], False),
    ],
    # a dropped column's values stay in the files: a new column of its name (even of another
    # type) reads null in them, at the top and in the struct
    "drop-then-add-again": [
        ("append", [row(1, a=1, n="x", s={"a": 1}), row(2, a=2, n="y", s={"a": 2})], False),
        ("drop", "a"),
        ("add", "a", "int64"),
        ("append", [row(3, a=1, n="x", s={"a": 3})], False),
        ("add", "s.b", "string"),
        ("drop", "s.a"),
        ("add", "s.a", "int64"),
        ("append", [row(4, s={"b": "y", "a": 1})], False),
        ("drop", "n"),
        ("add", "n", "int64"),
        ("append", [row(5, n=1, a=2)], True),
        ("delete", "a", "is_null", None),
        ("drop", "s"),
        ("add", "s", [["a", "int64"]]),
        ("append", [row(6, s={"a": 5})], False),
        ("compact", False),
    ],
    # renames back and forth, then two columns swap names (the files' a and n now mean each
    # other's columns), a widening and a reorder over it all
    "rename-back-and-forth": [
        ("append", [row(1, a=1, n="x", s={"a": 1}), row(2, a=None, n="y", s=None)], False),
        ("rename", "a", "b"),
        ("rename", "b", "a"),
        ("rename", "a", "b"),
        ("rename", "n", "a"),
        ("append", [row(3, b=2, a="z", s={"a": 2})], False),
        ("rename", "b", "n"),
        ("rename", "s.a", "b"),
        ("rename", "s.b", "a"),
        ("widen", "n"),
        ("reorder", ["s", "a", "n"]),
        ("append", [row(4, n=1, a="x", s={"a": 4})], True),
        ("delete", "a", "=", "x"),
        ("rename", "id", "key"),
        ("compact", True),
    ],
}


@pytest.mark.parametrize("keyed", [False, True], ids=["plain", "keyed"])
@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_name_reuse_scenarios(catalog: Catalog, keyed: bool, scenario: str) -> None:
    t, m = new_table(catalog, keyed)
    snaps = [(t.version, m.snap())]
    for op in SCENARIOS[scenario]:
        if op[0] == "append":  # the scenarios' rows carry keys of their own
            m.next_id = max(m.next_id, *(r["id"] + 1 for r in op[1]))
            if m.key != "id":
                op = ("append", [{m.key if c == "id" else c: v for c, v in r.items()} for r in op[1]], op[2])
        apply(t, m, op)
        snap = m.snap()
        check(t, snap)
        for col in m.scalars():  # "=" on every column, by each value it holds, and is_null
            for v in sorted({r[col] for r in m.rows if r[col] is not None}) or domain(m, col)[:1]:
                check(t, snap, where=(col, "=", v))
            check(t, snap, where=(col, "is_null", None))
        snaps.append((t.version, snap))
    for v, snap in snaps:
        check(t, snap, version=v)
    check(catalog.load_table(t.ident), m.snap())
