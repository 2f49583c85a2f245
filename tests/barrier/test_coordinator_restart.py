"""The coordinator's machine restarts: its process is killed with SIGKILL, a new one starts 5 s later (its lease: 3 s).

Nothing of a coordinator lives outside the catalog database, so the new one
(another holder) takes the lease once the old one's has expired, and seals
the epoch that is open: barriers resume from the last sealed epoch, none is
skipped or sealed twice, and the root commits made while no coordinator ran
are in that epoch (and read at its barrier).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pytest

from lakestep.barrier import OPEN_EPOCH, Pipeline
from tests.waiting import exited, tail, wait_until

pytestmark = pytest.mark.slow

REPO_ROOT = Path(__file__).resolve().parents[2]
GAP_SECONDS = 5.0  # the machine is down this long: the scenario, not a threshold
KV = pa.schema([("k", pa.int64()), ("v", pa.int64())])


def coordinator(url: str, holder: str, log: Path) -> subprocess.Popen[bytes]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO_ROOT), *filter(None, [env.get("PYTHONPATH")])])
    # --idle 0.3: epochs without root commits are sealed on the clock too (the waits below count seals)
    return subprocess.Popen([sys.executable, "-m", "lakestep", "coordinator", "--url", url, "--interval", "0.3",
                             "--idle", "0.3", "--lease", "3", "--holder", holder], cwd=REPO_ROOT, env=env,
                            stdout=log.open("wb"), stderr=subprocess.STDOUT, start_new_session=True)


def test_a_coordinator_killed_and_replaced_resumes_from_the_last_sealed_epoch(catalog_spec, tmp_path) -> None:  # type: ignore[no-untyped-def]
    cat = catalog_spec.open()
    procs: list[subprocess.Popen[bytes]] = []
    try:
        cat.create_namespace("s")
        t = cat.create_table("s.t", KV)
        p = Pipeline(cat)
        p.register_job("feed", sinks=["s.t"], external_input=True)
        log1, log2 = tmp_path / "first.log", tmp_path / "second.log"
        first = coordinator(catalog_spec.url, "first", log1)
        procs.append(first)
        # a coordinator that exited ends a wait at once
        wait_until(lambda: len(p.seals()) >= 3, "three seals", timeout=180, failed=exited(first, "the coordinator"),
                   detail=tail(log1))

        os.killpg(first.pid, signal.SIGKILL)  # the machine is gone: no lease released, nothing cleaned up
        first.wait(30)
        open_at_kill = p.open_epoch()
        sealed_at_kill = [s.barrier for s in p.seals()]
        assert sealed_at_kill == list(range(1, open_at_kill))
        # root commits while no coordinator runs: they land in the open epoch
        meantime = []
        for i in range(1, 4):
            with cat.transaction(job_id="feed", batch_id=i) as tx:
                tx.append(t, {"k": [i], "v": [i]}, barrier=OPEN_EPOCH)
            meantime.append(tx.results[0].version)
        time.sleep(GAP_SECONDS)
        assert p.open_epoch() == open_at_kill  # nobody sealed meanwhile

        second = coordinator(catalog_spec.url, "second", log2)
        procs.append(second)
        wait_until(lambda: len(p.seals()) >= open_at_kill + 2, "seals by the new coordinator", timeout=180,
                   failed=exited(second, "the new coordinator"), detail=tail(log2))

        seals = p.seals()
        assert [s.barrier for s in seals] == list(range(1, len(seals) + 1))  # no gap, nothing sealed twice
        assert {s.holder for s in seals if s.barrier < open_at_kill} == {"first"}
        assert {s.holder for s in seals if s.barrier >= open_at_kill} == {"second"}
        assert seals[open_at_kill - 1].token > seals[open_at_kill - 2].token  # a new lease, fenced
        history = {h.version: h for h in t.history()}
        assert [history[v].barrier for v in meantime] == [open_at_kill] * 3
        at = t.to_arrow(version=p.version_at("s.t", open_at_kill))
        assert sorted(at.column("k").to_pylist()) == [1, 2, 3]
        assert t.to_arrow(version=p.version_at("s.t", open_at_kill - 1)).num_rows == 0
        print(f"\nFAULT {catalog_spec.backend} coordinator SIGKILL + {GAP_SECONDS:g}s gap: last sealed {open_at_kill - 1}, the new "
              f"coordinator sealed {open_at_kill}..{seals[-1].barrier}, 3 root commits in epoch {open_at_kill}, "
              "0 lost, 0 duplicated")
    finally:
        for proc in procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
                try:
                    proc.wait(30)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait(30)
        cat.close()
