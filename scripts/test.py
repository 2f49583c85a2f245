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
4. Each lane records every test's durations as pytest measured them (setup,
   call, teardown; tests/conftest.py) in the run's folder (``lakestep-tests-*``
   under the temp directory, printed at the end, kept): ``slowest.txt`` has the
   40 slowest tests of each lane, then the 40 that cost the most CPU (the lane's
   processes, from the end of the test before: on 2 cores both lanes share the
   CPU, so CPU, not a lane's wall time, is what the budget buys). The run ends with a one-screen summary: each
   lane's wall time, its 10 slowest tests and the share of the lane they take,
   then each lane's status and the tests that failed, last (a CI log's tail).
5. The Spark lane's JVMs start from a class-data archive made once per
   virtualenv, pyspark and JVM (lakestep/testing/spark.py): a Spark JVM starts in
   about half the time. Where it is missing it is made beside the running lanes,
   and the lane's JVMs started after it is complete map it. Every JVM of
   the lane compiles with C1 only (``JAVA_TOOL_OPTIONS``): short runs, less CPU.
6. When both lanes ran their whole selection, the budget guard runs last
   (tests/test_budget.py, marked ``budget``): it fails when a test outside
   tests/budget.py's allow-list took more than 60 s in this run.
7. The Spark lane's compatibility test runs the suite of tests/streaming/test_spark_versions.py
   on Spark 3.5 in a virtualenv of its own (scripts/compat.py), and tests/interop runs the JVM
   peers' Spark with their jars (scripts/jars.py): both are made beside the lanes as the run
   starts (``[prep]`` lines), when the whole suite runs (cached after the first run).
8. ``--long`` runs the endurance tests instead (marked ``long``: soaks, torture
   runs, the biggest scale curves), which `make test` leaves out: `make test-long`.
9. The exit status is 0 when each lane passed or collected nothing (pytest's
   status 5, e.g. arguments that select only catalog tests) and at least one
   ran tests, and the guard passed; otherwise the first failing status.

Not guaranteed: the lanes' test order is pytest's, per lane; a test that is
not marked ``spark`` but starts a Spark application would share the machine
with the Spark lane (tests/conftest.py refuses such a test: it asks for the
``spark`` fixture without the mark).
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LANES = (("spark", "spark"), ("other", "not spark"))
SLOWEST_KEPT, SLOWEST_SHOWN = 40, 10


def _pump(name: str, proc: subprocess.Popen[bytes], lock: threading.Lock, ended: dict[str, float]) -> None:
    assert proc.stdout is not None
    for raw in iter(proc.stdout.readline, b""):
        line = raw.decode(errors="replace").rstrip("\n")
        with lock:
            print(f"[{name:5}] {line}", flush=True)
    proc.wait()
    ended[name] = time.monotonic()


def _class_archive(lock: threading.Lock, making: list[threading.Thread]) -> dict[str, str]:
    """The Spark lane's class-data archive (lakestep/testing/spark.py): made once per virtualenv,
    pyspark and JVM (under the virtualenv, so `make clean` drops it), then mapped by every local
    Spark JVM of the lane (~2x faster start-up). Returns the lane's environment for it; {} when
    there is no java or pyspark. A missing archive is made in a thread of its own (appended to
    ``making``) while the lane already runs: its JVMs look for the file when they start, so the ones
    started before it is complete (renamed into place whole) run without it, the later ones with it."""
    if os.environ.get("LAKESTEP_SPARK_CLASS_ARCHIVE"):
        return {}
    sys.path.insert(0, str(ROOT))
    try:
        from lakestep.testing.spark import CLASS_ARCHIVE_ENV, class_archive_path, make_class_archive

        path = class_archive_path(Path(sys.prefix) / "spark-class-archive")
    except Exception as e:  # no java, no pyspark: the lane says so itself
        with lock:
            print(f"[spark] no class-data archive: {e}", flush=True)
        return {}
    if path.is_file():
        with lock:
            print(f"[spark] class-data archive {path.name}: cached", flush=True)
        return {CLASS_ARCHIVE_ENV: str(path)}

    def make() -> None:
        began = time.monotonic()
        ok = make_class_archive(path)
        with lock:
            what = f"made in {time.monotonic() - began:.0f} s" if ok else "could not be made"
            print(f"[spark] class-data archive {path.name}: {what} (the lane's JVMs started from now on map it)",
                  flush=True)

    making.append(threading.Thread(target=make, daemon=True))
    making[-1].start()
    return {CLASS_ARCHIVE_ENV: str(path)}


