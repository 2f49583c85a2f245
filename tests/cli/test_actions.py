"""The commands that change things, the services, and what every command shares (errors,
--catalog, --json, --help, masking); on SQLite and PostgreSQL. The commands run in this process
(conftest.lakestep); the installed console script and the ``python -m`` aliases are each started
as a real process by one test here."""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pytest

from lakestep.barrier import Pipeline

from ..conftest import CatalogSpec
from ..test_secrets import SECRET, pg_url_with_password
from .conftest import ORPHAN, ROOT, SCRIPT, Shop, lakestep, lakestep_process

COMMANDS = ["tables", "describe", "barriers", "lineage", "compact", "cleanup", "rollback", "coordinator",
            "maintenance", "publish", "serve", "doctor", "report", "alter"]


def test_compact(shop: Shop) -> None:
    doc = lakestep("compact", "shop.orders", "--json", catalog=shop.url).json()
    assert doc == {"tables": [{"table": "shop.orders", "outcome": "compacted", "version": 4, "removed_files": 3,
                               "added_files": 1}]}
    orders = shop.catalog.load_table("shop.orders")
    assert orders.history(limit=1)[0].operation == "COMPACT" and len(orders.files()) == 1
    assert sorted(orders.to_arrow().column("k").to_pylist()) == [1, 2, 3, 4]
    again = lakestep("compact", "--all", "--json", catalog=shop.url).json()
    assert {t["table"]: t["outcome"] for t in again["tables"]} == {
        t: "noop" for t in ("shop.customers", "shop.daily", "shop.notes", "shop.orders", "shop.summary", "shop.vip")}
    text = lakestep("compact", "shop.orders", catalog=shop.url)
    assert text.code == 0 and re.search(r"shop\.orders\s+│ noop\s+│ 4 ", text.out), text.out
    usage = lakestep("compact", catalog=shop.url)
    assert usage.code == 2 and "name the tables to compact, or pass --all" in usage.err
    assert lakestep("compact", "shop.nope", catalog=shop.url).err == "error: table 'shop.nope' does not exist\n"


def test_cleanup(shop: Shop) -> None:
    notes = shop.catalog.load_table("shop.notes")
    v2_file = [f.path for f in notes.files(version=2)]
    dry = lakestep("cleanup", "--dry-run", "--json", catalog=shop.url).json()
    by = {t["table"]: t for t in dry["tables"]}
    assert dry["dry_run"] and set(by) == {"shop.customers", "shop.daily", "shop.notes", "shop.orders",
                                          "shop.summary", "shop.vip"}
    assert by["shop.orders"]["orphan_files"] == [ORPHAN] and by["shop.orders"]["expired_files"] == []
    assert by["shop.notes"]["expired_files"] == v2_file and by["shop.notes"]["pinned_versions"] == [1]
    assert by["shop.notes"]["floor_version"] == 3 and by["shop.notes"]["orphan_files"] == []
    assert dry["total_bytes"] == shop.orphan.stat().st_size + by["shop.notes"]["expired_bytes"]
    assert all(not t["expired_files"] and not t["orphan_files"] for n, t in by.items()
               if n not in ("shop.orders", "shop.notes"))
    assert shop.orphan.exists()  # a dry run deletes nothing

    refused = lakestep("cleanup", catalog=shop.url)
    assert refused.code == 2 and "pass --dry-run to see what would go, or --yes to delete" in refused.err
    short = lakestep("cleanup", "shop.orders", "--yes", "--retention", "0", catalog=shop.url)
    assert short.code == 2 and "shorter than the retention of shop.orders" in short.err

    done = lakestep("cleanup", "shop.orders", "shop.notes", "--yes", "--json", catalog=shop.url).json()
    by = {t["table"]: t for t in done["tables"]}
    assert not done["dry_run"] and by["shop.orders"]["orphan_files"] == [ORPHAN]
    assert by["shop.notes"]["expired_files"] == v2_file
    assert (by["shop.notes"]["pruned_file_rows"], by["shop.notes"]["pruned_commit_rows"]) == (1, 2)
    assert not shop.orphan.exists()
    assert [h.version for h in notes.history()] == [3, 1]  # versions 0 and 2 pruned, 1 pinned by "keep"
    assert notes.to_arrow(snapshot="keep").column("id").to_pylist() == [1]
    after = lakestep("cleanup", "--dry-run", "--json", catalog=shop.url).json()
    assert after["total_bytes"] == 0
    text = lakestep("cleanup", "--dry-run", catalog=shop.url)
    assert text.code == 0 and text.lines()[0].strip() == "cleanup (dry run): would delete 0 B"


