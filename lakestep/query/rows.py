"""Rows of a query result for people and JSON: every column kept, duplicate names included.

A result may hold several columns of one name (``SELECT d.v, s.v ...``);
``pyarrow.Table.to_pylist`` keeps one of them. :func:`labels` names each
column once (a later column ``v`` becomes ``v_2``, ``v_3``, skipping names
already taken) and :func:`records` gives each row as a dict keyed by those
labels, in column order. Not guaranteed: a label is stable for one result's
column order only.
"""

from __future__ import annotations

from typing import Any, Sequence

import pyarrow as pa


def labels(names: Sequence[str]) -> list[str]:
    """One distinct label per column: its name, or ``name_k`` for the k-th column of that name."""
    taken = set(names)
    out: list[str] = []
    seen: dict[str, int] = {}
    for name in names:
        n = seen.get(name, 0) + 1
        seen[name] = n
        if n == 1:
            out.append(name)
            continue
        label = f"{name}_{n}"
        while label in taken:
            n += 1
            label = f"{name}_{n}"
        taken.add(label)
        out.append(label)
    return out


def records(table: pa.Table, limit: int | None = None) -> tuple[list[str], list[dict[str, Any]]]:
    """(the labels, the first ``limit`` rows, all if None, as dicts keyed by label)."""
    keys = labels(table.column_names)
    part = table if limit is None else table.slice(0, limit)
    columns = [part.column(i).to_pylist() for i in range(part.num_columns)]
    return keys, [dict(zip(keys, values)) for values in zip(*columns)]
