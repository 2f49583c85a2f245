"""The Spark application of the DerivedJob kill-and-restart test (a subprocess; failpoints kill it).

``s.raw`` (written by the test) -> job ``d1`` (``DerivedJob``: each batch's new rows,
``id * 2 + 1``, appended to ``s.d1``) -> job ``agg`` (``DerivedJob``: all of ``s.d1``
grouped by ``v % 3``, overwriting ``s.agg``). Both jobs run every ready barrier in
turn (``run_available``) until both have reached the newest barrier ``s.raw`` has
precommitted, then the process prints ``DONE`` and exits 0.

    python -m tests.streaming.derived_app --catalog URL --workdir DIR

The tables must exist and the jobs be registered (the test does it). With
``LAKESTEP_FAILPOINTS=derived.written=exit@N`` (or ``derived.committed``) the
process dies (status 137) at the N-th batch that reached that step.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]


def d1(batch):  # type: ignore[no-untyped-def]
    return batch.changes("s.raw").selectExpr("id", "id * 2 + 1 AS v")


def agg(batch):  # type: ignore[no-untyped-def]
    return batch.table("s.d1").selectExpr("v % 3 AS k").groupBy("k").count() \
        .selectExpr("k", "CAST(count AS BIGINT) AS n")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--catalog", required=True)
    ap.add_argument("--workdir", required=True)
    args = ap.parse_args(argv)
    os.environ["PYTHONPATH"] = os.pathsep.join([str(REPO_ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])

    from lakestep.streaming import DerivedJob
    from lakestep.testing.spark import local_session

    spark = local_session("lakestep-derived-app", args.workdir,
                          jvm_options="-XX:TieredStopAtLevel=1 -XX:+UseSerialGC")
    jobs = [DerivedJob(spark, args.catalog, "d1", sources=["s.raw"], sinks=["s.d1"], transform=d1),
            DerivedJob(spark, args.catalog, "agg", sources=["s.d1"], sinks={"s.agg": "overwrite"}, transform=agg)]
    for job in jobs:
        print(f"{job.job} reached barrier {job.run_available()}", flush=True)
    print("DONE", flush=True)
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