def _quick_jit() -> dict[str, str]:
    """Every JVM the Spark lane starts (its shared session's, the applications, benchmarks and demo it
    runs as processes, the JVM peers') compiles with C1 only: their runs are seconds long, and C2's
    compiler threads cost them ~20% more CPU than they save (benchmarks.freshness's smoke run: 84 s
    of CPU against 103-109 s). Nothing in `make test` judges a speed. A JAVA_TOOL_OPTIONS of the
    caller's own is kept as it is."""
    return {} if "JAVA_TOOL_OPTIONS" in os.environ else {"JAVA_TOOL_OPTIONS": "-XX:TieredStopAtLevel=1"}


def _summary(run: Path, walls: dict[str, float]) -> None:
    """Write the slowest tests of each lane to ``run/slowest.txt`` and print a short summary."""
    sys.path.insert(0, str(ROOT))
    from tests.budget import load

    kept, shown = [], []
    for name, wall in walls.items():
        path = run / f"durations-{name}.jsonl"
        totals = load([path]) if path.exists() else {}
        slowest = sorted(totals.items(), key=lambda nd: -nd[1])
        kept.append(f"# lane {name}: {len(totals)} tests, wall {wall / 60:.1f} min")
        kept += [f"{d:8.1f} s  {n}" for n, d in slowest[:SLOWEST_KEPT]]
        cpu = _cpu(path) if path.exists() else {}
        if cpu:
            kept.append(f"# lane {name}: CPU seconds of the lane's processes, {sum(cpu.values()) / 60:.1f} min in all")
            kept += [f"{c:8.1f} s  {n}" for n, c in sorted(cpu.items(), key=lambda nc: -nc[1])[:SLOWEST_KEPT]]
        top = slowest[:SLOWEST_SHOWN]
        share = sum(d for _, d in top) / wall if wall else 0.0
        shown.append(f"lane {name}: {wall / 60:.1f} min wall, {len(totals)} tests; "
                     f"the {len(top)} slowest take {share:.0%} of it:")
        shown += [f"  {d:7.1f} s  {n}" for n, d in top]
    (run / "slowest.txt").write_text("\n".join(kept) + "\n")
    print("\n".join(shown), flush=True)
    print(f"durations: {run / 'slowest.txt'}", flush=True)


def _cpu(path: Path) -> dict[str, float]:
    """Each test's CPU seconds as tests/conftest.py recorded them (its lane's processes, from the
    end of the test before to its own end)."""
    import json

    rows = (json.loads(line) for line in path.read_text().splitlines() if line.strip())
    return {r["nodeid"]: r["cpu"] for r in rows if "cpu" in r}


def _failures(run: Path, codes: dict[str, int]) -> None:
    """Print each lane's exit status and the tests that failed or errored, last: a CI log that
    keeps only its tail still says what broke."""
    import json

    for name, code in codes.items():
        path = run / f"durations-{name}.jsonl"
        bad: dict[str, str] = {}
        for line in (path.read_text().splitlines() if path.exists() else []):
            row = json.loads(line) if line.strip() else {}
            if row.get("outcome") == "failed":
                bad.setdefault(row["nodeid"], "failed" if row["when"] == "call" else f"error in {row['when']}")
        status = {0: "passed", 5: "nothing collected"}.get(code, f"exit {code}")
        print(f"lane {name}: {status}" + (f", {len(bad)} failing:" if bad else ""), flush=True)
        for nodeid, what in bad.items():
            print(f"  {what}: {nodeid}", flush=True)


