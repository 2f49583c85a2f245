"""The read-only commands through the installed console script: tables, describe, barriers,
lineage, doctor; on SQLite and PostgreSQL, against the shop pipeline of conftest.py."""

from __future__ import annotations

import re

import pytest

from lakestep.barrier import BarrierState

from .conftest import ORPHAN, Shop, lakestep

MANAGED = ["shop.customers", "shop.orders", "shop.daily", "shop.vip", "shop.summary"]  # roots by name, then lineage
GRID = {  # table -> the letter of barriers 1..4 (conftest.py's docstring)
    "shop.orders": "SCPP", "shop.customers": "SCPP", "shop.daily": "SCP·", "shop.vip": "SC··", "shop.summary": "SC··",
}
LETTER = {"SNAPSHOT": "S", "COMMIT": "C", "PRECOMMIT": "P"}


def test_tables(shop: Shop) -> None:
    doc = lakestep("tables", "--json", catalog=shop.url).json()
    got = {t["table"]: (t["kind"], t["job"], t["version"], t["data_version"], t["files"], t["frontier"], t["behind"])
           for t in doc["tables"]}
    assert got == {
        "shop.customers": ("root", "crm", 1, 1, 1, 4, 0),
        "shop.daily": ("derived", "daily", 3, 3, 1, 3, 1),
        "shop.notes": ("unmanaged", None, 3, 3, 1, None, None),
        "shop.orders": ("root", "ingest", 3, 3, 3, 4, 0),
        "shop.summary": ("derived", "summary", 2, 2, 1, 2, 2),
        "shop.vip": ("derived", "vip", 2, 2, 1, 2, 2),
    }
    assert {t["table"]: t["stored_rows"] for t in doc["tables"]}["shop.orders"] == 4
    text = lakestep("tables", catalog=shop.url)
    assert text.code == 0, text.err
    row = next(line for line in text.lines() if "shop.vip" in line)
    assert re.search(r"shop\.vip\s+│?\s*derived\s+│?\s*vip\s+│?\s*2\s+│?\s*2\s+│?\s*1\b", row), row
    assert "6 table(s)" in text.out
    only = lakestep("tables", "--json", "--namespace", "nope", catalog=shop.url).json()
    assert only["tables"] == []


def test_describe(shop: Shop) -> None:
    doc = lakestep("describe", "shop.customers", "--json", catalog=shop.url).json()
    assert doc["table"] == "shop.customers" and doc["kind"] == "root" and doc["job"] == "crm"
    assert doc["readers"] == ["vip"] and doc["primary_key"] == ["id"] and doc["partition_by"] == []
    assert doc["schema"] == [{"name": "id", "type": "int64", "nullable": False, "id": 1, "stored_as": "id"},
                             {"name": "tier", "type": "string", "nullable": True, "id": 2, "stored_as": "tier"}]
    assert doc["properties"] == {"owner": "crm-team"}
    assert doc["snapshots"] == [{"name": "lakestep-barrier-1", "version": 1, "barrier": 1,
                                 "created_at": doc["snapshots"][0]["created_at"], "expires_at": None}]
    assert [(h["version"], h["operation"], h["barrier"], h["added_rows"]) for h in doc["history"]] == [
        (1, "MERGE", 1, 2), (0, "CREATE", None, 0)]
    daily = lakestep("describe", "shop.daily", "--history", "2", "--json", catalog=shop.url).json()
    assert [(h["version"], h["operation"], h["barrier"]) for h in daily["history"]] == [
        (3, "OVERWRITE", 3), (2, "OVERWRITE", 2)]
    assert (daily["frontier"], daily["behind"], daily["readers"]) == (3, 1, ["vip"])
    notes = lakestep("describe", "shop.notes", "--json", catalog=shop.url).json()
    assert [(s["name"], s["version"]) for s in notes["snapshots"]] == [("keep", 1)]
    assert notes["retention_seconds"] == 0 and notes["kind"] == "unmanaged"
    text = lakestep("describe", "shop.customers", catalog=shop.url)
    assert text.code == 0, text.err
    assert re.search(r"primary key\s+id", text.out)
    assert re.search(r"│ id\s+│ int64\s+│ no\s+│ primary key", text.out), text.out
    assert re.search(r"owner\s+│ crm-team", text.out)
    assert re.search(r"│\s+1 │ MERGE\s+│\s+1 │", text.out), text.out
    missing = lakestep("describe", "shop.nope", catalog=shop.url)
    assert missing.code == 1 and missing.out == ""
    assert missing.err == "error: table 'shop.nope' does not exist\n"


