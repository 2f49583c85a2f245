"""Exactly once across crashes: Kafka -> s.raw (root job) -> s.agg (derived job), killed and restarted.

The Spark application (``pipeline_app.py``) runs as a subprocess in its own
process group and is killed with SIGKILL (driver, JVM and Python workers at
once) at random points: after a random delay, inside a sink commit through a
failpoint (``LAKESTEP_FAILPOINTS``: the Python worker doing the commit exits
between writing the files and committing them), and right after a commit
became visible in the catalog (before Spark could record it in its commit
log). Records are produced before the first start and between restarts. At the
end the application runs until every record is in, then:

* every Kafka record (partition, offset) is in ``s.raw`` exactly once, with its key and value;
* at every barrier ``s.agg`` has precommitted, ``s.agg`` at that barrier equals
  the transformation of ``s.raw`` at that barrier (no loss, no duplicate, no
  row of a later barrier).
"""

from __future__ import annotations

import collections
import os
import random
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, TypeVar

import pyarrow as pa
import pytest

from lakestep.barrier import Pipeline
from lakestep.streaming import register_job
from tests.processes import kill_tree, wait_dead
from tests.sparkcluster import HOOK_DIR
from tests.waiting import exited, wait_until

if TYPE_CHECKING:
    from tests.sparkcluster import SparkCluster

pytestmark = [pytest.mark.spark, pytest.mark.kafka]

T = TypeVar("T")

# Each run of the test costs minutes (a Spark start-up per kill), so it covers both catalog backends and
# both kinds of storage in two variants: SQLite with the warehouse on the local disk, and PostgreSQL with
# it on S3 (the executors write and read the bucket with the storage options the driver hands them:
# tests/conftest.py, tests/s3server.py). LAKESTEP_TEST_S3=all adds the other two pairings.
CATALOGS = ["sqlite", "postgres-s3"] + (["postgres", "sqlite-s3"] if os.environ.get("LAKESTEP_TEST_S3") == "all"
                                        else [])

REPO_ROOT = Path(__file__).resolve().parents[2]
RAW = pa.schema([("key", pa.string()), ("value", pa.string()), ("partition", pa.int32()), ("offset", pa.int64())])
AGG = pa.schema([("partition", pa.int32()), ("offset", pa.int64()), ("key", pa.string()), ("v", pa.string()),
                 ("n", pa.int32())])
AGG2 = pa.schema([("partition", pa.int32()), ("offset", pa.int64()), ("m", pa.int64())])


def transform(rows: list[dict]) -> list[tuple]:  # type: ignore[type-arg]
    """pipeline_app.transform, in Python."""
    return sorted((r["partition"], r["offset"], r["key"], r["value"].upper(), len(r["value"])) for r in rows)


def agg_rows(rows: list[dict]) -> list[tuple]:  # type: ignore[type-arg]
    return sorted((r["partition"], r["offset"], r["key"], r["v"], r["n"]) for r in rows)


def transform2(rows: list[dict]) -> list[tuple]:  # type: ignore[type-arg]
    """pipeline_app.transform2 (s.agg -> s.agg2), in Python."""
    return sorted((r["partition"], r["offset"], r["n"] * 1000 + r["partition"]) for r in rows)


def agg2_rows(rows: list[dict]) -> list[tuple]:  # type: ignore[type-arg]
    return sorted((r["partition"], r["offset"], r["m"]) for r in rows)


def check_derived(p: Pipeline, source: Any, derived: Any, f: Any, rows_of: Any, last: int) -> int:
    """``derived`` equals ``f(source)`` at every barrier it has precommitted, up to at least ``last``
    (exact comparisons of whole rows, as multisets). Returns the number of rows at its frontier."""
    frontier = p.frontier(derived.ident) or 0
    assert frontier >= last, f"{derived.ident} precommitted only up to {frontier}, not {last}"
    barriers = sorted({h.barrier for h in derived.history() if h.barrier} | {frontier})
    for b in barriers:
        if b > frontier:
            continue
        want = f(source.to_arrow(version=p.version_at(source.ident, b)).to_pylist())
        got = rows_of(derived.to_arrow(version=p.version_at(derived.ident, b)).to_pylist())
        if got != want:
            extra = collections.Counter(got) - collections.Counter(want)
            missing = collections.Counter(want) - collections.Counter(got)
            raise AssertionError(f"{derived.ident} != f({source.ident}) at barrier {b}: {sum(extra.values())} extra "
                                 f"/ duplicate rows {list(extra)[:10]}, {sum(missing.values())} missing "
                                 f"{list(missing)[:10]}")
    return len(rows_of(derived.to_arrow(version=p.version_at(derived.ident, frontier)).to_pylist()))