def test_rollback(shop: Shop) -> None:
    dry = lakestep("rollback", "--to-barrier", "1", "--dry-run", "--json", catalog=shop.url).json()
    plan = {t["table"]: (t["from_version"], t["to_version"]) for t in dry["tables"]}
    assert plan == {"shop.orders": (3, 1), "shop.daily": (3, 1), "shop.vip": (2, 1), "shop.summary": (2, 1)}
    assert shop.catalog.load_table("shop.orders").version == 3  # a dry run changes nothing
    refused = lakestep("rollback", "--to-barrier", "1", catalog=shop.url)
    assert refused.code == 2 and "--dry-run to preview it, or --yes to do it" in refused.err
    below = lakestep("rollback", "--to-barrier", "0", "--yes", catalog=shop.url)
    assert below.code == 1 and below.out == ""
    assert re.fullmatch(r"error: cannot roll back to barrier 0: table 'shop\.\w+' has a snapshot of barrier 1, "
                        r"and snapshots are never rolled back\n", below.err), below.err

    done = lakestep("rollback", "--to-barrier", "1", "--yes", "--json", catalog=shop.url).json()
    got = {t["table"]: (t["from_version"], t["to_version"], t["restore_version"]) for t in done["tables"]}
    assert got == {"shop.orders": (3, 1, 4), "shop.daily": (3, 1, 4), "shop.vip": (2, 1, 3),
                   "shop.summary": (2, 1, 3)}
    assert done["to_barrier"] == 1 and done["open_epoch"] == 5 and done["rollback_id"] == 1
    grid = lakestep("barriers", "--json", catalog=shop.url).json()
    assert {t["table"]: t["frontier"] for t in grid["tables"]} == {
        "shop.orders": 4, "shop.customers": 4, "shop.daily": 1, "shop.vip": 1, "shop.summary": 1}
    assert grid["committed"] == 1
    assert sorted(shop.catalog.load_table("shop.orders").to_arrow().column("k").to_pylist()) == [1, 2]


def test_coordinator(shop: Shop) -> None:
    standby = lakestep("coordinator", "--duration", "0.3", "--interval", "0.01", "--holder", "standby", "--json",
                       catalog=shop.url)
    assert standby.code == 0, standby.err
    assert standby.json() == {"holder": "standby", "seals": []}  # coord-1 holds the lease for an hour
    shop.coordinator.release()
    run = lakestep("coordinator", "--max-seals", "2", "--interval", "0.01", "--holder", "cli-coord", "--json",
                   catalog=shop.url)
    assert run.code == 0, run.err
    doc = run.json()
    assert doc["holder"] == "cli-coord" and [s["barrier"] for s in doc["seals"]] == [5, 6]
    assert "coordinator cli-coord on" in run.err  # the log line on stderr
    p = Pipeline(shop.catalog)
    assert p.open_epoch() == 7 and [s.holder for s in p.seals()][-2:] == ["cli-coord", "cli-coord"]
    grid = lakestep("barriers", "--json", catalog=shop.url).json()
    assert grid["coordinator"]["holder"] is None  # released on exit
    states = {t["table"]: t["states"]["2"] for t in grid["tables"]}
    assert all("SNAPSHOT" in s for s in states.values())  # its ticks snapshotted the committed barrier 2
    text = lakestep("coordinator", "--max-seals", "1", "--interval", "0.01", "--holder", "again", catalog=shop.url)
    assert text.code == 0 and text.out == "coordinator again sealed 1 epoch(s): barriers 7..7\n"
    alias = subprocess.run([sys.executable, "-m", "lakestep", "coordinator", "--url", shop.url, "--max-seals",
                            "1", "--interval", "0.01", "--holder", "alias"], capture_output=True, text=True,
                           timeout=120, env={**os.environ, "PYTHONPATH": str(ROOT)}, cwd=str(ROOT))
    assert alias.returncode == 0, alias.stderr
    assert [(s.barrier, s.holder) for s in p.seals()][-1] == (8, "alias")


