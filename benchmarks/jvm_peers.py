"""lakestep against what teams run on the JVM instead, same machine, same run: root ingest from Kafka.

    python -m benchmarks.jvm_peers [--quick] [--rounds N] [--messages N] [--warmup N] [--out FILE]

1. **Set-up.** The peers' jars and Spark (scripts/jars.py: jars/pom.xml, its pyspark in its own
   virtualenv) are fetched when missing. One Kafka-protocol broker (tansu) and one topic of
   ``messages`` records (4 partitions) serve every reader.
2. **Two Spark applications, one working at a time.** lakestep runs in this process on the project's
   Spark; the peers in benchmarks/jvm_peer_app.py on theirs (Spark 4.1.1 with Spark's Kafka source,
   Delta Lake, Iceberg's Spark runtime), started once and asked one run at a time. A warm-up run of
   each reader precedes the rounds; each round runs every reader once, the order reversed every other
   round; each run reads the whole topic from its start into a fresh table, ``availableNow``.
3. **Readers.** lakestep: ``lakestep-kafka`` -> the ``lakestep`` sink, and ``kafka.ingest``; peers:
   Spark's ``kafka`` source -> Delta, -> Iceberg (Hadoop catalog), -> Parquet files.
4. **Figures.** rows/s = rows / the sum of the query's trigger times (benchmarks.streaming's
   ``batch_stats``: from each trigger's offset lookup to its commit; the query start before the first
   trigger is in ``wall_s`` only); the median over rounds per reader; the ratio of each lakestep
   reader to Spark's Kafka source into Delta, from the same rounds. Every run must land every record
   exactly once (``table_rows`` and ``distinct_offsets`` equal ``messages`` and one sentinel record
   per partition, :func:`sentinels`).
5. **Target** (issue 44): lakestep's ingest at least 1.0x Spark's Kafka source into Delta.

Not guaranteed: the two Spark versions differ (the peers run the newest line Iceberg and the served
Kafka source support); the JVMs are idle, not stopped, while the other works; figures from a busy
machine are not comparable (report a quiet machine's medians).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import lakestep

from .commit import Check, finish, text_table
from .streaming import PARTITIONS, make_spark, produce, run_kafka_lakestep, step

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT / "scripts"))
import jars  # noqa: E402  (scripts/jars.py)

INGEST_TARGET = 1.0
LAKESTEP_READERS = ("lakestep-kafka", "kafka.ingest")
PEER_READERS = ("spark-kafka->delta", "spark-kafka->iceberg", "spark-kafka->parquet")
BASELINE = "spark-kafka->delta"


class Peer:
    """The peers' Spark application (benchmarks/jvm_peer_app.py), asked one run at a time."""

    def __init__(self, work: Path) -> None:
        py, peer_jars, env = jars.peer_spark()
        self.version = subprocess.check_output([str(py), "-c", "import pyspark; print(pyspark.__version__)"],
                                               text=True).strip()
        self.log = (work / "peer.log").open("w")
        self.proc = subprocess.Popen(
            [str(py), "-m", "benchmarks.jvm_peer_app", str(work / "peer"), *map(str, peer_jars)],
            cwd=REPO_ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log, text=True, env=env)
        line = self._line()
        if line.strip() != "ready":
            raise RuntimeError(f"the peers' Spark did not start: {line!r} (log: {work / 'peer.log'})")

    def _line(self) -> str:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the peers' Spark ended (exit {self.proc.wait()}; log: {self.log.name})")
        return line

    def ask(self, request: dict[str, Any]) -> dict[str, Any]:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(request) + "\n")
        self.proc.stdin.flush()
        return json.loads(self._line())

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                assert self.proc.stdin is not None
                self.proc.stdin.write(json.dumps({"op": "stop"}) + "\n")
                self.proc.stdin.close()
                self.proc.wait(120)
            except Exception:
                self.proc.kill()
        self.log.close()


def sentinels(broker: Any, topic: str) -> None:
    """One record more in each partition, each in a record batch of its own. Spark's ``kafka`` source
    ends an ``availableNow`` query at ListOffsets(latest), which tansu answers from the start of a
    partition's last record batch (seen: 4,575 where the high watermark was 5,000; lakestep's source
    reads to the high watermark of a Fetch instead, lakestep/streaming/kafka): with one-record batches
    last, every reader reads every record, the sentinels included."""
    from kafka import KafkaProducer

    prod = KafkaProducer(bootstrap_servers=broker.bootstrap_servers, linger_ms=0, acks=1)
    for p in range(PARTITIONS):
        prod.send(topic, value=b'{"sentinel":true}', partition=p).get(timeout=60)
    prod.close()


def run_reader(reader: str, spark: Any, peer: Peer, root: Path, broker: Any, topic: str, n: int, mpt: int,
               name: str) -> dict[str, Any]:
    try:
        if reader == "lakestep-kafka":
            return run_kafka_lakestep(spark, root, broker, topic, n, mpt, name=name)
        if reader == "kafka.ingest":
            return run_kafka_lakestep(spark, root, broker, topic, n, mpt, name=name, writer="ingest")
        return peer.ask({"op": "ingest", "sink": reader.split(">", 1)[1], "bootstrap": broker.bootstrap_servers,
                         "topic": topic, "max_per_trigger": mpt, "name": name})
    except Exception as e:  # reported in the row; the check on it fails
        return {"error": f"{type(e).__name__}: {e}"[:3000]}