def test_barriers_grid(shop: Shop) -> None:
    doc = lakestep("barriers", "--json", catalog=shop.url).json()
    assert (doc["open_epoch"], doc["sealed"], doc["committed"], doc["barriers"]) == (5, 4, 2, [1, 2, 3, 4])
    assert doc["coordinator"]["holder"] == "coord-1" and doc["coordinator"]["alive"]
    tables = {t["table"]: t for t in doc["tables"]}
    assert list(tables) == MANAGED  # no unmanaged table
    for name, letters in GRID.items():
        top = "".join(next((LETTER[s] for s in ("SNAPSHOT", "COMMIT", "PRECOMMIT") if s in tables[name]["states"][str(b)]),
                           "·") for b in range(1, 5))
        assert top == letters, name
        for b in range(1, 5):  # the same answer as the library's per-cell question
            assert set(tables[name]["states"][str(b)]) == {s.value for s in shop.pipeline.states(name, b)}, (name, b)
    assert {n: (t["frontier"], t["behind"]) for n, t in tables.items()} == {
        "shop.orders": (4, 0), "shop.customers": (4, 0), "shop.daily": (3, 1), "shop.vip": (2, 2),
        "shop.summary": (2, 2)}
    seals = {s.barrier: s.sealed_at for s in shop.pipeline.seals()}
    assert tables["shop.daily"]["lag_seconds"] == pytest.approx(doc["now"] - seals[4])
    assert tables["shop.vip"]["lag_seconds"] == pytest.approx(doc["now"] - seals[3])
    assert tables["shop.orders"]["lag_seconds"] == 0
    assert {int(b): at for b, at in doc["sealed_at"].items()} == pytest.approx(seals)
    assert BarrierState.SNAPSHOT in shop.pipeline.states("shop.vip", 1)

    text = lakestep("barriers", catalog=shop.url)
    assert text.code == 0, text.err
    assert text.lines()[0].startswith("open epoch 5 · newest sealed 4 · committed 2 · oldest retained 1 · "
                                      "coordinator coord-1 (lease expires in")
    for name, letters in GRID.items():
        row = next(line for line in text.lines() if f" {name} " in line)
        assert re.findall(r"│\s+([SCP·])\s+(?=│)", row) == list(letters), row
    last = lakestep("barriers", "--last", "2", "--all", "--json", catalog=shop.url).json()
    assert last["barriers"] == [3, 4] and [t["table"] for t in last["tables"]][-1] == "shop.notes"


def test_barriers_colours_and_lagging_rows(shop: Shop) -> None:
    colour = lakestep("barriers", catalog=shop.url, env={"FORCE_COLOR": "1"})
    assert colour.code == 0, colour.err
    rows = {name: next(line for line in colour.lines() if name in line) for name in MANAGED}
    bold_red = "\x1b[1;31m"
    assert bold_red in rows["shop.vip"] and bold_red in rows["shop.daily"]  # lagging: highlighted
    assert bold_red not in rows["shop.orders"] and bold_red not in rows["shop.customers"]
    blue, green, yellow = "\x1b[1;37;44m", "\x1b[1;30;42m", "\x1b[30;43m"  # SNAPSHOT, COMMIT, PRECOMMIT cells
    assert all(c in rows["shop.orders"] for c in (blue, green, yellow))
    assert blue in rows["shop.vip"] and green in rows["shop.vip"] and yellow not in rows["shop.vip"]


def test_lineage(shop: Shop) -> None:
    doc = lakestep("lineage", "--json", catalog=shop.url).json()
    assert {j["job"]: (j["external_input"], j["sources"], j["sinks"]) for j in doc["jobs"]} == {
        "crm": (True, [], ["shop.customers"]), "daily": (False, ["shop.orders"], ["shop.daily"]),
        "ingest": (True, [], ["shop.orders"]), "summary": (False, ["shop.vip"], ["shop.summary"]),
        "vip": (False, ["shop.customers", "shop.daily"], ["shop.vip"])}  # sources in table-id order
    assert set(map(tuple, doc["edges"])) == set([
        (None, "crm", "shop.customers"), (None, "ingest", "shop.orders"), ("shop.orders", "daily", "shop.daily"),
        ("shop.daily", "vip", "shop.vip"), ("shop.customers", "vip", "shop.vip"),
        ("shop.vip", "summary", "shop.summary")]) and len(doc["edges"]) == 6
    assert doc["tables"] == {"shop.orders": "root", "shop.customers": "root", "shop.daily": "derived",
                             "shop.vip": "derived", "shop.summary": "derived"}
    text = lakestep("lineage", catalog=shop.url)
    assert text.code == 0, text.err
    tree = [(len(line) - len(line.lstrip(" │├└─")), line.strip(" │├└─")) for line in text.lines()[1:]]
    assert [(d, s.split("  ")[0]) for d, s in tree] == [
        (4, "job crm"), (8, "shop.customers"), (12, "job vip"), (16, "shop.vip"), (20, "job summary"),
        (24, "shop.summary"),
        (4, "job ingest"), (8, "shop.orders"), (12, "job daily"), (16, "shop.daily"), (20, "job vip")]
    lines = dict((s.split("  ")[0] + str(d), s) for d, s in tree)
    assert lines["job vip20"].endswith("(see above)")  # a join hangs under both sources, expanded once
    assert "frontier 2  2 behind" in lines["shop.vip16"] and "frontier 4" in lines["shop.orders8"]