def test_maintenance(shop: Shop) -> None:
    doc = lakestep("maintenance", "--table", "shop.orders", "--rounds", "1", "--min-files", "2", "--json",
                   catalog=shop.url).json()
    assert doc["rounds"][0]["round"] == 1
    assert doc["rounds"][0]["tables"] == {"shop.orders": {
        "compaction": 4, "compacted_files": 3, "deleted_files": 1, "deleted_bytes": len(b"PAR1 not really parquet PAR1")}}
    assert not shop.orphan.exists()  # the old orphan went with the round's cleanup
    text = lakestep("maintenance", "--table", "shop.orders", "--rounds", "1", "--min-files", "2", catalog=shop.url)
    assert text.code == 0 and re.search(r"shop\.orders\s+│ noop\s+│ 0\s+│ 0\s+│ 0", text.out), text.out
    bad = lakestep("maintenance", "--table", "shop.nope", "--rounds", "1", catalog=shop.url)
    assert bad.code == 1 and bad.err == "error: table 'shop.nope' does not exist\n"
    customers = shop.catalog.load_table("shop.customers")
    for i in (3, 4, 5):  # 4 files: the alias's default --min-files
        customers.upsert({"id": [i], "tier": ["free"]})
    alias = subprocess.run([sys.executable, "-m", "lakestep", "maintenance", "--url", shop.url, "--table",
                            "shop.customers", "--rounds", "1"], capture_output=True, text=True, timeout=120,
                           env={**os.environ, "PYTHONPATH": str(ROOT)}, cwd=str(ROOT))
    assert alias.returncode == 0, alias.stderr
    assert customers.history(limit=1)[0].operation == "COMPACT" and len(customers.files()) == 1


def test_publish_doctor_and_describe(shop: Shop) -> None:
    """``lakestep publish``: one round tags the committed barrier and moves main; the doctor then
    reports the publishing lag, describe the Iceberg metadata; ``--enable`` makes the
    maintenance loop publish."""
    from lakestep.iceberg import sql_catalog

    assert not [f for f in lakestep("doctor", "--no-storage", "--json", catalog=shop.url).json()["findings"]
                if f["check"] == "publishing"]  # nothing published, publishing off: nothing to say
    doc = lakestep("publish", "--once", "--json", catalog=shop.url).json()
    (r,) = doc["rounds"]
    assert r["leader"] and r["complete"] == 2 and r["barriers"] == [1, 2]
    assert r["tables"]["shop.daily"]["tags"] == [1, 2] and not r["tables"]["shop.daily"]["error"]
    ice = sql_catalog(shop.catalog).load_table("shop.daily")
    assert ice.metadata.current_snapshot_id == ice.snapshot_by_name("barrier-2").snapshot_id
    pub = [f for f in lakestep("doctor", "--no-storage", "--json", catalog=shop.url).json()["findings"]
           if f["check"] == "publishing"]
    assert [(f["severity"], f["facts"]["complete"], f["facts"]["lag"]) for f in pub] == [("ok", 2, 0)]
    desc = lakestep("describe", "shop.daily", "--json", catalog=shop.url).json()
    assert desc["iceberg"]["metadata_location"] == ice.metadata_location and desc["iceberg"]["main_version"] is not None
    text = lakestep("describe", "shop.daily", catalog=shop.url)
    assert "iceberg" in text.out and "metadata.json" in text.out
    assert lakestep("publish", "--disable", "--json", catalog=shop.url).json() == {"enabled": False}
    assert lakestep("publish", "--enable", catalog=shop.url).out.startswith("publishing to Iceberg is on for ")
    m = lakestep("maintenance", "--rounds", "1", "--json", catalog=shop.url).json()
    assert m["rounds"][0]["publish"] == {"leader": True, "barriers": 0, "complete": 2, "errors": {}}
    again = lakestep("publish", "--once", "--json", catalog=shop.url).json()["rounds"][0]
    assert again["leader"] and again["barriers"] == []  # nothing new since


