"""A TCP proxy in front of the test PostgreSQL server that injects network faults.

Real faults, not mocks: lakestep talks to the real server through a real
socket, and the proxy does to that socket what networks and failovers do:

* ``cut_after(marker)``: the next time a client sends a message containing
  ``marker``, the message reaches the server (which executes and commits it),
  but the connection is cut before the answer comes back: the client cannot
  know whether its statement landed;
* ``stall()``: stop relaying in both directions, connections stay open (a
  server or a middlebox that stopped answering; TCP keeps acknowledging);
* ``refuse()``: close every connection and refuse new ones (a server that went
  away after the catalog was opened);
* ``heal()``: back to relaying.
"""

from __future__ import annotations

import contextlib
import select
import socket
import threading
from typing import Iterator
from urllib.parse import urlsplit, urlunsplit


class PgProxy:
    def __init__(self, upstream: tuple[str, int]) -> None:
        self.upstream = upstream
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._lock = threading.Lock()
        self._mode = "relay"
        self._marker: bytes | None = None
        self._conns: list[tuple[socket.socket, socket.socket]] = []
        self.cuts = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._accept, daemon=True, name="pgproxy")
        self._thread.start()

    # ------------------------------------------------------------ control
    def url_for(self, url: str) -> str:
        """``url`` (a PostgreSQL URL of the upstream server) pointed at the proxy, without TLS: the
        proxy finds its markers in the statements' text, which a TLS session would hide (a server
        installed by apt has ``ssl = on``, and libpq's default ``sslmode=prefer`` takes it)."""
        parts = urlsplit(url)
        user = parts.netloc.rsplit("@", 1)
        host = f"127.0.0.1:{self.port}"
        netloc = f"{user[0]}@{host}" if len(user) == 2 else host
        query = "&".join([q for q in parts.query.split("&") if q and not q.startswith("sslmode=")] + ["sslmode=disable"])
        return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))

    def cut_after(self, marker: bytes) -> None:
        with self._lock:
            self._mode, self._marker = "cut", marker

    def stall(self) -> None:
        with self._lock:
            self._mode = "stall"

    def refuse(self) -> None:
        with self._lock:
            self._mode = "refuse"
            conns, self._conns = self._conns, []
        for pair in conns:
            _close(*pair)

    def heal(self) -> None:
        with self._lock:
            self._mode, self._marker = "relay", None

    def close(self) -> None:
        self._stop.set()
        self.refuse()
        self._listener.close()

    # ------------------------------------------------------------ relaying
    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            with self._lock:
                refused = self._mode == "refuse"
            if refused:
                _close(client)
                continue
            try:
                server = socket.create_connection(self.upstream)
            except OSError:
                _close(client)
                continue
            with self._lock:
                self._conns.append((client, server))
            threading.Thread(target=self._pump, args=(client, server), daemon=True).start()

    def _pump(self, client: socket.socket, server: socket.socket) -> None:
        armed = False  # the marker went to the server: cut before its answer comes back
        try:
            while not self._stop.is_set():
                with self._lock:
                    mode = self._mode
                if mode == "stall":
                    self._stop.wait(0.05)
                    continue
                if mode == "refuse":
                    return
                ready, _, _ = select.select([client, server], [], [], 0.05)
                for src in ready:
                    data = src.recv(65536)
                    if not data:
                        return
                    with self._lock:
                        mode, marker = self._mode, self._marker
                    if mode == "stall":
                        # keep what was read: relay it when healed (nothing is lost in flight)
                        self._held(src, data, client, server)
                        continue
                    if src is client:
                        if mode == "cut" and marker is not None and marker in data:
                            armed = True
                            with self._lock:
                                self._mode, self._marker = "relay", None
                        server.sendall(data)
                    else:
                        if armed:
                            self.cuts += 1
                            return  # the server answered (it committed): the client never hears it
                        client.sendall(data)
        except OSError:
            pass
        finally:
            _close(client, server)
            with self._lock:
                with contextlib.suppress(ValueError):
                    self._conns.remove((client, server))

    def _held(self, src: socket.socket, data: bytes, client: socket.socket, server: socket.socket) -> None:
        while not self._stop.is_set():
            with self._lock:
                if self._mode != "stall":
                    break
            self._stop.wait(0.05)
        (server if src is client else client).sendall(data)


def _close(*socks: socket.socket) -> None:
    for s in socks:
        with contextlib.suppress(OSError):
            s.shutdown(socket.SHUT_RDWR)
        with contextlib.suppress(OSError):
            s.close()


@contextlib.contextmanager
def pg_proxy(url: str) -> Iterator[PgProxy]:
    parts = urlsplit(url)
    proxy = PgProxy((parts.hostname or "127.0.0.1", parts.port or 5432))
    try:
        yield proxy
    finally:
        proxy.close()