def findings(doc: dict) -> set[tuple[str, str, str]]:  # type: ignore[type-arg]
    return {(f["severity"], f["check"], f["subject"]) for f in doc["findings"]}


def test_doctor(shop: Shop) -> None:
    calm = lakestep("doctor", "--stuck-after", "100000", "--json", catalog=shop.url)
    assert calm.code == 0, calm.err  # warnings only
    doc = calm.json()
    assert doc["healthy"] and doc["worst"] == "warning"
    assert findings(doc) == {
        ("ok", "coordinator", "coordinator"), ("ok", "job", "ingest"), ("ok", "job", "crm"),
        ("warning", "job", "daily"), ("warning", "job", "vip"), ("warning", "job", "summary"),
        ("warning", "orphans", "shop.orders"), ("info", "reclaimable", "shop.notes"), ("warning", "pins", "shop.notes"),
    }
    by = {(f["check"], f["subject"]): f for f in doc["findings"]}
    assert by[("job", "daily")]["facts"] | {"lag_seconds": 0, "last_commit_at": 0} == {
        "kind": "derived", "frontier": 3, "behind": 1, "lag_seconds": 0, "ready": 1, "last_commit_at": 0,
        "sinks": ["shop.daily"], "stuck": False}
    assert by[("job", "vip")]["facts"]["ready"] == 1 and by[("job", "vip")]["facts"]["behind"] == 2
    assert by[("job", "summary")]["facts"]["waiting_for"] == "shop.vip"
    assert "waiting for its source shop.vip (frontier 2, job 'vip')" in by[("job", "summary")]["message"]
    assert by[("orphans", "shop.orders")]["facts"] == {"files": [ORPHAN], "bytes": shop.orphan.stat().st_size}
    assert by[("pins", "shop.notes")]["facts"]["name"] == "keep" and by[("pins", "shop.notes")]["facts"]["files"] == 1
    assert by[("reclaimable", "shop.notes")]["facts"]["files"] == 1

    stuck = lakestep("doctor", "--stuck-after", "0", "--json", catalog=shop.url)
    assert stuck.code == 3
    doc = stuck.json()
    assert not doc["healthy"] and doc["worst"] == "error"
    assert {(s, c, x) for s, c, x in findings(doc) if s == "error"} == {
        ("error", "job", "daily"), ("error", "job", "vip")}  # summary only waits for vip: not stuck
    assert ("warning", "job", "summary") in findings(doc)

    text = lakestep("doctor", "--stuck-after", "0", "--no-storage", catalog=shop.url)
    assert text.code == 3
    assert re.search(r"ERROR\s+│ job\s+│ daily\s+│ stuck: input for 1 barrier\(s\) is ready", text.out), text.out
    assert text.lines()[-1] == "PROBLEMS FOUND: 2 error(s), 1 warning(s)"  # summary waits: a warning
    assert "orphan" not in text.out  # --no-storage

    shop.coordinator.release()  # the coordinator is gone
    gone = lakestep("doctor", "--no-storage", "--stuck-after", "100000", "--json", catalog=shop.url)
    assert gone.code == 3
    coord = next(f for f in gone.json()["findings"] if f["check"] == "coordinator")
    assert coord["severity"] == "error" and coord["message"].startswith("no coordinator holds the lease")
    assert "epoch 5 has been open for" in coord["message"]
    quiet = lakestep("doctor", "--no-storage", "--stuck-after", "100000", "-q", "--json", catalog=shop.url).json()
    assert {f["severity"] for f in quiet["findings"]} == {"error", "warning"}