# ----------------------------------------------------------- what every command shares
def test_every_command_has_help_with_an_example() -> None:
    top = lakestep("--help")
    assert top.code == 0 and all(c in top.out for c in COMMANDS)
    for c in COMMANDS:
        h = lakestep(c, "--help")
        assert h.code == 0, (c, h.err)
        assert "Example:" in h.out and f"lakestep {c}" in h.out and "--catalog URL" in h.out and "--json" in h.out, c


def test_catalog_from_env_or_warehouse_and_errors(catalog_spec: CatalogSpec, tmp_path: Path) -> None:
    missing = lakestep("tables")
    assert missing.code == 2 and "Missing option '--catalog'" in missing.err
    nowhere = lakestep("tables", catalog=str(tmp_path / "nowhere"))
    assert nowhere.code == 1 and nowhere.err.startswith("error: no lakestep catalog at sqlite:///")
    assert not (tmp_path / "nowhere").exists()  # nothing was created
    bad = lakestep("tables", catalog="nope://x")
    assert bad.code == 1
    assert bad.err == "error: unsupported catalog database 'nope': lakestep supports sqlite and postgresql\n"
    cat = catalog_spec.open()
    cat.create_namespace("n")
    cat.create_table("n.t", pa.schema([("x", pa.int64())]))
    cat.close()
    env = lakestep("tables", "--json", env={"LAKESTEP_CATALOG": catalog_spec.url})
    assert [t["table"] for t in env.json()["tables"]] == ["n.t"]
    if catalog_spec.backend == "sqlite":  # the warehouse directory stands for its catalog.db
        wh = lakestep("tables", "--json", catalog=catalog_spec.warehouse)
        assert [t["table"] for t in wh.json()["tables"]] == ["n.t"]


def test_passwords_are_masked_everywhere(pg_spec: CatalogSpec, tmp_path: Path) -> None:
    cat = pg_spec.open()
    cat.create_namespace("n")
    cat.close()
    url = pg_url_with_password(pg_spec.url)  # the test server trusts local connections: any password works
    for args in (("tables",), ("tables", "--json"), ("barriers",), ("lineage",), ("doctor",),
                 ("report", "--html", str(tmp_path / "r.html"))):
        r = lakestep(*args, catalog=url)
        assert r.code == 0, (args, r.err)
        assert SECRET not in r.out + r.err, args
    shown = lakestep("tables", "--json", catalog=url).json()["catalog"]
    assert re.match(r"postgresql(\+psycopg2)?://postgres:\*\*\*@127\.0\.0\.1", shown), shown
    page = (tmp_path / "r.html").read_text()
    assert SECRET not in page and ":***@" in page
    for u in (pg_url_with_password(pg_spec.url).replace(":5432", ":1"),
              pg_url_with_password(pg_spec.url, "no_such_db_ls")):
        r = lakestep("doctor", catalog=u)
        assert r.code == 1 and SECRET not in r.out + r.err and "Traceback" not in r.err
        assert r.err.startswith("error: ") and len(r.err.splitlines()) == 1, r.err


def test_json_is_one_document_for_every_command(shop: Shop, tmp_path: Path) -> None:
    for args in (("tables",), ("describe", "shop.orders"), ("barriers",), ("lineage",), ("doctor",),
                 ("compact", "--all"), ("cleanup", "--dry-run"), ("rollback", "--to-barrier", "2", "--dry-run"),
                 ("maintenance", "--rounds", "1", "--interval", "0"),
                 ("report", "--html", str(tmp_path / "r.html"))):
        r = lakestep(*args, "--json", catalog=shop.url)
        assert r.code in (0, 3), (args, r.err)
        json.loads(r.out)  # parses as one document, and nothing else is on stdout


