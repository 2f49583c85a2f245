"""Primary-key tables: upserts merged on read, deletes by key, minor and major compaction."""

from __future__ import annotations

import random

import pyarrow as pa
import pytest

from lakestep import Catalog, errors

SCHEMA = pa.schema([("k", pa.int64()), ("day", pa.string()), ("v", pa.int64())])


@pytest.fixture
def table(catalog: Catalog):  # type: ignore[no-untyped-def]
    catalog.create_namespace("s")
    return catalog.create_table("s.pk", SCHEMA, primary_key=["k", "day"], partition_by=["day"])


def view(t, **kw) -> dict:  # type: ignore[no-untyped-def]
    rows = t.to_arrow(**kw).to_pylist()
    keys = [tuple(r[k] for k in t.primary_key) for r in rows]
    assert len(keys) == len(set(keys)), "a key appears twice"
    return {key: (r["v"] if len(key) == 2 else (r["day"], r["v"])) for key, r in zip(keys, rows)}


@pytest.mark.parametrize("seed", [7, 8, 9])
def test_random_upserts_match_a_copy_on_write_model(table, seed: int) -> None:  # type: ignore[no-untyped-def]
    """Any sequence of upserts, deletes and compactions reads like the model dict, at every version
    (a key of two columns, partitioned)."""
    _random_history(table, seed)


@pytest.mark.parametrize("seed", [7, 8, 9, 10])
def test_random_upserts_match_a_copy_on_write_model_one_key_column(catalog: Catalog, seed: int) -> None:
    """The same with a key of one column, unpartitioned: the largest file's rows are judged by a
    hash lookup of its keys (pk.merge_files), not an anti-join."""
    catalog.create_namespace("s")
    _random_history(catalog.create_table("s.pk1", SCHEMA, primary_key=["k"]), seed)


def _random_history(table, seed: int) -> None:  # type: ignore[no-untyped-def]
    one = table.primary_key == ["k"]
    rng = random.Random(seed)
    model: dict = {}
    models = {0: {}}
    for step in range(40):
        op = rng.random()
        if op < 0.6:
            n = rng.randint(1, 6)
            ks = [rng.randint(0, 15) for _ in range(n)]
            days = [rng.choice(["a", "b"]) for _ in range(n)]
            vs = [step * 100 + i for i in range(n)]
            r = table.upsert({"k": ks, "day": days, "v": vs})
            for k, d, v in zip(ks, days, vs):  # within a batch the last row of a key wins
                if one:
                    model[(k,)] = (d, v)
                else:
                    model[(k, d)] = v
            assert r.operation == "MERGE" and r.added_files >= 1
        elif op < 0.8:
            k = rng.randint(0, 15)
            table.delete([("k", "=", k)])
            model = {key: v for key, v in model.items() if key[0] != k}
        elif op < 0.9:
            table.update({"v": -1}, [("v", ">", step * 50)])
            if one:
                model = {key: ((d, -1) if v > step * 50 else (d, v)) for key, (d, v) in model.items()}
            else:
                model = {key: (-1 if v > step * 50 else v) for key, v in model.items()}
        else:
            table.compact(major=rng.random() < 0.5, min_files=2)
        models[table.version] = dict(model)
        assert view(table) == model
    for v, m in models.items():  # time travel: merged at every version
        assert view(table, version=v) == m
    table.compact(major=True)
    assert view(table) == model
    assert all(f.stats["_ls_deleted"].max in (False, None) for f in table.files())  # no tombstones left
    assert table.count() == len(model)


def test_compaction_keeps_the_view_and_no_data_version(table) -> None:  # type: ignore[no-untyped-def]
    for i in range(6):
        table.upsert({"k": [1, 2, i + 10], "day": ["a", "a", "a"], "v": [i, i, i]})
    table.delete([("k", "=", 2)])
    before, dv = view(table), table.data_version
    r = table.compact()
    assert r.removed_files == 7 and view(table) == before and table.data_version == dv
    r = table.compact(major=True)
    assert r.added_files == 1 and view(table) == before
    assert view(table) == {(1, "a"): 5, **{(i + 10, "a"): i for i in range(6)}}


def test_minor_compaction_merges_only_adjacent_small_files(table) -> None:  # type: ignore[no-untyped-def]
    """A big file between small ones must not be merged across: its rows would be reordered."""
    table.upsert({"k": [1], "day": ["a"], "v": [1]})
    table.upsert({"k": [1], "day": ["a"], "v": [2]})
    big = pa.table({"k": list(range(2, 20_000)) + [1], "day": ["a"] * 19_999, "v": [3] * 19_999})
    table.upsert(big)
    table.upsert({"k": [5], "day": ["a"], "v": [4]})
    table.upsert({"k": [6], "day": ["a"], "v": [5]})
    sizes = sorted(f.file_size for f in table.files())
    target = sizes[-1]  # the big file counts as full; the others are small
    r = table.compact(target_file_size=target, min_files=2)
    assert r.removed_files == 4  # two runs of two: before and after the big file
    v = view(table)
    assert v[(1, "a")] == 3 and v[(5, "a")] == 4 and v[(6, "a")] == 5


def test_pk_rules(catalog: Catalog) -> None:
    catalog.create_namespace("s")
    with pytest.raises(errors.InvalidSchemaError):
        catalog.create_table("s.bad", SCHEMA, primary_key=["k"], partition_by=["day"])
    plain = catalog.create_table("s.plain", SCHEMA)
    with pytest.raises(errors.NoPrimaryKeyError):
        plain.upsert({"k": [1], "day": ["a"], "v": [1]})
    t = catalog.create_table("s.ok", SCHEMA, primary_key=["k"])
    with pytest.raises(errors.InvalidArgumentError):
        t.update({"k": 5}, [("k", "=", 1)])
