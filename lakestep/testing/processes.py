"""Process trees from /proc: their members, memory and descriptors, and killing one with SIGKILL
the way a machine dies: every process at once.

Spark's ``pyspark.daemon`` calls setsid(), so its Python workers leave the
process group of the JVM that started them: a process group is not enough.

1. the tree under the root is frozen (SIGSTOP) from the top down, three rounds,
   so that nothing forks a child the walk would miss;
2. the root's process group and every process found are sent SIGKILL;
3. the caller waits (the suite's ``tests.processes.wait_dead``) until none of them is alive (a zombie counts as dead).

Not guaranteed: a process that double-forked out of the tree before step 1 is not found.

Used by the suite's crash tests and by ``benchmarks.soak`` (its supervisor kills and samples its
processes). Linux only (/proc).
"""

from __future__ import annotations

import collections
import os
import signal
from pathlib import Path


def children() -> dict[int, list[int]]:
    """Every process's children, from /proc."""
    kids: dict[int, list[int]] = collections.defaultdict(list)
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
            kids[ppid].append(int(entry))
    return kids


def descendants(root: int) -> set[int]:
    kids, out, todo = children(), set(), [root]
    while todo:
        for k in kids.get(todo.pop(), []):
            if k not in out:
                out.add(k)
                todo.append(k)
    return out


def send(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def kill_tree(root: int) -> set[int]:
    """Steps 1 and 2: SIGKILL ``root`` (a process group leader), its group and all its descendants.
    Returns the pids killed."""
    tree: set[int] = set()
    for _ in range(3):
        for pid in descendants(root) - tree:
            send(pid, signal.SIGSTOP)
            tree.add(pid)
    tree.add(root)
    try:
        os.killpg(root, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    for pid in tree:
        send(pid, signal.SIGKILL)
    return tree


def tree(root: int) -> set[int]:
    """``root`` and its descendants (the ones alive now)."""
    return {root, *descendants(root)} if alive(root) else set()


def rss_bytes(pids: set[int]) -> int:
    """The resident memory of ``pids``, summed (VmRSS; a process gone meanwhile counts 0)."""
    total = 0
    for pid in pids:
        try:
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1]) * 1024
                    break
        except OSError:
            continue
    return total


def open_fds(pids: set[int]) -> int:
    """The open file descriptors of ``pids``, summed."""
    total = 0
    for pid in pids:
        try:
            total += len(os.listdir(f"/proc/{pid}/fd"))
        except OSError:
            continue
    return total