def test_progress_bar_on_a_terminal(shop: Shop) -> None:
    r = lakestep("doctor", "--stuck-after", "100000", catalog=shop.url, env={"TTY_COMPATIBLE": "1"})
    assert r.code == 0, r.err
    assert "checking storage of shop." in r.err  # the bar's label (transient: erased when done)
    quiet = lakestep("doctor", "--stuck-after", "100000", catalog=shop.url)
    assert "checking storage" not in quiet.err  # not on a pipe


def test_missing_cli_extra_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "rich", None)  # `import rich` now raises ImportError(name="rich")
    from lakestep.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(["tables"])
    assert code == 1 and out.getvalue() == "" and "Traceback" not in err.getvalue()
    assert err.getvalue() == ("lakestep: the command line needs the 'cli' extra (rich is missing): "
                              "pip install 'lakestep[cli]'\n")


def test_console_script_is_a_real_process(tmp_path: Path) -> None:
    """The installed ``lakestep`` script, started as a user starts it: its exit status is main's
    return value, its error is one line on stderr, and its output goes to the process's stdout
    (the other tests run the same main in this process)."""
    assert SCRIPT.exists()
    version = lakestep_process("--version")
    assert version.code == 0 and version.out.startswith("lakestep, version "), version
    missing = lakestep_process("tables", catalog=str(tmp_path / "nowhere"))
    assert missing.code == 1 and missing.out == ""
    assert missing.err.startswith("error: no lakestep catalog at sqlite:///") and len(missing.err.splitlines()) == 1