def check_exactly_once(cat: Any, produced: dict[tuple[int, int], tuple[str, str]], last: int,
                       derived2: bool = False) -> None:
    """The end of the test: every Kafka record in s.raw exactly once, every micro-batch committed
    once, and s.agg = transform(s.raw) (and s.agg2 = transform2(s.agg)) at every barrier precommitted."""
    raw, agg = cat.load_table("s.raw"), cat.load_table("s.agg")
    p = Pipeline(cat)
    # every input record exactly once in s.raw
    rows = raw.to_arrow().to_pylist()
    counts = collections.Counter((r["partition"], r["offset"]) for r in rows)
    dupes = {k: n for k, n in counts.items() if n > 1}
    assert not dupes, f"records in s.raw more than once: {sorted(dupes.items())[:20]}"
    assert set(counts) == set(produced), (f"missing {sorted(set(produced) - set(counts))[:20]}, "
                                          f"unexpected {sorted(set(counts) - set(produced))[:20]}")
    assert all(produced[(r["partition"], r["offset"])] == (r["key"], r["value"]) for r in rows)
    batches = collections.Counter((h.job_id, h.batch_id) for h in raw.history()
                                  if h.added_rows and h.job_id is not None)  # (compactions have no key)
    assert all(n == 1 for n in batches.values()), f"a micro-batch committed twice: {batches}"

    # s.agg is the transformation of s.raw at every barrier it precommitted (and s.agg2 of s.agg)
    assert check_derived(p, raw, agg, transform, agg_rows, last) == len(produced)
    if derived2:
        agg2 = cat.load_table("s.agg2")
        assert check_derived(p, agg, agg2, transform2, agg2_rows, last) == len(produced)


# Test-only hook: after the sink's catalog commit of a batch with rows of job J (or of each job of "J1,J2"), write
# a marker ("<marker>.<job>") and hang, so that the test kills the app after the catalog commit and before Spark
# records the batch in its commit log.
_PAUSE_HOOK = """
import os
_spec = os.environ.get("LS_TEST_PAUSE_AFTER_COMMIT")
try:  # only in the process running the sink's commit (cheap elsewhere: workers start under a timeout)
    with open("/proc/self/cmdline", "rb") as _f:
        _sink = b"python_streaming_sink_runner" in _f.read()
except OSError:
    _sink = False
if _spec and _sink:
    _jobs, _marker = _spec.split(":", 1)
    import time
    import lakestep.streaming.microbatch as _pr
    _orig = _pr.commit_batch

    def commit_batch(cat, job, batch_id, table, files, **kw):
        res = _orig(cat, job, batch_id, table, files, **kw)
        if job in _jobs.split(",") and files:
            with open(f"{_marker}.{job}", "w") as f:
                f.write(f"{job} batch {batch_id}")
            time.sleep(600)
        return res

    _pr.commit_batch = commit_batch
"""


# Test-only hook: every Python process of the app (driver and Spark's Python workers) logs lakestep's lines at
# INFO to stderr, with its pid (the outage test counts the wait lines of sinks, sources and the coordinator).
_LOG_HOOK = """
import logging as _logging, os as _os, sys as _sys
if _os.environ.get("LS_TEST_LOG_LAKESTEP"):
    _h = _logging.StreamHandler(_sys.stderr)
    _h.setFormatter(_logging.Formatter("%(asctime)s pid %(process)d %(levelname)s %(name)s: %(message)s"))
    _logging.getLogger("lakestep").addHandler(_h)
    _logging.getLogger("lakestep").setLevel(_logging.INFO)
"""


