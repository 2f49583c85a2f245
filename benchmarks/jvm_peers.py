"""lakestep against what teams run on the JVM instead, same machine, same run: root ingest from Kafka,
sink throughput, and freshness over a three-level pipeline with its answers checked.

    python -m benchmarks.jvm_peers [--quick] [--only ingest,sinks,freshness] [--rounds N] [--messages N]
        [--warmup N] [--backends sqlite,postgres] [--fresh-peers delta,iceberg] [--triggers 0.2,1]
        [--seconds S] [--rate R] [--rows-per-batch N] [--batches N] [--[no-]warm] [--out FILE]

1. **Set-up.** The peers' jars and Spark (scripts/jars.py: jars/pom.xml, its pyspark in its own
   virtualenv) are fetched when missing. lakestep runs in this process on the project's Spark; the
   peers in benchmarks/jvm_peer_app.py on theirs (Spark 4.1.1 with Spark's Kafka source, Delta Lake,
   Iceberg's Spark runtime with a Hadoop catalog), started once and asked one run at a time, so that
   only one of the two applications works at a time. Every section runs ``rounds`` rounds, the order
   of the systems reversed every other round; the figures are medians over the rounds.
2. **Root ingest** (``ingest``): one tansu topic of ``messages`` records (4 partitions); each run
   reads the whole topic from its start into a fresh table, ``availableNow``. lakestep:
   ``lakestep-kafka`` -> the ``lakestep`` sink, and ``kafka.ingest``; peers: Spark's ``kafka`` source
   -> Delta, -> Iceberg, -> Parquet files. A warm-up run of each reader on a small topic precedes the
   rounds. rows/s = rows / the sum of the query's trigger times (benchmarks.streaming's
   ``batch_stats``: from each trigger's offset lookup to its commit; the query start before the
   first trigger is in ``wall_s`` only). Every run must land every record exactly once (the
   sentinels: :func:`sentinels`). Target: each lakestep reader at least 1.0x Spark's source into Delta.
3. **Sink throughput** (``sinks``): benchmarks.streaming.run_sink, the ``rate-micro-batch`` frame
   (``rows_per_batch`` rows a batch, ``batches`` + 1 batches, the first dropped) into the
   ``lakestep`` sink and ``foreach_batch(writer="spark")`` (``lakestep-spark``), against Delta's and
   Iceberg's streaming sinks. Target: lakestep's sinks at least 0.9x Delta's rows/s.
4. **Freshness** (``freshness``): benchmarks.freshness's pipeline (Kafka -> raw -> d1 -> d2, every
   level ``processingTime`` = each of ``triggers``), its producer (``rate`` records/s, each value the
   time it was sent), measurement window and statistics, per system: lakestep on each catalog
   backend (benchmarks.freshness.run_cell: the root query, d1 and d2 as DerivedJobs, a coordinator
   sealing every 0.2 s; the reader takes each new ``read_committed`` answer), Delta Lake and Iceberg
   (the three levels as Structured Streaming queries, each level's streaming source reading the one
   below; :class:`PeerReader` takes each new version of d2). Record-to-answer latency p50 / p99 of
   the records produced in the window. Each answer is probed: the row counts of raw, d1 and d2 at
   the versions it reads (lakestep: the versions ``choose`` returned; the peers: each table's newest,
   read one after the other as a naive query does) must be equal for a join of raw and d2 on id to
   be the truth of some moment; ``wrong`` counts the answers where they are not. Targets: lakestep's
   p50 at most 1.0x Delta's at each trigger, lakestep's wrong answers 0, nothing lost or duplicated.
5. ``--warm`` (the default but with ``--quick``): the sinks and freshness sections first run each
   system once unreported (a fresh JVM compiles its hot paths in the first minute).

Not guaranteed: the two Spark versions differ (the peers run the newest line Iceberg and the served
Kafka source support); the peers run with the settings a small deployment would use (Delta's state
reconstruction in the session's 2 partitions, not its cluster default of 50: 7 s a micro-batch here);
the JVMs are idle, not stopped, while the other works; the readers of the freshness section run in
this process; figures from a busy machine are not comparable (report a quiet machine's medians).
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
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

import lakestep

from . import freshness
from .commit import Check, finish, text_table
from .peers import DEFAULT_PG_DSN
from .streaming import PARTITIONS, make_spark, produce, run_kafka_lakestep, run_sink, step

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT / "scripts"))
import jars  # noqa: E402  (scripts/jars.py)

INGEST_TARGET = 1.0
LAKESTEP_READERS = ("lakestep-kafka", "kafka.ingest")
PEER_READERS = ("spark-kafka->delta", "spark-kafka->iceberg", "spark-kafka->parquet")
BASELINE = "spark-kafka->delta"
FRESH_TARGET = 1.0  # lakestep's freshness p50 / Delta's, same trigger
SINK_TARGET = 0.9  # lakestep's sink rows/s / Delta's sink's
FRESH_PEERS = ("delta", "iceberg")
LAKESTEP_SINKS = ("lakestep", "lakestep-spark")
PEER_SINKS = ("delta", "iceberg")


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


def _local(uri: str) -> str:
    from urllib.parse import urlparse

    u = urlparse(uri)
    return u.path if u.scheme in ("file", "") else uri


class PeerReader(threading.Thread):
    """The peers' side of benchmarks.freshness.Reader, in this process: first-seen times of the ids of
    d2 at each of its new versions (Delta: delta-rs; Iceberg: PyIceberg on the Hadoop catalog's newest
    ``vN.metadata.json``), reading only the data files those versions added; each answer also counts
    the rows of raw, d1 and d2 at their newest versions, read one after the other as a naive query
    does (``wrong``: the answers where they differ, i.e. where a join of raw and d2 on id is not the
    truth of any moment)."""

    def __init__(self, fmt: str, locations: dict[str, str]) -> None:
        super().__init__(name=f"freshness-reader-{fmt}", daemon=True)
        self.fmt, self.locations = fmt, locations
        self.seen: dict[int, float] = {}
        self.duplicates = self.wrong = 0
        self.answers: list[tuple[float, int]] = []
        self.halt = threading.Event()
        self.error: BaseException | None = None
        self._files: set[str] = set()
        self._hints: dict[str, int] = {}
        self._ops: tuple[Any, Any, Any] | None = None  # (version, new_files, count) of the format
        self._last = -1

    # Delta Lake
    def _delta(self) -> tuple[Any, Any]:
        from deltalake import DeltaTable

        tables = {t: DeltaTable(loc) for t, loc in self.locations.items()}

        def version() -> int:
            tables["d2"].update_incremental()
            return tables["d2"].version()

        def new_files() -> list[str]:
            return [f for f in tables["d2"].file_uris() if f not in self._files]

        def count(t: str) -> int:
            if t != "d2":
                tables[t].update_incremental()
            return pa.table(tables[t].get_add_actions(flatten=True)).column("num_records").to_pylist()

        return version, new_files, lambda t: sum(count(t))

    # Iceberg (Hadoop catalog: metadata/version-hint.text names the newest vN.metadata.json)
    def _iceberg(self) -> tuple[Any, Any, Any]:
        from pyiceberg.manifest import ManifestEntryStatus
        from pyiceberg.table import StaticTable

        state: dict[str, Any] = {}

        def load(t: str) -> Any:
            hint = Path(self.locations[t]) / "metadata" / "version-hint.text"
            try:
                n = int(hint.read_text().strip())
            except (OSError, ValueError):  # not written yet, or being replaced
                n = self._hints.get(t, 0)
            if n and (t not in state or self._hints.get(t) != n):
                state[t] = StaticTable.from_metadata(str(hint.parent / f"v{n}.metadata.json"))
                self._hints[t] = n
            return state.get(t)

        def version() -> int:
            load("d2")
            return self._hints.get("d2", 0)

        def new_files() -> list[str]:
            tbl, out = state["d2"], []
            snap, known = tbl.current_snapshot(), state.setdefault("snapshots", set())
            while snap is not None and snap.snapshot_id not in known:
                known.add(snap.snapshot_id)
                for m in snap.manifests(tbl.io):
                    if m.added_snapshot_id == snap.snapshot_id:
                        out += [e.data_file.file_path for e in m.fetch_manifest_entry(tbl.io, discard_deleted=True)
                                if e.status == ManifestEntryStatus.ADDED]
                snap = tbl.snapshot_by_id(snap.parent_snapshot_id) if snap.parent_snapshot_id else None
            return out

        def count(t: str) -> int:
            tbl = load(t)
            snap = tbl.current_snapshot() if tbl is not None else None
            return int(snap.summary["total-records"]) if snap is not None else 0

        return version, new_files, count

    def poll(self) -> bool:
        """One look at d2: False when its version has not changed; else the new files' ids and the
        answer's probe are recorded (True). :meth:`run` calls it until halted; a test may call it
        itself, without the thread."""
        if self._ops is None:
            self._ops = self._delta() if self.fmt == "delta" else self._iceberg()
        version, new_files, count = self._ops
        v = version()
        if v == self._last:
            return False
        t = time.time()
        files = new_files()
        for f in files:
            for i in pq.read_table(_local(f), columns=["id"]).column("id").to_pylist():
                if i in self.seen:
                    self.duplicates += 1
                else:
                    self.seen[i] = t
        self._files.update(files)
        self._last = v
        self.wrong += len({count(tb) for tb in ("raw", "d1", "d2")}) > 1
        self.answers.append((t, v))  # last: an answer counted is a probed one
        return True

    def run(self) -> None:
        try:
            while not self.halt.is_set():
                if not self.poll():
                    self.halt.wait(freshness.POLL)
        except BaseException as e:  # reported by the cell
            self.error = e


def run_peer_cell(peer: Peer, broker: Any, fmt: str, trigger: float, params: dict[str, Any],
                  tag: str) -> dict[str, Any]:
    """benchmarks.freshness.run_cell for a peer: its pipeline in the peers' Spark, the same producer,
    window and statistics, :class:`PeerReader` as the reader."""
    name = f"{fmt}-t{trigger:g}-{tag}".replace(".", "p")
    topic = f"fresh-{name}-{uuid.uuid4().hex[:6]}"
    broker.create_topic(topic, partitions=freshness.PARTITIONS)
    started = peer.ask({"op": "pipeline", "format": fmt, "bootstrap": broker.bootstrap_servers, "topic": topic,
                        "trigger": trigger, "name": name})
    if "error" in started:
        raise RuntimeError(f"the peers' {fmt} pipeline did not start: {started['error']}")
    producer = freshness.Producer(broker.bootstrap_servers, topic, params["rate"])
    reader = PeerReader(fmt, started["locations"])
    reader.start()
    producer.start()

    def failed() -> str | None:
        for th in (producer, reader):
            if th.error is not None:
                return f"{th.name} failed: {th.error!r}"
        return peer.ask({"op": "pipeline_status", "name": name}).get("failed")

    out: dict[str, Any] = {"system": fmt, "trigger": trigger}
    try:
        ids = freshness.measure(producer, reader, failed, params, out)
    finally:
        producer.halt.set()
        reader.halt.set()
        reader.join(timeout=60)
        out["spark"] = peer.ask({"op": "pipeline_stop", "name": name})
    out.update(freshness.latency_stats(ids, producer, reader))
    out["probes_wrong"] = reader.wrong
    return out


def run_freshness(spark: Any, peer: Peer, root: Path, params: dict[str, Any]) -> dict[str, Any]:
    """Every system's freshness cell per trigger, ``rounds`` times interleaved (order reversed every
    other round); lakestep's cells are benchmarks.freshness.run_cell (DerivedJob levels, the
    coordinator sealing every ``interval`` s) with the answers' row counts probed."""
    from lakestep.testing import TansuBroker

    fp = {"rate": params["fresh_rate"], "seconds": params["fresh_seconds"], "warmup": params["fresh_warmup"],
          "drain": 120.0, "start_timeout": 300.0, "derived": "driver", "quiet_commit_s": freshness.QUIET_COMMIT,
          "probe": True}
    systems = [*(f"lakestep-{b}" for b in params["backends"]), *params["fresh_peers"]]
    cells: list[dict[str, Any]] = []
    with TansuBroker() as broker:
        for rnd in range(-1 if params["warm"] else 0, params["rounds"]):  # -1: each system once, not reported
            for trigger in params["triggers"][:1] if rnd < 0 else params["triggers"]:
                for system in (systems if rnd % 2 == 0 else systems[::-1]):
                    step(f"freshness round {rnd + 1}/{params['rounds']}: {system}, trigger {trigger:g} s"
                         if rnd >= 0 else f"freshness warm-up: {system}")
                    try:
                        if system.startswith("lakestep-"):
                            cell = freshness.run_cell(spark, broker, root, system.split("-", 1)[1], params["pg_dsn"],
                                                      params["interval"], trigger, fp, f"r{rnd + 1}")
                            cell = {"system": system, **cell}
                        else:
                            cell = run_peer_cell(peer, broker, system, trigger, fp, f"r{rnd + 1}")
                    except Exception as e:  # reported in the cell; the checks on it fail
                        cell = {"system": system, "trigger": trigger, "error": f"{type(e).__name__}: {e}"[:3000]}
                    cell["round"] = rnd + 1
                    if rnd >= 0:
                        cells.append(cell)
    out: dict[str, Any] = {"cells": cells, "params": fp, "medians": {}}
    for trigger in params["triggers"]:
        for system in systems:
            mine = [c for c in cells if c["system"] == system and c["trigger"] == trigger and "error" not in c]
            out["medians"][f"{system} t{trigger:g}"] = {
                k: (round(statistics.median(c[k] for c in mine), 3) if len(mine) == params["rounds"] else None)
                for k in ("p50_s", "p99_s")} | {
                "answers": sum(c["answers"] for c in mine), "wrong": sum(c["probes_wrong"] for c in mine),
                "lost_or_duplicated": sum(c["missing"] + c["duplicates"] + c["unexpected"] for c in mine)}
    return out


