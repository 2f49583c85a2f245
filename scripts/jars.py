"""The JVM peers' jars and their Spark: what `make jars` runs, and what the interop tests and
benchmarks.jvm_peers call.

    python scripts/jars.py            # fetch the jars (cached); print the folder
    python scripts/jars.py --peer     # also the peers' virtualenv (pyspark of jars/pom.xml); print its python

1. ``jars/pom.xml`` pins every artifact: Spark's Kafka source, Iceberg's Spark runtime, Delta
   Lake, and the PostgreSQL and SQLite JDBC drivers. `mvn dependency:copy-dependencies` copies
   them with their runtime dependencies (Spark's own, which the pom declares ``provided``, are
   left out) from Maven Central into ``.jars/`` beside the project (git-ignored), through the
   local Maven repository (``~/.m2``), with jars/settings.xml (Central for the mirror Spark's pom names). The copy is made once: a stamp of the pom's hash says it is
   whole (a copy cut short is remade), a lock file keeps two runs from making it at once.
2. The peers run on the Spark of the pom's ``spark.version``: pyspark of that release, in the
   virtualenv ``scripts/compat.py`` makes for its line (``.venv-spark-4.1``; that line's tested
   release is the pom's, so the two share it).
3. :func:`classpath` lists the jars a Spark session of that pyspark needs on top of its own: a
   jar whose artifact pyspark already ships (slf4j, zstd, ...) is left out, so the session keeps
   its own version of it.

Not guaranteed: the first run downloads about 150 MB from Maven Central; without network and
without the cache, it fails with Maven's own error (``JarsError``).
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
POM = ROOT / "jars" / "pom.xml"
FOLDER = ROOT / ".jars"


class JarsError(RuntimeError):
    """The jars could not be fetched (no Maven, no network and no cache, an artifact not served)."""


def pom_property(name: str) -> str:
    """A ``<properties>`` value of jars/pom.xml (``spark.version``, ``iceberg.version``, ...)."""
    m = re.search(rf"<{re.escape(name)}>([^<]+)</{re.escape(name)}>", POM.read_text())
    if m is None:
        raise JarsError(f"jars/pom.xml has no property {name}")
    return m.group(1)


SPARK = pom_property("spark.version")
"""The peers' Spark release (their pyspark's version)."""


def ensure(*, quiet: bool = True) -> Path:
    """Step 1: the folder of jars, fetched when missing or stale."""
    FOLDER.mkdir(exist_ok=True)
    key = hashlib.sha256(POM.read_bytes() + POM.with_name("settings.xml").read_bytes()).hexdigest()[:16]
    stamp = FOLDER / "stamp"
    with open(FOLDER / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if stamp.exists() and stamp.read_text() == key:
            return FOLDER
        stamp.unlink(missing_ok=True)
        for old in FOLDER.glob("*.jar"):
            old.unlink()
        mvn(["-f", str(POM), "dependency:copy-dependencies", f"-DoutputDirectory={FOLDER}", "-DincludeScope=runtime"],
            quiet=quiet, label="jars")
        stamp.write_text(key)
    return FOLDER


def mvn(args: list[str], *, quiet: bool, label: str) -> None:
    """Maven with jars/settings.xml and ``args``; its output shown unless ``quiet``. Raises
    :class:`JarsError` with the end of its output when it fails or is not installed."""
    exe = shutil.which("mvn")
    if exe is None:
        raise JarsError("Maven (mvn) is not installed: scripts/ensure-services.sh installs it")
    cmd = [exe, "-B", *(["-q"] if quiet else []), "-s", str(POM.with_name("settings.xml")), *args]
    if not quiet:
        print(f"[{label}]", " ".join(cmd), flush=True)
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=quiet, text=True)
    if proc.returncode != 0:
        raise JarsError(f"mvn {' '.join(args)} failed (exit {proc.returncode}):\n"
                        f"{(proc.stdout or '')[-3000:]}{(proc.stderr or '')[-2000:]}")


def peer_python() -> Path:
    """Step 2: the python of the peers' virtualenv (made when missing)."""
    sys.path.insert(0, str(ROOT / "scripts"))
    from compat import venv_for

    return venv_for(SPARK)


def _artifact(jar: str) -> str:
    """``kafka-clients-3.9.1.jar`` -> ``kafka-clients``."""
    return re.sub(r"-\d[\w.\-]*$", "", jar.removesuffix(".jar"))


def classpath(spark_jars: Path, folder: Path = FOLDER) -> list[Path]:
    """Step 3: the jars of ``folder`` whose artifacts ``spark_jars`` (pyspark's ``jars/``) lacks."""
    own = {_artifact(j.name) for j in spark_jars.glob("*.jar")}
    return sorted(j for j in folder.glob("*.jar") if _artifact(j.name) not in own)


PEER_ENV_DROP = ("LAKESTEP_SPARK_CLASS_ARCHIVE", "PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON")
"""What a `make test` lane sets for its own Spark that the peers' Spark must not inherit (the newest
Spark's class-data archive, this interpreter as the workers' Python)."""


def peer_spark() -> tuple[Path, list[Path], dict[str, str]]:
    """Steps 1-3 for a peer application: its python, the jars it adds to its pyspark's own, and
    the environment to run it with."""
    folder, py = ensure(), peer_python()
    spark_jars = Path(subprocess.check_output(
        [str(py), "-c", "import os, pyspark; print(os.path.join(os.path.dirname(pyspark.__file__), 'jars'))"],
        text=True).strip())
    return py, classpath(spark_jars, folder), {k: v for k, v in os.environ.items() if k not in PEER_ENV_DROP}


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="scripts/jars.py", description=__doc__.splitlines()[0])
    ap.add_argument("--peer", action="store_true", help="also make the peers' virtualenv; print its python")
    args = ap.parse_args(argv)
    try:
        folder = ensure(quiet=False)
    except JarsError as e:
        print(f"scripts/jars.py: {e}", file=sys.stderr)
        return 1
    print(folder)
    if args.peer:
        print(peer_python())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
