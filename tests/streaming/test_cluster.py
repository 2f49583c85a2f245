"""lakestep on a real Spark standalone cluster (tests/sparkcluster.py): README "On a cluster" as written,
exactly once when the cluster loses a worker in the middle of a micro-batch, and
``foreach_batch(..., writer="spark")`` counting the rows the executors wrote.

The README test runs first, while both workers are up; the crash test kills one.

The pipeline of the local-mode crash test (pipeline_app.py, with its second
derived job: Kafka -> s.raw -> s.agg -> s.agg2) is submitted with
``spark-submit --py-files lakestep.zip`` to the cluster of tests/sparkcluster.py
(a master and two workers, separate JVMs), from a directory of its own; the
catalog is on PostgreSQL, the warehouse on the S3 server. Executors import
lakestep only from the zip and cannot reach the catalog database (tests/cluster_hook).

1. worker 0 is armed: its first sink task that wrote rows holds after writing its files;
2. once that task holds (a marker file it wrote: a condition, not a delay), worker 0's JVM,
   its executor's JVM and the executor's Python workers are SIGKILLed together;
3. more records are produced; Spark reschedules the lost task on worker 1 and the pipeline goes on;
4. once every record is in and both derived jobs precommitted the last barrier with rows,
   the exactly-once check of test_exactly_once.py runs (every record once in s.raw, every
   micro-batch committed once, s.agg = f(s.raw) and s.agg2 = g(s.agg) at every precommitted
   barrier, exact integers), and no executor tried to open the catalog database;
5. the held task's files are in storage but not in the table (orphans for cleanup), and a later
   attempt of the same task (same batch and partition) is what was committed.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pytest

from lakestep.barrier import Pipeline
from lakestep.streaming import register_job
from tests.sparkcluster import REPO_ROOT, lakestep_zip
from tests.streaming.test_exactly_once import AGG, AGG2, RAW, App, check_exactly_once

pytestmark = [pytest.mark.spark, pytest.mark.kafka, pytest.mark.slow]


def _cluster_block() -> str:
    text = (REPO_ROOT / "README.md").read_text()
    section = text.split("## On a cluster", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```bash\n(.*?)```", section, flags=re.S)
    assert blocks, "README's 'On a cluster' section has no bash block"
    return blocks[0]


def _readme_runner(catalog_spec, spark_cluster, tmp_path: Path):  # type: ignore[no-untyped-def]
    """Runs a bash script as README "On a cluster" says to: from a copy of the repository's lakestep/ and
    examples/ (a fresh clone, no lakestep installed on the executors), against the test's standalone cluster,
    with the catalog of ``catalog_spec`` and a spark-defaults.conf as a cluster's would say it."""
    clone = tmp_path / "clone"
    for part in ("lakestep", "examples"):
        shutil.copytree(REPO_ROOT / part, clone / part, ignore=shutil.ignore_patterns("__pycache__"))
    s3 = catalog_spec.storage_options
    conf = tmp_path / "conf"  # as a cluster's spark-defaults.conf would say it
    conf.mkdir()
    shutil.copy(spark_cluster.conf / "log4j2.properties", conf / "log4j2.properties")
    aws = {"AWS_ACCESS_KEY_ID": s3["access_key"], "AWS_SECRET_ACCESS_KEY": s3["secret_key"],
           "AWS_REGION": s3["region"], "AWS_ENDPOINT_URL": s3["endpoint_override"]}
    defaults = {**{f"spark.executorEnv.{k}": v for k, v in aws.items()},
                "spark.executor.memory": "512m", "spark.driver.host": "127.0.0.1",
                "spark.driver.bindAddress": "127.0.0.1", "spark.ui.enabled": "false",
                "spark.driver.extraJavaOptions": f"-Dlog4j2.configurationFile=file:{conf / 'log4j2.properties'} "
                                                 "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC",
                "spark.executor.extraJavaOptions": "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"}
    (conf / "spark-defaults.conf").write_text("".join(f"{k} {v}\n" for k, v in defaults.items()))
    env = spark_cluster.driver_env(
        SPARK_CONF_DIR=str(conf), PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
        SPARK_MASTER=spark_cluster.url, LAKESTEP_CATALOG=catalog_spec.url, LAKESTEP_WAREHOUSE=catalog_spec.warehouse,
        **aws)

    def run(script: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["bash", "-euo", "pipefail", "-c", script], cwd=clone, env=env, capture_output=True,
                              text=True, timeout=600)

    return run


