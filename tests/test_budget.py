"""The suite's budget guard (tests/budget.py): no test outside the allow-list takes over 60 s.

``test_no_test_over_the_limit`` reads the durations pytest recorded for every test of the run it
belongs to; scripts/test.py runs it after both lanes have finished (it is marked ``budget``, which
the lanes leave out). The other tests here check the guard itself, on made-up duration files.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

from tests import budget

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.budget
def test_no_test_over_the_limit() -> None:
    run = os.environ.get("LAKESTEP_TEST_RUN_DIR")
    if not run:
        pytest.skip("run by scripts/test.py after the lanes (it reads their durations)")
    files = sorted(Path(run).glob("durations-*.jsonl"))
    assert files, f"no durations recorded under {run}"
    totals = budget.load(files)
    assert totals, "the lanes recorded no durations"
    slow = budget.over_budget(totals)
    assert not slow, (f"tests over {budget.LIMIT_S:.0f} s that tests/budget.py ALLOWED does not name "
                      "(make them cheaper, move an endurance run to `make test-long`, or allow it "
                      "with the reason it must be slow):\n"
                      + "\n".join(f"  {d:7.1f} s  {n}" for n, d in slow))


def _write(path: Path, rows: list[tuple[str, str, float]]) -> Path:
    path.write_text("".join(json.dumps({"nodeid": n, "when": w, "duration": d, "outcome": "passed"}) + "\n"
                            for n, w, d in rows))
    return path


def test_guard_adds_phases_and_flags_unlisted_tests(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    a = _write(tmp_path / "durations-a.jsonl", [("t.py::fast", "call", 2.0), ("t.py::slow", "setup", 31.0),
                                                 ("t.py::slow", "call", 30.0), ("t.py::slow", "teardown", 0.5)])
    b = _write(tmp_path / "durations-b.jsonl", [("u.py::listed[sqlite]", "call", 300.0),
                                                 ("u.py::listed_not", "call", 61.0)])
    monkeypatch.setattr(budget, "ALLOWED", {"u.py::listed": "made-up reason"})
    totals = budget.load([a, b])
    assert totals["t.py::slow"] == pytest.approx(61.5)
    assert budget.over_budget(totals) == [("t.py::slow", 61.5), ("u.py::listed_not", 61.0)]
    assert budget.over_budget(totals, limit=100.0) == []


def test_allow_list_names_existing_tests_with_reasons() -> None:
    """Every allowed entry is a test function that exists (a stale entry would let a new test hide
    behind an old name) and says why it must be slow."""
    for key, why in budget.ALLOWED.items():
        assert len(why.split()) >= 4, f"{key}: say why it must be slow"
        path, _, name = key.partition("::")
        source = (ROOT / path).read_text()
        assert re.search(rf"def {re.escape(name.split('::')[-1])}\(", source), f"{key}: no such test"


def test_the_run_ends_with_what_failed(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """scripts/test.py's last lines name each lane's status and its failing tests (a CI log that keeps
    only its tail still says what broke), from the outcomes the lanes recorded."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("lakestep_test_runner", ROOT / "scripts" / "test.py")
    runner = importlib.util.module_from_spec(spec)
    assert spec.loader is not None
    spec.loader.exec_module(runner)
    rows = [("t.py::ok", "call", "passed"), ("t.py::bad", "setup", "passed"), ("t.py::bad", "call", "failed"),
            ("t.py::broken", "setup", "failed")]
    (tmp_path / "durations-spark.jsonl").write_text("".join(
        json.dumps({"nodeid": n, "when": w, "duration": 1.0, "outcome": o}) + "\n" for n, w, o in rows))
    runner._failures(tmp_path, {"spark": 1, "other": 0})
    assert capsys.readouterr().out.splitlines() == [
        "lane spark: exit 1, 2 failing:", "  failed: t.py::bad", "  error in setup: t.py::broken",
        "lane other: passed"]