class App:
    """One run of pipeline_app.py in its own process group."""

    def __init__(self, tmp: Path, run: int, args: list[str], failpoints: str | None,
                 pause_after_commit: str | None = None, log_lakestep: bool = False,
                 submit: "tuple[SparkCluster, Path] | None" = None) -> None:
        """``submit``: (cluster, lakestep zip): ``spark-submit --py-files`` the app to the cluster from a
        directory of its own, lakestep coming from the zip only (tests/sparkcluster.py); else local mode."""
        # spark-submit's Python driver gets --py-files, the Python processes its JVM starts for data sources
        # only PYTHONPATH: the zip goes on both (README, "On a cluster")
        env = dict(os.environ) if submit is None else submit[0].driver_env(PYTHONPATH=f"{HOOK_DIR}:{submit[1]}")
        paths = [*([str(REPO_ROOT)] if submit is None else []), *filter(None, [env.get("PYTHONPATH")])]
        self.marker = tmp / f"app-{run}.committed"
        hooks = ([_PAUSE_HOOK] if pause_after_commit else []) + ([_LOG_HOOK] if log_lakestep else [])
        if hooks:  # every Python process of the app loads the hooks (sitecustomize)
            hook = tmp / f"hook-{run}"
            hook.mkdir(exist_ok=True)
            (hook / "sitecustomize.py").write_text("\n".join(hooks))
            paths.insert(0, str(hook))
        if pause_after_commit:
            env["LS_TEST_PAUSE_AFTER_COMMIT"] = f"{pause_after_commit}:{self.marker}"
        env.pop("LS_TEST_LOG_LAKESTEP", None)
        if log_lakestep:
            env["LS_TEST_LOG_LAKESTEP"] = "1"
        env["PYTHONPATH"] = os.pathsep.join(paths)
        env.pop("LAKESTEP_FAILPOINTS", None)
        if failpoints:
            env["LAKESTEP_FAILPOINTS"] = failpoints
        self.out = tmp / f"app-{run}.out"
        self.err = tmp / f"app-{run}.err"
        cmd, cwd = [sys.executable, "-m", "tests.streaming.pipeline_app", *args], REPO_ROOT
        if submit is not None:
            cwd = tmp / "driver"
            cwd.mkdir(exist_ok=True)
            cmd = submit[0].submit_command([str(REPO_ROOT / "tests" / "streaming" / "pipeline_app.py"), *args],
                                           submit[1])
        self.proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=self.out.open("wb"), stderr=self.err.open("wb"),
                                     start_new_session=True)

    def paused(self, job: str) -> Path:
        """The marker a job's paused commit writes (``pause_after_commit``)."""
        return self.marker.with_name(f"{self.marker.name}.{job}")

    def ready(self) -> bool:
        return b"READY" in self.out.read_bytes()

    def exited(self) -> int | None:
        return self.proc.poll()

    def kill(self) -> None:
        """SIGKILL the application: its process group and every descendant, at once (tests/processes.py)."""
        tree = kill_tree(self.proc.pid)
        self.proc.wait(30)
        wait_dead(tree, "the app's processes")

    def tail(self) -> str:
        return (self.out.read_text(errors="replace")[-1500:] + "\n--- stderr ---\n"
                + self.err.read_text(errors="replace")[-3000:])

    def wait(self, cond: Callable[[], T], what: str, timeout: float,
             ignoring: tuple[type[BaseException], ...] = ()) -> T:
        """:func:`wait_until` ``cond`` while the app runs: its exit ends the wait at once, and a
        failed wait shows the tail of its output."""
        return wait_until(cond, what, timeout=timeout, interval=0.2, failed=exited(self.proc, "the app"),
                          detail=self.tail, ignoring=ignoring)


