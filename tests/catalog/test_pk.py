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


@pytest.mark.parametrize("merge", ["runs", "unsorted", "unsorted-large", "hash"])
@pytest.mark.parametrize("seed", [7, 8, 9, 10])
def test_random_upserts_match_a_copy_on_write_model_one_key_column(catalog: Catalog, seed: int, merge: str,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """The same with a key of one column, unpartitioned, merged each way pk.merge_files has:
    as sorted runs (an integer key); with compaction writing its files out of key order (as
    before it sorted them), sorted on read, or, when large (here: any), by hash; and by hash
    with the sorted runs off (a key type they do not take): the largest file's rows judged by
    a hash lookup of its keys, not an anti-join."""
    from lakestep.catalog import pk

    if merge.startswith("unsorted"):
        monkeypatch.setattr(pk, "in_key_order", lambda t, keys: t.take(list(range(t.num_rows))[::-1]))
    if merge == "unsorted-large":
        monkeypatch.setattr(pk, "_SORT_ROWS", 1)
    if merge == "hash":
        monkeypatch.setattr(pk, "_searchable", lambda t: False)
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


TRIGGER = "lakestep.pk.compaction-trigger"


def _keys_in_order(t, f) -> bool:  # type: ignore[no-untyped-def]
    ks = t.read_physical([f]).column("k").to_pylist()
    return all(a < b for a, b in zip(ks, ks[1:]))


@pytest.mark.parametrize("trigger", [3, 0])
def test_compaction_on_write_keeps_few_files_in_key_order(catalog: Catalog, trigger: int) -> None:
    """With ``lakestep.pk.compaction-trigger`` n, every n-th write merges the newest files of similar
    size (writes._newest_runs): after 30 upserts and deletes of random keys the table holds a few
    files (a binary counter: at most log2(30 / n) + 1 merged, fewer than n new, the first
    upsert's), each in key order; every version reads as the model; the merges are COMPACT
    commits that change no data version. With 0 nothing is merged."""
    catalog.create_namespace("s")
    t = catalog.create_table("s.w", SCHEMA, primary_key=["k"], properties={TRIGGER: str(trigger)})
    rng = random.Random(trigger)
    model: dict = {}
    models = {}
    for step in range(30):
        if step % 10 == 9:
            k = rng.randint(0, 300)
            t.delete([("k", "<", k)])
            model = {key: v for key, v in model.items() if key[0] >= k}
        else:
            ks = [rng.randint(0, 300) for _ in range(20)]
            t.upsert({"k": ks, "day": ["a"] * 20, "v": [step * 100 + i for i in range(20)]})
            model.update({(k,): ("a", step * 100 + i) for i, k in enumerate(ks)})
        models[t.version] = dict(model)
        assert view(t) == model
    history = t.history()
    merges = [c for c in history if c.operation == "COMPACT"]
    files = t.files()
    if trigger:
        assert len(merges) >= 30 // trigger - 2, [c.summary for c in merges]
        assert all(c.summary["runs"] == trigger and c.removed_files >= trigger for c in merges)
        assert len(files) <= 1 + 3 + (trigger - 1), sorted((f.seq, f.record_count) for f in files)
    else:
        assert not merges and len(files) == 30
    assert all(_keys_in_order(t, f) for f in files)
    by_version = {c.version: c for c in history}
    for c in merges:  # no new data version: incremental readers never see the rows again
        assert c.data_version == by_version[c.version - 1].data_version
        assert view(t, version=c.version) == view(t, version=c.version - 1)
    for v, m in models.items():
        assert view(t, version=v) == m


def test_compaction_on_write_counts_writes_per_catalog(catalog: Catalog) -> None:
    """The count is the catalog object's, not a handle's: a job that loads the table for each
    write still merges every n-th write."""
    catalog.create_namespace("s")
    catalog.create_table("s.w", SCHEMA, primary_key=["k"], properties={TRIGGER: "4"})
    for i in range(8):
        catalog.load_table("s.w").upsert({"k": [i], "day": ["a"], "v": [i]})
    t = catalog.load_table("s.w")
    assert [c.operation for c in t.history()].count("COMPACT") == 2
    assert len(t.files()) == 1 and t.count() == 8  # the second merge took the first one's file


@pytest.mark.parametrize("value", ["1", "-2", "x", "2.5"])
def test_compaction_trigger_must_be_off_or_two_or_more(catalog: Catalog, value: str) -> None:
    catalog.create_namespace("s")
    with pytest.raises(errors.InvalidPropertyError, match=TRIGGER):
        catalog.create_table("s.w", SCHEMA, primary_key=["k"], properties={TRIGGER: value})


def test_a_failed_compaction_on_write_leaves_the_write_committed(catalog: Catalog, caplog) -> None:  # type: ignore[no-untyped-def]
    """The merge runs after the write's commit: when it fails (here a file it must read is gone)
    the write stands, the failure is logged, and the next writes go on."""
    catalog.create_namespace("s")
    t = catalog.create_table("s.w", SCHEMA, primary_key=["k"], properties={TRIGGER: "3"})
    t.upsert({"k": [1], "day": ["a"], "v": [1]})
    t.upsert({"k": [2], "day": ["a"], "v": [2]})
    first = min(t.files(), key=lambda f: f.seq)
    t.writer.delete(first.path)
    with caplog.at_level("WARNING", logger="lakestep.catalog.table"):
        r = t.upsert({"k": [3], "day": ["a"], "v": [3]})
    assert r.operation == "MERGE" and t.history()[0].version == r.version  # committed, no merge after it
    assert "compaction on write of s.w failed" in caplog.text
    assert len(t.files()) == 3
    with pytest.raises(errors.LakestepError):
        t.to_arrow()  # the file is gone for readers too: nothing hid that
