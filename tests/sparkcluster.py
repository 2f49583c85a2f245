"""A real Spark standalone cluster for the tests, from the pyspark distribution.

One master and two workers, each its own JVM started with ``spark-class``
(``org.apache.spark.deploy.master.Master`` / ``...worker.Worker``) in its own
process group, on 127.0.0.1 and free ports, with its own working directory,
local (shuffle) directory and ``TMPDIR`` under the test's temporary
directory. Applications are started with ``spark-submit`` (:meth:`SparkCluster.submit`)
from a directory of their own, and ship lakestep as a zip (``--py-files``).

What the workers' processes (their executors and the executors' Python
workers) see (tests/cluster_hook/sitecustomize.py):

* no lakestep unless the application ships it (the shared virtualenv's
  editable install is hidden, and the workers' PYTHONPATH holds only the hook);
* no catalog database: a connection attempt is written to :attr:`SparkCluster.db_log`
  and refused;
* worker 0 only, when armed (:meth:`SparkCluster.hold_next_sink_task`): its
  first sink task that wrote rows waits after writing its files, so that a
  test can kill the worker in the middle of a micro-batch.

Protocol:

1. :meth:`start`: the master; once its log says where it listens, the workers;
   ready when each worker's log says it registered with the master;
2. :meth:`kill_worker`: SIGKILL the worker's JVM, its executor's JVM and the
   executor's Python workers at once (tests/processes.py); :meth:`ensure_workers`
   starts a new worker in its place;
3. :meth:`stop`: every daemon's process tree is SIGKILLed (also when the test failed); should the
   test process itself be killed, the daemons get SIGKILL from the kernel (PR_SET_PDEATHSIG).

Not guaranteed: the ports are chosen by the JVMs (port 0); nothing here
separates machines, so "not on the driver's machine" is enforced only where
the hook can enforce it (imports, the catalog database, TMPDIR, working directories).
"""

from __future__ import annotations

import errno
import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path

from lakestep.testing.spark import log4j2_properties
from tests.processes import kill_tree, wait_dead
from tests.waiting import wait_until

REPO_ROOT = Path(__file__).resolve().parents[1]
HOOK_DIR = REPO_ROOT / "tests" / "cluster_hook"
_JVM_OPTS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
def spark_home() -> Path:
    import pyspark

    return Path(pyspark.__file__).parent


def lakestep_zip(dest: Path) -> Path:
    """``python -m zipfile -c lakestep.zip lakestep/`` from this checkout (what README "On a cluster" says)."""
    subprocess.run([sys.executable, "-m", "zipfile", "-c", str(dest), "lakestep/"], cwd=REPO_ROOT, check=True)
    with zipfile.ZipFile(dest) as z:
        assert "lakestep/streaming/sink.py" in z.namelist()
    return dest


