"""`make compat`'s short lane in `make test`: the compatibility suite (tests/streaming/
test_spark_versions.py) on Spark 3.5, the line furthest from the newest, in its own virtualenv
(scripts/compat.py; scripts/test.py makes that virtualenv beside the lanes as the run starts).
`make compat` runs every line."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.spark
def test_the_compatibility_suite_passes_on_spark_3_5(tmp_path: Path) -> None:
    out = tmp_path / "compat.json"
    proc = subprocess.run([sys.executable, "scripts/compat.py", "--only", "3.5", "--json", str(out)], cwd=ROOT,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=1800)
    assert proc.returncode == 0, proc.stdout[-6000:]
    [run] = json.loads(out.read_text())
    assert run["line"] == "3.5" and run["pyspark"].startswith("3.5.")
    # every test of the file ran or was skipped by a rule of compat.py (named in its reason)
    assert run["failed"] == 0 and run["passed"] >= 5, run
    assert proc.stdout.count("compat rule 'format'") == run["skipped"], proc.stdout[-3000:]