def test_readme_commands_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The README's operator section: its commands run as written (in a fresh directory); the
    ``python`` ones as processes (the ``python -m examples.operator`` main is started here), the
    ``lakestep`` ones through the same main in this process (the script: see above)."""
    text = (ROOT / "README.md").read_text()
    section = text.split("## Watching a pipeline", 1)[1].split("\n## ", 1)[0]
    block = re.search(r"```bash\n(.*?)```", section, flags=re.S)
    assert block is not None
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "120", "PYTHONIOENCODING": "utf-8"}
    env.pop("LAKESTEP_CATALOG", None)
    monkeypatch.chdir(tmp_path)  # the relative ./ops-wh and report.html of the in-process commands
    codes = {}
    for line in block.group(1).splitlines():
        cmd = line.split("#", 1)[0].strip()
        if not cmd or cmd.startswith("pip "):
            continue
        words = shlex.split(cmd)
        if words[0] == "lakestep":
            run = lakestep(*words[1:], env={"COLUMNS": "120"})
            codes[cmd], err = run.code, run.err
        else:
            assert words[0] == "python", cmd
            r = subprocess.run([sys.executable, *words[1:]], capture_output=True, text=True, timeout=300, env=env,
                               cwd=tmp_path)
            codes[cmd], err = r.returncode, r.stderr
        assert "Traceback" not in err, (cmd, err)
    assert codes == {
        "python -m examples.operator ./ops-wh": 0,
        "lakestep barriers --catalog ./ops-wh": 0,
        "lakestep lineage --catalog ./ops-wh": 0,
        "lakestep doctor --catalog ./ops-wh": 3,  # the example leaves no coordinator running
        'lakestep query "SELECT d.k, d.v, s.v FROM shop.daily d JOIN shop.summary s ON d.k = s.k" '
        "--catalog ./ops-wh": 0,
        "lakestep report --html report.html --catalog ./ops-wh": 0,
    }
    assert (tmp_path / "report.html").stat().st_size > 10_000


def test_alter(catalog_spec: CatalogSpec) -> None:
    """``lakestep alter``: widen, make optional, add; each a commit; a refusal names its reason
    and changes nothing; a type name it does not know is a usage error."""
    cat = catalog_spec.open()
    cat.create_namespace("a")
    t = cat.create_table("a.t", pa.schema([pa.field("id", pa.int32(), nullable=False), ("q", pa.int16()),
                                           pa.field("note", pa.string(), nullable=False)]))
    t.append(pa.table({"id": [1], "q": [2], "note": ["x"]}, schema=t.schema))
    url = catalog_spec.url
    r = lakestep("alter", "a.t", "--widen", "q=int64", "--widen", "id=bigint", "--optional", "note",
                 "--add", "price=decimal(12,2)", "--json", catalog=url)
    assert r.code == 0, r.err
    doc = r.json()
    assert (doc["version_before"], doc["version"]) == (1, 5)  # four ALTER commits
    assert doc["columns"] == [{"name": "id", "type": "int64", "nullable": False, "id": 1},
                              {"name": "q", "type": "int64", "nullable": True, "id": 2},
                              {"name": "note", "type": "string", "nullable": True, "id": 3},
                              {"name": "price", "type": "decimal128(12, 2)", "nullable": True, "id": 4}]
    t.refresh()
    assert t.to_arrow().to_pylist() == [{"id": 1, "q": 2, "note": "x", "price": None}]
    again = lakestep("alter", "a.t", "--widen", "q=int64", "--json", catalog=url).json()
    assert again["version"] == 5  # already so: nothing committed
    narrow = lakestep("alter", "a.t", "--widen", "q=int8", catalog=url)
    assert narrow.code == 1 and "cannot change column 'q'" in narrow.err and "not a safe widening" in narrow.err
    bad = lakestep("alter", "a.t", "--widen", "q=int65", catalog=url)
    assert bad.code == 2 and "unknown type 'int65'" in bad.err
    assert lakestep("alter", "a.t", catalog=url).code == 2
    moved = lakestep("alter", "a.t", "--order", "price,id,note,q", "--json", catalog=url).json()
    assert [c["name"] for c in moved["columns"]] == ["price", "id", "note", "q"] and moved["version"] == 6
    assert [c["id"] for c in moved["columns"]] == [4, 1, 3, 2]  # ids stay with their columns
    left_out = lakestep("alter", "a.t", "--order", "price,id", catalog=url)
    assert left_out.code == 1 and "left out" in left_out.err
    lakestep("alter", "a.t", "--order", "id,q,note,price", catalog=url)
    t.refresh()
    assert t.version == 7 and t.schema.field("q").type == pa.int64()
    alters = [h.summary for h in t.history() if h.operation == "ALTER"]
    assert alters[-1] == {"change": "add_columns", "columns": [{"name": "price", "type": "decimal128(12, 2)", "id": 4}]}
    assert alters[0] == {"change": "reorder_columns", "from": ["price", "id", "note", "q"], "to": ["id", "q", "note", "price"]}
    # rename and drop: the ids stay with the columns; the old rows read under the new name
    moved = lakestep("alter", "a.t", "--rename", "q=qty", "--drop", "note", "--json", catalog=url)
    assert moved.code == 0, moved.err
    assert [(c["name"], c["id"]) for c in moved.json()["columns"]] == [("id", 1), ("qty", 2), ("price", 4)]
    t.refresh()
    assert t.version == 9 and t.to_arrow().to_pylist() == [{"id": 1, "qty": 2, "price": None}]
    assert t.to_arrow(version=7).to_pylist() == [{"id": 1, "q": 2, "note": "x", "price": None}]
    shown = lakestep("describe", "a.t", "--json", catalog=url).json()["schema"]
    assert [(c["name"], c["id"], c["stored_as"]) for c in shown] == [("id", 1, "id"), ("qty", 2, "q"),
                                                                     ("price", 4, "price")]
    assert "stored as" in lakestep("describe", "a.t", catalog=url).out
    taken = lakestep("alter", "a.t", "--rename", "qty=price", catalog=url)
    assert taken.code == 1 and "exists already" in taken.err
    assert lakestep("alter", "a.t", "--rename", "qty", catalog=url).code == 2
    key = lakestep("alter", "a.t", "--drop", "nope", catalog=url)
    assert key.code == 1 and "no such column" in key.err
    cat.close()
