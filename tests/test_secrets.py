"""Passwords in catalog URLs never reach messages, reprs, logs or the CLIs' output."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

from lakestep import Catalog, errors
from lakestep.secrets import mask_url

ROOT = Path(__file__).resolve().parents[1]
SECRET = "s3cretPw"


@pytest.mark.parametrize("text, masked", [
    (f"postgresql://postgres:{SECRET}@127.0.0.1:5432/db", "postgresql://postgres:***@127.0.0.1:5432/db"),
    (f"'postgres ql://postgres:{SECRET}@h/x'", "'postgres ql://postgres:***@h/x'"),
    (f"postgresql://u:p@{SECRET}@h:1/db", "postgresql://u:***@h:1/db"),
    (f"host=h password={SECRET} user=u", "host=h password=*** user=u"),
    (f"postgresql://u@h/db?password={SECRET}&x=1", "postgresql://u@h/db?password=***&x=1"),
    ("sqlite:////tmp/wh/catalog.db", "sqlite:////tmp/wh/catalog.db"),
])
def test_mask_url(text: str, masked: str) -> None:
    assert mask_url(text) == masked


def pg_url_with_password(pg_url: str, database: str | None = None) -> str:
    """``pg_url`` with the password SECRET (and, given, another ``database``): the test server
    trusts local connections, so any password works. Also tests/cli/test_actions.py's."""
    scheme, rest = pg_url.split("://", 1)
    userinfo, hostpart = rest.split("@", 1)
    if database is not None:
        hostpart = hostpart.split("/", 1)[0] + "/" + database
    return f"{scheme}://{userinfo.split(':')[0]}:{SECRET}@{hostpart}"


def test_catalog_attributes_and_errors_hide_the_password(pg_spec, caplog) -> None:  # type: ignore[no-untyped-def]
    caplog.set_level(logging.DEBUG)
    url = pg_url_with_password(pg_spec.url)  # the test server trusts local connections: any password works
    cat = Catalog(url, warehouse=pg_spec.warehouse)
    try:
        assert SECRET not in repr(cat) and SECRET not in cat.url and SECRET not in str(vars(cat))
        assert SECRET in cat.connection_url()  # for handing to other processes
    finally:
        cat.close()
    bad = [f"postgres ql://postgres:{SECRET}@127.0.0.1/x",           # malformed
           pg_url_with_password(pg_spec.url).replace(":5432", ":1"),  # refused
           pg_url_with_password(pg_spec.url, "no_such_db_lakestep")]  # missing database
    for u in bad:
        with pytest.raises(errors.LakestepError) as ei:
            Catalog(u, warehouse=pg_spec.warehouse, timeouts=None)
        assert SECRET not in str(ei.value) and SECRET not in repr(ei.value)
    assert SECRET not in caplog.text


@pytest.mark.parametrize("command", ["coordinator", "maintenance"])
def test_cli_errors_are_one_masked_line(command: str, tmp_path) -> None:  # type: ignore[no-untyped-def]
    from tests.conftest import PG_URL

    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    for url in (f"postgres ql://postgres:{SECRET}@127.0.0.1/x",
                pg_url_with_password(PG_URL).replace(":5432", ":1"),
                pg_url_with_password(PG_URL, "no_such_db_lakestep")):
        args = [sys.executable, "-m", "lakestep", command, "--url", url]
        if command == "maintenance":
            args += ["--rounds", "1"]
        else:
            args += ["--duration", "1"]
        proc = subprocess.run(args, capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path)
        assert proc.returncode == 1, proc.stderr
        out = proc.stdout + proc.stderr
        assert SECRET not in out
        assert "Traceback" not in out
        assert proc.stderr.strip().startswith("error: ") and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
