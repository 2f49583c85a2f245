"""A single-node Trino server with Iceberg catalogs: what tests/interop/test_trino.py runs.

    python scripts/trino.py            # fetch and unpack the server (cached); print its folder

1. :func:`ensure` fetches ``io.trino:trino-server:VERSION:tar.gz`` (about 820 MB) from Maven
   Central with `mvn dependency:copy` (jars/settings.xml, through the local Maven repository
   ``~/.m2``) and unpacks it into ``.jars/trino-VERSION/`` beside the project (git-ignored),
   keeping only the plugins of :data:`PLUGINS` (Trino loads every folder of ``plugin/``; fewer
   start faster). The unpacked copy is made once: a stamp says it is whole (a copy cut short is
   remade), a lock file keeps two runs from making it at once; the downloaded tarball is deleted
   after unpacking (Maven's cache keeps its own copy).
2. :class:`Trino` starts that server in a fresh folder: a coordinator that schedules work on
   itself, its HTTP server on a free port of 127.0.0.1, one Iceberg catalog per entry of
   ``catalogs`` (``etc/catalog/<name>.properties``), the JVM of :data:`JAVA_HOME` with a small
   heap. It waits until ``GET /v1/info`` says ``"starting": false`` and then until
   ``system.runtime.nodes`` lists the node active (before that, a query that reads splits fails
   with "No nodes available"), within ``start_timeout``; :meth:`Trino.query` runs a
   statement through Trino's HTTP protocol (``POST /v1/statement``, then ``nextUri``) and returns
   its rows as Trino's JSON gives them (bigint as int; varchar, decimal and date as strings).
   Leaving the context kills the server's process group. Trino's output goes to
   ``<folder>/trino.log``; errors carry its tail.

Not guaranteed: the first run downloads about 820 MB; without network and without the cache,
:func:`ensure` fails with Maven's own error (:class:`TrinoError`). Trino 476 needs Java 24 or newer.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path
from typing import Any, Mapping

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))
import jars  # noqa: E402  (scripts/jars.py: Maven with jars/settings.xml)
from lakestep.testing.ports import free_port  # noqa: E402

JARS = ROOT / ".jars"
VERSION = "476"
FOLDER = JARS / f"trino-{VERSION}"
PLUGINS = ("iceberg",)
"""The plugins kept from the server's ``plugin/`` folder."""
JAVA_HOME = Path(os.environ.get("LAKESTEP_TRINO_JAVA_HOME", "/usr/lib/jvm/temurin-25-jdk-amd64"))
JVM_OPTIONS = (  # Trino's recommended jvm.config, with a small heap
    "-XX:+UseG1GC", "-XX:G1HeapRegionSize=32M", "-XX:+ExplicitGCInvokesConcurrent",
    "-XX:+ExitOnOutOfMemoryError", "-XX:-OmitStackTraceInFastThrow", "-XX:ReservedCodeCacheSize=256M",
    "-XX:PerMethodRecompilationCutoff=10000", "-XX:PerBytecodeRecompilationCutoff=10000",
    "-Djdk.attach.allowAttachSelf=true", "-Djdk.nio.maxCachedBufferSize=2000000", "-Dfile.encoding=UTF-8",
    "-XX:+EnableDynamicAgentLoading", "--enable-native-access=ALL-UNNAMED")


class TrinoError(RuntimeError):
    """The server could not be fetched or started, or a query failed."""


