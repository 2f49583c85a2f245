"""Table properties are validated at create and at change; stored bad values never crash anyone (issue 9, item 3)."""

from __future__ import annotations

import datetime as dt
import json
import logging
import os

import pyarrow as pa
import pytest
import sqlalchemy as sa

from lakestep import Catalog, errors
from lakestep.catalog import schema as S
from lakestep.catalog.properties import DEFAULT_RETENTION_SECONDS, KNOWN
from lakestep.catalog.ttl import apply_ttl
from lakestep.services import MaintenanceLoop

from ..waiting import wait_until

SCHEMA = pa.schema([("id", pa.int64()), ("at", pa.timestamp("us", tz="UTC")), ("name", pa.string())])

BAD = [
    ({"lakestep.retention-seconds": "-5"}, "lakestep.retention-seconds"),
    ({"lakestep.retention-seconds": "abc"}, "lakestep.retention-seconds"),
    ({"lakestep.retention-seconds": "nan"}, "lakestep.retention-seconds"),
    ({"lakestep.retention-seconds": "inf"}, "lakestep.retention-seconds"),
    ({"lakestep.retention-seconds": ""}, "lakestep.retention-seconds"),
    ({"lakestep.retention-seconds": None}, "lakestep.retention-seconds"),
    ({"lakestep.isolation": "serialisable"}, "lakestep.isolation"),
    ({"lakestep.ttl.column": "at", "lakestep.ttl.seconds": "0"}, "lakestep.ttl.seconds"),
    ({"lakestep.ttl.column": "at", "lakestep.ttl.seconds": "-1"}, "lakestep.ttl.seconds"),
    ({"lakestep.ttl.column": "at", "lakestep.ttl.seconds": "a day"}, "lakestep.ttl.seconds"),
    ({"lakestep.ttl.column": "nope", "lakestep.ttl.seconds": "60"}, "lakestep.ttl.column"),
    ({"lakestep.ttl.column": "name", "lakestep.ttl.seconds": "60"}, "lakestep.ttl.column"),
    ({"lakestep.ttl.column": "at"}, "lakestep.ttl.seconds"),
    ({"lakestep.ttl.seconds": "60"}, "lakestep.ttl.column"),
    ({"lakestep.retention": "60"}, "lakestep.retention"),  # a typo of a known key
    ({"lakestep.compression": "zstd"}, "lakestep.compression"),
]


@pytest.fixture
def ns(catalog: Catalog) -> Catalog:
    catalog.create_namespace("s")
    return catalog


@pytest.mark.parametrize("props,key", BAD, ids=[f"{k}={list(p.values())[-1]!r}" for p, k in BAD])
def test_bad_properties_are_refused_at_create(ns: Catalog, props: dict, key: str) -> None:
    with pytest.raises(errors.InvalidPropertyError) as ei:
        ns.create_table("s.t", SCHEMA, properties=props)
    assert ei.value.key == key
    assert set(ei.value.known) == set(KNOWN)
    assert ns.list_tables() == []
    assert not os.path.exists(os.path.join(ns.warehouse, "s"))  # no directory either


def test_unknown_lakestep_key_names_the_known_ones(ns: Catalog) -> None:
    with pytest.raises(errors.InvalidPropertyError) as ei:
        ns.create_table("s.t", SCHEMA, properties={"lakestep.retention-secs": "60"})
    assert all(k in str(ei.value) for k in KNOWN)


def test_good_properties_and_user_keys_are_stored(ns: Catalog) -> None:
    props = {"lakestep.retention-seconds": "0", "lakestep.isolation": "serializable",
             "lakestep.ttl.column": "at", "lakestep.ttl.seconds": "86400", "owner": "ops", "team.x": "anything"}
    t = ns.create_table("s.t", SCHEMA, properties=props)
    assert ns.load_table("s.t").properties == props and t.retention_seconds == 0.0


@pytest.mark.parametrize("props,key", BAD, ids=[f"{k}={list(p.values())[-1]!r}" for p, k in BAD])
def test_bad_properties_are_refused_at_change(ns: Catalog, props: dict, key: str) -> None:
    t = ns.create_table("s.t", SCHEMA, properties={"lakestep.retention-seconds": "60", "owner": "ops"})
    with pytest.raises(errors.InvalidPropertyError):
        t.set_properties(props)
    assert t.properties == ns.load_table("s.t").properties == {"lakestep.retention-seconds": "60", "owner": "ops"}