@pytest.mark.parametrize("catalog_spec", ["postgres-s3"], indirect=True)
def test_readme_cluster_commands_run(catalog_spec, spark_cluster, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """README "On a cluster": its commands, as written, against the test's standalone cluster
    (tests/sparkcluster.py), from a copy of the repository's lakestep/ and examples/ (a fresh clone,
    no lakestep installed on the executors), with the catalog on PostgreSQL and the warehouse on S3."""
    block = _cluster_block()
    proc = _readme_runner(catalog_spec, spark_cluster, tmp_path)(block)
    assert proc.returncode == 0 and "\nok: " in f"\n{proc.stdout}", f"{block}\n{proc.stdout}\n{proc.stderr[-4000:]}"
    assert "lakestep.zip" in proc.stdout.split("executors run lakestep:", 1)[1].splitlines()[0], proc.stdout
    assert spark_cluster.db_attempts() == "", spark_cluster.db_attempts()


# `make test-long`: the same README commands without the zip, a second spark-submit (~40 s). `make test` checks
# the same register() check with a worker Python that lacks lakestep in local mode
# (tests/streaming/test_executors.py::test_register_names_a_worker_python_without_lakestep).
@pytest.mark.long
@pytest.mark.parametrize("catalog_spec", ["postgres-s3"], indirect=True)
def test_readme_cluster_commands_without_the_zip_fail_before_any_query(catalog_spec, spark_cluster,  # type: ignore[no-untyped-def]
                                                                         tmp_path: Path) -> None:
    """Without ``--py-files`` the executors have no lakestep: register() says so before any query starts
    (the other mistake, the zip missing from spark-submit's PYTHONPATH: tests/streaming/test_executors.py)."""
    block = _cluster_block()
    broken = block.replace("--py-files lakestep.zip", "")
    assert broken != block
    proc = _readme_runner(catalog_spec, spark_cluster, tmp_path)(broken)
    out = proc.stdout + proc.stderr  # spark-submit passes its Python's stderr on as stdout
    assert proc.returncode != 0 and "SparkSetupError" in out and "lakestep cannot run on Spark's executors" in out \
        and "No module named 'lakestep'" in out, f"{broken}\n{proc.stdout}\n{proc.stderr[-4000:]}"
    assert spark_cluster.db_attempts() == "", spark_cluster.db_attempts()


@pytest.mark.parametrize("catalog_spec", ["sqlite"], indirect=True)
def test_spark_writer_counts_rows_on_a_cluster(catalog_spec, spark_cluster, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """``foreach_batch(..., writer="spark")`` on the cluster (tests/streaming/native_cluster_app.py, submitted
    with the zip): the executors write the files, the driver commits them; a batch whose files hold fewer
    rows than Spark counted on the executors (a file lost before the driver listed it, as when executors
    write to a disk the driver does not see) is refused and nothing of it is committed. Local mode does
    not count (its executors are the driver's threads): this is where the count is tested."""
    cat = catalog_spec.open()
    cat.create_namespace("n")
    t = cat.create_table("n.t", pa.schema([pa.field("id", pa.int64(), nullable=False), ("amount", pa.int64())]))
    dist = tmp_path / "dist"
    dist.mkdir()
    cmd = spark_cluster.submit_command(
        [str(REPO_ROOT / "tests" / "streaming" / "native_cluster_app.py"), catalog_spec.url, "n.t", t.location],
        lakestep_zip(dist / "lakestep.zip"))
    proc = subprocess.run(cmd, cwd=dist, env=spark_cluster.driver_env(), capture_output=True, text=True, timeout=600)
    out = proc.stdout
    assert proc.returncode == 0 and "BATCH 0 committed" in out, f"{out}\n{proc.stderr[-4000:]}"
    assert f"MASTER {spark_cluster.url}" in out, out
    assert re.search(r"BATCH 1 refused: Spark wrote 2 row\(s\) of batch 1 for n\.t, but the files the driver "
                     r"finds under \S+ hold [01]", out), f"{out}\n{proc.stderr[-4000:]}"
    t = t.refresh()
    assert (t.count(), [(h.job_id, h.batch_id) for h in t.history() if h.version > 0]) == (3, [("feed", 0)])
    on_disk = sorted(str(f.relative_to(t.location)) for f in Path(t.location).rglob("*") if f.is_file())
    assert on_disk == sorted(f.path for f in t.files())  # batch 1's remaining file was deleted too
    assert spark_cluster.db_attempts() == "", spark_cluster.db_attempts()
    cat.close()


@pytest.mark.parametrize("catalog_spec", ["postgres-s3"], indirect=True)
def test_exactly_once_when_a_worker_dies_mid_batch(catalog_spec, spark_cluster, kafka_broker, kafka_topic_name,  # type: ignore[no-untyped-def]
                                                   tmp_path) -> None:
    cat = catalog_spec.open()
    cat.create_namespace("s")
    raw = cat.create_table("s.raw", RAW)
    agg = cat.create_table("s.agg", AGG)
    agg2 = cat.create_table("s.agg2", AGG2)
    register_job(catalog_spec.url, "agg", sources=["s.raw"], sinks=["s.agg"])
    register_job(catalog_spec.url, "agg2", sources=["s.agg"], sinks=["s.agg2"])
    topic = kafka_topic_name()
    kafka_broker.create_topic(topic, 2)
    produced: dict[tuple[int, int], tuple[str, str]] = {}

    def produce(n: int) -> None:
        base = len(produced)
        keys = [f"k{base + i}" for i in range(n)]
        values = [f"val-{base + i}-" + "x" * (i % 17) for i in range(n)]
        for i, (p, off) in enumerate(kafka_broker.produce(topic, values, keys=keys)):
            produced[(p, off)] = (keys[i], values[i])

    dist = tmp_path / "dist"
    dist.mkdir()
    zipped = lakestep_zip(dist / "lakestep.zip")
    args = ["--catalog", catalog_spec.url, "--bootstrap", kafka_broker.bootstrap_servers, "--topic", topic,
            "--checkpoints", str(tmp_path / "ck"), "--derived2", "--stagger", "--interval", "5", "--max-offsets", "100"]
    args += [a for kv in catalog_spec.storage for a in ("--storage", f"{kv[0]}={kv[1]}")]
    t0 = time.monotonic()
    phases: list[str] = []

    def phase(what: str) -> None:
        phases.append(f"{what} at {time.monotonic() - t0:.0f}s")

    spark_cluster.hold_next_sink_task()  # step 1
    app = App(tmp_path, 1, args, None, submit=(spark_cluster, zipped))
    try:
        app.wait(app.ready, "READY", 240)
        phase("READY")
        # records only now: the queries started idle (the driver JVM gives each data source's Python process 10 s
        # to connect back, which a loaded machine can exceed while batches run)
        produce(120)
        # lakestep on the executors is the shipped zip, unpacked in each worker's own directory
        found = re.search(r"^EXECUTORS (.*)$", app.out.read_text(), flags=re.M)
        assert found and found.group(1) != "None", app.tail()
        locations = re.findall(r"location='([^']*)'", found.group(1))
        assert locations and all(loc.endswith("/lakestep.zip") and "/worker" in loc and str(tmp_path) not in loc
                                 for loc in locations), found.group(1)

        held = app.wait(spark_cluster.held, "a sink task on worker 0 to hold mid-batch", 240)  # step 2
        heads = (raw.refresh().version, agg.refresh().version, agg2.refresh().version)
        phase("held")
        spark_cluster.kill_worker(0)
        phase("killed")
        print(f"\nkilled worker 0 while its task held: {held}; table versions {heads}")
        assert app.exited() is None, app.tail()

        produce(40)  # step 3
        app.wait(lambda: raw.count() >= len(produced), f"{len(produced)} rows in s.raw", 240)  # step 4
        phase("all in s.raw")
        p = Pipeline(cat)
        last = max(h.barrier for h in raw.history() if h.barrier is not None and h.added_rows)
        for t in ("s.agg", "s.agg2"):
            app.wait(lambda t=t: (p.frontier(t) or 0) >= last, f"{t} to precommit barrier {last}", 240)
        phase("derived caught up")
    finally:
        app.kill()
    print("; ".join(phases))
    check_exactly_once(cat, produced, last, derived2=True)
    assert spark_cluster.db_attempts() == "", f"executors tried to reach the catalog database:\n" \
                                              f"{spark_cluster.db_attempts()}"
    # the lost attempt's files are orphans in storage; its task ran again (another attempt) and that was committed
    m = re.match(r"(\S+) ((b\d+-p\d+-a)\d+-)", held)
    assert m, held
    ident, lost, prefix = m.group(1, 2, 3)
    table = cat.load_table(ident)
    committed = [f.path.rsplit("/", 1)[-1] for f in table.files()]
    stored = [path.rsplit("/", 1)[-1] for path in catalog_spec.files_under(table.location)]
    assert any(name.startswith(lost) for name in stored), (lost, stored)
    assert not any(name.startswith(lost) for name in committed), (lost, committed)
    assert any(name.startswith(prefix) for name in committed), (prefix, committed)
    cat.close()