def clean_env(**extra: str) -> dict[str, str]:
    """This process's environment without what would let lakestep or Spark settings leak into the cluster."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON", "SPARK_HOME", "SPARK_CONF_DIR",
                        "LAKESTEP_FAILPOINTS") and not k.startswith(("AWS_", "LS_TEST_"))}
    env.update(extra)
    return env


def _die_with_parent() -> None:
    """In the child before exec: SIGKILL it when the test process dies (even of SIGKILL, when no teardown
    runs); spark-class execs the JVM, which keeps the setting. Its executors then lose their worker and exit."""
    import ctypes
    import signal

    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


class _Daemon:
    def __init__(self, name: str, cls: str, args: list[str], base: Path, env: dict[str, str]) -> None:
        self.name = name
        self.dir = base / name
        for sub in ("work", "local", "tmp"):
            (self.dir / sub).mkdir(parents=True, exist_ok=True)
        self.log = self.dir / "daemon.log"
        env = {**env, "TMPDIR": str(self.dir / "tmp"), "SPARK_LOCAL_DIRS": str(self.dir / "local"),
               "SPARK_WORKER_DIR": str(self.dir / "work"), "SPARK_LOG_DIR": str(self.dir),
               "SPARK_DAEMON_JAVA_OPTS": f"{_JVM_OPTS} -Djava.io.tmpdir={self.dir / 'tmp'}"}
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen([str(spark_home() / "bin" / "spark-class"), cls, *args], cwd=self.dir,
                                         env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                                         preexec_fn=_die_with_parent)

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def died(self) -> str | None:
        code = self.proc.poll()
        return None if code is None else f"{self.name} exited with status {code}:\n{self.text()[-3000:]}"

    def kill(self) -> None:
        tree = kill_tree(self.proc.pid)  # also when the JVM is gone: its Python workers may not be
        self.proc.wait(30)
        wait_dead(tree, f"{self.name}'s processes")


class SparkCluster:
    """Steps 1-3 of the module docstring."""

    def __init__(self, base: Path, workers: int = 2) -> None:
        self.base = base
        self.n = workers
        self.conf = base / "conf"
        self.conf.mkdir(parents=True, exist_ok=True)
        (self.conf / "log4j2.properties").write_text(log4j2_properties("warn", {"org.apache.spark.deploy": "info"}))
        self.db_log = base / "executor-db-attempts.log"
        self.hold_dir = base / "hold"
        self.master: _Daemon | None = None
        self.workers: list[_Daemon | None] = [None] * workers
        self.url = ""
        self._started = 0

    def _env(self) -> dict[str, str]:
        return clean_env(SPARK_HOME=str(spark_home()), SPARK_CONF_DIR=str(self.conf), SPARK_LOCAL_IP="127.0.0.1",
                         SPARK_DAEMON_MEMORY="256m")

    def start(self) -> "SparkCluster":
        self.master = _Daemon("master", "org.apache.spark.deploy.master.Master",
                              ["--host", "127.0.0.1", "--port", "0", "--webui-port", "0"], self.base, self._env())
        m = wait_until(lambda: re.search(r"Starting Spark master at (spark://\S+)", self.master.text()),  # type: ignore[union-attr]
                       "the Spark master to listen", timeout=120, interval=0.1, failed=self.master.died)
        self.url = m.group(1)
        self.ensure_workers()
        return self

    def ensure_workers(self) -> None:
        """Start the workers that are not running, and wait until each registered with the master."""
        started = []
        for i, w in enumerate(self.workers):
            if w is None or w.proc.poll() is not None:
                self._started += 1
                env = {**self._env(), "PYTHONPATH": str(HOOK_DIR), "LS_TEST_NO_EDITABLE": "1",
                       "LS_TEST_NO_CATALOG_DB": str(self.db_log)}
                if i == 0:
                    env["LS_TEST_HOLD_DIR"] = str(self.hold_dir)
                self.workers[i] = w = _Daemon(f"worker{i}-{self._started}", "org.apache.spark.deploy.worker.Worker",
                                              ["--host", "127.0.0.1", "--port", "0", "--webui-port", "0", "--cores",
                                               "1", "--memory", "1g", self.url], self.base, env)
                started.append(w)
        for w in started:
            wait_until(lambda: "Successfully registered with master" in w.text(), f"{w.name} to register",
                       timeout=120, interval=0.1, failed=w.died)

    def hold_next_sink_task(self) -> None:
        """Arm step 3 of tests/cluster_hook: worker 0's next sink task with rows waits (a fresh hold directory)."""
        self.hold_dir.mkdir(exist_ok=True)
        for p in self.hold_dir.iterdir():
            p.unlink()
        os.mkfifo(self.hold_dir / "gate")

    def disarm(self) -> None:
        """No sink task holds (a held one is released)."""
        self.release()
        if self.hold_dir.exists():
            for p in self.hold_dir.iterdir():
                p.unlink()
            self.hold_dir.rmdir()

    def held(self) -> str | None:
        """What the held task wrote (its table, task prefix and rows), once it holds."""
        if not self.hold_dir.exists():
            return None
        for p in self.hold_dir.glob("task-*"):
            return p.read_text()
        return None

    def release(self) -> None:
        """A held task goes on, and so does any that arrives later (the marker first, then a byte into the gate)."""
        if not self.hold_dir.exists():
            return
        (self.hold_dir / "release").write_text("")
        try:
            fd = os.open(self.hold_dir / "gate", os.O_WRONLY | os.O_NONBLOCK)
        except OSError as e:  # ENXIO: no task holds the gate open; ENOENT: never armed
            if e.errno not in (errno.ENXIO, errno.ENOENT):
                raise
            return
        try:
            os.write(fd, b"x")
        finally:
            os.close(fd)

    def kill_worker(self, i: int) -> None:
        """Step 2: SIGKILL worker ``i``, its executor and the executor's Python workers."""
        w = self.workers[i]
        assert w is not None
        w.kill()

    def db_attempts(self) -> str:
        return self.db_log.read_text() if self.db_log.exists() else ""

    def logs(self) -> str:
        parts = []
        for d in [self.master, *self.workers]:
            if d is not None:
                parts.append(f"--- {d.name} ---\n{d.text()[-2000:]}")
        return "\n".join(parts)

    def submit_command(self, app: list[str], pyfiles: Path | None, conf: dict[str, str] | None = None) -> list[str]:
        """``spark-submit`` of ``app`` (a script and its arguments) to this cluster."""
        cmd = [str(spark_home() / "bin" / "spark-submit"), "--master", self.url]
        if pyfiles is not None:
            cmd += ["--py-files", str(pyfiles)]
        settings = {
            "spark.pyspark.python": sys.executable,
            "spark.executor.memory": "512m",
            "spark.executor.cores": "1",
            "spark.executor.extraJavaOptions": _JVM_OPTS,
            "spark.driver.extraJavaOptions": f"{_JVM_OPTS} -Dlog4j2.configurationFile=file:{self.conf / 'log4j2.properties'}",
            "spark.driver.host": "127.0.0.1",
            "spark.driver.bindAddress": "127.0.0.1",
            "spark.ui.enabled": "false",
            "spark.ui.showConsoleProgress": "false",
            "spark.sql.shuffle.partitions": "2",
            **(conf or {}),
        }
        for k, v in settings.items():
            cmd += ["--conf", f"{k}={v}"]
        return cmd + app

    def driver_env(self, **extra: str) -> dict[str, str]:
        """The environment of a driver: no lakestep but what the application ships (the hook hides the
        editable install), and the catalog database reachable."""
        return clean_env(**{"SPARK_HOME": str(spark_home()), "SPARK_CONF_DIR": str(self.conf),
                            "SPARK_LOCAL_IP": "127.0.0.1", "PYTHONPATH": str(HOOK_DIR), "LS_TEST_NO_EDITABLE": "1",
                            "PYSPARK_PYTHON": sys.executable, **extra})

    def stop(self) -> None:
        """Step 3: the workers, then the master."""
        self.release()
        for d in [*self.workers, self.master]:
            if d is not None:
                d.kill()
