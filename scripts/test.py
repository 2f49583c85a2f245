"""Run the test suite in two lanes at once: what `make test` (and so CI) runs.

    python scripts/test.py [pytest arguments ...]     # both lanes
    LAKESTEP_TEST_LANES=1 python scripts/test.py ...  # one serial pytest run

1. The *Spark lane* runs every test marked ``spark`` (``-m spark``), one after
   the other: two Spark applications at once on a small machine starve each
   other, and Spark gives a data source's Python worker 10 s to start and
   connect back (a hard-coded limit in Spark, no setting).
2. The *other lane* runs everything else (``-m "not spark"``) beside it: the
   catalog, barrier, CLI and query tests use PostgreSQL, SQLite and their own
   processes, and share the machine with one Spark application at a time.
3. Each lane is its own pytest process with its own ``--basetemp``; its
   session fixtures (PostgreSQL cluster, Kafka broker, S3 server, ...) are its
   own, on free ports. The lanes' lines are printed as they come, each with
   its lane's prefix; each lane ends with pytest's own summary.
4. The exit status is 0 when each lane passed or collected nothing (pytest's
   status 5, e.g. arguments that select only catalog tests) and at least one
   ran tests; otherwise the first failing lane's status.

Not guaranteed: the lanes' test order is pytest's, per lane; a test that is
not marked ``spark`` but starts a Spark application would share the machine
with the Spark lane (tests/conftest.py refuses such a test: it asks for the
``spark`` fixture without the mark).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LANES = (("spark", "spark"), ("other", "not spark"))


def _pump(name: str, proc: subprocess.Popen[bytes], lock: threading.Lock) -> None:
    assert proc.stdout is not None
    for raw in iter(proc.stdout.readline, b""):
        line = raw.decode(errors="replace").rstrip("\n")
        with lock:
            print(f"[{name:5}] {line}", flush=True)


def main(argv: list[str]) -> int:
    if "-m" in argv or any(a.startswith("-m") and a != "-m" and not a.startswith("--") for a in argv):
        print("scripts/test.py: -m selects the lanes' tests itself; run pytest directly to pass -m",
              file=sys.stderr)
        return 2
    if os.environ.get("LAKESTEP_TEST_LANES") == "1":
        return subprocess.call([sys.executable, "-m", "pytest", *argv], cwd=ROOT)
    started = time.monotonic()
    lock = threading.Lock()
    with tempfile.TemporaryDirectory(prefix="lakestep-tests-") as tmp:
        procs: list[tuple[str, subprocess.Popen[bytes], threading.Thread]] = []
        for name, marks in LANES:
            proc = subprocess.Popen(
                [sys.executable, "-m", "pytest", "-m", marks, f"--basetemp={Path(tmp) / name}", *argv],
                cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                env={**os.environ, "PYTHONUNBUFFERED": "1", "LAKESTEP_TEST_LANE": name})
            pump = threading.Thread(target=_pump, args=(name, proc, lock), daemon=True)
            pump.start()
            procs.append((name, proc, pump))
        try:
            codes = {}
            for name, proc, pump in procs:
                codes[name] = proc.wait()
                pump.join()
        except KeyboardInterrupt:
            for _, proc, _ in procs:
                proc.terminate()
            raise
    minutes = (time.monotonic() - started) / 60
    print(f"lanes: {', '.join(f'{n} exit {c}' for n, c in codes.items())}; {minutes:.1f} min", flush=True)
    ran = [c for c in codes.values() if c != 5]
    if not ran:
        return 5
    failed = [c for c in ran if c != 0]
    return failed[0] if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
