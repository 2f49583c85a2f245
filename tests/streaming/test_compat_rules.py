"""The Spark version rules (lakestep/streaming/compat.py), without Spark: the matrix, the
errors, and that the ranges pip installs and `make compat` tests say the same."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import tomllib

from lakestep.errors import LakestepError, SparkVersionError, StreamingJobError
from lakestep.streaming import compat

ROOT = Path(__file__).resolve().parents[2]


def test_each_feature_needs_the_line_the_matrix_says() -> None:
    want = {"derived_job": (3, 5), "foreach_batch": (3, 5), "spark_sql": (3, 5), "format": (4, 0),
            "sink": (4, 1), "source": (4, 2), "kafka": (4, 2)}
    assert {k: v[0] for k, v in compat.FEATURES.items()} == want
    for line in ((3, 5), (4, 0), (4, 1), (4, 2), (4, 3)):
        runs = {f for f in want if compat.supports(f, line)}
        assert runs == {f for f, need in want.items() if line >= need}
    assert not compat.supports("format", (3, 5)) and compat.supports("format", (4, 0))


@pytest.mark.parametrize("feature,line", [("format", (3, 5)), ("sink", (4, 0)), ("source", (4, 1)), ("kafka", (4, 1))])
def test_a_missing_feature_is_a_typed_error_naming_the_version_and_what_instead(feature: str, line: tuple[int, int]) -> None:
    with pytest.raises(SparkVersionError) as e:
        compat.require(feature, line)
    needs = compat.FEATURES[feature][0]
    assert isinstance(e.value, StreamingJobError) and isinstance(e.value, LakestepError)
    assert (e.value.feature, e.value.needs, e.value.found) == (feature, f"{needs[0]}.{needs[1]}", f"{line[0]}.{line[1]}")
    assert str(e.value).startswith(f"{compat.FEATURES[feature][1]} needs Spark {needs[0]}.{needs[1]} or newer; "
                                   f"this is Spark {line[0]}.{line[1]}: ")
    compat.require(feature, needs)  # the line it needs runs it


def test_versions_parse() -> None:
    assert compat.parse("3.5.9") == (3, 5) and compat.parse("4.0.0.dev1") == (4, 0) and compat.parse("4.10") == (4, 10)
    with pytest.raises(SparkVersionError):
        compat.parse("four")


def test_the_session_must_run_the_drivers_spark_line() -> None:
    class Session:  # what check_session reads of a SparkSession: its JVM's version
        version = compat.pyspark_version()

    assert compat.check_session(Session()) == compat.version()
    Session.version = "3.4.1" if compat.version() != (3, 4) else "4.0.0"
    with pytest.raises(SparkVersionError, match=r"pyspark .* drives Spark .*: install the pyspark of the cluster"):
        compat.check_session(Session())


def test_pip_range_and_tested_releases_agree_with_the_matrix() -> None:
    """pyproject's ``spark`` extra installs exactly compat.SUPPORTED, `make compat` tests one
    release of every line in it, and the newest is the one the project's virtualenv runs."""
    extra = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["spark"]
    pins = [d for d in extra if d.startswith("pyspark")]
    assert pins == [f"pyspark{compat.SUPPORTED}"]
    low, high = re.fullmatch(r">=(\d+\.\d+),<(\d+\.\d+)", compat.SUPPORTED).groups()  # type: ignore[union-attr]
    lines = [compat.parse(r) for r in compat.TESTED]
    assert lines[0] == compat.parse(low) and lines == sorted(set(lines))
    assert all(compat.parse(low) <= x < compat.parse(high) for x in lines)
    assert [x for x in lines if x[0] == 4] == [(4, m) for m in range(compat.parse(high)[1])]
    assert compat.version() == lines[-1], "the project's virtualenv runs the newest tested line"


def test_the_jvm_peers_run_on_a_tested_release() -> None:
    """jars/pom.xml's Spark is the tested release of its line: the peers share that line's
    virtualenv (scripts/jars.py), so `make compat` and the interop tests make it once."""
    import re

    spark = re.search(r"<spark.version>([^<]+)</spark.version>", (ROOT / "jars" / "pom.xml").read_text())
    assert spark is not None and spark.group(1) in compat.TESTED
