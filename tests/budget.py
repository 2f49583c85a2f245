"""The suite's time budget: what `make test` may spend, and the tests allowed to be slow.

`make test` (scripts/test.py) must finish within 25 minutes on the 2-core machine. To keep it
there, no single test may take more than :data:`LIMIT_S` seconds (setup, call and teardown added up,
as pytest measured them in that run), unless :data:`ALLOWED` names it with the reason it must be
slow. tests/test_budget.py checks every run's durations against this after the lanes finish.

Long endurance runs do not belong in `make test` at all: they are marked ``long`` and run by
`make test-long`; `make test` runs a short version of each.
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

LIMIT_S = 60.0
"""No test outside :data:`ALLOWED` may take longer than this (seconds, all phases)."""

BUDGET_MIN = 25
"""`make test`'s budget in minutes, wall time, on the 2-core machine (README, "Two commands")."""

ALLOWED: dict[str, str] = {
    # nodeid (or a prefix of it, ending before the parameters) -> why it must take over LIMIT_S.
}


def load(files: list[Path]) -> dict[str, float]:
    """Each test's total duration (setup + call + teardown) from the lanes' duration files
    (tests/conftest.py ``pytest_runtest_logreport``)."""
    totals: dict[str, float] = defaultdict(float)
    for path in files:
        for line in path.read_text().splitlines():
            if line.strip():
                row = json.loads(line)
                totals[row["nodeid"]] += float(row["duration"])
    return dict(totals)


def allowed(nodeid: str) -> bool:
    return any(nodeid == key or nodeid.startswith(key + "[") for key in ALLOWED)


def over_budget(totals: dict[str, float], limit: float = LIMIT_S) -> list[tuple[str, float]]:
    """The tests that took longer than ``limit`` and are not allowed to, slowest first."""
    return sorted(((n, d) for n, d in totals.items() if d > limit and not allowed(n)),
                  key=lambda nd: -nd[1])