def run_sinks(spark: Any, peer: Peer, root: Path, params: dict[str, Any]) -> dict[str, Any]:
    """benchmarks.streaming.run_sink for each sink (lakestep's in this process's Spark, the peers' in
    theirs), ``rounds`` times interleaved; rows/s = rows / the kept batches' trigger time."""
    rows: list[dict[str, Any]] = []
    sinks = [*LAKESTEP_SINKS, *PEER_SINKS]
    for rnd in range(-1 if params["warm"] else 0, params["rounds"]):  # round -1: each sink once, not reported
        row: dict[str, Any] = {"load_1min": round(os.getloadavg()[0], 2)}
        for sink in (sinks if rnd % 2 == 0 else sinks[::-1]):
            step(f"sink round {rnd + 1}/{params['rounds']}: {sink}" if rnd >= 0 else f"sink warm-up: {sink}")
            try:
                if sink in LAKESTEP_SINKS:
                    (root / f"sink-{rnd + 1}-{sink}").mkdir()
                    row[sink] = run_sink(spark, root / f"sink-{rnd + 1}-{sink}", sink, params["rows_per_batch"],
                                         params["batches"])
                else:
                    row[sink] = peer.ask({"op": "sink", "format": sink, "rows_per_batch": params["rows_per_batch"],
                                          "batches": params["batches"], "name": f"r{rnd + 1}-{sink}"})
            except Exception as e:
                row[sink] = {"error": f"{type(e).__name__}: {e}"[:3000]}
        if rnd >= 0:
            rows.append(row)
    out: dict[str, Any] = {"rounds": rows}
    for sink in sinks:
        rates = [r[sink].get("rows_per_s") for r in rows]
        out[f"{sink} rows/s median"] = statistics.median(rates) if None not in rates else None
    for sink in LAKESTEP_SINKS:
        ratios = [r[sink]["rows_per_s"] / r["delta"]["rows_per_s"] for r in rows
                  if r[sink].get("rows_per_s") and r["delta"].get("rows_per_s")]
        out[f"{sink} / delta median"] = round(statistics.median(ratios), 3) if len(ratios) == len(rows) else None
    out["table_rows"] = sorted({r[s].get("table_rows") for r in rows for s in sinks}, key=str)
    return out


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
    parts, errors = [], []
    if "ingest" in r:
        ing, rounds = r["ingest"], r["ingest"].get("rounds", [])
        rows = [[reader, ing.get(f"{reader} rows/s median"),
                 *[rnd[reader].get("rows_per_s") if "error" not in rnd[reader] else "error" for rnd in rounds],
                 ing.get(f"{reader} / {BASELINE} median", "-" if reader != BASELINE else 1.0)]
                for reader in (*LAKESTEP_READERS, *PEER_READERS)]
        parts.append(text_table(
            f"root ingest: {r['params']['messages']} Kafka records, rows/s (lakestep on Spark "
            f"{r['machine']['pyspark']}, peers on Spark {r['machine']['peer_spark']})",
            ["reader", "median", *[f"round {i + 1}" for i in range(len(rounds))], f"/ {BASELINE}"], rows))
        errors += [f"  {k} in round {i + 1}: {v['error']}" for i, rnd in enumerate(rounds) for k, v in rnd.items()
                   if isinstance(v, dict) and "error" in v]
    if "freshness" in r:
        fr = r["freshness"]
        rows = [[key, m["p50_s"], m["p99_s"], m["answers"], m["wrong"], m["lost_or_duplicated"]]
                for key, m in fr["medians"].items()]
        parts.append(text_table(
            f"freshness: Kafka -> raw -> d1 -> d2, {fr['params']['rate']:g} records/s, record-to-answer s "
            f"(medians of {r['params']['rounds']} rounds; wrong: answers whose tables' row counts differ)",
            ["system, trigger", "p50", "p99", "answers", "wrong", "lost/dup"], rows))
        errors += [f"  {c['system']} t{c['trigger']:g} round {c['round']}: {c['error']}" for c in fr["cells"]
                   if "error" in c]
    if "sinks" in r:
        sk, rounds = r["sinks"], r["sinks"]["rounds"]
        rows = [[sink, sk.get(f"{sink} rows/s median"),
                 *[rnd[sink].get("rows_per_s") if "error" not in rnd[sink] else "error" for rnd in rounds],
                 sk.get(f"{sink} / delta median", "-" if sink != "delta" else 1.0)]
                for sink in (*LAKESTEP_SINKS, *PEER_SINKS)]
        parts.append(text_table(
            f"sink throughput: {r['params']['batches']} batches of {r['params']['rows_per_batch']} rows "
            "(rate-micro-batch), rows/s over the triggers", ["sink", "median",
                                                             *[f"round {i + 1}" for i in range(len(rounds))],
                                                             "/ delta"], rows))
        errors += [f"  {k} in round {i + 1}: {v['error']}" for i, rnd in enumerate(rounds) for k, v in rnd.items()
                   if isinstance(v, dict) and "error" in v]
    lines = ["\n\n".join(parts), *(["errors:", *errors] if errors else []), "",
             *[f"{c.name}: {c.value} {c.op} {c.target}: {c.result}" for c in checks]]
    return "\n".join(lines)