class KeyedPipeline:
    """The tables, job and topic of pipeline_app.py's Kafka -> s.raw -> s.agg pipeline on a fresh
    catalog, and the records produced to it (check them with :func:`check_exactly_once`)."""

    def __init__(self, spec: Any, broker: Any, topic: str, pad: Callable[[int], int]) -> None:
        self.cat = spec.open()
        self.cat.create_namespace("s")
        self.raw = self.cat.create_table("s.raw", RAW)
        self.agg = self.cat.create_table("s.agg", AGG)
        register_job(spec.url, "agg", sources=["s.raw"], sinks=["s.agg"])
        broker.create_topic(topic, 2)
        self.broker, self.topic, self.pad = broker, topic, pad
        self.produced: dict[tuple[int, int], tuple[str, str]] = {}

    def produce(self, n: int) -> None:
        """n keyed records; a value's padding is ``pad(i)`` characters."""
        base = len(self.produced)
        keys = [f"k{base + i}" for i in range(n)]
        values = [f"val-{base + i}-" + "x" * self.pad(i) for i in range(n)]
        for i, (partition, offset) in enumerate(self.broker.produce(self.topic, values, keys=keys)):
            self.produced[(partition, offset)] = (keys[i], values[i])


# What each run before the last one does: ("delay", seconds after READY) | ("failpoint", spec)
# | ("after_commit", table): SIGKILL as soon as a new commit of the table is visible
# | ("pause_after_commit", job): SIGKILL between the sink's catalog commit and Spark's commit log (a hook).
# Each run costs a Spark start-up (30-60 s on the shared 2-core machine), so each backend takes two kills
# and each kind of kill is made once: a failpoint inside the commit (before the database commit on SQLite,
# with the locks held on PostgreSQL) and a kill between the sink's commit and Spark's commit log (the root
# job on SQLite, the derived job on PostgreSQL). A kill at a random moment ("delay") is left to the soak
# variant: it hits one of these points or none.
PLANS = {
    "sqlite": [("failpoint", "commit.before_db_commit=exit"), ("pause_after_commit", "ingest")],
    "postgres": [("failpoint", "commit.locked=exit"), ("pause_after_commit", "agg")],
}
# `make test` runs the kill that only a streaming pipeline has, in one pipeline on PostgreSQL with S3:
# between a sink's catalog commit and Spark's commit log, of the root job and of the derived job at once
# (the root job's batch committed and held, the derived job's batch of it committed and held, then the
# kill), whose replays must commit nothing twice (two Spark applications). On SQLite the same replay of a root job's
# committed batch is made in `make test` by tests/streaming/test_kafka_ingest.py and
# test_spark_versions.py (foreach_batch); the failpoint kills inside the commit by
# tests/catalog/test_transactions.py (a process killed at each point, both backends). With Spark around
# them, every kind of kill on each backend runs in `make test-long` (test_exactly_once_across_every_kind_of_crash).
SHORT_PLANS = {"postgres": [("pause_after_commit", "ingest,agg")]}
# The soak variant (LAKESTEP_CRASH_KILLS=N): N runs, each killed in a way drawn at random from these.
KINDS = [("delay", None), ("after_commit", "s.raw"), ("after_commit", "s.agg"), ("pause_after_commit", "agg"),
         ("pause_after_commit", "ingest"), ("failpoint", "commit.before_db_commit=exit"),
         ("failpoint", "commit.locked=exit"), ("failpoint", "commit.after_add=exit")]


def _plan(spec: Any, rnd: random.Random, plans: dict[str, list[tuple[str, str | None]]]) -> list[tuple[str, str | None]]:
    kills = int(os.environ.get("LAKESTEP_CRASH_KILLS", "0"))
    return [rnd.choice(KINDS) for _ in range(kills)] if kills > 0 else plans[spec.backend]