def main(argv: list[str]) -> int:
    if "-m" in argv or any(a.startswith("-m") and a != "-m" and not a.startswith("--") for a in argv):
        print("scripts/test.py: -m selects the lanes' tests itself; run pytest directly to pass -m",
              file=sys.stderr)
        return 2
    long = "--long" in argv
    argv = [a for a in argv if a != "--long"]
    if os.environ.get("LAKESTEP_TEST_LANES") == "1":
        marks = "long" if long else "not long and not budget"
        return subprocess.call([sys.executable, "-m", "pytest", "-m", marks, *argv], cwd=ROOT)
    started = time.monotonic()
    lock = threading.Lock()
    run = Path(tempfile.mkdtemp(prefix="lakestep-tests-"))
    procs: list[tuple[str, subprocess.Popen[bytes], threading.Thread]] = []
    ended: dict[str, float] = {}
    codes: dict[str, int] = {}
    prep = None
    making: list[threading.Thread] = []  # the class-data archive, when it is made during this run
    if not long and not any(not a.startswith("-") for a in argv):  # the whole suite: its compat lane's venv
        # the interop tests' jars and Spark first (the Spark lane runs them last), then Spark 3.5's venv
        py = shlex.quote(sys.executable)
        prep = subprocess.Popen(["sh", "-c", f"{py} scripts/jars.py --peer; {py} scripts/compat.py --prepare --only 3.5"],
                                cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        threading.Thread(target=_pump, args=("prep", prep, lock, ended), daemon=True).start()
    for name, marks in reversed(LANES):  # the other lane first
        marks = f"{marks} and long" if long else f"{marks} and not long and not budget"
        extra = {**_class_archive(lock, making), **_quick_jit()} if name == "spark" else {}
        proc = subprocess.Popen(
            [sys.executable, "-m", "pytest", "-m", marks, f"--basetemp={run / name}", *argv],
            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONUNBUFFERED": "1", "LAKESTEP_TEST_LANE": name,
                 "LAKESTEP_TEST_DURATIONS": str(run / f"durations-{name}.jsonl"), **extra})
        pump = threading.Thread(target=_pump, args=(name, proc, lock, ended), daemon=True)
        pump.start()
        procs.append((name, proc, pump))
    try:
        for name, proc, pump in procs:
            codes[name] = proc.wait()
            pump.join()
    except KeyboardInterrupt:
        for _, proc, _ in procs:
            proc.terminate()
        raise
    if prep is not None:
        prep.wait()
    for thread in making:
        thread.join()
    minutes = (time.monotonic() - started) / 60
    print(f"lanes: {', '.join(f'{n} exit {c}' for n, c in codes.items())}; {minutes:.1f} min", flush=True)
    _summary(run, {name: ended[name] - started for name, _ in LANES})
    _failures(run, codes)
    ran = [c for c in codes.values() if c != 5]
    if not ran:
        return 5
    failed = [c for c in ran if c != 0]
    if not long and not failed:
        # the guard, over the durations of every test this run ran
        guard = subprocess.call([sys.executable, "-m", "pytest", "-q", "-m", "budget", "-p", "no:cacheprovider",
                                 "tests/test_budget.py"], cwd=ROOT,
                                env={**os.environ, "LAKESTEP_TEST_RUN_DIR": str(run)})
        if guard != 0:
            failed.append(guard)
            print("budget guard: failed (tests/test_budget.py, above)", flush=True)
    if not failed:
        for name, _ in LANES:  # the lanes' temp folders are large; the durations stay
            shutil.rmtree(run / name, ignore_errors=True)
    return failed[0] if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
