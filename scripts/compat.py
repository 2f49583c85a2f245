"""The compatibility suite on every Spark line lakestep supports: what `make compat` runs.

    python scripts/compat.py                    # every release of compat.TESTED
    python scripts/compat.py --only 3.5 4.0     # some lines
    python scripts/compat.py --json FILE        # also the results as JSON

1. For each release V of ``lakestep.streaming.compat.TESTED`` (one per Spark line) but the one
   this interpreter has, a virtualenv ``.venv-spark-<line>`` beside the project's ``.venv`` is
   made once (cached; remade when V or pyproject.toml changes): ``pip install -e '.[spark]'
   'pyspark==V'`` into it, so pip itself shows that the ``spark`` extra installs with that
   Spark. The test-only packages (pytest, the Kafka broker, ...) come from the project's
   virtualenv, after its own (a ``.pth`` file), so the venv's pyspark, pandas and pyarrow win.
2. tests/streaming/test_spark_versions.py runs there with ``-m spark`` (the same files on every line; a test a line
   cannot run is skipped with the rule of lakestep/streaming/compat.py it follows), one line
   after the other (one Spark application at a time), and on this interpreter's Spark last.
3. The end: a table (line, pyspark, passed, failed, skipped, wall) and with ``--json`` the same
   as JSON; skipped tests' reasons are in each run's pytest summary (``-rs``). The exit status
   is 0 when every line passed.

Not guaranteed: the first run downloads each pyspark (about 300 MB each) from the package index.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from lakestep.streaming.compat import TESTED, parse  # noqa: E402


def line_of(release: str) -> str:
    major, minor = parse(release)
    return f"{major}.{minor}"


def venv_for(release: str, *, quiet: bool = True) -> Path:
    """Step 1: the virtualenv of ``release``, made when missing or stale (one process at a time:
    a lock file beside it); its python."""
    import fcntl

    venv = ROOT / f".venv-spark-{line_of(release)}"
    with open(ROOT / f".venv-spark-{line_of(release)}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return _made(venv, release, quiet)


def _made(venv: Path, release: str, quiet: bool) -> Path:
    py = venv / "bin" / "python"
    key = hashlib.sha256((release + (ROOT / "pyproject.toml").read_text()).encode()).hexdigest()[:16]
    stamp = venv / ".lakestep-compat"
    if py.exists() and stamp.exists() and stamp.read_text() == key:
        return py
    began = time.monotonic()
    print(f"[compat] making {venv.name} (pyspark {release}) ...", flush=True)
    if not (venv / "bin" / "pip").exists():
        subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], check=True)
    pth = Path(subprocess.check_output([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                       text=True).strip()) / "zz_lakestep_project_venv.pth"
    pth.unlink(missing_ok=True)  # pip resolves in the venv alone
    q = ["-q"] if quiet else []
    subprocess.run([str(py), "-m", "pip", "install", *q, "--disable-pip-version-check", "-e", f"{ROOT}[spark]",
                    f"pyspark=={release}"], check=True, cwd=ROOT)
    # the project's virtualenv after the venv's own packages: pytest and the test services
    pth.write_text(f"import site; site.addsitedir({sysconfig.get_paths()['purelib']!r})\n")
    stamp.write_text(key)
    print(f"[compat] {venv.name} made in {time.monotonic() - began:.0f} s", flush=True)
    return py


def _env() -> dict[str, str]:
    """The suite's environment: not the settings of a `make test` lane this may run inside (its
    durations file, the newest Spark's class-data archive)."""
    drop = {"LAKESTEP_TEST_DURATIONS", "LAKESTEP_SPARK_CLASS_ARCHIVE", "LAKESTEP_TEST_LANE", "PYSPARK_PYTHON",
            "PYSPARK_DRIVER_PYTHON"}
    return {**{k: v for k, v in os.environ.items() if k not in drop}, "PYTHONUNBUFFERED": "1"}


def run_suite(py: Path, pytest_args: list[str]) -> dict[str, object]:
    """Step 2: tests/streaming/test_spark_versions.py under ``py``; its counts from pytest's last line."""
    began = time.monotonic()
    proc = subprocess.Popen([str(py), "-m", "pytest", "-m", "spark", "-rs", "-q", "-p", "no:cacheprovider",
                             "tests/streaming/test_spark_versions.py", *pytest_args], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env=_env())
    assert proc.stdout is not None
    last = ""
    for line in proc.stdout:
        print(f"  {line}", end="", flush=True)
        if line.strip():
            last = line
    code = proc.wait()
    counts = {k: int(n) for n, k in re.findall(r"(\d+) (passed|failed|skipped|errors?)", last)}
    version = subprocess.check_output([str(py), "-c", "import pyspark; print(pyspark.__version__)"], text=True).strip()
    return {"pyspark": version, "line": line_of(version), "exit": code, "passed": counts.get("passed", 0),
            "failed": counts.get("failed", 0) + counts.get("error", 0) + counts.get("errors", 0),
            "skipped": counts.get("skipped", 0), "seconds": round(time.monotonic() - began, 1)}


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", nargs="*", help="Spark lines to run (e.g. 3.5 4.0); default: every tested one")
    ap.add_argument("--json", help="write the results here too")
    ap.add_argument("--prepare", action="store_true", help="only make the virtualenvs (scripts/test.py, beside the lanes)")
    ap.add_argument("pytest_args", nargs="*", help="more pytest arguments (after --)")
    args = ap.parse_args(argv)
    import pyspark

    here = pyspark.__version__
    releases = [r for r in TESTED if not args.only or line_of(r) in args.only]
    if args.prepare:
        for release in releases:
            if line_of(release) != line_of(here):
                venv_for(release)
        return 0
    results = []
    for release in releases:
        py = Path(sys.executable) if line_of(release) == line_of(here) else venv_for(release)
        print(f"[compat] Spark {line_of(release)} ({py})", flush=True)
        results.append(run_suite(py, args.pytest_args))
    print(f"{'line':5} {'pyspark':8} {'passed':>6} {'failed':>6} {'skipped':>7} {'wall s':>7}")
    for r in results:
        print(f"{r['line']:5} {r['pyspark']:8} {r['passed']:>6} {r['failed']:>6} {r['skipped']:>7} {r['seconds']:>7}")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2) + "\n")
    return 0 if results and all(r["exit"] == 0 for r in results) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
