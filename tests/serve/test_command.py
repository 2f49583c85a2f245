"""``python -m lakestep serve`` (the command ``lakestep serve``) as a process: it serves the
published tables with a token from the environment, logs neither the token nor the catalog's
password, and stops cleanly on SIGTERM."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import requests
from pyiceberg.catalog.rest import RestCatalog

from lakestep.testing.ports import free_port
from tests.iceberg.readers import counter
from tests.serve.conftest import TOKEN
from tests.serve.test_rest import Shop, rows_at
from tests.waiting import exited, tail, wait_until

ROOT = Path(__file__).resolve().parents[2]


def test_the_command_serves_until_sigterm(shop: Shop, tmp_path: Path) -> None:
    port = free_port()
    log = tmp_path / "serve.log"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "LAKESTEP_SERVE_TOKEN": TOKEN}
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "lakestep", "serve", "--catalog", shop.cat.connection_url(),
                                 "--port", str(port), "--refresh", "7", "--log-level", "DEBUG"], stdout=out,
                                stderr=subprocess.STDOUT,
                                env=env, cwd=ROOT)
    uri = f"http://127.0.0.1:{port}"
    auth = {"Authorization": f"Bearer {TOKEN}"}

    def healthy() -> bool:
        try:
            return requests.get(uri + "/health", headers=auth, timeout=5).status_code == 200
        except requests.ConnectionError:
            return False

    try:
        wait_until(healthy, "lakestep serve answers /health", timeout=60, failed=exited(proc, "lakestep serve"),
                   detail=tail(log))
        assert requests.get(uri + "/health").status_code == 401
        rc = RestCatalog("lakestep", uri=uri, token=TOKEN, warehouse="lakestep@consistent")
        assert rc.properties["prefix"] == "barrier=3"
        assert counter(rc.load_table("shop.counts").scan().to_arrow()) == rows_at(shop, "shop.counts", 3)
        # the same process serves the metrics and the live page, behind the same token
        metrics = requests.get(uri + "/metrics", headers=auth, timeout=60)
        assert metrics.status_code == 200 and metrics.headers["content-type"].startswith("text/plain; version=0.0.4")
        assert 'lakestep_table_behind_barriers{kind="derived",table="shop.counts"} 2.0' in metrics.text
        page = requests.get(uri + "/", headers=auth, timeout=60)
        assert page.status_code == 200 and '<meta http-equiv="refresh" content="7">' in page.text
        assert requests.get(uri + "/metrics", timeout=60).status_code == 401
    finally:
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=60)
    assert code == 0, tail(log)()
    text = log.read_text()
    assert "serving" in text and TOKEN not in text and shop.cat.url not in text
    password = shop.cat.backend.engine.url.password
    if password:
        assert str(password) not in text
