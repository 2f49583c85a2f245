"""docs/operations.md's service definitions run as written: each systemd unit's ``ExecStart`` against a
catalog of the test's own (the binary's path and the environment file's values substituted), and each
Kubernetes container's command through the command line's parser."""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

import pyarrow as pa
import pytest
import yaml

from lakestep import Catalog
from lakestep.testing.ports import free_port
from tests.waiting import wait_until

ROOT = Path(__file__).resolve().parents[1]
DOC = (ROOT / "docs" / "operations.md").read_text()
BINARY = "/opt/lakestep/bin/lakestep"


def units() -> dict[str, list[str]]:
    """Each unit's ExecStart, split as systemd does (``${VAR}`` left for the test to fill)."""
    out = {}
    for block in re.findall(r"```ini\n(.*?)```", DOC, flags=re.S):
        name = re.search(r"/etc/systemd/system/(lakestep-[a-z]+)\.service", block)
        start = re.search(r"^ExecStart=(.*)$", block, flags=re.M)
        if name and start:
            out[name.group(1)] = shlex.split(start.group(1))
    return out


def environment() -> dict[str, str]:
    block = next(b for b in re.findall(r"```ini\n(.*?)```", DOC, flags=re.S) if "lake.env" in b)
    return dict(line.split("=", 1) for line in block.splitlines() if line and not line.startswith("#"))


def test_the_page_defines_the_three_services() -> None:
    assert set(units()) == {"lakestep-coordinator", "lakestep-maintenance", "lakestep-serve"}
    assert set(environment()) == {"LAKESTEP_CATALOG", "LAKESTEP_SERVE_TOKEN"}
    for argv in units().values():
        assert argv[0] == BINARY and "${LAKESTEP_CATALOG}" in argv


@pytest.fixture
def catalog_url(tmp_path: Path) -> str:
    cat = Catalog(warehouse=str(tmp_path / "wh"))
    cat.create_namespace("shop")
    cat.create_table("shop.orders", pa.schema([("id", pa.int64())])).append(pa.table({"id": [1, 2]}))
    url = cat.connection_url()
    cat.close()
    return url


def command(unit: str, url: str, *extra: str) -> list[str]:
    argv = [url if a == "${LAKESTEP_CATALOG}" else a for a in units()[unit]]
    return [sys.executable, "-m", "lakestep", *argv[1:], *extra]


def test_the_coordinator_unit_seals(catalog_url: str) -> None:
    # the catalog has no root job: its epoch is sealed after --idle (10 intervals by default)
    r = subprocess.run(command("lakestep-coordinator", catalog_url, "--duration", "3", "--idle", "1", "--json"),
                       cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    assert len(json.loads(r.stdout)["seals"]) >= 1


def test_the_maintenance_unit_runs_a_round(catalog_url: str) -> None:
    r = subprocess.run(command("lakestep-maintenance", catalog_url, "--rounds", "1", "--json"), cwd=ROOT,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    rounds = json.loads(r.stdout)["rounds"]
    assert len(rounds) == 1 and "shop.orders" in rounds[0]["tables"]


def test_the_serve_unit_answers_and_stops_on_sigterm(catalog_url: str) -> None:
    port = free_port()
    argv = command("lakestep-serve", catalog_url)
    argv[argv.index("--port") + 1] = str(port)
    env = {**os.environ, "LAKESTEP_SERVE_TOKEN": environment()["LAKESTEP_SERVE_TOKEN"]}
    proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        req = urllib.request.Request(f"http://127.0.0.1:{port}/health",
                                     headers={"Authorization": f"Bearer {env['LAKESTEP_SERVE_TOKEN']}"})

        def healthy() -> bool:
            try:
                with urllib.request.urlopen(req, timeout=5) as r:
                    return r.status == 200
            except OSError:
                assert proc.poll() is None, proc.communicate()[1][-2000:]
                return False

        wait_until(healthy, "lakestep serve to answer /health", timeout=60)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_the_kubernetes_commands_parse() -> None:
    block = next(b for b in re.findall(r"```yaml\n(.*?)```", DOC, flags=re.S) if "kind: Deployment" in b)
    commands = {}
    for doc in yaml.safe_load_all(block):
        if doc["kind"] == "Deployment":
            (c,) = doc["spec"]["template"]["spec"]["containers"]
            commands[doc["metadata"]["name"]] = c["command"]
    assert set(commands) == {"lakestep-coordinator", "lakestep-maintenance", "lakestep-serve"}
    for name, argv in commands.items():
        assert argv[0] == "lakestep" and argv[1] == name.split("-", 1)[1]
        r = subprocess.run([sys.executable, "-m", "lakestep", *argv[1:], "--help"], cwd=ROOT, capture_output=True,
                           text=True, timeout=60)
        assert r.returncode == 0, (name, r.stderr[-2000:])  # an unknown option or a bad value's type fails
