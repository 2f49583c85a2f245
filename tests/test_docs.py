"""The README's examples run as written, and the demo runs."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_readme_python_blocks_run(tmp_path: Path) -> None:
    text = (ROOT / "README.md").read_text()
    blocks = [b for b in re.findall(r"```python\n(.*?)```", text, flags=re.S) if "not run by the doc test" not in b]
    assert blocks
    for i, code in enumerate(blocks):
        script = tmp_path / f"block{i}.py"
        script.write_text(code)
        for _ in range(2):  # twice: examples must be re-runnable (exist_ok, idempotent keys)
            proc = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True,
                                  timeout=300)
            assert proc.returncode == 0, f"README block {i} failed:\n{code}\n{proc.stderr}"


def test_demo_runs(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-m", "examples.demo"], cwd=tmp_path, capture_output=True, text=True,
                          timeout=600, env=env)
    assert proc.returncode == 0, proc.stderr
    assert "history of shop.orders" in proc.stdout and "COMPACT" in proc.stdout


def test_design_citations_point_at_existing_sections() -> None:
    """Code and docs cite ``docs/design.md §N``: each section exists, and nothing cites a file outside the repo."""
    headings = set(re.findall(r"^#{2,3} (\d+(?:\.\d+)?)\.? ", (ROOT / "docs" / "design.md").read_text(), flags=re.M))
    cited: set[str] = set()
    outside = ("../" + "shared", "DESIGN" + ".md")  # spelled apart so that this file passes its own check
    for path in [*ROOT.glob("lakestep/**/*.py"), *ROOT.glob("tests/**/*.py"), ROOT / "README.md"]:
        text = path.read_text()
        assert not any(o in text for o in outside), f"{path} cites a design file outside the repo"
        cited |= set(re.findall(r"docs/design\.md §(\d+(?:\.\d+)?)", text))
    assert cited, "nothing cites docs/design.md"
    assert cited <= headings, f"cited sections missing from docs/design.md: {sorted(cited - headings)}"


def _cluster_block() -> str:
    text = (ROOT / "README.md").read_text()
    section = text.split("## On a cluster", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```bash\n(.*?)```", section, flags=re.S)
    assert blocks, "README's 'On a cluster' section has no bash block"
    return blocks[0]


@pytest.mark.spark
@pytest.mark.slow
@pytest.mark.parametrize("catalog_spec", ["postgres-s3"], indirect=True)
def test_readme_cluster_commands_run(catalog_spec, spark_cluster, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """README "On a cluster": its commands, as written, against the test's standalone cluster
    (tests/sparkcluster.py), from a copy of the repository's lakestep/ and examples/ (a fresh clone,
    no lakestep installed on the executors), with the catalog on PostgreSQL and the warehouse on S3;
    and without the zip on the executors they fail with SparkSetupError saying so."""
    block = _cluster_block()
    clone = tmp_path / "clone"
    for part in ("lakestep", "examples"):
        shutil.copytree(ROOT / part, clone / part, ignore=shutil.ignore_patterns("__pycache__"))
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

    proc = run(block)
    assert proc.returncode == 0 and "\nok: " in f"\n{proc.stdout}", f"{block}\n{proc.stdout}\n{proc.stderr[-4000:]}"
    assert "lakestep.zip" in proc.stdout.split("executors run lakestep:", 1)[1].splitlines()[0], proc.stdout

    # without --py-files the executors have no lakestep: register() says so before any query starts (the
    # other mistake, the zip missing from spark-submit's PYTHONPATH: tests/streaming/test_executors.py)
    broken = block.replace("--py-files lakestep.zip", "")
    assert broken != block
    proc = run(broken)
    out = proc.stdout + proc.stderr  # spark-submit passes its Python's stderr on as stdout
    assert proc.returncode != 0 and "SparkSetupError" in out and "lakestep cannot run on Spark's executors" in out \
        and "No module named 'lakestep'" in out, f"{broken}\n{proc.stdout}\n{proc.stderr[-4000:]}"
    assert spark_cluster.db_attempts() == "", spark_cluster.db_attempts()
