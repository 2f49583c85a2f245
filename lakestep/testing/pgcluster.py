"""A PostgreSQL cluster of the test's own, to stop and start without disturbing anyone.

``initdb`` into a fresh temporary directory, a free port on 127.0.0.1, trust
authentication for the ``postgres`` role, its Unix socket in that directory;
``pg_ctl`` starts and stops it. PostgreSQL refuses to run as root, so as root
(CI containers) every server command runs as the ``postgres`` OS user that the
distribution's package created (``runuser -u postgres --``), and the directory
is handed to that user. The binaries are PostgreSQL's server binaries of the
newest version installed (``/usr/lib/postgresql/<version>/bin``, as
``scripts/ensure-services.sh`` installs them), or those of
``LAKESTEP_TEST_PG_BIN``.

    with PgCluster() as pg:
        url = pg.create_database("t1")
        pg.stop()          # every connection is cut; new ones are refused
        pg.start()
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import subprocess
import tempfile
import uuid
from pathlib import Path

import sqlalchemy as sa

from lakestep.errors import LakestepError
from lakestep.testing.ports import free_port


class PgClusterError(LakestepError, RuntimeError):
    """The server's binaries are missing, or one of its commands (initdb, pg_ctl) failed."""


def server_bindir() -> str:
    """Where initdb, pg_ctl and postgres are."""
    env = os.environ.get("LAKESTEP_TEST_PG_BIN")
    if env:
        return env
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"),
                   key=lambda p: [int(x) if x.isdigit() else 0 for x in Path(p).parts[-3].split(".")])
    if found:
        return str(Path(found[-1]).parent)
    initdb = shutil.which("initdb")
    if initdb:
        return str(Path(initdb).parent)
    raise PgClusterError("no PostgreSQL server binaries (initdb, pg_ctl): run scripts/ensure-services.sh, or set "
                       "LAKESTEP_TEST_PG_BIN")


class PgCluster:
    """One PostgreSQL server in a temporary directory (module docstring)."""

    def __init__(self) -> None:
        self.bindir = server_bindir()
        self.root = Path(tempfile.mkdtemp(prefix="lakestep-pg-"))
        self.data = self.root / "data"
        self.logfile = self.root / "server.log"
        self.port = free_port()
        self._as: list[str] = []
        if os.geteuid() == 0:  # initdb and postgres refuse root
            user = pwd.getpwnam("postgres")
            os.chown(self.root, user.pw_uid, user.pw_gid)
            self._as = ["runuser", "-u", "postgres", "--"]
        try:
            self._run("initdb", "-D", str(self.data), "-U", "postgres", "--auth=trust", "-E", "UTF8",
                      "--no-sync", "--no-instructions")
            with open(self.data / "postgresql.conf", "a") as conf:
                conf.write(f"\nlisten_addresses = '127.0.0.1'\nport = {self.port}\n"
                           f"unix_socket_directories = '{self.root}'\nfsync = off\nsynchronous_commit = off\n"
                           "full_page_writes = off\nmax_connections = 60\nshared_buffers = 32MB\n")
            self.start()
        except BaseException:
            self.destroy()
            raise

    def _run(self, tool: str, *args: str) -> None:
        cmd = [*self._as, os.path.join(self.bindir, tool), *args]
        out = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=self.root)
        if out.returncode != 0:
            raise PgClusterError(f"{' '.join(cmd)} failed ({out.returncode}):\n{out.stdout[-3000:]}")

    @property
    def running(self) -> bool:
        return (self.data / "postmaster.pid").exists()

    def start(self) -> None:
        """Start the server and wait until it accepts connections."""
        self._run("pg_ctl", "-D", str(self.data), "-l", str(self.logfile), "-w", "-t", "120", "start")

    def stop(self, mode: str = "fast") -> None:
        """Stop the server (``fast``: connections are cut, transactions in flight roll back)."""
        self._run("pg_ctl", "-D", str(self.data), "-m", mode, "-w", "-t", "120", "stop")

    def url(self, database: str = "postgres") -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{database}"

    def create_database(self, name: str | None = None) -> str:
        """A new database; returns its URL."""
        name = name or f"t_{uuid.uuid4().hex[:10]}"
        engine = sa.create_engine(self.url().replace("postgresql://", "postgresql+psycopg2://", 1),
                                  isolation_level="AUTOCOMMIT", poolclass=sa.pool.NullPool)
        try:
            with engine.connect() as c:
                c.execute(sa.text(f'CREATE DATABASE "{name}"'))
        finally:
            engine.dispose()
        return self.url(name)

    def destroy(self) -> None:
        try:
            if self.running:
                self.stop("immediate")
        finally:
            shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> "PgCluster":
        return self

    def __exit__(self, *exc: object) -> None:
        self.destroy()