SECTIONS = ("ingest", "freshness", "sinks")


def checks_of(r: dict[str, Any]) -> list[Check]:
    p, checks = r["params"], []
    if "ingest" in r:
        checks += [Check(f"{reader} / {BASELINE} rows/s (median)", r["ingest"].get(f"{reader} / {BASELINE} median"),
                         ">=", INGEST_TARGET) for reader in LAKESTEP_READERS]
        landed, want = r["ingest"].get("landed"), p["messages"] + PARTITIONS  # sentinels(): one more per partition
        checks += [Check("rows landed by every reader, every run", landed[0] if landed else None, "==", want),
                   Check("distinct (partition, offset) of every run", landed[1] if landed else None, "==", want)]
    if "freshness" in r:
        med = r["freshness"]["medians"]
        for t in p["triggers"]:
            delta = med[f"delta t{t:g}"]["p50_s"] if "delta" in p["fresh_peers"] else None
            for b in p["backends"]:
                mine = med[f"lakestep-{b} t{t:g}"]
                if "delta" in p["fresh_peers"]:
                    checks.append(Check(f"lakestep-{b} / delta freshness p50 (trigger {t:g} s)",
                                        round(mine["p50_s"] / delta, 3) if mine["p50_s"] and delta else None, "<=",
                                        FRESH_TARGET))
                checks.append(Check(f"lakestep-{b} wrong answers (trigger {t:g} s)", mine["wrong"], "==", 0))
        mine = [m for k, m in med.items() if k.startswith("lakestep-")]  # the peers': in the table
        checks.append(Check("lakestep's records lost or duplicated", sum(m["lost_or_duplicated"] for m in mine)
                            if all(m["p50_s"] is not None for m in mine) else None, "==", 0))
    if "sinks" in r:
        checks += [Check(f"{sink} / delta sink rows/s (median)", r["sinks"].get(f"{sink} / delta median"), ">=",
                         SINK_TARGET) for sink in LAKESTEP_SINKS]
        # a run stops after batches + 1 batches with rows (the first one a warm-up); one more may land
        # before the query stops: each table holds whole batches, at least batches + 1 of them
        landed, per = r["sinks"]["table_rows"], p["rows_per_batch"]
        whole = all(isinstance(n, int) and n % per == 0 for n in landed)
        checks.append(Check("fewest rows in a sink's table, whole batches only",
                            min(landed) if landed and whole else None, ">=", per * (p["batches"] + 1)))
    return checks


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="small sizes, one round: a smoke run")
    ap.add_argument("--only", default=",".join(SECTIONS), help=f"sections to run (default {','.join(SECTIONS)})")
    ap.add_argument("--rounds", type=int, default=None, help="rounds of every section (default 3, 1 with --quick)")
    ap.add_argument("--messages", type=int, default=None, help="ingest: records in the topic (default 1,000,000; "
                                                                "20,000 with --quick)")
    ap.add_argument("--warmup", type=int, default=None, help="ingest: records of each reader's warm-up run "
                                                              "(default 20,000; 2,000 with --quick; 0: none)")
    ap.add_argument("--backends", default="sqlite,postgres", help="freshness: lakestep's catalog backends")
    ap.add_argument("--triggers", default=None, help="freshness: processingTime triggers, s (default 0.2,1; "
                                                      "--quick 0.2)")
    ap.add_argument("--seconds", type=float, default=None, help="freshness: measurement window per cell "
                                                                "(default 30; --quick 10)")
    ap.add_argument("--rate", type=float, default=200.0, help="freshness: records per second")
    ap.add_argument("--fresh-peers", default=",".join(FRESH_PEERS),
                    help="freshness: the peers' pipelines (default delta,iceberg; the lakestep / Delta targets "
                         "need delta)")
    ap.add_argument("--rows-per-batch", type=int, default=None, help="sinks: rows per micro-batch (default "
                                                                      "200,000; --quick 20,000)")
    ap.add_argument("--batches", type=int, default=None, help="sinks: kept micro-batches (default 10; --quick 2)")
    ap.add_argument("--warm", action=argparse.BooleanOptionalAction, default=None,
                    help="freshness and sinks: run each system once first, not reported (default: yes; "
                         "--quick: no)")
    ap.add_argument("--pg-dsn", default=os.environ.get("LAKESTEP_BENCH_PG_DSN", DEFAULT_PG_DSN))
    ap.add_argument("--out", default="benchmarks/results/jvm_peers.json")
    args = ap.parse_args(argv)
    q = args.quick
    only = [x for x in args.only.split(",") if x]
    if set(only) - set(SECTIONS):
        ap.error(f"--only: unknown sections {sorted(set(only) - set(SECTIONS))}")
    params = {"quick": q, "sections": only, "rounds": args.rounds or (1 if q else 3),
              "messages": args.messages or (20_000 if q else 1_000_000),
              "max_offsets_per_trigger": 5_000 if q else 200_000,
              "warmup_messages": args.warmup if args.warmup is not None else (2_000 if q else 20_000),
              "backends": [b for b in args.backends.split(",") if b],
              "triggers": freshness._floats(args.triggers or ("0.2" if q else "0.2,1")), "interval": 0.2,
              "fresh_rate": args.rate, "fresh_peers": [x for x in args.fresh_peers.split(",") if x],
              "fresh_seconds": args.seconds or (10.0 if q else 30.0),
              "fresh_warmup": 2.0 if q else 5.0, "pg_dsn": args.pg_dsn,
              "rows_per_batch": args.rows_per_batch or (20_000 if q else 200_000),
              "batches": args.batches or (2 if q else 10),
              "warm": args.warm if args.warm is not None else not q}
    import pyspark

    r: dict[str, Any] = {"machine": {"date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
                                     "cpu_count": os.cpu_count(), "python": platform.python_version(),
                                     "lakestep": lakestep.__version__, "pyspark": pyspark.__version__},
                         "params": {k: v for k, v in params.items() if k != "pg_dsn"},
                         "versions": {k: jars.pom_property(f"{k}.version") for k in ("spark", "iceberg", "delta")}}
    with tempfile.TemporaryDirectory(prefix="lakestep-bench-jvm-") as tmp:
        root = Path(tmp)
        step("starting the peers' Spark and lakestep's")
        peer = Peer(root)
        r["machine"]["peer_spark"] = peer.version
        spark = make_spark(root / "lakestep")
        from .formats import PlainSource, TimedSink

        spark.dataSource.register(PlainSource)
        spark.dataSource.register(TimedSink)
        spark.conf.set("spark.sql.streaming.numRecentProgressUpdates", "100000")
        try:
            if "ingest" in only:
                r["ingest"] = run_ingest(spark, peer, root, params)
            if "sinks" in only:
                r["sinks"] = run_sinks(spark, peer, root, params)
            if "freshness" in only:
                r["freshness"] = run_freshness(spark, peer, root, params)
        finally:
            spark.stop()
            peer.close()
    checks = checks_of(r)
    finish(Path(args.out), r, checks, report(r, checks))


if __name__ == "__main__":
    main()