@pytest.mark.parametrize("catalog_spec", ["postgres-s3"], indirect=True)
def test_exactly_once_across_crashes(catalog_spec, kafka_broker, kafka_topic_name, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """The short run (`make test`): a kill between a sink's catalog commit and Spark's commit log."""
    _crash_run(catalog_spec, kafka_broker, kafka_topic_name, tmp_path, SHORT_PLANS)


@pytest.mark.long
@pytest.mark.parametrize("catalog_spec", CATALOGS, indirect=True)
def test_exactly_once_across_every_kind_of_crash(catalog_spec, kafka_broker, kafka_topic_name, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """`make test-long`: every kind of kill of PLANS on each backend, inside the commit too."""
    _crash_run(catalog_spec, kafka_broker, kafka_topic_name, tmp_path, PLANS)


def _crash_run(catalog_spec, kafka_broker, kafka_topic_name, tmp_path,  # type: ignore[no-untyped-def]
               plans: dict[str, list[tuple[str, str | None]]]) -> None:
    seed = int(os.environ.get("LAKESTEP_CRASH_SEED", str(time.time_ns() % 2**32)))
    print(f"exactly-once crash test: LAKESTEP_CRASH_SEED={seed} replays this run's delays, kills and records")
    rnd = random.Random(seed)
    started = time.time()
    topic = kafka_topic_name()
    kp = KeyedPipeline(catalog_spec, kafka_broker, topic, pad=lambda i: rnd.randint(0, 20))
    cat, raw, agg, produce, produced = kp.cat, kp.raw, kp.agg, kp.produce, kp.produced

    args = ["--catalog", catalog_spec.url, "--bootstrap", kafka_broker.bootstrap_servers, "--topic", topic,
            "--checkpoints", str(tmp_path / "ck")]
    args += [a for kv in catalog_spec.storage for a in ("--storage", f"{kv[0]}={kv[1]}")]
    produce(150)
    log: list[str] = []
    run = 0
    for kind, arg in _plan(catalog_spec, rnd, plans):
        run += 1
        app = App(tmp_path, run, args, arg if kind == "failpoint" else None,
                  arg if kind == "pause_after_commit" else None)
        heads = (raw.version, agg.version)
        try:
            app.wait(app.ready, "READY", 120)
            if kind == "delay":
                delay = rnd.uniform(5.0, 25.0)
                time.sleep(delay)
                log.append(f"run {run}: killed {delay:.1f}s after READY")
            elif kind == "after_commit":
                n0 = cat.load_table(arg).count()  # a commit with rows: its replay has files to commit
                app.wait(lambda: cat.load_table(arg).count() > n0, f"a commit of rows to {arg}", 150)
                log.append(f"run {run}: killed right after {arg} v{cat.load_table(arg).version}")
            elif kind == "pause_after_commit":
                assert arg is not None
                for job in arg.split(","):
                    app.wait(app.paused(job).exists, f"a commit of job {job} with rows", 150)
                log.append(f"run {run}: killed after the catalog commits of "
                           f"{', '.join(app.paused(job).read_text() for job in arg.split(','))}, before Spark's "
                           f"commit log")
            else:  # the failpoint kills the Python worker of the first commit: what does Spark do?
                try:
                    # a hang, not a speed limit
                    wait_until(lambda: app.exited() is not None, "the app to fail", timeout=300)
                    outcome = f"app exited with status {app.exited()}"
                except AssertionError:
                    outcome = "app still running after 300s"
                first = next((ln for ln in app.out.read_text(errors="replace").splitlines()
                              if ln.startswith("QUERY FAILED")), "")
                log.append(f"run {run}: failpoint {arg}: {outcome}; {first[:300]}")
                # the failpoint killed the process inside its first commit, which never landed, and the
                # query failed with it (pipeline_app exits 3): no commit at all in this run
                assert app.exited() == 3 and first, f"seed {seed}, run {run}: {outcome}\n{app.tail()}"
                assert (cat.load_table("s.raw").version, cat.load_table("s.agg").version) == heads, (
                    f"seed {seed}, run {run}: a commit landed although every commit of the run died at {arg}")
        finally:
            app.kill()
        produce(rnd.randint(30, 80))

    # the last run: no faults, until everything is in and the derived job has caught up
    run += 1
    app = App(tmp_path, run, args, None)
    p = Pipeline(cat)
    try:
        app.wait(app.ready, "READY", 120)
        app.wait(lambda: raw.count() >= len(produced), f"{len(produced)} rows in s.raw", 240)
        last = max(h.barrier for h in raw.history() if h.barrier is not None and h.added_rows)
        app.wait(lambda: (p.frontier("s.agg") or 0) >= last, f"s.agg to precommit barrier {last}", 240)
    finally:
        app.kill()
    elapsed = time.time() - started
    print(f"\n[{catalog_spec.backend}{'-s3' if catalog_spec.on_s3 else ''}] {len(produced)} records, {run} runs, {elapsed:.0f}s\n  " + "\n  ".join(log))

    check_exactly_once(cat, produced, last)
    cat.close()
