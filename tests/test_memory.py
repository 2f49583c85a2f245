"""lakestep's processes allocate Arrow memory from a pool that gives it back (lakestep/_memory.py).

Each case runs in a fresh interpreter: pyarrow reads its default pool once, on import. The
memory growth the choice prevents is measured by the endurance run (benchmarks/soak.py) and the
reproduction in lakestep/_memory.py's docstring, not here: no thresholds in tests.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

# the lakestep command's entry point, then a table written and read in the same process
PROBE = """
import json, sys
{before}
from lakestep.cli import main
try:
    main(["--version"])
except SystemExit:
    pass
import pyarrow as pa
from lakestep import Catalog
cat = Catalog(warehouse=sys.argv[1])
cat.create_namespace("m")
t = cat.create_table("m.t", pa.schema([("k", pa.int64())]))
t.append({{"k": list(range(1000))}})
rows = t.to_arrow()
import os
print(json.dumps({{"pool": pa.default_memory_pool().backend_name, "rows": rows.num_rows,
                  "env": os.environ.get("ARROW_DEFAULT_MEMORY_POOL")}}))
"""


def probe(tmp_path: Path, *, env: dict[str, str] | None = None, before: str = "") -> dict[str, object]:
    e = {k: v for k, v in os.environ.items() if k != "ARROW_DEFAULT_MEMORY_POOL"}
    e.update(env or {})
    e["PYTHONPATH"] = str(REPO)
    out = subprocess.run([sys.executable, "-c", PROBE.format(before=before), str(tmp_path / "wh")], env=e,
                         capture_output=True, text=True, timeout=120, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def pyarrow_default() -> str:
    """pyarrow's own default pool in a fresh interpreter (the variable unset)."""
    return subprocess.run([sys.executable, "-c", "import pyarrow as pa; print(pa.default_memory_pool().backend_name)"],
                          env={k: v for k, v in os.environ.items() if k != "ARROW_DEFAULT_MEMORY_POOL"},
                          capture_output=True, text=True, check=True).stdout.strip()


def test_the_lakestep_command_runs_on_jemalloc(tmp_path: Path) -> None:
    """``plain``: pyarrow's own default here (mimalloc on Linux), shown when the test fails."""
    plain = pyarrow_default()
    got = probe(tmp_path)
    assert got == {"pool": "jemalloc", "rows": 1000, "env": "jemalloc"}, (plain, got)


def test_a_pool_the_user_chose_is_kept(tmp_path: Path) -> None:
    assert probe(tmp_path, env={"ARROW_DEFAULT_MEMORY_POOL": "mimalloc"})["pool"] == "mimalloc"  # the default
    assert probe(tmp_path / "system", env={"ARROW_DEFAULT_MEMORY_POOL": "system"})["pool"] == "system"


def test_a_process_that_imported_pyarrow_first_is_left_alone(tmp_path: Path) -> None:
    """pyarrow chose its pool when it was imported: the variable set later would say what is not
    so (and leak into child processes), so it is not set."""
    got = probe(tmp_path, before="import os, pyarrow; first = pyarrow.default_memory_pool().backend_name")
    plain = pyarrow_default()
    assert got["pool"] == plain and got["env"] is None
