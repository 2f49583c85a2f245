"""The crash tests' process-tree killing (lakestep/testing/processes.py), and waiting for it."""

from __future__ import annotations

from lakestep.testing.processes import alive, children, descendants, kill_tree, send  # noqa: F401
from tests.waiting import wait_until


def wait_dead(pids: set[int], what: str, timeout: float = 60) -> None:
    """Step 3."""
    wait_until(lambda: not any(alive(pid) for pid in pids), f"{what} to die of SIGKILL", timeout=timeout,
               detail=lambda: f"still alive: {[pid for pid in pids if alive(pid)]}")
