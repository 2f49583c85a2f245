"""The benchmarks the README and the issues name run, in a tiny configuration: each is an
entry point (``python -m benchmarks.X``) and must not rot. No timing is checked here."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_query_benchmark_runs(tmp_path: Path) -> None:
    out = tmp_path / "query.json"
    r = subprocess.run([sys.executable, "-m", "benchmarks.query", "--backends", "sqlite,postgres", "--rounds", "2",
                        "--files", "2", "--rows", "10", "--barriers", "1", "--out", str(out)],
                       cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    results = json.loads(out.read_text())["results"]
    assert set(results) == {"sqlite", "postgres"}
    for by_reader in results.values():
        assert set(by_reader) == {"arrow", "duckdb"}
        assert all(v["rounds"] == 2 for v in by_reader.values())
    assert "overhead ms" in r.stdout