def run_ingest(spark: Any, peer: Peer, root: Path, params: dict[str, Any]) -> dict[str, Any]:
    from lakestep.testing import TansuBroker

    n, mpt, rounds = params["messages"], params["max_offsets_per_trigger"], params["rounds"]
    readers = [*LAKESTEP_READERS, *PEER_READERS]
    out: dict[str, Any] = {"rounds": []}
    with TansuBroker() as broker:
        topic = f"jvm-peers-{int(time.time())}"
        step(f"producing {n} records (+{params['warmup_messages']} for the warm-up)")
        out["produce"] = produce(broker, topic, n)
        sentinels(broker, topic)
        if params["warmup_messages"]:
            produce(broker, f"{topic}-warmup", params["warmup_messages"])
            sentinels(broker, f"{topic}-warmup")
        for reader in readers if params["warmup_messages"] else ():
            step(f"warm-up: {reader}")
            out.setdefault("warmup", {})[reader] = run_reader(reader, spark, peer, root, broker, f"{topic}-warmup",
                                                              params["warmup_messages"], mpt,
                                                              f"warm-{reader.replace('>', '-').replace('.', '-')}")
        for i in range(rounds):
            row: dict[str, Any] = {"load_1min": round(os.getloadavg()[0], 2)}
            for reader in (readers if i % 2 == 0 else readers[::-1]):
                step(f"round {i + 1}/{rounds}: {reader}")
                row[reader] = run_reader(reader, spark, peer, root, broker, topic, n, mpt,
                                         f"r{i}-{reader.replace('>', '-').replace('.', '-')}")
            out["rounds"].append(row)
    for reader in readers:
        rates = [r[reader].get("rows_per_s") for r in out["rounds"]]
        out[f"{reader} rows/s median"] = statistics.median(rates) if rates and None not in rates else None
    base = [r[BASELINE].get("rows_per_s") for r in out["rounds"]]
    for reader in LAKESTEP_READERS:
        ratios = [round(r[reader]["rows_per_s"] / b, 3) for r, b in zip(out["rounds"], base)
                  if b and r[reader].get("rows_per_s")]
        out[f"{reader} / {BASELINE} median"] = (statistics.median(ratios)
                                                if len(ratios) == len(out["rounds"]) and ratios else None)
    # every run landed every record once, the sentinels included
    landed = {(r[k].get("table_rows"), r[k].get("distinct_offsets")) for r in out["rounds"] for k in readers}
    out["landed"] = list(landed.pop()) if len(landed) == 1 else None
    return out


def report(r: dict[str, Any], checks: list[Check]) -> str:
    ing, rounds = r["ingest"], r["ingest"].get("rounds", [])
    rows = [[reader, ing.get(f"{reader} rows/s median"),
             *[rnd[reader].get("rows_per_s") if "error" not in rnd[reader] else "error" for rnd in rounds],
             ing.get(f"{reader} / {BASELINE} median", "-" if reader != BASELINE else 1.0)]
            for reader in (*LAKESTEP_READERS, *PEER_READERS)]
    text = text_table(f"root ingest: {r['params']['messages']} Kafka records, rows/s (lakestep on Spark "
                      f"{r['machine']['pyspark']}, peers on Spark {r['machine']['peer_spark']})",
                      ["reader", "median", *[f"round {i + 1}" for i in range(len(rounds))], f"/ {BASELINE}"], rows)
    errors = [f"  {k} in round {i + 1}: {v['error']}" for i, rnd in enumerate(rounds) for k, v in rnd.items()
              if isinstance(v, dict) and "error" in v]
    lines = [text, *(["errors:", *errors] if errors else []), "",
             *[f"{c.name}: {c.value} {c.op} {c.target}: {c.result}" for c in checks]]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="small sizes, one round: a smoke run")
    ap.add_argument("--rounds", type=int, default=None, help="rounds of every reader (default 3, 1 with --quick)")
    ap.add_argument("--messages", type=int, default=None, help="records in the topic (default 1,000,000; 20,000 "
                                                                "with --quick)")
    ap.add_argument("--warmup", type=int, default=None, help="records of each reader's warm-up run (default 20,000; "
                                                              "2,000 with --quick; 0: none, a smoke run)")
    ap.add_argument("--out", default="benchmarks/results/jvm_peers.json")
    args = ap.parse_args(argv)
    q = args.quick
    params = {"quick": q, "messages": args.messages or (20_000 if q else 1_000_000),
              "max_offsets_per_trigger": 5_000 if q else 200_000, "rounds": args.rounds or (1 if q else 3),
              "warmup_messages": args.warmup if args.warmup is not None else (2_000 if q else 20_000)}
    import pyspark

    r: dict[str, Any] = {"machine": {"date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
                                     "cpu_count": os.cpu_count(), "python": platform.python_version(),
                                     "lakestep": lakestep.__version__, "pyspark": pyspark.__version__},
                         "params": params, "versions": {k: jars.pom_property(f"{k}.version")
                                                        for k in ("spark", "iceberg", "delta")}}
    with tempfile.TemporaryDirectory(prefix="lakestep-bench-jvm-") as tmp:
        root = Path(tmp)
        step("starting the peers' Spark and lakestep's")
        peer = Peer(root)
        r["machine"]["peer_spark"] = peer.version
        spark = make_spark(root / "lakestep")
        try:
            r["ingest"] = run_ingest(spark, peer, root, params)
        finally:
            spark.stop()
            peer.close()
    n = params["messages"]
    checks = [Check(f"{reader} / {BASELINE} rows/s (median)", r["ingest"].get(f"{reader} / {BASELINE} median"),
                    ">=", INGEST_TARGET) for reader in LAKESTEP_READERS]
    landed, want = r["ingest"].get("landed"), n + PARTITIONS  # sentinels(): one more record per partition
    checks += [Check("rows landed by every reader, every run", landed[0] if landed else None, "==", want),
               Check("distinct (partition, offset) of every run", landed[1] if landed else None, "==", want)]
    finish(Path(args.out), r, checks, report(r, checks))


if __name__ == "__main__":
    main()