def test_set_properties(ns: Catalog) -> None:
    t = ns.create_table("s.t", SCHEMA, properties={"lakestep.retention-seconds": "60", "owner": "ops"})
    t.set_properties({"lakestep.ttl.column": "at", "lakestep.ttl.seconds": "3600"}, remove=["owner"])
    assert ns.load_table("s.t").properties == {
        "lakestep.retention-seconds": "60", "lakestep.ttl.column": "at", "lakestep.ttl.seconds": "3600"}
    with pytest.raises(errors.InvalidPropertyError):  # half a TTL
        t.set_properties(remove=["lakestep.ttl.seconds"])
    t.set_properties(remove=["lakestep.ttl.seconds", "lakestep.ttl.column"])
    assert t.properties == {"lakestep.retention-seconds": "60"}


def stored_properties(catalog: Catalog, ident: str, props: dict) -> None:
    """Store properties as a lakestep without validation would have (a table from an older version)."""
    ns, name = ident.split(".")
    with catalog.backend.write() as conn:
        conn.execute(sa.update(S.tables).where(S.tables.c.namespace == ns, S.tables.c.name == name)
                     .values(properties=json.dumps(props)))


OLD = dt.datetime(2000, 1, 1, tzinfo=dt.timezone.utc)


def test_a_stored_bad_property_falls_back_and_is_logged(ns: Catalog, caplog) -> None:  # type: ignore[no-untyped-def]
    t = ns.create_table("s.t", SCHEMA)
    t.append({"id": [1, 2], "at": [OLD, OLD], "name": ["a", "b"]})
    stored_properties(ns, "s.t", {"lakestep.retention-seconds": "abc", "lakestep.isolation": "bogus",
                                  "lakestep.ttl.column": "at", "lakestep.ttl.seconds": "-1"})
    t = ns.load_table("s.t")
    with caplog.at_level(logging.WARNING, logger="lakestep.catalog.properties"):
        assert t.retention_seconds == DEFAULT_RETENTION_SECONDS  # keeps files longer
        assert apply_ttl(t) is None  # removes no rows
        t.delete([("id", "=", 1)])  # isolation falls back to serializable: it still runs
        t.compact()
        assert t.cleanup().deleted_files == []  # the 7-day default: nothing is old enough
    assert t.to_arrow().column("id").to_pylist() == [2]
    logged = caplog.text
    assert "lakestep.retention-seconds" in logged and "lakestep.ttl" in logged and "lakestep.isolation" in logged
    t.set_properties({"lakestep.retention-seconds": "60"}, remove=["lakestep.isolation", "lakestep.ttl.column",
                                                                    "lakestep.ttl.seconds"])
    assert t.retention_seconds == 60.0


def test_maintenance_survives_a_bad_table(ns: Catalog) -> None:
    """Before the fix, one table's "abc" retention crashed the maintenance round for every table."""
    names = ["s.a", "s.bad", "s.z"]
    for ident in names:
        t = ns.create_table(ident, SCHEMA)
        for i in range(3):
            t.append({"id": [i], "at": [OLD], "name": ["x"]})
    stored_properties(ns, "s.bad", {"lakestep.retention-seconds": "abc"})
    report = MaintenanceLoop(ns, min_files=2).run_once()
    assert set(report.tables) == set(names)
    for ident in names:
        assert "error" not in report.tables[ident], report.tables[ident]
        assert report.tables[ident]["compacted_files"] == 3
        assert len(ns.load_table(ident).files()) == 1


def test_a_stopped_maintenance_loop_starts_again(ns: Catalog) -> None:
    """stop() then start(): the loop runs rounds again (it once exited at once: its stop stayed set)."""
    ns.create_table("s.a", SCHEMA)
    loop = MaintenanceLoop(ns, interval=0.01)
    loop.start()
    wait_until(lambda: loop.rounds >= 1, what="a first round")
    loop.stop()
    done = loop.rounds
    thread = loop.start()
    wait_until(lambda: loop.rounds > done, what="a round after the restart", failed=lambda: (
        None if thread.is_alive() else "the restarted loop's thread ended"))
    loop.stop()
    assert not thread.is_alive()


def test_maintenance_logs_and_skips_a_failing_table(ns: Catalog, caplog) -> None:  # type: ignore[no-untyped-def]
    """A table whose data file is gone fails its round; the tables after it still run."""
    for ident in ("s.a", "s.broken", "s.z"):
        t = ns.create_table(ident, SCHEMA)
        for i in range(3):
            t.append({"id": [i], "at": [OLD], "name": ["x"]})
    broken = ns.load_table("s.broken")
    os.remove(broken.writer.full_path(broken.files()[0].path))
    with caplog.at_level(logging.WARNING, logger="lakestep.services.maintenance"):
        report = MaintenanceLoop(ns, min_files=2).run_once()
    assert report.tables["s.broken"]["error"].startswith("DataFileCorruptError")
    assert report.tables["s.a"]["compacted_files"] == report.tables["s.z"]["compacted_files"] == 3
    assert "s.broken" in caplog.text