def ensure(*, quiet: bool = True) -> Path:
    """Step 1: the unpacked server's folder, fetched and unpacked when missing or stale."""
    JARS.mkdir(exist_ok=True)
    key = hashlib.sha256(f"{VERSION} {PLUGINS}".encode() + (ROOT / "jars" / "settings.xml").read_bytes()).hexdigest()[:16]
    stamp = FOLDER / "stamp"
    with open(JARS / f".trino-{VERSION}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if stamp.exists() and stamp.read_text() == key:
            return FOLDER
        shutil.rmtree(FOLDER, ignore_errors=True)
        download = JARS / f"trino-{VERSION}.download"
        shutil.rmtree(download, ignore_errors=True)
        try:
            jars.mvn(["dependency:copy", f"-Dartifact=io.trino:trino-server:{VERSION}:tar.gz",
                      f"-DoutputDirectory={download}"], quiet=quiet, label="trino")
        except jars.JarsError as e:
            raise TrinoError(f"trino-server {VERSION}: {e}") from e
        top = f"trino-server-{VERSION}/"
        partial = FOLDER.with_name(FOLDER.name + ".partial")
        shutil.rmtree(partial, ignore_errors=True)
        with tarfile.open(download / f"trino-server-{VERSION}.tar.gz") as tar:
            def members():  # type: ignore[no-untyped-def]
                for m in tar:
                    parts = m.name.removeprefix(top).strip("/").split("/")
                    if not m.name.startswith(top) or (parts[0] == "plugin" and len(parts) > 1
                                                      and parts[1] not in PLUGINS):
                        continue
                    yield m  # its own name: hard links name their targets by theirs
            safe = {"filter": "tar"} if hasattr(tarfile, "tar_filter") else {}  # Python < 3.10.12: none
            tar.extractall(partial, members=members(), **safe)  # type: ignore[arg-type]
        (partial / top).rename(FOLDER)
        shutil.rmtree(partial)
        shutil.rmtree(download, ignore_errors=True)
        stamp.write_text(key)
    return FOLDER


def _props(values: Mapping[str, str]) -> str:
    return "".join(f"{k}={v}\n" for k, v in values.items())


class Trino:
    """Step 2: a single-node Trino in ``workdir`` (made fresh) with ``catalogs`` (name -> the
    catalog's properties, ``connector.name`` included). A context manager: entering starts it and
    waits until it answers; leaving stops it."""

    def __init__(self, workdir: Path, catalogs: Mapping[str, Mapping[str, str]], *, heap: str = "2G",
                 start_timeout: float = 300.0) -> None:
        self.workdir = Path(workdir)
        self.catalogs = catalogs
        self.heap = heap
        self.start_timeout = start_timeout
        self.log = self.workdir / "trino.log"
        self.port = 0
        self.proc: subprocess.Popen[bytes] | None = None
        self.started_in: float | None = None
        """Seconds from launching the JVM until the server answered as started."""

    @property
    def uri(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def tail(self, chars: int = 6000) -> str:
        try:
            return self.log.read_text(errors="replace")[-chars:]
        except OSError:
            return "(no log)"

    def __enter__(self) -> "Trino":
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> None:
        import requests

        home = ensure()
        java = JAVA_HOME / "bin" / "java"
        if not java.exists():
            raise TrinoError(f"no Java at {JAVA_HOME} (Trino {VERSION} needs Java 24 or newer)")
        etc = self.workdir / "etc"
        shutil.rmtree(self.workdir, ignore_errors=True)
        (etc / "catalog").mkdir(parents=True)
        self.port = free_port()
        (etc / "config.properties").write_text(_props({
            "coordinator": "true",
            "node-scheduler.include-coordinator": "true",
            "http-server.http.port": str(self.port),
            "discovery.uri": self.uri,
            "node.environment": "lakestep_test",
            "node.id": f"lakestep-{os.getpid()}-{self.port}",
            "node.internal-address": "127.0.0.1",
            "node.bind-ip": "127.0.0.1",
            "plugin.dir": str(home / "plugin"),
            "catalog.config-dir": str(etc / "catalog"),
            "query.max-memory": "1GB",
            "query.max-memory-per-node": "512MB",
        }))
        (etc / "log.properties").write_text("io.trino=INFO\n")
        for name, props in self.catalogs.items():
            (etc / "catalog" / f"{name}.properties").write_text(_props(props))
        cmd = [str(java), "-server", f"-Xmx{self.heap}", *JVM_OPTIONS,
               f"-Dconfig={etc / 'config.properties'}", f"-Dlog.levels-file={etc / 'log.properties'}",
               "-cp", str(home / "lib" / "*"), "io.trino.server.TrinoServer"]
        env = {**os.environ, "JAVA_HOME": str(JAVA_HOME)}
        began = time.monotonic()
        data = self.workdir / "data"  # the server's working directory (the launcher's node.data-dir)
        data.mkdir()
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen(cmd, cwd=data, env=env, stdout=out, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, start_new_session=True)
        deadline = began + self.start_timeout
        while True:
            if self.proc.poll() is not None:
                raise TrinoError(f"Trino exited with {self.proc.returncode} while starting; its log ends:\n"
                                 f"{self.tail()}")
            try:
                info = requests.get(f"{self.uri}/v1/info", timeout=5).json()
                if info.get("starting") is False:
                    break
            except (requests.RequestException, ValueError):
                pass
            if time.monotonic() > deadline:
                self.stop()
                raise TrinoError(f"Trino did not start within {self.start_timeout:.0f} s; its log ends:\n"
                                 f"{self.tail()}")
            time.sleep(0.5)
        # Started is not yet schedulable: the node announces itself to the coordinator's discovery
        # a moment later, and until then a query that reads splits fails with "No nodes available".
        while True:
            try:
                if self.query("SELECT count(*) FROM system.runtime.nodes WHERE state = 'active'") == [[1]]:
                    break
            except TrinoError:
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise TrinoError(f"Trino's node did not become active within {self.start_timeout:.0f} s; "
                                 f"its log ends:\n{self.tail()}")
            time.sleep(0.5)
        self.started_in = time.monotonic() - began

    def query(self, sql: str, *, timeout: float = 300.0) -> list[list[Any]]:
        """The rows of ``sql`` (a list per row, in Trino's JSON types); :class:`TrinoError` with
        Trino's message when it fails."""
        import requests

        headers = {"X-Trino-User": "lakestep", "X-Trino-Source": "lakestep-tests"}
        deadline = time.monotonic() + timeout
        resp = requests.post(f"{self.uri}/v1/statement", data=sql.encode(), headers=headers, timeout=60)
        rows: list[list[Any]] = []
        while True:
            if resp.status_code == 503:  # busy: the protocol says retry the same request
                time.sleep(0.1)
                resp = requests.get(resp.url, headers=headers, timeout=60)
                continue
            if resp.status_code != 200:
                raise TrinoError(f"HTTP {resp.status_code} for {sql!r}: {resp.text[:2000]}")
            body = resp.json()
            if body.get("error"):
                err = body["error"]
                raise TrinoError(f"{err.get('errorName')}: {err.get('message')} (query {sql!r})")
            rows.extend(body.get("data") or [])
            nxt = body.get("nextUri")
            if nxt is None:
                return rows
            if time.monotonic() > deadline:
                requests.delete(nxt, headers=headers, timeout=10)
                raise TrinoError(f"query did not finish within {timeout:.0f} s: {sql!r}")
            resp = requests.get(nxt, headers=headers, timeout=60)

    def stop(self) -> None:
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=20)


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="scripts/trino.py", description=__doc__.splitlines()[0])
    ap.parse_args(argv)
    try:
        print(ensure(quiet=False))
    except TrinoError as e:
        print(f"scripts/trino.py: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
